package outbox

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A row is stuck when the relay cannot publish it: the broker refuses it
// (too large, topic missing, not authorised), so the relay retries it with
// backoff and every later row of its key waits behind it. Operators list
// stuck rows (ListStuck), then retry them (Retry), set them aside to retry
// later (Park) or give up on them (Drop). Parked and dropped rows are moved
// to the outbox's "<outbox>_dead" table, never deleted, and every action
// is logged in "<outbox>_ops" with who did it and why. Migrate creates both
// tables, also for an outbox created before they existed.

// ErrNoStuckTables is returned when the outbox has no "<outbox>_dead" and
// "<outbox>_ops" tables: it was migrated by an older version.
var ErrNoStuckTables = errors.New("outbox: the stuck-row tables do not exist: run `eventsctl migrate` (or outbox.Migrate) to add them")

// ErrNotStuck is returned for a row an operation does not apply to: not in
// the outbox, already published, or already in the asked-for state.
var ErrNotStuck = errors.New("outbox: row cannot be changed")

// Row states reported by Locate and DeadRow.State.
const (
	StatePending   = "pending"   // in the outbox, waiting for the relay
	StatePublished = "published" // in the outbox, published
	StateParked    = "parked"    // moved out; Retry puts it back
	StateDropped   = "dropped"   // moved out, not to be delivered; kept for the record
	StateRetried   = "retried"   // was parked or dropped, copied back as RetriedAs
)

// StuckRow is the oldest pending row of a key that the relay has failed to
// publish: the row that holds its key's later rows back.
type StuckRow struct {
	ID        int64
	EventID   string
	EventType string
	Topic     string
	Key       []byte
	// Attempts counts failed publish attempts; LastError is the broker's
	// or the relay's last error.
	Attempts  int
	LastError string
	CreatedAt time.Time
	Age       time.Duration
	// Waiting counts the key's pending rows, this one included.
	Waiting int64
}

// StuckFilter selects stuck rows; the zero value lists every key whose
// oldest pending row failed at least once, up to 100.
type StuckFilter struct {
	// MinAttempts is the least number of failed attempts (default 1; 0 also
	// lists keys that were never tried, e.g. while no relay runs).
	MinAttempts int
	// MinAge is the least age of the row.
	MinAge time.Duration
	// Topic limits the list to one topic.
	Topic string
	// Limit bounds the rows returned (default 100).
	Limit int
	// AnyAttempts makes a MinAttempts of 0 mean 0 (every key's oldest
	// pending row) rather than the default 1.
	AnyAttempts bool
}

// DeadRow is a row moved out of the outbox by Park or Drop.
type DeadRow struct {
	// ID is the row's id in the outbox when it was moved; Retry, Park and
	// Drop take it.
	ID        int64
	EventID   string
	EventType string
	Topic     string
	Key       []byte
	Attempts  int
	LastError string
	CreatedAt time.Time
	// State is StateParked, StateDropped or StateRetried.
	State   string
	MovedAt time.Time
	MovedBy string
	Reason  string
	// RetriedAs is the new outbox id of a retried row (0 otherwise).
	RetriedAs int64
}

// OpRecord is one logged operator action.
type OpRecord struct {
	ID       int64
	At       time.Time
	Actor    string // who, as the operator gave it (Operation.By)
	DBUser   string // the database role that ran it
	Action   string // "retry", "park" or "drop"
	OutboxID int64
	EventID  string
	Topic    string
	Key      []byte
	Reason   string
	Detail   string
}

// Operation says who asks for an action on a stuck row, and why; both are
// logged.
type Operation struct {
	By     string
	Reason string
}

// Result is what an action did.
type Result struct {
	ID      int64
	EventID string
	Topic   string
	Key     []byte
	// From and To are the row's states before and after.
	From, To string
	// NewID is the outbox id of a row retried from the dead table.
	NewID int64
}

