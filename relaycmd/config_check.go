package relaycmd

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/heraldhq/herald/relay"
)

func newConfigCommand(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Check a configuration file",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newConfigCheckCommand(g))
	return cmd
}

func newConfigCheckCommand(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Load and validate the configuration, connect to the database and each sink, and print the routes",
		Long: `Do what relay run does before it relays, and stop there: load the
configuration (every ${VAR} must be set) and validate every key, connect to
the database and check its schema is migrated for this relay, create each
sink a route uses and check it can reach its destination (NATS: connect and
JetStream, and a stream for each subject a route fixes; Kafka: a metadata
request, and each topic a route fixes exists; email: connect, EHLO and
AUTH; webhooks are not checked: any request would be one the endpoint must
answer), then print which topics go to which sinks and destinations.

Exit status 0 when everything answers, 1 when the database or a sink does
not, 2 when the configuration is invalid.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := g.loadAll()
			if err != nil {
				return err
			}
			return s.check(cmd.Context(), cmd.OutOrStdout(), g.config)
		},
	}
}

// check runs the checks of relay config check, printing each outcome to
// out, and fails when one failed.
func (s *setup) check(ctx context.Context, out io.Writer, path string) error {
	fmt.Fprintf(out, "config %s: valid\n", path)
	for _, w := range s.file.Warnings() {
		fmt.Fprintf(out, "warning: %s\n", w.Message)
	}
	var failed []string
	if err := s.checkDatabase(ctx); err != nil {
		fmt.Fprintf(out, "database %s: FAILED: %v\n", s.redactedURL(), err)
		failed = append(failed, "the database")
	} else {
		fmt.Fprintf(out, "database %s: %s is migrated\n", s.redactedURL(), s.outboxName())
	}

	built, err := s.file.Build(ctx, s.logger)
	if err != nil {
		return runtimeError(err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		if err := built.Close(closeCtx); err != nil {
			s.logger.WarnContext(ctx, "config check: closing sinks", "error", err)
		}
	}()
	types := map[string]string{}
	for _, r := range s.file.Routes() {
		for _, t := range r.Targets {
			types[t.Sink] = t.Type
		}
	}
	checks := relay.CheckSinks(ctx, built.Config.Routes)
	for _, sk := range built.Sinks {
		name := sk.Name()
		err, checked := checks[name]
		switch {
		case !checked:
			fmt.Fprintf(out, "sink %s (%s): not checked (no check for this type: its first delivery shows whether it answers)\n", name, types[name])
		case err != nil:
			fmt.Fprintf(out, "sink %s (%s): FAILED: %v\n", name, types[name], err)
			failed = append(failed, "sink "+name)
		default:
			fmt.Fprintf(out, "sink %s (%s): ok\n", name, types[name])
		}
	}

	fmt.Fprintln(out, "\nroutes (the first whose topics match an event's topic, and whose where filter passes, applies):")
	for _, r := range s.file.Routes() {
		targets := make([]string, len(r.Targets))
		for i, t := range r.Targets {
			dest := t.Destination
			if dest == "" {
				dest = "the event's topic"
			}
			targets[i] = fmt.Sprintf("%s (%s: %s)", t.Sink, t.Type, dest)
			if t.Type == "webhook" || t.Type == "email" || t.Type == "stdout" || t.Type == "discard" {
				targets[i] = fmt.Sprintf("%s (%s)", t.Sink, t.Type) // these ignore the destination
			}
		}
		where := ""
		if r.Where != "" {
			where = " where " + r.Where
		}
		fmt.Fprintf(out, "  %s%s -> %s\n", strings.Join(r.Topics, ", "), where, strings.Join(targets, ", "))
	}
	fmt.Fprintln(out, "  any other event -> dead letter at the routing step (no route matches)")
	if len(failed) > 0 {
		return runtimeError(fmt.Errorf("config check failed: %s", strings.Join(failed, ", ")))
	}
	return nil
}

// checkDatabase connects once and checks the schema is at this relay's
// version.
func (s *setup) checkDatabase(ctx context.Context) error {
	db, err := s.connect(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.checkSchema(ctx, s.tables); err != nil {
		return s.scrub(err)
	}
	return nil
}
