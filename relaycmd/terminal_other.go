//go:build !linux

package relaycmd

import "os"

// stdinIsTerminal reports whether standard input is a character device,
// the best guess at a terminal without a termios call.
func stdinIsTerminal() bool {
	fi, err := os.Stdin.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
