package console

import (
	"math"
	"net"
	"net/http"
	"sync"
	"time"
)

// maxLoginClients bounds the clients whose failed sign-ins are counted.
const maxLoginClients = 10000

// loginLimiter limits failed sign-ins per client address: a token bucket
// per client of burst failures, refilled at burst per window. A client
// with an empty bucket is refused before its token is even compared, so
// guessing the admin token costs an attacker one try per window/burst.
//
// Memory is bounded: a client whose bucket has refilled holds no
// information and is dropped; past max clients, those closest to refilled
// go first. A client that signs in is forgotten.
type loginLimiter struct {
	burst  float64
	window time.Duration
	max    int
	now    func() time.Time

	mu      sync.Mutex
	clients map[string]*bucket
}

// bucket is a client's failures still counted: tokens left (up to
// burst) as of at.
type bucket struct {
	tokens float64
	at     time.Time
}

func newLoginLimiter(burst int, window time.Duration, max int, now func() time.Time) *loginLimiter {
	return &loginLimiter{burst: float64(burst), window: window, max: max, now: now, clients: map[string]*bucket{}}
}

// tokensAt is b's tokens at t, refilled since b.at.
func (l *loginLimiter) tokensAt(b *bucket, t time.Time) float64 {
	refill := t.Sub(b.at).Seconds() / l.window.Seconds() * l.burst
	return min(b.tokens+max(refill, 0), l.burst)
}

// wait returns how long client must wait before its next sign-in: zero
// when it may try now.
func (l *loginLimiter) wait(client string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.clients[client]
	if b == nil {
		return 0
	}
	tokens := l.tokensAt(b, l.now())
	if tokens >= 1 {
		return 0
	}
	// Rounded up to the millisecond: a float's error must not let a
	// client in a nanosecond early, nor tell it a wait of 5.999999999 s.
	ms := math.Ceil((1 - tokens) / l.burst * float64(l.window) / float64(time.Millisecond))
	return time.Duration(ms) * time.Millisecond
}

// failed counts a failed sign-in of client.
func (l *loginLimiter) failed(client string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b := l.clients[client]
	if b == nil {
		l.makeRoom(now)
		b = &bucket{tokens: l.burst, at: now}
		l.clients[client] = b
	}
	b.tokens, b.at = max(l.tokensAt(b, now)-1, 0), now
}

// succeeded forgets client's failures.
func (l *loginLimiter) succeeded(client string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.clients, client)
}

// makeRoom drops the clients whose buckets have refilled and, when the
// map is still full, the one closest to refilled.
func (l *loginLimiter) makeRoom(now time.Time) {
	if len(l.clients) < l.max {
		return
	}
	var fullest string
	most := -1.0
	for c, b := range l.clients {
		tokens := l.tokensAt(b, now)
		if tokens >= l.burst {
			delete(l.clients, c)
			continue
		}
		if tokens > most {
			fullest, most = c, tokens
		}
	}
	if len(l.clients) >= l.max {
		delete(l.clients, fullest)
	}
}

// clientOf is the address a request came from, without its port: the
// key failed sign-ins are counted under. Behind a reverse proxy every
// client shares the proxy's address, and so its limit.
func clientOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
