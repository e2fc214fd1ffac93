package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/internal/testenv"
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
	{name: "Exec without arguments", alone: true, run: func(ctx context.Context, tx pgx.Tx, id string) error {
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
	{name: "Exec of two statements with named arguments", alone: true, run: func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO orders VALUES ('%s'); SELECT 1`, id), pgx.NamedArgs{})
		return err
	}},
	{name: "Exec of a prepared statement", alone: true, run: func(ctx context.Context, tx pgx.Tx, id string) error {
		if _, err := tx.Prepare(ctx, "insert_order", `INSERT INTO orders VALUES ($1)`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "insert_order", id)
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

// execModes are the connection settings the BEGIN is tested under: all of
// pgx's; on the simple protocol (as behind PgBouncer) a batch is one
// multi-statement query.
var execModes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec,
	pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol,
}

// modePool is a traced pool on base's database with the given exec mode.
func modePool(t *testing.T, base *pgxpool.Pool, mode pgx.QueryExecMode) (*pgxpool.Pool, *testenv.Sent) {
	t.Helper()
	return testenv.TracedPool(t, base, func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = mode })
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
				tx := beginTx(t, pool, pgx.TxOptions{})
				trace.Take() // forget the last transaction's
				if err := fs.run(ctx, tx, id); err != nil {
					t.Fatalf("%v, %s: %v", mode, fs.name, err)
				}
				if _, err := w.Write(ctx, tx, newEvent(d, id, 0)); err != nil {
					t.Fatalf("%v, %s: write: %v", mode, fs.name, err)
				}
				queries, batches := trace.Take()
				if fs.alone {
					if len(queries) == 0 || queries[0] != "begin" {
						t.Fatalf("%v, %s: sent alone %q, want the BEGIN first", mode, fs.name, queries)
					}
				} else if slices.Contains(queries, "begin") || len(batches) != 1 || batches[0][0] != "begin" {
					t.Fatalf("%v, %s: sent alone %q and in batches %q, want the BEGIN only in a batch with the statement", mode, fs.name, queries, batches)
				}
				end := tx.Rollback
				if commit {
					end = tx.Commit
				}
				if err := end(ctx); err != nil {
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
				waitReleased(t, pool)
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
	pool, trace := testenv.TracedPool(t, base)
	for _, end := range []func(*PipelineTx) error{
		func(tx *PipelineTx) error { return tx.Commit(ctx) },
		func(tx *PipelineTx) error { return tx.Rollback(ctx) },
	} {
		tx := beginTx(t, pool, pgx.TxOptions{})
		if err := end(tx); err != nil {
			t.Fatal(err)
		}
		if q, b := trace.Take(); len(q)+len(b) != 0 {
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
	q, b := trace.Take()
	if len(q) != 0 || len(b) != 1 || len(b[0]) != 3 || b[0][0] != "begin" || b[0][2] != sqlCommit {
		t.Fatalf("an events-only transaction sent %q and %q, want one batch: begin, the insert, COMMIT", q, b)
	}
	if n := count(t, base, `SELECT count(*) FROM outbox`); n != 1 {
		t.Fatalf("%d outbox rows, want 1", n)
	}
	waitReleased(t, pool)
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
			tx := beginTx(t, pool, bad)
			err := fs.run(ctx, tx, id)
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
			waitReleased(t, pool)
		}
	}
	if n := count(t, base, `SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("%d events written by refused transactions", n)
	}
}

// TestPipelineTxFailedFirstStatement: a first statement the database
// refuses, when it runs or when it is prepared, is reported as pgx reports
// it, and the transaction then behaves as any failed pgx transaction.
func TestPipelineTxFailedFirstStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base, w := pipelineFixture(t)
	if _, err := base.Exec(ctx, `INSERT INTO orders VALUES ('taken')`); err != nil {
		t.Fatal(err)
	}
	refused := []struct {
		sql, code string
	}{
		{`INSERT INTO orders VALUES ($1)`, "23505"},        // runs, violates the key
		{`INSERT INTO no_such_table VALUES ($1)`, "42P01"}, // cannot be prepared
	}
	for _, mode := range execModes {
		pool, _ := modePool(t, base, mode)
		for _, r := range refused {
			tx := beginTx(t, pool, pgx.TxOptions{})
			if _, err := w.Write(ctx, tx, newEvent(descriptorFor("dup"), "a", 0)); err != nil {
				t.Fatal(err)
			}
			_, err := tx.Exec(ctx, r.sql, "taken")
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != r.code || strings.Contains(err.Error(), "begin") {
				t.Fatalf("%v, %s: %v, want SQLSTATE %s as pgx reports it", mode, r.sql, err, r.code)
			}
			if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
				t.Fatalf("%v, %s: Commit of a failed transaction: %v, want ErrTxCommitRollback", mode, r.sql, err)
			}
			waitReleased(t, pool)
		}
	}
	if n := count(t, base, `SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("%d events committed by failed transactions", n)
	}
}

// TestPipelineTxUnencodableFirstArgument: an argument pgx cannot encode
// fails the first statement's batch, which pgx ends by closing the
// connection: the transaction reports it from then on and commits nothing.
func TestPipelineTxUnencodableFirstArgument(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := pipelineFixture(t)
	tx := beginTx(t, pool, pgx.TxOptions{})
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, make(chan int)); err == nil || !strings.Contains(err.Error(), "encode") {
		t.Fatalf("unencodable argument: %v, want pgx's encoding error", err)
	}
	if _, err := w.Write(ctx, tx, newEvent(descriptorFor("enc"), "a", 0)); err == nil {
		t.Fatal("an event written after the connection was closed")
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("Commit: %v, want ErrTxCommitRollback", err)
	}
	waitReleased(t, pool)
	if n := count(t, pool, `SELECT count(*) FROM orders`) + count(t, pool, `SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("%d rows committed", n)
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

// waitReleased waits until pool has no connection acquired: a connection
// the pool destroys on release leaves the count in the background.
func waitReleased(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for pool.Stat().AcquiredConns() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still acquired after 30 s", pool.Stat().AcquiredConns())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPipelineTxFirstStatementFailsOnClient: a first statement that fails
// before anything runs (named arguments refused, a context already done, a
// statement Postgres cannot prepare) fails as it would on a pgx
// transaction, and the transaction carries on where pgx's would.
func TestPipelineTxFirstStatementFailsOnClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base, w := pipelineFixture(t)
	done, cancel := context.WithCancel(ctx)
	cancel()
	failures := []struct {
		name string
		run  func(tx pgx.Tx) error
	}{
		{"strict named arguments missing one", func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `INSERT INTO orders VALUES (@id) RETURNING id`, pgx.StrictNamedArgs{}).Scan(new(string))
		}},
		{"context already done", func(tx pgx.Tx) error {
			_, err := tx.Exec(done, `INSERT INTO orders VALUES ($1)`, "never")
			return err
		}},
		{"context already done, no arguments", func(tx pgx.Tx) error {
			_, err := tx.Exec(done, `INSERT INTO orders VALUES ('never')`)
			return err
		}},
	}
	for _, mode := range execModes {
		pool, _ := modePool(t, base, mode)
		for i, f := range failures {
			id := fmt.Sprintf("client-%v-%d", mode, i)
			err := BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				err := f.run(tx)
				if err == nil {
					return fmt.Errorf("%s accepted", f.name)
				}
				if strings.Contains(err.Error(), "begin") {
					return fmt.Errorf("%s blamed on the BEGIN: %w", f.name, err)
				}
				if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, id); err != nil {
					return fmt.Errorf("after %s: %w", f.name, err)
				}
				_, err = w.Write(ctx, tx, newEvent(descriptorFor("client"), id, 0))
				return err
			})
			if err != nil {
				t.Fatalf("%v: %v", mode, err)
			}
			if n := count(t, base, fmt.Sprintf(`SELECT count(*) FROM orders WHERE id = '%s'`, id)); n != 1 {
				t.Fatalf("%v, %s: %d order rows committed, want 1", mode, f.name, n)
			}
			waitReleased(t, pool)
		}
	}
	if n := count(t, base, `SELECT count(*) FROM orders WHERE id = 'never'`); n != 0 {
		t.Fatal("a statement on a done context ran")
	}
}

