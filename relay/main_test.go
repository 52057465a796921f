package relay

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves goroutines behind: a relay
// that returned from Run must have stopped everything it started.
// The test binary is also the relay process of the memory test.
func TestMain(m *testing.M) {
	if schema := os.Getenv(memoryChildEnv); schema != "" {
		os.Exit(memoryChild(schema))
	}
	goleak.VerifyTestMain(m)
}
