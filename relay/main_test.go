package relay

import (
	"flag"
	"strconv"
	"testing"

	"go.uber.org/goleak"
)

// testParallel is how many of the package's parallel tests run at once
// unless -test.parallel says otherwise. The tests spend their time waiting
// on the database, on polls and on leases, not on the CPU (docs/benchmarks.md,
// Test time): at the default, GOMAXPROCS, a 2-core machine would run them
// two at a time, mostly idle.
// Each test has its own schema or database and a pool of at most 8
// connections, so this many stay well within a server's max_connections.
const testParallel = 6

// TestMain fails the package if a test leaves goroutines behind: a relay
// that returned from Run must have stopped everything it started.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", strconv.Itoa(testParallel)); err != nil {
			panic(err)
		}
	}
	goleak.VerifyTestMain(m)
}
