// Package healthz is the example's container health check: the images have
// no shell or curl, so each binary asks its own HTTP listener for /healthz.
package healthz

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Check asks the listener at listen (host:port, as given by the flag named
// flag) for /healthz and returns nil when it answers 200 OK. A wildcard or
// empty host is asked on 127.0.0.1.
func Check(ctx context.Context, flag, listen string) error {
	if listen == "" {
		return fmt.Errorf("healthcheck: needs %s", flag)
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("%s: %w", flag, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/healthz", nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: %s", resp.Status)
	}
	return nil
}