// stuckEnv resolves the outbox and checks its stuck-row tables exist.
func stuckEnv(ctx context.Context, pool *pgxpool.Pool, opts []Option) (resolvedTable, stuckQueries, error) {
	_, t, err := schemaOptions(opts)
	if err != nil {
		return resolvedTable{}, stuckQueries{}, err
	}
	rt, err := resolve(ctx, pool, t)
	if err != nil {
		return rt, stuckQueries{}, err
	}
	st := stuckTablesOf(rt)
	var ok bool
	if err := pool.QueryRow(ctx, sqlTableExists, st.dead).Scan(&ok); err != nil {
		return rt, stuckQueries{}, fmt.Errorf("outbox: look up %s: %w", st.deadName, err)
	}
	if !ok {
		return rt, stuckQueries{}, fmt.Errorf("%w (outbox %s.%s)", ErrNoStuckTables, rt.schema, rt.name)
	}
	return rt, newStuckQueries(st), nil
}

// ListStuck returns, oldest first, the head row of every key that is stuck
// by f's measure.
func ListStuck(ctx context.Context, pool *pgxpool.Pool, f StuckFilter, opts ...Option) ([]StuckRow, error) {
	_, t, err := schemaOptions(opts)
	if err != nil {
		return nil, err
	}
	rt, err := resolve(ctx, pool, t)
	if err != nil {
		return nil, err
	}
	q := newStuckQueries(stuckTablesOf(rt))
	if f.MinAttempts == 0 && !f.AnyAttempts {
		f.MinAttempts = 1
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := pool.Query(ctx, q.listStuck, f.MinAttempts, f.MinAge.Seconds(), f.Topic, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list stuck rows of %s: %w", t, err)
	}
	var out []StuckRow
	for rows.Next() {
		var r StuckRow
		var age float64
		if err := rows.Scan(&r.ID, &r.EventID, &r.EventType, &r.Topic, &r.Key, &r.Attempts, &r.LastError, &age, &r.CreatedAt, &r.Waiting); err != nil {
			rows.Close()
			return nil, fmt.Errorf("outbox: list stuck rows of %s: %w", t, err)
		}
		r.Age = time.Duration(age * float64(time.Second))
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: list stuck rows of %s: %w", t, err)
	}
	return out, nil
}

// ListDead returns the rows moved out of the outbox, in the order they
// were moved; state ("" for all) and topic ("" for all) filter them.
func ListDead(ctx context.Context, pool *pgxpool.Pool, state, topic string, limit int, opts ...Option) ([]DeadRow, error) {
	_, q, err := stuckEnv(ctx, pool, opts)
	if err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 100
	}
	rows, err := pool.Query(ctx, q.listDead, state, topic, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list parked rows: %w", err)
	}
	var out []DeadRow
	for rows.Next() {
		var r DeadRow
		var retried *int64
		if err := rows.Scan(&r.ID, &r.EventID, &r.EventType, &r.Topic, &r.Key, &r.Attempts, &r.LastError,
			&r.State, &r.MovedAt, &r.MovedBy, &r.Reason, &retried, &r.CreatedAt); err != nil {
			rows.Close()
			return nil, fmt.Errorf("outbox: list parked rows: %w", err)
		}
		if retried != nil {
			r.RetriedAs = *retried
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: list parked rows: %w", err)
	}
	return out, nil
}

// Operations returns the logged operator actions, oldest first; id (0 for
// all) limits them to one outbox row.
func Operations(ctx context.Context, pool *pgxpool.Pool, id int64, limit int, opts ...Option) ([]OpRecord, error) {
	_, q, err := stuckEnv(ctx, pool, opts)
	if err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 1000
	}
	rows, err := pool.Query(ctx, q.listOps, id, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list operations: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (OpRecord, error) {
		var o OpRecord
		err := row.Scan(&o.ID, &o.At, &o.Actor, &o.DBUser, &o.Action, &o.OutboxID, &o.EventID, &o.Topic, &o.Key, &o.Reason, &o.Detail)
		return o, err
	})
}

// Locate returns where the row with the outbox id is: StatePending,
// StatePublished, StateParked, StateDropped or StateRetried.
func Locate(ctx context.Context, pool *pgxpool.Pool, id int64, opts ...Option) (string, error) {
	_, q, err := stuckEnv(ctx, pool, opts)
	if err != nil {
		return "", err
	}
	var state string
	err = pool.QueryRow(ctx, q.locate, id).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("%w: no row with id %d in the outbox or its dead table (see `eventsctl outbox list --stuck`)", ErrNotStuck, id)
	}
	if err != nil {
		return "", fmt.Errorf("outbox: locate row %d: %w", id, err)
	}
	return state, nil
}