// TestPipelineTxBeginQueryOfSeveralStatements: a BeginQuery that is more
// than one statement goes alone, as pgx sends it, and takes effect.
func TestPipelineTxBeginQueryOfSeveralStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base, w := pipelineFixture(t)
	opts := pgx.TxOptions{BeginQuery: `BEGIN; SET LOCAL statement_timeout = 5000`}
	for _, mode := range execModes {
		pool, _ := modePool(t, base, mode)
		tx := beginTx(t, pool, opts)
		var timeout string
		if err := tx.QueryRow(ctx, `SELECT current_setting($1)`, "statement_timeout").Scan(&timeout); err != nil || timeout != "5s" {
			t.Fatalf("%v: statement_timeout %q (%v), want the BeginQuery's 5s", mode, timeout, err)
		}
		if _, err := w.Write(ctx, tx, newEvent(descriptorFor("several"), "a", 0)); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("%v: %v", mode, err)
		}
	}
	if n := count(t, base, `SELECT count(*) FROM outbox`); n != len(execModes) {
		t.Fatalf("%d events committed, want %d", n, len(execModes))
	}
}

// TestPipelineTxRowsLeftOpen: rows of the first query left open at Commit
// make the Commit fail, and the caller's connection is closed rather than
// left inside the transaction, where a later COMMIT would keep the
// business row without its event.
func TestPipelineTxRowsLeftOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := pipelineFixture(t)
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	tx, err := BeginConn(ctx, c.Conn(), pgx.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, `INSERT INTO orders VALUES ($1), ($1 || '-b') RETURNING id`, "open")
	if err != nil {
		t.Fatal(err)
	}
	if !rows.Next() {
		t.Fatalf("no row: %v", rows.Err())
	}
	if _, err := w.Write(ctx, tx, newEvent(descriptorFor("open"), "open", 0)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("Commit with rows left open succeeded")
	}
	rows.Close()
	if conn := c.Conn(); !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
		t.Fatalf("the caller's connection is left in transaction status %q", conn.PgConn().TxStatus())
	}
	if n := count(t, pool, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("%d order rows committed without their event", n)
	}
}

