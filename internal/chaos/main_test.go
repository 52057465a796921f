package chaos

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

var (
	seedFlag     = flag.String("chaos.seed", "", "seed of the fault schedule: an integer, or \"random\" for one from the clock (default: CHAOS_SEED, else each test's fixed seed)")
	durationFlag = flag.Duration("chaos.duration", 0, "inject faults for this long instead of each test's fixed number of faults (default: CHAOS_DURATION)")
)

// relayBin is the relay binary, built once: TestMain starts the build and
// the tests that run it wait for it (waitRelayBin), so that their servers
// start meanwhile.
var (
	relayBin   string
	relayBuild func() error
)

// testParallel is how many of the package's parallel tests run at once
// unless -test.parallel says otherwise: every chaos test, each on servers of
// its own. They wait on their relays, sinks and servers more than they
// compute; at the default, GOMAXPROCS, a 2-core machine would run them two
// at a time and the longest after the others.
const testParallel = 4

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", strconv.Itoa(testParallel)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	dir, err := os.MkdirTemp("", "herald-chaos-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	relayBin = filepath.Join(dir, "relay")
	build := exec.Command("go", "build", "-trimpath", "-o", relayBin, "github.com/heraldhq/herald/cmd/relay")
	var out bytes.Buffer
	build.Stdout, build.Stderr = &out, &out
	if err := build.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "building the relay:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	relayBuild = sync.OnceValue(func() error {
		if err := build.Wait(); err != nil {
			return fmt.Errorf("building the relay: %v\n%s", err, out.Bytes())
		}
		return nil
	})
	code := m.Run()
	_ = relayBuild() // the build ends before its directory is removed
	os.RemoveAll(dir)
	os.Exit(code)
}

// waitRelayBin waits until relayBin is built, and fails the test if it
// could not be.
func waitRelayBin(t *testing.T) {
	t.Helper()
	if err := relayBuild(); err != nil {
		t.Fatal(err)
	}
}

// chaosSeed returns the seed of a test's fault schedule: the flag, else
// CHAOS_SEED, else the test's fixed seed.
func chaosSeed(t *testing.T, fixed int64) int64 {
	t.Helper()
	s, from := *seedFlag, "-chaos.seed"
	if s == "" {
		s, from = os.Getenv("CHAOS_SEED"), "CHAOS_SEED"
	}
	seed, err := parseSeed(s, fixed, time.Now())
	if err != nil {
		t.Fatalf("%s: %v", from, err)
	}
	return seed
}

// parseSeed reads a seed setting: empty keeps the test's fixed seed, which
// keeps the default run (CI) the same from one run to the next; "random"
// takes one from the clock, for longer runs that explore other schedules.
func parseSeed(s string, fixed int64, now time.Time) (int64, error) {
	switch s {
	case "":
		return fixed, nil
	case "random":
		return now.UnixNano(), nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: want an integer or \"random\"", s)
	}
	return v, nil
}

// chaosDuration returns how long to inject faults: the flag, else
// CHAOS_DURATION; zero means each test's fixed number of faults.
func chaosDuration(t *testing.T) time.Duration {
	t.Helper()
	if *durationFlag != 0 {
		return *durationFlag
	}
	d, err := parseDuration(os.Getenv("CHAOS_DURATION"))
	if err != nil {
		t.Fatalf("CHAOS_DURATION: %v", err)
	}
	return d
}

// parseDuration reads a duration setting; empty is zero.
func parseDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q: want a positive duration such as 10m", s)
	}
	return d, nil
}
