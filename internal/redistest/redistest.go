// Package redistest is test support for code that talks to Redis: the URL
// of the shared Redis server (skipping or failing when it is down), an
// admin client, key prefixes unique to one test whose keys are deleted in
// cleanup, and a reader for the entries of a stream.
//
// Tests share one Redis server and run in parallel across packages, so
// every key a test writes must start with its own Prefix.
package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	goredis "github.com/redis/go-redis/v9"

	"github.com/heraldhq/herald/internal/localpeer"
)

// DefaultURL is the shared server's URL when REDIS_URL is not set.
const DefaultURL = "redis://127.0.0.1:6379/0"

// URL returns the shared Redis server's URL: $REDIS_URL, or DefaultURL.
// When no server answers there, the test fails if CI=true and is skipped
// otherwise, with what to start.
func URL(t testing.TB) string {
	t.Helper()
	return server.URL(t)
}

var server = localpeer.Service{Name: "Redis server", Env: "REDIS_URL", Default: DefaultURL,
	Start: `redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no`}

// Client returns a client of the server at url, closed in cleanup.
func Client(t testing.TB, url string) *goredis.Client {
	t.Helper()
	opts, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	c := goredis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return c
}

// Prefix returns a key prefix unique to the calling test ("herald_test:"
// and 8 hex digits and ":") and deletes every key under it in cleanup.
func Prefix(t testing.TB, c *goredis.Client) string {
	t.Helper()
	prefix := "herald_test:" + uuid.NewString()[:8] + ":"
	t.Cleanup(func() { DeleteKeys(t, c, prefix+"*") })
	return prefix
}

// DeleteKeys deletes the keys matching pattern (a SCAN MATCH pattern).
func DeleteKeys(t testing.TB, c *goredis.Client, pattern string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Errorf("redistest: scanning %s: %v", pattern, err)
		return
	}
	if len(keys) > 0 {
		if err := c.Del(ctx, keys...).Err(); err != nil {
			t.Errorf("redistest: deleting %d keys under %s: %v", len(keys), pattern, err)
		}
	}
}

// Entries returns every entry of stream, oldest first (none when the key
// does not exist).
func Entries(t testing.TB, c *goredis.Client, stream string) []goredis.XMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs, err := c.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		t.Fatalf("redistest: reading stream %s: %v", stream, err)
	}
	return msgs
}