// TestPipelineTxConnectionLostInFirstQuery: a connection lost while the
// first query's rows stream makes Commit report the lost connection, not
// pgx.ErrTxClosed, which callers read as "already ended".
func TestPipelineTxConnectionLostInFirstQuery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pipelineFixture(t)
	tx := beginTx(t, pool, pgx.TxOptions{})
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rows, err := tx.Query(qctx, `SELECT g FROM generate_series(1, $1::int) g`, 50_000_000)
	if err != nil {
		t.Fatal(err)
	}
	for n := 0; rows.Next(); n++ {
		if n == 1000 {
			cancel()
		}
	}
	rows.Close()
	err = tx.Commit(ctx)
	if err == nil || errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Commit after the connection was lost: %v, want the lost connection reported", err)
	}
	waitReleased(t, pool)
}

// TestPipelineTxSendBatchFirst: a caller's batch that goes out with the
// BEGIN has no transaction of its own to hand out, and a batch that itself
// begins a transaction is refused, as pgx refuses it inside one.
func TestPipelineTxSendBatchFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pipelineFixture(t)
	tx := beginTx(t, pool, pgx.TxOptions{})
	nested := &pgx.Batch{}
	nested.BeginTx(pgx.TxOptions{})
	nested.Queue(`INSERT INTO orders VALUES ($1)`, "nested")
	if err := tx.SendBatch(ctx, nested).Close(); err == nil || !strings.Contains(err.Error(), "BeginTx") {
		t.Fatalf("a batch beginning its own transaction: %v, want a refusal", err)
	}
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO orders VALUES ($1)`, "batched")
	br := tx.SendBatch(ctx, b)
	if br.Tx() != nil {
		t.Fatal("the caller's batch hands out a transaction")
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders`); n != 1 {
		t.Fatalf("%d order rows, want 1", n)
	}
}

