package redistest_test

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/heraldhq/herald/internal/redistest"
)

// TestURLWhenNoServer runs TestURLProbe in a child process against a port
// nothing listens on: skipped locally, failed under CI=true.
func TestURLWhenNoServer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "redis://" + ln.Addr().String() + "/0"
	ln.Close()
	for _, ci := range []string{"", "true"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestURLProbe$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "REDISTEST_PROBE=1", "REDIS_URL="+dead, "CI="+ci)
		out, err := cmd.CombinedOutput()
		switch {
		case ci == "" && (err != nil || !strings.Contains(string(out), "--- SKIP: TestURLProbe")):
			t.Fatalf("CI unset: want a skip, got %v:\n%s", err, out)
		case ci == "true" && (err == nil || !strings.Contains(string(out), "--- FAIL: TestURLProbe")):
			t.Fatalf("CI=true: want a failure, got %v:\n%s", err, out)
		}
		if !strings.Contains(string(out), "redis-server --daemonize yes") || !strings.Contains(string(out), dead) {
			t.Fatalf("the message does not say what to start:\n%s", out)
		}
	}
}

// TestURLProbe is TestURLWhenNoServer's child process.
func TestURLProbe(t *testing.T) {
	if os.Getenv("REDISTEST_PROBE") != "1" {
		t.Skip("run by TestURLWhenNoServer in a child process")
	}
	t.Logf("URL returned %s", redistest.URL(t))
}
