package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// firstStatement is one way a transaction's first statement reaches a
// PipelineTx; each inserts the order id into orders.
type firstStatement struct {
	name string
	run  func(ctx context.Context, tx pgx.Tx, id string) error
	// alone: the BEGIN cannot go with this statement and is sent on its
	// own first (as pgx.BeginTx sends it).
	alone bool
}

var firstStatements = []firstStatement{
	{name: "Exec", run: func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, id)
		return err
	}},
	{name: "Exec without arguments", run: func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO orders VALUES ('%s');`, id))
		return err
	}},
	{name: "Exec of two statements", alone: true, run: func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO orders VALUES ('%s'); SELECT 1`, id))
		return err
	}},
	{name: "Exec with an exec mode", alone: true, run: func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, pgx.QueryExecModeExec, id)
		return err
	}},
	{name: "Exec with named arguments", run: func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders VALUES (@id)`, pgx.NamedArgs{"id": id})
		return err
	}},
	{name: "QueryRow", run: func(ctx context.Context, tx pgx.Tx, id string) error {
		var got string
		if err := tx.QueryRow(ctx, `INSERT INTO orders VALUES ($1) RETURNING id`, id).Scan(&got); err != nil {
			return err
		}
		if got != id {
			return fmt.Errorf("RETURNING gave %q, want %q", got, id)
		}
		return nil
	}},
	{name: "Query read to the end", run: func(ctx context.Context, tx pgx.Tx, id string) error {
		rows, err := tx.Query(ctx, `INSERT INTO orders VALUES ($1), ($1 || '-b') RETURNING id`, id)
		if err != nil {
			return err
		}
		// No Close: rows that reach their end release the connection,
		// as pgx's own do.
		n := 0
		for rows.Next() {
			n++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if n != 2 {
			return fmt.Errorf("%d rows returned, want 2", n)
		}
		return nil
	}},
	{name: "Query closed early", run: func(ctx context.Context, tx pgx.Tx, id string) error {
		rows, err := tx.Query(ctx, `INSERT INTO orders VALUES ($1), ($1 || '-b') RETURNING id`, id)
		if err != nil {
			return err
		}
		if !rows.Next() {
			return fmt.Errorf("no row returned: %v", rows.Err())
		}
		rows.Close()
		return rows.Err()
	}},
	{name: "SendBatch", run: func(ctx context.Context, tx pgx.Tx, id string) error {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO orders VALUES ($1)`, id)
		var got string
		b.Queue(`SELECT id FROM orders WHERE id = $1`, id).QueryRow(func(r pgx.Row) error { return r.Scan(&got) })
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if got != id {
			return fmt.Errorf("the batch's second query read %q, want %q", got, id)
		}
		return nil
	}},
	{name: "savepoint", run: func(ctx context.Context, tx pgx.Tx, id string) error {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, `INSERT INTO orders VALUES ($1)`, id); err != nil {
			return err
		}
		return sp.Commit(ctx)
	}},
	{name: "CopyFrom", alone: true, run: func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"orders"}, []string{"id"}, pgx.CopyFromRows([][]any{{id}}))
		return err
	}},
	{name: "Conn", alone: true, run: func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.Conn().Exec(ctx, `INSERT INTO orders VALUES ($1)`, id)
		return err
	}},
}

// execModes are the connection settings the BEGIN is tested under: pgx's
// default and the simple protocol (as behind PgBouncer), whose batches are
// one multi-statement query.
var execModes = []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol}

// modePool is a traced pool on base's database with the given exec mode.
func modePool(t *testing.T, base *pgxpool.Pool, mode pgx.QueryExecMode) (*pgxpool.Pool, *roundTrips) {
	t.Helper()
	cfg := base.Config()
	cfg.ConnConfig.DefaultQueryExecMode = mode
	trace := &roundTrips{}
	cfg.ConnConfig.Tracer = trace
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, trace
}

// TestPipelineTxFirstStatementCarriesBegin: whichever way the first
// statement comes, it runs inside the transaction (a rollback undoes it, a
// commit keeps it with the event), the BEGIN goes out with it unless it
// cannot, and the connection goes back to the pool idle.
func TestPipelineTxFirstStatementCarriesBegin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base, w := pipelineFixture(t)
	d := descriptorFor("first")
	for _, mode := range execModes {
		pool, trace := modePool(t, base, mode)
		for i, fs := range firstStatements {
			for _, commit := range []bool{true, false} {
				id := fmt.Sprintf("%v-%d-%v", mode, i, commit)
				tx, err := Begin(ctx, pool, pgx.TxOptions{})
				if err != nil {
					t.Fatal(err)
				}
				// A failing check must not leave the connection acquired:
				// the pool's Close would wait for it.
				defer func() { _ = tx.Rollback(ctx) }()
				trace.sent() // forget the last transaction's
				if err := fs.run(ctx, tx, id); err != nil {
					t.Fatalf("%v, %s: %v", mode, fs.name, err)
				}
				if _, err := w.Write(ctx, tx, newEvent(d, id, 0)); err != nil {
					t.Fatalf("%v, %s: write: %v", mode, fs.name, err)
				}
				queries, batches := trace.sent()
				if fs.alone {
					if len(queries) == 0 || queries[0] != "begin" {
						t.Fatalf("%v, %s: sent alone %q, want the BEGIN first", mode, fs.name, queries)
					}
				} else if slices.Contains(queries, "begin") || len(batches) != 1 || batches[0][0] != "begin" {
					t.Fatalf("%v, %s: sent alone %q and in batches %q, want the BEGIN only in a batch with the statement", mode, fs.name, queries, batches)
				}
				if commit {
					err = tx.Commit(ctx)
				} else {
					err = tx.Rollback(ctx)
				}
				if err != nil {
					t.Fatalf("%v, %s: end: %v", mode, fs.name, err)
				}
				want := 0
				if commit {
					want = 1
				}
				orders := count(t, base, fmt.Sprintf(`SELECT count(*) FROM orders WHERE id = '%s'`, id))
				events := count(t, base, fmt.Sprintf(`SELECT count(*) FROM outbox WHERE key = '%s'::bytea`, id))
				if orders != want || events != want {
					t.Fatalf("%v, %s, commit %v: %d order rows and %d events kept, want %d of each", mode, fs.name, commit, orders, events, want)
				}
				if n := pool.Stat().AcquiredConns(); n != 0 {
					t.Fatalf("%v, %s: %d connections still acquired", mode, fs.name, n)
				}
			}
		}
	}
}