// Park moves a pending row out of the outbox into "<outbox>_dead" so its
// key's later rows flow again, or turns a dropped row back into a parked
// one. Retry puts a parked row back.
func Park(ctx context.Context, pool *pgxpool.Pool, id int64, op Operation, opts ...Option) (Result, error) {
	return setAside(ctx, pool, id, StateParked, op, opts)
}

// Drop moves a pending or parked row out of the outbox into
// "<outbox>_dead" as dropped: it will not be delivered, and stays there for
// the record (Retry still puts it back).
func Drop(ctx context.Context, pool *pgxpool.Pool, id int64, op Operation, opts ...Option) (Result, error) {
	return setAside(ctx, pool, id, StateDropped, op, opts)
}

func checkOp(op Operation) error {
	if strings.TrimSpace(op.By) == "" {
		return errors.New("outbox: an operation on a stuck row must say who asks for it (Operation.By)")
	}
	return nil
}

func setAside(ctx context.Context, pool *pgxpool.Pool, id int64, to string, op Operation, opts []Option) (Result, error) {
	if err := checkOp(op); err != nil {
		return Result{}, err
	}
	_, q, err := stuckEnv(ctx, pool, opts)
	if err != nil {
		return Result{}, err
	}
	action := map[string]string{StateParked: "park", StateDropped: "drop"}[to]
	res := Result{ID: id, To: to}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, q.moveOut, id, to, op.By, op.Reason).Scan(&res.EventID, &res.Topic, &res.Key)
		res.From = StatePending
		if errors.Is(err, pgx.ErrNoRows) {
			err = tx.QueryRow(ctx, q.restate, id, to, op.By, op.Reason).Scan(&res.EventID, &res.Topic, &res.Key)
			res.From = map[string]string{StateParked: StateDropped, StateDropped: StateParked}[to]
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return notApplicable(ctx, tx, q, id, action)
		}
		if err != nil {
			return fmt.Errorf("outbox: %s row %d: %w", action, id, err)
		}
		return logOp(ctx, tx, q, op, action, res, fmt.Sprintf("%s -> %s", res.From, to))
	})
	return res, err
}

// Retry makes a stuck row publishable again. A pending row has its failure
// count and error cleared (a relay still backing off the key retries it
// when the backoff ends). A parked or dropped row is
// copied back into the outbox under a new id (so it is published after the
// key's rows that went through meanwhile; consumers deduplicate on the
// unchanged event id) and kept in the dead table as retried.
func Retry(ctx context.Context, pool *pgxpool.Pool, id int64, op Operation, opts ...Option) (Result, error) {
	if err := checkOp(op); err != nil {
		return Result{}, err
	}
	_, q, err := stuckEnv(ctx, pool, opts)
	if err != nil {
		return Result{}, err
	}
	res := Result{ID: id, To: StatePending}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var attempts int
		var lastErr string
		err := tx.QueryRow(ctx, q.resetPending, id).Scan(&res.EventID, &res.Topic, &res.Key, &attempts, &lastErr)
		if err == nil {
			res.From = StatePending
			return logOp(ctx, tx, q, op, "retry", res, fmt.Sprintf("cleared %d failed attempts; last error: %s", attempts, lastErr))
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("outbox: retry row %d: %w", id, err)
		}
		var eventType, headers string
		var value []byte
		var created time.Time
		err = tx.QueryRow(ctx, q.takeDead, id).Scan(&res.EventID, &eventType, &res.Topic, &res.Key, &value, &headers, &created, &res.From)
		if errors.Is(err, pgx.ErrNoRows) {
			return notApplicable(ctx, tx, q, id, "retry")
		}
		if err != nil {
			return fmt.Errorf("outbox: retry row %d: %w", id, err)
		}
		if err := tx.QueryRow(ctx, q.reinsert, res.EventID, eventType, res.Topic, res.Key, value, headers, created).Scan(&res.NewID); err != nil {
			return fmt.Errorf("outbox: retry row %d: put it back in the outbox: %w", id, err)
		}
		if _, err := tx.Exec(ctx, q.markRetry, id, res.NewID); err != nil {
			return fmt.Errorf("outbox: retry row %d: %w", id, err)
		}
		return logOp(ctx, tx, q, op, "retry", res, fmt.Sprintf("%s -> pending as id %d", res.From, res.NewID))
	})
	return res, err
}

