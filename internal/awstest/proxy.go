package awstest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy forwards TCP connections to a server, and drops them on demand:
// the server side closing the client's connections, deterministically and
// without disturbing the server.
type Proxy struct {
	ln       net.Listener
	target   string
	accepted atomic.Int64

	mu    sync.Mutex
	conns []net.Conn
}

// StartProxy listens on a free port and forwards to target (host:port);
// it is closed in cleanup.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("awstest: proxy: %v", err)
	}
	p := &Proxy{ln: ln, target: target}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.DropAll()
	})
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Accepted counts the connections the proxy accepted so far.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// DropAll closes every open connection, both sides.
func (p *Proxy) DropAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *Proxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		go func() {
			io.Copy(server, client)
			server.Close()
		}()
		go func() {
			io.Copy(client, server)
			client.Close()
		}()
	}
}