// TestPipelineTxLargeObjectsEndWithTheTransaction: a large-object handle
// used after Commit reports pgx.ErrTxClosed, as pgx's does, instead of
// running on the connection, which is back in the pool by then.
func TestPipelineTxLargeObjectsEndWithTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base, w := pipelineFixture(t)
	cfg := base.Config()
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	tx := beginTx(t, pool, pgx.TxOptions{})
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, "lo"); err != nil {
		t.Fatal(err)
	}
	lo := tx.LargeObjects()
	if _, err := lo.Create(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, tx, newEvent(descriptorFor("lo"), "lo", 0)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := lo.Create(ctx, 0); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("a handle used after Commit: %v, want ErrTxClosed", err)
	}
	after := tx.LargeObjects()
	if _, err := after.Create(ctx, 0); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("LargeObjects after Commit: %v, want ErrTxClosed", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM pg_largeobject_metadata`); n < 1 {
		t.Fatal("the large object created in the transaction is gone")
	}
}

// TestPipelineTxStatementTexts: a text of several statements, any of which
// may end the transaction or a savepoint, has the queued rows sent ahead of
// it, so they share the fate of the business rows around them.
func TestPipelineTxStatementTexts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := pipelineFixture(t)
	d := descriptorFor("texts")
	// The COMMIT inside the text commits the queued event with the order.
	tx := beginTx(t, pool, pgx.TxOptions{})
	if _, err := w.Write(ctx, tx, newEvent(d, "c", 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('c'); COMMIT`); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	orders, events := count(t, pool, `SELECT count(*) FROM orders WHERE id = 'c'`), count(t, pool, `SELECT count(*) FROM outbox WHERE key = 'c'::bytea`)
	if orders != 1 || events != 1 {
		t.Fatalf("COMMIT in a text: %d order rows and %d events kept, want 1 and 1", orders, events)
	}
	// The ROLLBACK TO inside the text drops the event with the order.
	tx = beginTx(t, pool, pgx.TxOptions{})
	if _, err := tx.Exec(ctx, `SAVEPOINT s`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, "r"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, tx, newEvent(d, "r", 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1; ROLLBACK TO SAVEPOINT s`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	orders, events = count(t, pool, `SELECT count(*) FROM orders WHERE id = 'r'`), count(t, pool, `SELECT count(*) FROM outbox WHERE key = 'r'::bytea`)
	if orders != 0 || events != 0 {
		t.Fatalf("ROLLBACK TO in a text: %d order rows and %d events kept, want none", orders, events)
	}
}

// TestPipelineTxBatchCallbacksOnce: a caller's batch whose first query
// fails before the BEGIN took effect is sent again after it, and its
// callbacks run as often as on a pgx transaction, not once more.
func TestPipelineTxBatchCallbacksOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base, _ := pipelineFixture(t)
	// calls sends the malformed batch in a transaction begun by begin and
	// counts the callback's runs.
	calls := func(pool *pgxpool.Pool, begin func(context.Context, *pgxpool.Pool) (pgx.Tx, error)) int {
		tx, err := begin(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		n := 0
		b := &pgx.Batch{}
		b.Queue(`SELEC $1::int`, 1).QueryRow(func(r pgx.Row) error {
			n++
			return r.Scan(new(int))
		})
		if err := tx.SendBatch(ctx, b).Close(); err == nil {
			t.Fatal("a malformed query succeeded")
		}
		return n
	}
	for _, mode := range execModes {
		pool, _ := modePool(t, base, mode)
		want := calls(pool, func(ctx context.Context, p *pgxpool.Pool) (pgx.Tx, error) { return p.Begin(ctx) })
		got := calls(pool, func(ctx context.Context, p *pgxpool.Pool) (pgx.Tx, error) { return Begin(ctx, p, pgx.TxOptions{}) })
		if got != want {
			t.Fatalf("%v: the callback ran %d times, %d on a pgx transaction", mode, got, want)
		}
	}
}

// TestPipelineTxEndsWithoutQueuedRows: a savepoint refused on a done
// context, with nothing queued, leaves the transaction able to commit (as
// pgx's), and a CommitQuery of several statements commits the queued rows.
func TestPipelineTxEndsWithoutQueuedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := pipelineFixture(t)
	done, cancel := context.WithCancel(ctx)
	cancel()
	tx := beginTx(t, pool, pgx.TxOptions{CommitQuery: `COMMIT; SELECT 1`})
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, "sp"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Begin(done); err == nil {
		t.Fatal("a savepoint opened on a done context")
	}
	if _, err := w.Write(ctx, tx, newEvent(descriptorFor("sp"), "sp", 0)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders`) + count(t, pool, `SELECT count(*) FROM outbox`); n != 2 {
		t.Fatalf("%d rows committed, want the order and its event", n)
	}
}