// notApplicable explains why id cannot take the action.
func notApplicable(ctx context.Context, tx pgx.Tx, q stuckQueries, id int64, action string) error {
	var state string
	err := tx.QueryRow(ctx, q.locate, id).Scan(&state)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: %s row %d: no such row in the outbox or its dead table (see `eventsctl outbox list --stuck`)", ErrNotStuck, action, id)
	case err != nil:
		return fmt.Errorf("outbox: %s row %d: %w", action, id, err)
	case state == StatePublished:
		return fmt.Errorf("%w: %s row %d: it is already published", ErrNotStuck, action, id)
	case state == StateRetried:
		return fmt.Errorf("%w: %s row %d: it was retried under a new id (see `eventsctl outbox list --parked`)", ErrNotStuck, action, id)
	default:
		return fmt.Errorf("%w: %s row %d: it is already %s", ErrNotStuck, action, id, state)
	}
}

func logOp(ctx context.Context, tx pgx.Tx, q stuckQueries, op Operation, action string, res Result, detail string) error {
	if _, err := tx.Exec(ctx, q.insertOp, op.By, action, res.ID, res.EventID, res.Topic, res.Key, op.Reason, detail); err != nil {
		return fmt.Errorf("outbox: %s row %d: log the operation: %w", action, res.ID, err)
	}
	return nil
}

// TopicStatus is one topic's share of an outbox's backlog.
type TopicStatus struct {
	Topic string
	// Pending counts the topic's unpublished rows; OldestPending is the age
	// of the oldest.
	Pending       int64
	OldestPending time.Duration
	// Failing counts pending rows that failed at least once; FailingKeys
	// the keys they belong to (the keys the relay backs off).
	Failing     int64
	FailingKeys int64
	// Parked and Dropped count the rows operators moved out of the outbox.
	Parked, Dropped int64
}

// topicStatuses returns the backlog per topic, sorted by topic, read in
// the caller's transaction. Parked and dropped counts are left zero when the
// outbox has no dead table yet.
func topicStatuses(ctx context.Context, q pgx.Tx, rt resolvedTable) ([]TopicStatus, error) {
	st := stuckTablesOf(rt)
	sq := newStuckQueries(st)
	byTopic := map[string]*TopicStatus{}
	get := func(t string) *TopicStatus {
		if byTopic[t] == nil {
			byTopic[t] = &TopicStatus{Topic: t}
		}
		return byTopic[t]
	}
	rows, err := q.Query(ctx, sq.topicPending)
	if err != nil {
		return nil, fmt.Errorf("outbox: status per topic: %w", err)
	}
	for rows.Next() {
		var topic string
		var n, failing, keys int64
		var oldest float64
		if err := rows.Scan(&topic, &n, &oldest, &failing, &keys); err != nil {
			rows.Close()
			return nil, fmt.Errorf("outbox: status per topic: %w", err)
		}
		ts := get(topic)
		ts.Pending, ts.OldestPending, ts.Failing, ts.FailingKeys = n, time.Duration(oldest*float64(time.Second)), failing, keys
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: status per topic: %w", err)
	}
	var ok bool
	if err := q.QueryRow(ctx, sqlTableExists, st.dead).Scan(&ok); err != nil {
		return nil, fmt.Errorf("outbox: look up %s: %w", st.deadName, err)
	}
	if ok {
		rows, err := q.Query(ctx, sq.topicDead)
		if err != nil {
			return nil, fmt.Errorf("outbox: status of parked rows: %w", err)
		}
		for rows.Next() {
			var topic string
			var parked, dropped int64
			if err := rows.Scan(&topic, &parked, &dropped); err != nil {
				rows.Close()
				return nil, fmt.Errorf("outbox: status of parked rows: %w", err)
			}
			if parked > 0 || dropped > 0 {
				ts := get(topic)
				ts.Parked, ts.Dropped = parked, dropped
			}
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("outbox: status of parked rows: %w", err)
		}
	}
	out := make([]TopicStatus, 0, len(byTopic))
	for _, ts := range byTopic {
		out = append(out, *ts)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Topic < out[j].Topic })
	return out, nil
}