// TestPipelineTxWithoutStatements: a transaction that runs nothing sends
// nothing, and one that only writes events is one round trip.
func TestPipelineTxWithoutStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base, w := pipelineFixture(t)
	pool, trace := tracedPool(t, base)
	for _, end := range []func(*PipelineTx) error{
		func(tx *PipelineTx) error { return tx.Commit(ctx) },
		func(tx *PipelineTx) error { return tx.Rollback(ctx) },
	} {
		tx, err := Begin(ctx, pool, pgx.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := end(tx); err != nil {
			t.Fatal(err)
		}
		if q, b := trace.sent(); len(q)+len(b) != 0 {
			t.Fatalf("an empty transaction sent %q and %q, want nothing", q, b)
		}
	}
	err := BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.Write(ctx, tx, newEvent(descriptorFor("only"), "a", 0))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	q, b := trace.sent()
	if len(q) != 0 || len(b) != 1 || len(b[0]) != 3 || b[0][0] != "begin" || b[0][2] != sqlCommit {
		t.Fatalf("an events-only transaction sent %q and %q, want one batch: begin, the insert, COMMIT", q, b)
	}
	if n := count(t, base, `SELECT count(*) FROM outbox`); n != 1 {
		t.Fatalf("%d outbox rows, want 1", n)
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still acquired", n)
	}
}

// TestPipelineTxFailedBegin: a BEGIN the database refuses takes the first
// statement down with it (it must never run outside the transaction, in
// either protocol), every later statement reports it, and Commit refuses.
func TestPipelineTxFailedBegin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base, w := pipelineFixture(t)
	bad := pgx.TxOptions{BeginQuery: `BEGIN ISOLATION LEVEL sideways`}
	for _, mode := range execModes {
		pool, _ := modePool(t, base, mode)
		for i, fs := range firstStatements {
			id := fmt.Sprintf("%v-%d", mode, i)
			tx, err := Begin(ctx, pool, bad)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			err = fs.run(ctx, tx, id)
			if err == nil {
				t.Fatalf("%v, %s: no error after a refused BEGIN", mode, fs.name)
			}
			if fs.name != "Conn" && !strings.Contains(err.Error(), "begin") {
				t.Fatalf("%v, %s: %v, want an error naming the BEGIN", mode, fs.name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1 || '-later')`, id); err == nil {
				t.Fatalf("%v, %s: a statement after a refused BEGIN ran", mode, fs.name)
			}
			if _, err := w.Write(ctx, tx, newEvent(descriptorFor("refused"), id, 0)); err == nil {
				t.Fatalf("%v, %s: an event written after a refused BEGIN", mode, fs.name)
			}
			if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
				t.Fatalf("%v, %s: Commit after a refused BEGIN: %v, want ErrTxCommitRollback", mode, fs.name, err)
			}
			if n := count(t, base, fmt.Sprintf(`SELECT count(*) FROM orders WHERE id LIKE '%s%%'`, id)); n != 0 {
				t.Fatalf("%v, %s: %d order rows written outside the refused transaction", mode, fs.name, n)
			}
			if n := pool.Stat().AcquiredConns(); n != 0 {
				t.Fatalf("%v, %s: %d connections still acquired", mode, fs.name, n)
			}
		}
	}
	if n := count(t, base, `SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("%d events written by refused transactions", n)
	}
}

// TestPipelineTxFailedFirstStatement: a first statement the database
// refuses is reported as pgx reports it, and the transaction then behaves
// as any failed pgx transaction.
func TestPipelineTxFailedFirstStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := pipelineFixture(t)
	if _, err := pool.Exec(ctx, `INSERT INTO orders VALUES ('taken')`); err != nil {
		t.Fatal(err)
	}
	tx, err := Begin(ctx, pool, pgx.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, tx, newEvent(descriptorFor("dup"), "a", 0)); err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, "taken")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("duplicate insert: %v, want a unique violation", err)
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("Commit of a failed transaction: %v, want ErrTxCommitRollback", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("%d events committed by a failed transaction", n)
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still acquired", n)
	}
}

// TestBeginConnRefusesOpenTransaction: a connection already in a
// transaction would take the pipeline's COMMIT for its own.
func TestBeginConnRefusesOpenTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pipelineFixture(t)
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	outer, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = outer.Rollback(ctx) }()
	if _, err := BeginConn(ctx, c.Conn(), pgx.TxOptions{}); err == nil || !strings.Contains(err.Error(), "already in a transaction") {
		t.Fatalf("BeginConn inside a transaction: %v, want a refusal", err)
	}
}
