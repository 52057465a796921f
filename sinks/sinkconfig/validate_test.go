package sinkconfig_test

import (
	"testing"
	"time"

	"github.com/heraldhq/herald/sinks/sinkconfig"
)

func TestNotNegative(t *testing.T) {
	t.Parallel()
	if err := sinkconfig.NotNegative("max_pending", 0); err != nil {
		t.Errorf("NotNegative(0) = %v, want nil", err)
	}
	if err := sinkconfig.NotNegative("timeout", time.Second); err != nil {
		t.Errorf("NotNegative(1s) = %v, want nil", err)
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{sinkconfig.NotNegative("max_pending", -1), "max_pending: -1 must not be negative"},
		{sinkconfig.NotNegative("max_len", int64(-5)), "max_len: -5 must not be negative"},
		{sinkconfig.NotNegative("timeout", -time.Second), "timeout: -1s must not be negative"},
	} {
		if tc.err == nil || tc.err.Error() != tc.want {
			t.Errorf("NotNegative = %v, want %q", tc.err, tc.want)
		}
	}
}
