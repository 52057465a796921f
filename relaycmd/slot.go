package relaycmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/heraldhq/herald/migrations"
)

func newSlotCommand(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "slot",
		Short: "Show or drop the replication slot a relay with database.capture: wal reads",
		Long: `A relay with database.capture: wal reads the events applications emit into
PostgreSQL's write-ahead log from a logical replication slot, created at
its first start. The server keeps the WAL from the slot's confirmed
position on: while no relay reads it (every relay down, or the slot
forgotten), the WAL grows on the server's disk. The slot is
database.slot, or herald_<schema>_<table> by default (--slot names another).`,
		Args: cobra.NoArgs,
	}
	var slot string
	cmd.PersistentFlags().StringVar(&slot, "slot", "", "the slot's name (default: database.slot, or herald_<schema>_<table>)")
	cmd.AddCommand(newSlotShowCommand(g, &slot), newSlotDropCommand(g, &slot))
	return cmd
}

func newSlotShowCommand(g *globalFlags, slot *string) *cobra.Command {
	return &cobra.Command{
		Use:   "show",
		Short: "Show whether a relay reads the slot, and the WAL it keeps",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, sl, err := g.openSlot(cmd.Context(), *slot)
			if err != nil {
				return err
			}
			return writeSlot(cmd.OutOrStdout(), sl)
		},
	}
}

func newSlotDropCommand(g *globalFlags, slot *string) *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "drop",
		Short: "Drop the slot: the server frees the WAL it keeps, and its unread events are lost",
		Long: `Drop the replication slot, which no relay may be reading (stop them first).
The server frees the WAL the slot kept; the events in it that no relay read
are lost. The next relay with database.capture: wal creates a new slot and
reads what is emitted from then on.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, sl, err := g.openSlot(cmd.Context(), *slot)
			if err != nil {
				return err
			}
			if !yes {
				q := fmt.Sprintf("drop replication slot %s, losing the events in its %d bytes of WAL that no relay read?", sl.Name, sl.BehindBytes)
				if err := confirm(os.Stdin, stdinIsTerminal(), cmd.ErrOrStderr(), q); err != nil {
					return err
				}
			}
			pool, err := s.newPool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := migrations.DropSlot(cmd.Context(), pool, sl.Name); err != nil {
				return runtimeError(s.scrub(err))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "dropped replication slot %s\n", sl.Name)
			return nil
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "do not ask for confirmation")
	return cmd
}

// openSlot reads the slot named name (or the configuration's) and returns
// the setup it was read with.
func (g *globalFlags) openSlot(ctx context.Context, name string) (*setup, migrations.Slot, error) {
	s, err := g.loadRead(false)
	if err != nil {
		return nil, migrations.Slot{}, err
	}
	if s.mysql() {
		return nil, migrations.Slot{}, usageError(errors.New("database.url: replication slots are PostgreSQL's (database.capture: wal); MySQL's binary log is not read"))
	}
	if name == "" {
		name = s.slotName()
	}
	pool, err := s.newPool(ctx)
	if err != nil {
		return nil, migrations.Slot{}, err
	}
	defer pool.Close()
	sl, err := migrations.ReadSlot(ctx, pool, name)
	if errors.Is(err, migrations.ErrNoSlot) {
		return nil, sl, runtimeError(fmt.Errorf("replication slot %s does not exist: a relay with database.capture: wal creates it at its first start", name))
	}
	if err != nil {
		return nil, sl, runtimeError(s.scrub(err))
	}
	return s, sl, nil
}

// slotName is database.slot, or the tables' default slot.
func (s *setup) slotName() string {
	if s.file != nil && s.file.Database.Slot != "" {
		return s.file.Database.Slot
	}
	return s.tables.WithDefaults().SlotName()
}

// writeSlot prints a slot's state in one line.
func writeSlot(out io.Writer, sl migrations.Slot) error {
	reader := "no relay reads it"
	if sl.Active {
		reader = fmt.Sprintf("read by server process %d", sl.ActivePID)
	}
	_, err := fmt.Fprintf(out, "slot %s: %s; keeps %d bytes of WAL, confirmed %d bytes behind the WAL's end; WAL status %s\n",
		sl.Name, reader, sl.RetainedBytes, sl.BehindBytes, sl.WALStatus)
	return err
}
