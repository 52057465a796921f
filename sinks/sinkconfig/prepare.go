package sinkconfig

import (
	"cmp"
	"log/slog"
)

// Config is a sink's configuration: it says what is wrong with it, and
// fills in the defaults of the settings it leaves unset.
type Config[C any] interface {
	// Validate reports the first problem, naming the setting.
	Validate() error
	// WithDefaults returns the configuration with its defaults filled in.
	WithDefaults() C
}

// Prepare is what a sink's constructor does first: it validates cfg and
// returns it with its defaults filled in, and logger, or slog.Default()
// when it is nil.
func Prepare[C Config[C]](cfg C, logger *slog.Logger) (C, *slog.Logger, error) {
	if err := cfg.Validate(); err != nil {
		return cfg, nil, err
	}
	return cfg.WithDefaults(), cmp.Or(logger, slog.Default()), nil
}
