package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier is what the status functions read through: a pool, a
// connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Info is the state of one saga instance.
type Info struct {
	ID     string
	Type   string
	Status Status
	// Step and StepName are the step the saga is at: the one whose command
	// or compensation it waits for, or where it ended.
	Step     int
	StepName string
	// Awaiting is the event ID of the command the saga waits for a reply
	// to, if any.
	Awaiting string
	// Attempt counts the sends of the current compensation.
	Attempt int
	// Deadline is when the step times out or the compensation is retried.
	Deadline     *time.Time
	DeadlineKind string
	// Failure says why the saga compensates (or was parked).
	Failure   string
	Version   int64
	Data      json.RawMessage
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Entry is one transition of a saga's path.
type Entry struct {
	Seq        int64
	Step       int
	StepName   string
	Transition string
	// Status is the saga's status after the entry.
	Status Status
	// EventID is the reply consumed, CommandID the command sent.
	EventID   string
	CommandID string
	Detail    string
	At        time.Time
}

// ErrNotFound is returned for a saga ID that does not exist.
var ErrNotFound = errors.New("saga: no such saga")

// ErrNotParked is returned by Retry for a saga that is not parked.
var ErrNotParked = errors.New("saga: saga is not parked")

func infoOf(st *state) Info {
	return Info{ID: st.id, Type: st.typ, Status: st.status, Step: st.step, StepName: st.stepName, Awaiting: st.awaiting,
		Attempt: st.attempt, Deadline: st.deadline, DeadlineKind: st.deadlineKind, Failure: st.failure, Version: st.version,
		Data: json.RawMessage(st.data), CreatedAt: st.created, UpdatedAt: st.updated}
}

// Get returns the state of one saga.
func Get(ctx context.Context, db Querier, id string, opts ...Option) (Info, error) {
	s, err := settingsFrom(opts)
	if err != nil {
		return Info{}, err
	}
	st, err := scanState(db.QueryRow(ctx, s.sql.get, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Info{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if err != nil {
		return Info{}, fmt.Errorf("saga: get %q from %s: %w", id, s.sql.table, err)
	}
	return infoOf(st), nil
}

// Filter selects sagas for List; zero fields match everything.
type Filter struct {
	Type   string
	Status Status
	// Limit bounds the result; 0 means 100.
	Limit int
}

// List returns sagas, oldest first.
func List(ctx context.Context, db Querier, f Filter, opts ...Option) ([]Info, error) {
	s, err := settingsFrom(opts)
	if err != nil {
		return nil, err
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := db.Query(ctx, s.sql.list, f.Type, string(f.Status), f.Limit)
	if err != nil {
		return nil, fmt.Errorf("saga: list %s: %w", s.sql.table, err)
	}
	defer rows.Close()
	var out []Info
	for rows.Next() {
		st, err := scanState(rows)
		if err != nil {
			return nil, fmt.Errorf("saga: list %s: %w", s.sql.table, err)
		}
		out = append(out, infoOf(st))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("saga: list %s: %w", s.sql.table, err)
	}
	return out, nil
}

// Counts returns how many sagas (of sagaType, or all when empty) are in
// each status.
func Counts(ctx context.Context, db Querier, sagaType string, opts ...Option) (map[Status]int64, error) {
	s, err := settingsFrom(opts)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, s.sql.counts, sagaType)
	if err != nil {
		return nil, fmt.Errorf("saga: count %s: %w", s.sql.table, err)
	}
	out := map[Status]int64{}
	var (
		status string
		n      int64
	)
	_, err = pgx.ForEachRow(rows, []any{&status, &n}, func() error { out[Status(status)] = n; return nil })
	if err != nil {
		return nil, fmt.Errorf("saga: count %s: %w", s.sql.table, err)
	}
	return out, nil
}

// Path returns the transitions of one saga, in order: the path it took,
// with timestamps, the replies consumed and the commands sent.
func Path(ctx context.Context, db Querier, id string, opts ...Option) ([]Entry, error) {
	s, err := settingsFrom(opts)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, s.sql.historyList, id)
	if err != nil {
		return nil, fmt.Errorf("saga: path of %q: %w", id, err)
	}
	var (
		out    []Entry
		e      Entry
		status string
	)
	_, err = pgx.ForEachRow(rows, []any{&e.Seq, &e.Step, &e.StepName, &e.Transition, &status, &e.EventID, &e.CommandID, &e.Detail, &e.At},
		func() error { e.Status = Status(status); out = append(out, e); return nil })
	if err != nil {
		return nil, fmt.Errorf("saga: path of %q: %w", id, err)
	}
	return out, nil
}

// Retry hands a parked saga back to its orchestrator: its compensation
// budget is reset and the timeout runner sends the compensation again at
// once. It needs no saga definition (eventsctl saga retry runs it) and
// refuses a saga that is not parked (ErrNotParked).
func Retry(ctx context.Context, db Querier, id string, opts ...Option) error {
	s, err := settingsFrom(opts)
	if err != nil {
		return err
	}
	// One statement: the update and the path entry commit together.
	var (
		step     int
		stepName string
	)
	err = db.QueryRow(ctx, s.sql.retry, id).Scan(&step, &stepName)
	if errors.Is(err, pgx.ErrNoRows) {
		if _, gerr := Get(ctx, db, id, opts...); errors.Is(gerr, ErrNotFound) {
			return gerr
		}
		return fmt.Errorf("%w: %q", ErrNotParked, id)
	}
	if err != nil {
		return fmt.Errorf("saga: retry %q: %w", id, err)
	}
	return nil
}
