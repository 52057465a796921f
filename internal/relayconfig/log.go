package relayconfig

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Log is the log section: how the relay writes its logs.
type Log struct {
	// Level is the lowest level written: debug, info, warn or error.
	// Defaults to info.
	Level string `yaml:"level"`
	// Format is text (logfmt-like key=value) or json. Defaults to text.
	Format string `yaml:"format"`
}

func (l Log) withDefaults() Log {
	if l.Level == "" {
		l.Level = "info"
	}
	if l.Format == "" {
		l.Format = "text"
	}
	return l
}

func (l Log) validate() error {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(l.Level)); err != nil {
		return fmt.Errorf("log.level: unknown level %q (known: debug, info, warn, error)", truncate(l.Level, 40))
	}
	switch strings.ToLower(l.Format) {
	case "text", "json":
	default:
		return fmt.Errorf("log.format: unknown format %q (known: json, text)", truncate(l.Format, 40))
	}
	return nil
}

// NewLogger returns a logger writing to w as the section says. An invalid
// section (Load has already refused it) falls back to text at info level.
func (l Log) NewLogger(w io.Writer) *slog.Logger {
	l = l.withDefaults()
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(l.Level)); err != nil {
		lv = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lv}
	if strings.EqualFold(l.Format, "json") {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
