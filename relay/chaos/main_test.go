package chaos

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

var (
	seedFlag     = flag.Int64("chaos.seed", 0, "seed of the fault schedule (0: CHAOS_SEED, else random)")
	durationFlag = flag.Duration("chaos.duration", 45*time.Second, "how long faults are injected in the main chaos test")
)

// relayBin is the relay binary, built once in TestMain.
var relayBin string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "herald-chaos-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	relayBin = filepath.Join(dir, "relay")
	build := exec.Command("go", "build", "-o", relayBin, "github.com/heraldhq/herald/cmd/relay")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building relay:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// chaosSeed returns the seed: the flag, then CHAOS_SEED, then the clock.
func chaosSeed(t *testing.T) int64 {
	t.Helper()
	if *seedFlag != 0 {
		return *seedFlag
	}
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q is not an integer", s)
		}
		return v
	}
	return time.Now().UnixNano()
}
