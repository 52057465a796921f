package relaycmd

import (
	"os"

	"golang.org/x/sys/unix"
)

// stdinIsTerminal reports whether standard input is a terminal someone can
// answer a prompt on (not a pipe, a file or /dev/null).
func stdinIsTerminal() bool {
	_, err := unix.IoctlGetTermios(int(os.Stdin.Fd()), unix.TCGETS)
	return err == nil
}
