package relayconfig

import (
	"fmt"
	"io/fs"
	"log/slog"
)

// Warning is a problem with a configuration that does not stop the relay.
// Load returns it in File.Warnings for the caller to log; relay run logs
// each at warn level.
type Warning struct {
	// Message says what is wrong and what to do, without any value.
	Message string
	// Attrs are the details, under stable keys.
	Attrs []slog.Attr
}

// Warnings returns the problems Load found that do not stop the relay: a
// file holding secrets written inline while group or others may read it.
// Parse, which has no file, finds none.
func (f *File) Warnings() []Warning { return f.warnings }

// readableSecrets returns the warning for a configuration file readable by
// group or others that holds secrets written inline (keys, never values),
// and whether there is one.
func readableSecrets(path string, mode fs.FileMode, keys []string) (Warning, bool) {
	if len(keys) == 0 || mode.Perm()&0o044 == 0 {
		return Warning{}, false
	}
	return Warning{
		Message: "relayconfig: the config file holds secrets written inline and is readable by group or others; " +
			"restrict it (chmod 600) or take the secrets from the environment with ${VAR}",
		Attrs: []slog.Attr{
			slog.String("file", path),
			slog.String("mode", fmt.Sprintf("%04o", mode.Perm())),
			slog.Any("keys", keys),
		},
	}, true
}
