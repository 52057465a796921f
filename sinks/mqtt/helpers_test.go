package mqtt_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/heraldhq/herald/internal/localpeer"
	"github.com/heraldhq/herald/sinks"
	"github.com/heraldhq/herald/sinks/mqtt"
)

var quiet = slog.New(slog.DiscardHandler)

// open returns a sink closed in cleanup.
func open(t *testing.T, cfg mqtt.Config) *mqtt.Sink {
	t.Helper()
	s, err := mqtt.New("test", cfg, quiet)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func publish(t *testing.T, s sinks.Sink, events ...sinks.Event) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := s.Publish(ctx, events)
	if len(errs) != len(events) {
		t.Fatalf("Publish returned %d results for %d events", len(errs), len(events))
	}
	return errs
}

// proxy is a TCP proxy in front of a broker that a test can cut (close
// every connection) or mute (drop what the broker sends), to fail the
// sink's connection deterministically without touching the shared broker.
type proxy struct {
	ln       net.Listener
	upstream string
	accepted atomic.Int64
	muted    atomic.Bool
	mu       sync.Mutex
	conns    []net.Conn
}

func startProxy(t *testing.T, upstream string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, upstream: strings.TrimPrefix(upstream, "mqtt://")}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go p.serve()
	return p
}

// url is the proxy's broker URL.
func (p *proxy) url() string { return "mqtt://" + p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.upstream)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		p.accepted.Add(1)
		go func() { _, _ = io.Copy(server, client); server.Close() }()
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := server.Read(buf)
				if n > 0 && !p.muted.Load() {
					if _, werr := client.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			client.Close()
		}()
	}
}

// cut closes every connection made through the proxy so far.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// privateBroker starts a Mosquitto of the test's own on a free port, with
// password authentication (user herald, password s3cret), an ACL letting
// herald write only under allowed/, and a maximum packet size of 4096
// bytes: the setup errors the shared anonymous broker cannot show. It is
// stopped in cleanup.
func privateBroker(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		if _, err = os.Stat("/usr/sbin/mosquitto"); err != nil {
			msg := "mosquitto is not installed (apt-get install -y mosquitto)"
			localpeer.Missing(t, msg)
		}
		bin = "/usr/sbin/mosquitto"
	}
	dir := t.TempDir()
	passwd := filepath.Join(dir, "passwd")
	if out, err := exec.Command("mosquitto_passwd", "-b", "-c", passwd, "herald", "s3cret").CombinedOutput(); err != nil {
		t.Fatalf("mosquitto_passwd: %v: %s", err, out)
	}
	acl := filepath.Join(dir, "acl")
	if err := os.WriteFile(acl, []byte("user herald\ntopic write allowed/#\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	conf := filepath.Join(dir, "mosquitto.conf")
	// Started as root, Mosquitto drops to the user named here: the
	// test's own, who can read the test's files.
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf("user %s\nlistener %s 127.0.0.1\nallow_anonymous false\npassword_file %s\nacl_file %s\nmax_packet_size 4096\npersistence false\nlog_dest stderr\n",
		me.Username, port, passwd, acl)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", conf)
	var logs strings.Builder
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting mosquitto: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return "mqtt://" + addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("private mosquitto did not listen on %s: %v; its log: %s", addr, err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
