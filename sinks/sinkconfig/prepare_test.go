package sinkconfig_test

import (
	"cmp"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks/sinkconfig"
)

type testConfig struct {
	Timeout time.Duration
	invalid bool
}

func (c testConfig) Validate() error {
	if c.invalid {
		return errors.New("timeout: invalid")
	}
	return nil
}

func (c testConfig) WithDefaults() testConfig {
	c.Timeout = cmp.Or(c.Timeout, time.Minute)
	return c
}

func TestPrepare(t *testing.T) {
	t.Parallel()
	cfg, logger, err := sinkconfig.Prepare(testConfig{}, nil)
	if err != nil || cfg.Timeout != time.Minute || logger != slog.Default() {
		t.Fatalf("Prepare = %+v, %v, %v; want the default timeout and slog.Default()", cfg, logger, err)
	}
	mine := slog.New(slog.DiscardHandler)
	if cfg, logger, _ = sinkconfig.Prepare(testConfig{Timeout: time.Second}, mine); cfg.Timeout != time.Second || logger != mine {
		t.Fatalf("Prepare kept neither the timeout nor the logger: %+v, %v", cfg, logger)
	}
	if _, _, err := sinkconfig.Prepare(testConfig{invalid: true}, nil); err == nil || err.Error() != "timeout: invalid" {
		t.Fatalf("Prepare of an invalid config: %v, want Validate's error", err)
	}
}
