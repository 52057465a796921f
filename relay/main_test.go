package relay

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind: a relay
// that returned from Run must have stopped everything it started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
