package redis_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/heraldhq/herald/sinks/redis"
)

// lockedBuffer is a bytes.Buffer safe for the client's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestLibraryLogGoesToSlog: go-redis's pool complains about a server it
// cannot reach; those lines reach the relay's logger, at warn, instead of
// stderr as plain text. Not parallel: the library's logger is process-wide.
func TestLibraryLogGoesToSlog(t *testing.T) {
	var out lockedBuffer
	redis.LogLibraryTo(slog.New(slog.NewJSONHandler(&out, nil)))
	t.Cleanup(func() { redis.LogLibraryTo(slog.New(slog.DiscardHandler)) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // a port nothing listens on
	c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err == nil {
		t.Fatal("PING to a closed port succeeded")
	}
	got := out.String()
	if !strings.Contains(got, `"level":"WARN","msg":"redis client"`) || !strings.Contains(got, "failed to dial") {
		t.Fatalf("go-redis's log line did not reach the slog logger as a warning; got %q", got)
	}
}
