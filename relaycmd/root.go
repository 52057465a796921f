package relaycmd

import (
	"errors"

	"github.com/spf13/cobra"
)

// globalFlags are the flags every command accepts.
type globalFlags struct {
	config      string
	databaseURL string
	schema      string
	table       string
	// opts are the options Main was given.
	opts *options
}

// newRootCommand builds the command tree. A new command is a file with a
// newXCommand(*globalFlags) constructor and one line here.
func newRootCommand(o *options) *cobra.Command {
	g := &globalFlags{opts: o}
	root := &cobra.Command{
		Use:   "relay",
		Short: "Herald relays transactional outbox rows from PostgreSQL to brokers",
		Long: `Herald relays the rows applications insert into a PostgreSQL outbox table,
inside their business transaction, to Kafka, NATS, webhooks and email.

Configuration comes from a YAML file (--config); ${NAME} and ${NAME:-default}
in its values are read from the environment, and DATABASE_URL overrides
database.url. Exit status: 1 for runtime failures, 2 for usage or
configuration errors.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// Without a command, the usage goes to stderr and the exit status is
		// 2, as for any other usage error: a script that forgot its command
		// must not pass.
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cmd.SetOut(cmd.ErrOrStderr())
			_ = cmd.Usage()
			return usageError(errors.New("a command is required"))
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	pf := root.PersistentFlags()
	pf.StringVarP(&g.config, "config", "c", "", "configuration file (YAML)")
	pf.StringVar(&g.databaseURL, "database-url", "", "PostgreSQL connection string, or mysql://user:password@host:3306/database (overrides DATABASE_URL and database.url)")
	pf.StringVar(&g.schema, "schema", "", "schema of the outbox tables (overrides database.schema; default public)")
	pf.StringVar(&g.table, "table", "", "outbox table name (overrides database.table; default outbox)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError(err) })

	root.AddCommand(newMigrateCommand(g))
	root.AddCommand(newRunCommand(g))
	root.AddCommand(newVersionCommand(o.version))
	root.AddCommand(newBenchCommand(g))
	root.AddCommand(newStatusCommand(g))
	root.AddCommand(newDLQCommand(g))
	root.AddCommand(newQueueCommand(g))
	root.AddCommand(newSlotCommand(g))
	root.AddCommand(newConfigCommand(g))
	return root
}
