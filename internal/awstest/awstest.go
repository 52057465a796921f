// Package awstest is test support for the sqs and sns sinks: an SQS/SNS
// server to test against (moto's server, started by the test binary, or
// the one AWS_TEST_ENDPOINT names), clients of it, queues and topics
// unique to one test and deleted in cleanup, a reader of what a queue
// received, and a TCP proxy that drops connections on demand.
//
// goaws (github.com/Admiral-Piett/goaws v0.4.5), the in-process server
// first meant for these tests, speaks only the AWS query protocol, and the
// SQS client (service/sqs v1.53.0) speaks only AWS JSON, so they cannot
// talk; goaws has no SNS PublishBatch either. moto implements both.
package awstest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/heraldhq/herald/internal/localpeer"
)

// Region, AccessKeyID and SecretAccessKey are what the tests' clients
// and sinks use; moto accepts any credentials unless it checks them.
const (
	Region          = "us-east-1"
	AccessKeyID     = "herald-test"
	SecretAccessKey = "herald-test-secret"
)

var shared struct {
	once     sync.Once
	endpoint string
	cmd      *exec.Cmd
	err      error
}

// Main runs the package's tests and stops the server they started; call
// it from TestMain: os.Exit(awstest.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	if shared.cmd != nil {
		shared.cmd.Process.Kill()
		shared.cmd.Wait()
	}
	return code
}

// Endpoint returns the endpoint of the server shared by the package's
// tests: $AWS_TEST_ENDPOINT, or a moto server started on a free port the
// first time. Without either, the test fails if CI=true and is skipped
// otherwise, saying what to install.
func Endpoint(t testing.TB) string {
	t.Helper()
	shared.once.Do(func() {
		if e := os.Getenv("AWS_TEST_ENDPOINT"); e != "" {
			shared.endpoint, shared.err = e, waitReady(e, 30*time.Second)
			return
		}
		shared.endpoint, shared.cmd, shared.err = start()
	})
	if shared.err != nil {
		msg := fmt.Sprintf("awstest: no SQS/SNS server: %v; install moto (pip install 'moto[server]', which puts moto_server on PATH) "+
			"or set AWS_TEST_ENDPOINT to a running one (moto_server -p 5000, LocalStack)", shared.err)
		localpeer.Missing(t, msg)
	}
	return shared.endpoint
}

// StartServer starts a moto server of the calling test's own, with extra
// environment variables (INITIAL_NO_AUTH_ACTION_COUNT=0 makes it check
// credentials), stopped in cleanup. It fails the test when moto_server is
// missing: call Endpoint first, which skips.
func StartServer(t testing.TB, env ...string) string {
	t.Helper()
	endpoint, cmd, err := start(env...)
	if err != nil {
		t.Fatalf("awstest: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return endpoint
}

func start(env ...string) (string, *exec.Cmd, error) {
	bin, err := exec.LookPath("moto_server")
	if err != nil {
		return "", nil, err
	}
	port, err := freePort()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "-H", "127.0.0.1", "-p", strconv.Itoa(port))
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("starting moto_server: %w", err)
	}
	endpoint := fmt.Sprintf("http://127.0.0.1:%d", port)
	// A loaded machine takes seconds to start Python.
	if err := waitReady(endpoint, 60*time.Second); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return "", nil, err
	}
	return endpoint, cmd, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitReady polls moto's API until it answers.
func waitReady(endpoint string, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		resp, err := http.Get(endpoint + "/moto-api/")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no server answered at %s within %s: %w", endpoint, bound, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Config returns a client configuration for endpoint with the test
// credentials, for the tests' own calls (creating queues, reading what
// arrived). It keeps the SDK's retries: moto's server closes idle
// keep-alive connections, and a call that picks one up as it closes fails
// with "use of closed network connection" where a retry succeeds.
func Config(endpoint string) aws.Config {
	return aws.Config{
		Region:           Region,
		Credentials:      credentials.NewStaticCredentialsProvider(AccessKeyID, SecretAccessKey, ""),
		BaseEndpoint:     aws.String(endpoint),
		RetryMaxAttempts: 5,
	}
}

// Context returns a context bounded generously for one admin call.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Server returns the endpoint of a server for the calling test alone:
// $AWS_TEST_ENDPOINT, or a moto server stopped in cleanup, for packages
// whose TestMain does not call Main. Without either, the test fails if
// CI=true and is skipped otherwise.
func Server(t testing.TB) string {
	t.Helper()
	if e := os.Getenv("AWS_TEST_ENDPOINT"); e != "" {
		return e
	}
	if _, err := exec.LookPath("moto_server"); err != nil {
		msg := fmt.Sprintf("awstest: no SQS/SNS server: %v; install moto (pip install 'moto[server]') or set AWS_TEST_ENDPOINT", err)
		localpeer.Missing(t, msg)
	}
	return StartServer(t)
}
