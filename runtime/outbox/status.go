package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TableStatus is a snapshot of an outbox table, for operators and alerts.
type TableStatus struct {
	// Table is the schema-qualified table name.
	Table string
	// Lanes is the table's number of key-hash lanes.
	Lanes int
	// Relays counts relay sessions connected to the table right now: one
	// per relay worker (WithWorkers), so a relay with 4 workers counts 4.
	Relays int
	// Pending counts rows not yet published.
	Pending int64
	// OldestPending is the age of the oldest pending row (0 if none).
	OldestPending time.Duration
	// Failing counts pending rows whose publishing has failed at least once.
	Failing int64
	// LastError is the error of the oldest failing pending row, if any.
	LastError string
	// Published counts published rows not yet removed by the cleanup.
	Published int64
	// LastPublishedAt is when the latest row was published (zero if none
	// is retained).
	LastPublishedAt time.Time
	// Topics is the backlog per topic (pending, oldest, failing keys,
	// parked and dropped rows), sorted by topic.
	Topics []TopicStatus
}

// Status reports the state of the outbox table.
func Status(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (TableStatus, error) {
	_, t, err := schemaOptions(opts)
	if err != nil {
		return TableStatus{}, err
	}
	rt, err := resolve(ctx, pool, t)
	if err != nil {
		return TableStatus{}, err
	}
	st := TableStatus{Table: rt.schema + "." + rt.name, Lanes: rt.lanes}
	q := newQueries(rt.qualified())
	// One snapshot for all the counts, so they agree with each other while
	// relays keep publishing.
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return st, fmt.Errorf("outbox: status %s: begin: %w", st.Table, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := scanPending(ctx, tx, q, &st); err != nil {
		return st, err
	}
	if st.Failing > 0 {
		err := tx.QueryRow(ctx, q.statusError).Scan(&st.LastError)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return st, fmt.Errorf("outbox: status %s: last error: %w", st.Table, err)
		}
	}
	var last *time.Time
	if err := tx.QueryRow(ctx, q.statusDone).Scan(&st.Published, &last); err != nil {
		return st, fmt.Errorf("outbox: status %s: published: %w", st.Table, err)
	}
	if last != nil {
		st.LastPublishedAt = *last
	}
	if st.Topics, err = topicStatuses(ctx, tx, rt); err != nil {
		return st, fmt.Errorf("outbox: status %s: %w", st.Table, err)
	}
	if err := tx.QueryRow(ctx, sqlLiveRelays, rt.oid, uint32(presenceLane)).Scan(&st.Relays); err != nil {
		return st, fmt.Errorf("outbox: status %s: relays: %w", st.Table, err)
	}
	return st, nil
}

func scanPending(ctx context.Context, q querier, qs queries, st *TableStatus) error {
	var oldest float64
	if err := q.QueryRow(ctx, qs.statusPending).Scan(&st.Pending, &oldest, &st.Failing); err != nil {
		return fmt.Errorf("outbox: status: pending rows: %w", err)
	}
	st.OldestPending = time.Duration(oldest * float64(time.Second))
	return nil
}
