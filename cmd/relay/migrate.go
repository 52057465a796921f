package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/heraldhq/herald/migrations"
)

func newMigrateCommand(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply, revert or list the outbox schema migrations",
		Long: `Apply, revert or list the outbox schema migrations.

The database comes from --database-url, DATABASE_URL or database.url in
--config (in that order); --config is optional. Several migrate commands may
run at once: an advisory lock serialises them.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newMigrateUpCommand(g), newMigrateDownCommand(g), newMigrateStatusCommand(g))
	return cmd
}

func newMigrateUpCommand(g *globalFlags) *cobra.Command {
	var target int
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Apply pending migrations (all, or up to --target)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if target < 0 || target > migrations.Latest() {
				return usageError(fmt.Errorf("--target: %d is not between 1 and %d", target, migrations.Latest()))
			}
			s, m, done, err := g.migrator(cmd)
			if err != nil {
				return err
			}
			defer done()
			applied, err := m.Up(cmd.Context(), target)
			for _, mig := range applied {
				fmt.Fprintf(cmd.OutOrStdout(), "applied %03d_%s\n", mig.Version, mig.Name)
			}
			if err != nil {
				return runtimeError(fmt.Errorf("migrating %s: %w", s.tables.Outbox(), s.scrub(err)))
			}
			if len(applied) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "nothing to apply: %s is up to date\n", s.tables.Outbox())
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&target, "target", 0, "version to migrate up to (0 means the latest)")
	return cmd
}

func newMigrateDownCommand(g *globalFlags) *cobra.Command {
	var steps int
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Revert the newest --steps migrations (default 1); this drops tables and their rows",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if steps < 1 {
				return usageError(fmt.Errorf("--steps: must be at least 1, got %d", steps))
			}
			s, m, done, err := g.migrator(cmd)
			if err != nil {
				return err
			}
			defer done()
			reverted, err := m.Down(cmd.Context(), steps)
			for _, mig := range reverted {
				fmt.Fprintf(cmd.OutOrStdout(), "reverted %03d_%s\n", mig.Version, mig.Name)
			}
			if err != nil {
				return runtimeError(fmt.Errorf("reverting migrations of %s: %w", s.tables.Outbox(), s.scrub(err)))
			}
			if len(reverted) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "nothing to revert: %s has no migration applied\n", s.tables.Outbox())
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&steps, "steps", 1, "number of migrations to revert")
	return cmd
}

func newMigrateStatusCommand(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "List the migrations and when each was applied",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, m, done, err := g.migrator(cmd)
			if err != nil {
				return err
			}
			defer done()
			status, err := m.Status(cmd.Context())
			if err != nil {
				return runtimeError(fmt.Errorf("reading migration status of %s: %w", s.tables.Outbox(), s.scrub(err)))
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "VERSION\tNAME\tAPPLIED AT")
			for _, st := range status {
				at := "pending"
				if !st.AppliedAt.IsZero() {
					at = st.AppliedAt.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(w, "%03d\t%s\t%s\n", st.Version, st.Name, at)
			}
			return w.Flush()
		},
	}
}

// migrator connects and returns a migrator for the selected tables, and a
// function releasing the connection.
func (g *globalFlags) migrator(cmd *cobra.Command) (*setup, *migrations.Migrator, func(), error) {
	s, err := g.load(false)
	if err != nil {
		return nil, nil, nil, err
	}
	pool, err := s.connect(cmd.Context())
	if err != nil {
		return nil, nil, nil, err
	}
	// No logger: the commands print each step themselves, and the
	// migrator's log lines would say it a second time.
	m, err := migrations.NewMigrator(pool, s.tables, nil)
	if err != nil {
		pool.Close()
		return nil, nil, nil, usageError(err)
	}
	return s, m, pool.Close, nil
}
