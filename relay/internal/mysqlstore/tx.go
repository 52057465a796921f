package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/heraldhq/herald/relay/internal/store"
)

// MySQL's error numbers the store acts on.
const (
	errLockWaitTimeout = 1205
	errDeadlock        = 1213
)

// retries is how many times a transaction runs at most when the server
// ends it with a deadlock or a lock wait timeout.
const retries = 5

// inTx runs fn in a READ COMMITTED transaction (the sessions' level on a
// *sql.DB opened by Open, else set for each transaction) and commits it,
// running it again (after a short jittered pause) when InnoDB chose it as
// a deadlock's victim (1213) or it waited too long for a row lock (1205):
// both roll the transaction, or the statement, back, and the whole
// transaction is what can be retried.
//
// READ COMMITTED: at REPEATABLE READ, InnoDB's default, a locking read or a
// DELETE reaching the end of the pending range locks the gap after the last
// row, and an application's INSERT waits for the relay's transaction
// (migrations/mysql, TestInsertWhileClaiming).
func (s *Store) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	return inTx(ctx, s.db, s.txOptions, fn)
}

// txOptionsFor returns the options that begin a READ COMMITTED
// transaction on db: none when every connection of db runs at that level
// already (opened by Open), which saves a round trip per transaction.
func txOptionsFor(db *sql.DB) *sql.TxOptions {
	if _, ok := db.Driver().(readCommittedDriver); ok {
		return nil
	}
	return &sql.TxOptions{Isolation: sql.LevelReadCommitted}
}

func inTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	var err error
	for attempt := 1; ; attempt++ {
		err = tryTx(ctx, db, opts, fn)
		if attempt == retries || !retryable(err) {
			return err
		}
		pause := time.Duration(attempt) * (2*time.Millisecond + rand.N(8*time.Millisecond))
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

func tryTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// retryable reports whether err ended a transaction that may succeed if
// run again.
func retryable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == errDeadlock || me.Number == errLockWaitTimeout)
}

// lockWaitTimeout reports whether err is a statement that waited too long
// for a row lock (1205).
func lockWaitTimeout(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == errLockWaitTimeout
}

// dataError marks err as the server refusing the data it was given (a
// value too long or out of range, a duplicate, a check constraint) rather
// than being unable to run the statement.
func dataError(err error) error {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return err
	}
	switch me.Number {
	case 1048, // a column cannot be NULL
		1062, // a duplicate entry (the unique head index)
		1264, // a value out of range
		1292, // an incorrect date or time value
		1366, // an incorrect value for the column (text not in its character set)
		1406, // data too long
		3819, // a check constraint (MySQL)
		4025: // a check constraint (MariaDB)
		return &store.DataError{Err: err}
	}
	return err
}
