package relayconfig

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/heraldhq/herald/relay"
	"github.com/heraldhq/herald/sinks"
)

// Built is a configuration turned into live sinks and the engine's Config.
type Built struct {
	// Config is ready for relay.NewPostgres: tables, settings, routes with their
	// sinks and destination templates, and the logger.
	Config relay.Config
	// Sinks are the sinks the routes use, in file order.
	Sinks []sinks.Sink
}

// Build creates the sinks that routes use (a sink no route uses is logged as
// a warning and not created) and returns them with the relay.Config. When a
// sink cannot be created, the ones already created are closed. A nil logger
// means slog.Default().
func (f *File) Build(ctx context.Context, logger *slog.Logger) (*Built, error) {
	if f.readOnly {
		return nil, errors.New("relayconfig: the configuration was loaded with LoadReadOnly, which does not read the sinks' settings; use Load")
	}
	if logger == nil {
		logger = slog.Default()
	}
	used := map[string]bool{}
	for _, r := range f.routes {
		for _, t := range r.targets {
			used[t.sink] = true
		}
	}
	b := &Built{}
	byName := map[string]sinks.Sink{}
	for _, spec := range f.sinks {
		if !used[spec.name] {
			logger.WarnContext(ctx, "relayconfig: sink is used by no route; not starting it", "sink", spec.name, "type", spec.typ)
			continue
		}
		s, err := spec.newSink(spec.name, logger)
		if err != nil {
			closeErr := b.Close(ctx)
			return nil, errors.Join(fmt.Errorf("creating %s sink %s: %w", spec.typ, spec.name, err), closeErr)
		}
		byName[spec.name] = s
		b.Sinks = append(b.Sinks, s)
	}
	b.Config = f.relayConfig(byName)
	b.Config.Logger = logger
	return b, nil
}

// Close closes every sink, flushing what they buffer, and returns their
// errors joined.
func (b *Built) Close(ctx context.Context) error {
	var errs []error
	for _, s := range b.Sinks {
		if err := s.Close(ctx); err != nil {
			errs = append(errs, fmt.Errorf("closing sink %s: %w", s.Name(), err))
		}
	}
	b.Sinks = nil
	return errors.Join(errs...)
}
