package shop

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Client calls a Service's HTTP API.
type Client struct {
	// BaseURL is where the service listens, e.g. http://127.0.0.1:8080.
	BaseURL string
	// HTTP sends the requests. Defaults to http.DefaultClient.
	HTTP *http.Client
}

// Create places an order.
func (c *Client) Create(ctx context.Context, n NewOrder) (*Order, error) {
	body, err := json.Marshal(n)
	if err != nil {
		return nil, fmt.Errorf("encoding the order: %w", err)
	}
	return c.do(ctx, "/orders", body, http.StatusCreated)
}

// Pay pays the order with the given id.
func (c *Client) Pay(ctx context.Context, id string) (*Order, error) {
	return c.do(ctx, "/orders/"+url.PathEscape(id)+"/pay", nil, http.StatusOK)
}

// do POSTs body to path and decodes the order of a want answer.
func (c *Client) do(ctx context.Context, path string, body []byte, want int) (*Order, error) {
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	u := strings.TrimSuffix(c.BaseURL, "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", u, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", u, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxRequestBytes))
	if err != nil {
		return nil, fmt.Errorf("POST %s: reading the answer: %w", u, err)
	}
	if resp.StatusCode != want {
		return nil, fmt.Errorf("POST %s: %s: %s", u, resp.Status, bytes.TrimSpace(data))
	}
	var o Order
	if err := json.Unmarshal(data, &o); err != nil {
		return nil, fmt.Errorf("POST %s: decoding the order: %w", u, err)
	}
	return &o, nil
}
