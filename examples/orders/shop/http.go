package shop

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
)

// maxRequestBytes bounds a request body.
const maxRequestBytes = 1 << 20

// Handler returns the service's HTTP API:
//
//	POST /orders           body NewOrder → 201 Order (status created)
//	POST /orders/{id}/pay  → 200 Order (status paid); 404 unknown; 409 already paid
//	GET  /orders/{id}      → 200 Order; 404 unknown
//	GET  /healthz          → 200 when the database answers
//
// Errors are JSON objects {"error": "..."}; 400 names the invalid field.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", s.handleCreate)
	mux.HandleFunc("POST /orders/{id}/pay", s.handlePay)
	mux.HandleFunc("GET /orders/{id}", s.handleGet)
	mux.HandleFunc("GET /healthz", s.handleHealth)
	return mux
}

func (s *Service) handleCreate(w http.ResponseWriter, r *http.Request) {
	var n NewOrder
	dec := json.NewDecoder(io.LimitReader(r.Body, maxRequestBytes))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(&n); err != nil {
		writeJSON(w, http.StatusBadRequest, errorBody{"request body: " + err.Error()})
		return
	}
	o, err := s.Create(r.Context(), n)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, o)
}

func (s *Service) handlePay(w http.ResponseWriter, r *http.Request) {
	o, err := s.Pay(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, o)
}

func (s *Service) handleGet(w http.ResponseWriter, r *http.Request) {
	o, err := s.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, o)
}

func (s *Service) handleHealth(w http.ResponseWriter, r *http.Request) {
	if err := s.db.ping(r.Context()); err != nil {
		s.log.WarnContext(r.Context(), "shop: health check: database unreachable", "error", err)
		writeJSON(w, http.StatusServiceUnavailable, errorBody{"database unreachable"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

type errorBody struct {
	Error string `json:"error"`
}

// writeError maps the service's errors to status codes; unexpected ones are
// logged and answered 500 without detail.
func (s *Service) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var invalid *InvalidError
	switch {
	case errors.As(err, &invalid):
		writeJSON(w, http.StatusBadRequest, errorBody{invalid.Error()})
	case errors.Is(err, ErrNotFound):
		writeJSON(w, http.StatusNotFound, errorBody{"no such order"})
	case errors.Is(err, ErrAlreadyPaid):
		writeJSON(w, http.StatusConflict, errorBody{"order already paid"})
	default:
		s.log.ErrorContext(r.Context(), "shop: request failed", "method", r.Method, "path", r.URL.Path, "error", err)
		writeJSON(w, http.StatusInternalServerError, errorBody{"internal error"})
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
