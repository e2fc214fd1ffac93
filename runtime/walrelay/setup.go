package walrelay

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrWALLevel matches (errors.Is) Setup's and Run's refusal when the
// server's wal_level is not logical.
var ErrWALLevel = errors.New("wal_level is not logical")

// ErrNoSlot matches (errors.Is) Run's and Drop's error for a slot that does
// not exist in the database (never created, dropped, or created in another
// database).
var ErrNoSlot = errors.New("replication slot does not exist")

// ErrSlotInvalidated matches (errors.Is) the error for a slot Postgres
// invalidated (wal_status "lost": it fell behind max_slot_wal_keep_size).
// The WAL it needed is gone, so events written in it can no longer be read;
// docs/runbook.md, "WAL relay: an invalidated slot", says how to recover.
var ErrSlotInvalidated = errors.New("replication slot invalidated")

// SQLSTATEs the package explains.
const (
	sqlstateDuplicateObject = "42710" // the slot or publication exists
	sqlstateObjectInUse     = "55006" // the slot is active for another process
	sqlstateUndefinedObject = "42704" // no such slot
	sqlstateConfigLimit     = "53400" // max_replication_slots reached
)

// Setup creates the WAL relay's publication and logical replication slot in
// the pool's database, if they do not exist yet; it is safe to run
// concurrently and repeatedly. Run it before the first WAL-source write
// (outbox.WithWALSource refuses writes until the slot exists): a message
// written before the slot exists is never read. It refuses with
// ErrWALLevel, naming the fix, when wal_level is not logical.
func Setup(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
	c, err := newConfig(opts)
	if err != nil {
		return err
	}
	if err := checkWALLevel(ctx, pool); err != nil {
		return err
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockSetup); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, publicationExists, c.publication).Scan(&exists); err != nil || exists {
			return err
		}
		_, err := tx.Exec(ctx, fmt.Sprintf(createPublication, pgx.Identifier{c.publication}.Sanitize()))
		return err
	}); err != nil {
		return fmt.Errorf("walrelay: setup: publication %q: %w", c.publication, err)
	}
	// A logical slot cannot be created in a transaction that wrote, so
	// not in the one above; a concurrent Setup that created it first is
	// an existing slot.
	st, err := readSlot(ctx, pool, c.slot)
	if err != nil {
		return err
	}
	if !st.Exists {
		var lsn string
		err := pool.QueryRow(ctx, createSlot, c.slot).Scan(&lsn)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == sqlstateDuplicateObject:
		case errors.As(err, &pgErr) && pgErr.Code == sqlstateConfigLimit:
			return fmt.Errorf("walrelay: setup: create slot %q: %w: every replication slot is in use: raise max_replication_slots (a restart) or drop an unused slot (SELECT slot_name, active FROM pg_replication_slots)", c.slot, err)
		case err != nil:
			return fmt.Errorf("walrelay: setup: create slot %q: %w", c.slot, err)
		default:
			return nil
		}
		if st, err = readSlot(ctx, pool, c.slot); err != nil {
			return err
		}
	}
	if st.Plugin != "pgoutput" {
		return fmt.Errorf("walrelay: setup: slot %q exists with plugin %q, not pgoutput: choose another slot name (WithSlot, --slot)", c.slot, st.Plugin)
	}
	return nil
}

// Drop removes the WAL relay's slot and its publication. Dropping the slot
// releases the WAL it retains: events written since its confirmed position
// and not yet published are then lost, so first switch the writers to the
// outbox table and let the relay catch up (docs/runbook.md, "Moving
// between relays"). A slot a relay is reading is refused: stop the relays
// first.
func Drop(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
	c, err := newConfig(opts)
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, dropSlot, c.slot)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == sqlstateObjectInUse:
		return fmt.Errorf("walrelay: drop slot %q: %w: a relay is reading it: stop the relays first", c.slot, err)
	case errors.As(err, &pgErr) && pgErr.Code == sqlstateUndefinedObject:
		return fmt.Errorf("walrelay: drop slot %q: %w", c.slot, ErrNoSlot)
	case err != nil:
		return fmt.Errorf("walrelay: drop slot %q: %w", c.slot, err)
	}
	if _, err := pool.Exec(ctx, fmt.Sprintf(dropPublication, pgx.Identifier{c.publication}.Sanitize())); err != nil {
		return fmt.Errorf("walrelay: drop publication %q: %w", c.publication, err)
	}
	return nil
}

// Slot is what Postgres reports of the relay's slot.
type Slot struct {
	Name      string
	Exists    bool
	Plugin    string
	Active    bool  // a relay is streaming from it
	ActivePID int32 // that relay's walsender process
	// Confirmed is the position up to which every event was published.
	Confirmed string
	// LagBytes is the WAL written since Confirmed, which the slot retains.
	LagBytes int64
	// WALStatus is Postgres' wal_status: "reserved", "extended",
	// "unreserved" (at risk: past max_wal_size, within
	// max_slot_wal_keep_size) or "lost" (invalidated).
	WALStatus string
	// SafeWALBytes is how much more WAL can be written before the slot is
	// invalidated by max_slot_wal_keep_size; -1 when unlimited.
	SafeWALBytes int64
}

// SlotStatus reads the slot (WithSlot) in the pool's database. A slot that
// does not exist is reported with Exists false, not as an error.
func SlotStatus(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (Slot, error) {
	c, err := newConfig(opts)
	if err != nil {
		return Slot{}, err
	}
	return readSlot(ctx, pool, c.slot)
}

// readSlot is SlotStatus for a slot name already validated.
func readSlot(ctx context.Context, pool *pgxpool.Pool, slot string) (Slot, error) {
	s := Slot{Name: slot}
	err := pool.QueryRow(ctx, slotRow, slot).Scan(&s.Plugin, &s.Active, &s.ActivePID, &s.Confirmed, &s.WALStatus, &s.SafeWALBytes, &s.LagBytes)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return s, nil
	case err != nil:
		return s, fmt.Errorf("walrelay: read slot %q: %w", slot, err)
	}
	s.Exists = true
	return s, nil
}

// checkWALLevel refuses a server whose wal_level is not logical.
func checkWALLevel(ctx context.Context, pool *pgxpool.Pool) error {
	var level string
	if err := pool.QueryRow(ctx, walLevel).Scan(&level); err != nil {
		return fmt.Errorf("walrelay: read wal_level: %w", err)
	}
	if level != "logical" {
		return fmt.Errorf("walrelay: %w (it is %q): run ALTER SYSTEM SET wal_level = logical and restart Postgres (on a managed service, set the logical replication parameter, e.g. rds.logical_replication = 1)", ErrWALLevel, level)
	}
	return nil
}