// TestPipelineTxRollbackTextDropsQueue: a ROLLBACK TO sent as text drops
// the rows queued since the savepoint instead of sending them first, so it
// works in a transaction a failed statement aborted (as the consumer's
// per-event savepoints do); a rollback that fails leaves the transaction
// unable to commit, since its rows are gone.
func TestPipelineTxRollbackTextDropsQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := pipelineFixture(t)
	d := descriptorFor("rollback-text")
	tx := beginTx(t, pool, pgx.TxOptions{})
	if _, err := tx.Exec(ctx, `SAVEPOINT handler`); err != nil {
		t.Fatal(err)
	}
	err := pgx.BeginFunc(ctx, tx, func(nested pgx.Tx) error {
		_, err := w.Write(ctx, nested, newEvent(d, "undone", 0))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 / $1::int`, 0); err == nil {
		t.Fatal("division by zero accepted")
	}
	if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT handler`); err != nil {
		t.Fatalf("rollback to the savepoint in an aborted transaction: %v", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, "kept"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, tx, newEvent(d, "kept", 1)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wantOutbox(t, pool, "kept/1")

	tx = beginTx(t, pool, pgx.TxOptions{})
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, "orphan"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, tx, newEvent(d, "orphan", 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT no_such_savepoint`); err == nil {
		t.Fatal("rollback to a missing savepoint accepted")
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("Commit after a failed rollback dropped the events: %v, want ErrTxCommitRollback", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE id = 'orphan'`); n != 0 {
		t.Fatal("the order committed without its event")
	}

	// A refused rollback aborts the transaction; a later rollback to an
	// existing savepoint recovers it, and it commits as any pgx
	// transaction would. Query sends the rollback this time.
	tx = beginTx(t, pool, pgx.TxOptions{})
	if _, err := tx.Exec(ctx, `SAVEPOINT y`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, "undone-2"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, tx, newEvent(d, "undone-2", 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT no_such_savepoint`); err == nil {
		t.Fatal("rollback to a missing savepoint accepted")
	}
	rows, err := tx.Query(ctx, `ROLLBACK TO SAVEPOINT y`)
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatalf("rollback to the savepoint after a refused one: %v", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, "recovered"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, tx, newEvent(d, "recovered", 4)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("Commit of a recovered transaction: %v", err)
	}
	wantOutbox(t, pool, "kept/1 recovered/4")
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE id LIKE 'undone%'`); n != 0 {
		t.Fatalf("%d rolled-back orders committed", n)
	}
}

// beginTx begins a PipelineTx on pool, failing the test if it cannot, and
// rolls it back when the test ends (a no-op once it has ended), so that a
// failing check does not leave the connection acquired: the pool's Close
// would wait for it.
func beginTx(t *testing.T, pool *pgxpool.Pool, opts pgx.TxOptions) *PipelineTx {
	t.Helper()
	tx, err := Begin(context.Background(), pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}
