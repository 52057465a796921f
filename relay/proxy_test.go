package relay

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/internal/pgtest"
)

// dbProxy forwards TCP connections to PostgreSQL until it is cut: then
// every connection through it drops and new ones are refused, as for a
// relay whose host died or was cut off from the database.
type dbProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns []net.Conn
	cut   bool
	wg    sync.WaitGroup
}

func newDBProxy(t testing.TB, target string) *dbProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dbProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *dbProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			up.Close()
			continue
		}
		p.conns = append(p.conns, c, up)
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

func (p *dbProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// cutOff drops every connection and refuses new ones.
func (p *dbProxy) cutOff() {
	p.mu.Lock()
	p.cut = true
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
}

func (p *dbProxy) close() {
	p.cutOff()
	p.wg.Wait()
}

// pool returns a relay's pool whose connections go through the proxy,
// closed when the test ends.
func (p *dbProxy) pool(t testing.TB, workers int) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(p.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(n)
	cfg.ConnConfig.Fallbacks = nil
	cfg.MaxConns = PoolSize(workers)
	ConfigurePool(cfg)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// databaseAddr is host:port of the test database.
func databaseAddr(t testing.TB) string {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ConnConfig.Host == "" || cfg.ConnConfig.Host[0] == '/' {
		t.Fatal(errors.New("the model test needs DATABASE_URL on TCP, not a socket"))
	}
	return net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
}
