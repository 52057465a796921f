package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/heraldhq/herald/migrations"
	"github.com/heraldhq/herald/outbox"
)

// orderHandler serves PUT /orders/{id}: the status change and its event
// commit together or not at all.
type orderHandler struct {
	pool   *pgxpool.Pool
	writer *outbox.Writer
	tables migrations.Tables
	logger *slog.Logger
}

// orderEvent is the payload of orders.<status>. Version counts the order's
// changes, so a consumer can see that a key's events arrive in order.
type orderEvent struct {
	ID      string `json:"id"`
	Status  string `json:"status"`
	Version int    `json:"version"`
}

func ordersTable(t migrations.Tables) string {
	return pgx.Identifier{t.Schema, "orders"}.Sanitize()
}

func (h *orderHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var body struct {
		Status string `json:"status"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<10)).Decode(&body); err != nil {
		http.Error(w, fmt.Sprintf("body: %v", err), http.StatusBadRequest)
		return
	}
	if body.Status == "" || len(body.Status) > 64 {
		http.Error(w, "body: status: required, at most 64 bytes", http.StatusBadRequest)
		return
	}
	ctx := r.Context()
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer tx.Rollback(ctx)
	// The upsert locks the order's row until commit, so two requests for one
	// order enqueue in commit order: the relay's per-key order is then the
	// order of the changes.
	ev := orderEvent{ID: id, Status: body.Status}
	if err := tx.QueryRow(ctx, `INSERT INTO `+ordersTable(h.tables)+` (id, status, version) VALUES ($1, $2, 1)
ON CONFLICT (id) DO UPDATE SET status = excluded.status, version = orders.version + 1
RETURNING version`, id, body.Status).Scan(&ev.Version); err != nil {
		h.fail(w, r, err)
		return
	}
	event, err := outbox.JSON("orders."+body.Status, ev)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	event.Key = id
	if _, err := h.writer.Enqueue(ctx, tx, event); err != nil {
		var invalid *outbox.ValidationError
		if errors.As(err, &invalid) {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h.fail(w, r, err)
		return
	}
	if err := tx.Commit(ctx); err != nil {
		h.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(ev)
}

func (h *orderHandler) fail(w http.ResponseWriter, r *http.Request, err error) {
	h.logger.ErrorContext(r.Context(), "embedded: updating an order", "order_id", r.PathValue("id"), "error", err)
	http.Error(w, "internal error", http.StatusInternalServerError)
}
