package admin

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/relay/deadletter"
	"github.com/heraldhq/herald/relay/internal/console"
)

// Opts configures NewForRelay.
type Opts struct {
	// Config is the server's address, token and readiness settings.
	Config Config
	// DB is the database /readyz checks: the relay's own pool (or
	// *sql.DB). Required.
	DB Pinger
	// DeadLetters serves the /dlq endpoints and the console's pages; a
	// store on the relay's database and tables (deadletter.New,
	// deadletter.NewMySQL). Required.
	DeadLetters *deadletter.Store
	// Metrics serves /metrics: promhttp over the registry the relay's
	// metrics.Metrics was registered in, say. Nil leaves /metrics out.
	Metrics http.Handler
	// Console serves the web console under /ui/. Defaults to false. The
	// console's links are absolute: serve the server's Handler at the
	// root of its host, not under a prefix.
	Console bool
	// ConsoleReadOnly hides replay and purge from the console and refuses
	// them. Defaults to false.
	ConsoleReadOnly bool
	// Logger receives the server's logs. Nil means slog.Default().
	Logger *slog.Logger
}

// NewForRelay returns the admin server of r: /readyz reports r's paused
// sinks, record failures, superseded configuration and sink checks, and the
// console, when Opts.Console is set, shows r's sinks, routes and
// throughput. It does not listen until Serve; an embedding service may
// mount Handler on its own server instead.
func NewForRelay(r *relay.Relay, opts Opts) (*Server, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	var ui http.Handler
	if opts.Console && opts.DeadLetters != nil {
		c, err := console.New(console.Config{Token: opts.Config.Token, ReadOnly: opts.ConsoleReadOnly}, console.Deps{
			DeadLetters: opts.DeadLetters,
			Sinks:       r.SinkNames(),
			Routes:      r.RouteSinks,
			PausedSinks: r.PausedSinks,
			PauseErrors: r.PauseErrors,
			SinkErrors:  func() map[string]error { return sinkErrors(r) },
			Throughput:  r.Throughput(),
			Retention:   r.Retention(),
			Logger:      opts.Logger,
		})
		if err != nil {
			return nil, fmt.Errorf("admin: creating the console: %w", err)
		}
		ui = c
	}
	return newServer(opts.Config, Deps{
		DB:            opts.DB,
		PausedSinks:   r.PausedSinks,
		RecordFailure: r.RecordFailure,
		Superseded:    r.Superseded,
		SinkErrors:    func() map[string]error { return sinkErrors(r) },
		Metrics:       opts.Metrics,
		DeadLetters:   opts.DeadLetters,
		Logger:        opts.Logger,
	}, ui)
}

// sinkErrors returns the latest check of each of r's checked sinks: nil for
// one that answered.
func sinkErrors(r *relay.Relay) map[string]error {
	checks := r.SinkChecks()
	out := make(map[string]error, len(checks))
	for name, c := range checks {
		out[name] = c.Err
	}
	return out
}
