package relaycmd

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/heraldhq/herald/internal/mysqlurl"
	"github.com/heraldhq/herald/migrations"
	mysqlmigrations "github.com/heraldhq/herald/migrations/mysql"
)

func newMigrateCommand(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply, revert or list the outbox schema migrations",
		Long: `Apply, revert or list the outbox schema migrations.

The database comes from --database-url, DATABASE_URL or database.url in
--config (in that order); --config is optional. A postgres:// URL migrates
the PostgreSQL schema, a mysql://user:password@host:3306/database URL the
MySQL/MariaDB schema (numbered on its own). Several migrate commands may run
at once: an advisory lock (GET_LOCK on MySQL) serialises them.`,
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
			s, err := g.loadRead(false)
			if err != nil {
				return err
			}
			if latest := s.latestVersion(); target < 0 || target > latest {
				return usageError(fmt.Errorf("--target: %d is not between 1 and %d", target, latest))
			}
			m, done, err := s.migrator(cmd)
			if err != nil {
				return err
			}
			defer done()
			applied, err := m.Up(cmd.Context(), target)
			for _, mig := range applied {
				fmt.Fprintf(cmd.OutOrStdout(), "applied %03d_%s\n", mig.Version, mig.Name)
			}
			if err != nil {
				return runtimeError(fmt.Errorf("migrating %s: %w", s.outboxName(), s.scrub(err)))
			}
			if len(applied) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "nothing to apply: %s is up to date\n", s.outboxName())
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
			s, err := g.loadRead(false)
			if err != nil {
				return err
			}
			m, done, err := s.migrator(cmd)
			if err != nil {
				return err
			}
			defer done()
			reverted, err := m.Down(cmd.Context(), steps)
			for _, mig := range reverted {
				fmt.Fprintf(cmd.OutOrStdout(), "reverted %03d_%s\n", mig.Version, mig.Name)
			}
			if err != nil {
				return runtimeError(fmt.Errorf("reverting migrations of %s: %w", s.outboxName(), s.scrub(err)))
			}
			if len(reverted) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "nothing to revert: %s has no migration applied\n", s.outboxName())
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
			s, err := g.loadRead(false)
			if err != nil {
				return err
			}
			m, done, err := s.migrator(cmd)
			if err != nil {
				return err
			}
			defer done()
			status, err := m.Status(cmd.Context())
			if err != nil {
				return runtimeError(fmt.Errorf("reading migration status of %s: %w", s.outboxName(), s.scrub(err)))
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

// migrator is what the migrate commands use of migrations.Migrator and of
// its MySQL twin.
type migrator interface {
	Up(ctx context.Context, target int) ([]migrations.Migration, error)
	Down(ctx context.Context, steps int) ([]migrations.Migration, error)
	Status(ctx context.Context) ([]migrations.Status, error)
}

// latestVersion is the newest schema version of the selected database.
func (s *setup) latestVersion() int {
	if s.mysql() {
		return mysqlmigrations.Latest()
	}
	return migrations.Latest()
}

// outboxName is the outbox table as the selected database quotes it.
func (s *setup) outboxName() string {
	if s.mysql() {
		if t, err := mysqlmigrations.NewTables(s.tables); err == nil {
			return t.Outbox()
		}
	}
	return s.tables.Outbox()
}

// migrator connects and returns a migrator for the selected database and
// tables, and a function releasing the connection.
func (s *setup) migrator(cmd *cobra.Command) (migrator, func(), error) {
	if s.mysql() {
		return s.mysqlMigrator(cmd.Context())
	}
	db, err := s.connect(cmd.Context())
	if err != nil {
		return nil, nil, err
	}
	// No logger: the commands print each step themselves, and the
	// migrator's log lines would say it a second time.
	m, err := migrations.NewMigrator(db.pool, s.tables, nil)
	if err != nil {
		db.Close()
		return nil, nil, usageError(err)
	}
	return m, db.Close, nil
}

// mysqlMigrator opens the MySQL database and checks it answers; one
// attempt.
func (s *setup) mysqlMigrator(ctx context.Context) (migrator, func(), error) {
	db, err := mysqlurl.Open(s.dbURL)
	if err != nil {
		return nil, nil, usageError(fmt.Errorf("database.url: %w", s.scrub(err)))
	}
	pingCtx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := db.PingContext(pingCtx); err != nil {
		db.Close()
		return nil, nil, runtimeError(fmt.Errorf("connecting to %s: %w", s.redactedURL(), s.scrub(err)))
	}
	m, err := mysqlmigrations.NewMigrator(db, s.tables, nil)
	if err != nil {
		db.Close()
		return nil, nil, usageError(err)
	}
	return m, func() { db.Close() }, nil
}
