package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
)

// pipelineFixture is a migrated outbox in a test schema, an orders table
// for the business rows, and a Writer.
func pipelineFixture(t *testing.T) (*pgxpool.Pool, *Writer) {
	t.Helper()
	ctx := context.Background()
	pool, _ := testenv.DB(t)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	// The Writer reads its table's shape once, on its first rows: done
	// here, so that the tests count only their transactions' round trips.
	w.learn(ctx, pool)
	return pool, w
}

// outboxSeqs returns the (key, seq) of the outbox rows in id order.
func outboxSeqs(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT key, value FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var key, value []byte
		if err := rows.Scan(&key, &value); err != nil {
			t.Fatal(err)
		}
		got = append(got, string(key)+"/"+seqOf(t, value))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// wantOutbox fails the test unless the outbox rows, in id order, are want
// (key/seq pairs separated by spaces).
func wantOutbox(t *testing.T, pool *pgxpool.Pool, want string) {
	t.Helper()
	if got := strings.Join(outboxSeqs(t, pool), " "); got != want {
		t.Fatalf("outbox rows %q, want %q", got, want)
	}
}

// seqOf reads the seq field out of a JSON envelope value.
func seqOf(t *testing.T, value []byte) string {
	t.Helper()
	s := string(value)
	i := strings.Index(s, `"seq":`)
	if i < 0 {
		t.Fatalf("no seq in %s", s)
	}
	s = s[i+len(`"seq":`):]
	return s[:strings.IndexAny(s, ",}")]
}

func count(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, sql string) int {
	t.Helper()
	var n int
	if err := q.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPipelineTxCommitsQueuedRowsInOrder: the rows wait in the transaction
// until Commit, go in in the order they were written (Write and WriteBatch
// mixed), commit with the business row, and the connection goes back to
// the pool.
func TestPipelineTxCommitsQueuedRowsInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := pipelineFixture(t)
	d := descriptorFor("piped")
	tx := beginTx(t, pool, pgx.TxOptions{})
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('o-1')`); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, tx, newEvent(d, "a", 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteBatch(ctx, tx, []events.Event{newEvent(d, "a", 1), newEvent(d, "b", 0)}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, tx, newEvent(d, "a", 2)); err != nil {
		t.Fatal(err)
	}
	if tx.Queued() != 4 {
		t.Fatalf("queued %d rows, want 4", tx.Queued())
	}
	if n := count(t, tx, `SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("%d outbox rows visible before Commit; they should wait in the queue", n)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wantOutbox(t, pool, "a/0 a/1 b/0 a/2")
	if n := count(t, pool, `SELECT count(*) FROM orders`); n != 1 {
		t.Fatalf("%d orders committed, want 1", n)
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("second Commit: %v, want ErrTxClosed", err)
	}
	if err := tx.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Rollback after Commit: %v, want ErrTxClosed", err)
	}
	if _, err := w.Write(ctx, tx, newEvent(d, "a", 3)); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Write after Commit: %v, want ErrTxClosed", err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1`); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Exec after Commit: %v, want ErrTxClosed", err)
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still acquired after Commit", n)
	}
}

// TestPipelineTxSendsRowsWithCommit proves the point of PipelineTx from
// what the connection sends, not from timings: the BEGIN goes with the
// first statement, writing events sends nothing, and Commit sends the
// INSERT and the COMMIT in one batch: two round trips in all, where a pgx
// transaction with the same statements spends four.
func TestPipelineTxSendsRowsWithCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base, w := pipelineFixture(t)
	pool, trace := testenv.TracedPool(t, base)
	d := descriptorFor("counted")
	err := BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, "o-1"); err != nil {
			return err
		}
		for i := range 3 {
			if _, err := w.Write(ctx, tx, newEvent(d, "a", i)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	queries, batches := trace.Take()
	if len(queries) != 0 {
		t.Fatalf("statements sent on their own: %q, want none", queries)
	}
	if len(batches) != 2 ||
		len(batches[0]) != 2 || batches[0][0] != "begin" || !strings.HasPrefix(batches[0][1], "INSERT INTO orders") ||
		len(batches[1]) != 2 || !strings.Contains(batches[1][0], "outbox") || batches[1][1] != sqlCommit {
		t.Fatalf("batches sent: %q, want two: begin with the business insert, then the outbox insert with COMMIT", batches)
	}
	if got := len(outboxSeqs(t, base)); got != 3 {
		t.Fatalf("%d outbox rows committed, want 3", got)
	}
}

// TestPipelineTxRollbackDropsRows: a rolled-back transaction (explicitly
// or by BeginFunc on an error) leaves no outbox row and no business row.
func TestPipelineTxRollbackDropsRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := pipelineFixture(t)
	d := descriptorFor("rolled")
	failed := errors.New("business rule broken")
	err := BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('o-1')`); err != nil {
			return err
		}
		if _, err := w.Write(ctx, tx, newEvent(d, "a", 0)); err != nil {
			return err
		}
		return failed
	})
	if !errors.Is(err, failed) {
		t.Fatalf("BeginFunc: %v, want the function's error", err)
	}
	tx := beginTx(t, pool, pgx.TxOptions{})
	if _, err := w.Write(ctx, tx, newEvent(d, "a", 1)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox`) + count(t, pool, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("%d rows left by rolled-back transactions", n)
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still acquired after Rollback", n)
	}
}

// TestPipelineTxSavepoints: rolling back a savepoint drops exactly the rows
// written after it, a released savepoint keeps its rows, and order holds
// across savepoints.
func TestPipelineTxSavepoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := pipelineFixture(t)
	d := descriptorFor("saved")
	write := func(tx pgx.Tx, key string, seq int) {
		t.Helper()
		if _, err := w.Write(ctx, tx, newEvent(d, key, seq)); err != nil {
			t.Fatal(err)
		}
	}
	err := BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		write(tx, "a", 0)
		sp1, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		write(sp1, "a", 1)
		sp2, err := sp1.Begin(ctx)
		if err != nil {
			return err
		}
		write(sp2, "dropped", 0)
		if err := sp2.Rollback(ctx); err != nil {
			return err
		}
		write(sp1, "a", 2)
		if err := sp1.Commit(ctx); err != nil {
			return err
		}
		// A savepoint rolled back with rows queued both before and after a
		// nested, released one.
		sp3, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		write(sp3, "dropped", 1)
		sp4, err := sp3.Begin(ctx)
		if err != nil {
			return err
		}
		write(sp4, "dropped", 2)
		if err := sp4.Commit(ctx); err != nil {
			return err
		}
		write(sp3, "dropped", 3)
		if err := sp3.Rollback(ctx); err != nil {
			return err
		}
		if _, err := w.Write(ctx, sp3, newEvent(d, "dropped", 4)); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("Write on a rolled-back savepoint: %v, want ErrTxClosed", err)
		}
		// pgx.BeginFunc on a savepoint, as nested code would use it.
		if err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			write(sp, "b", 0)
			return nil
		}); err != nil {
			return err
		}
		write(tx, "a", 3)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wantOutbox(t, pool, "a/0 a/1 a/2 b/0 a/3")
}

// TestPipelineTxFixedEventID: a write with a fixed event ID goes in at
// once, after the rows queued before it, so a duplicate is refused by
// Write as on any transaction, and order holds.
func TestPipelineTxFixedEventID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := pipelineFixture(t)
	d := descriptorFor("fixed")
	id := envelope.NewEventID()
	err := BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := w.Write(ctx, tx, newEvent(d, "a", 0)); err != nil {
			return err
		}
		if _, err := w.Write(ctx, tx, newEvent(d, "a", 1), events.WithEventID(id)); err != nil {
			return err
		}
		if n := count(t, tx, `SELECT count(*) FROM outbox`); n != 2 {
			t.Errorf("%d rows inserted by the fixed-ID write, want 2 (the queued one and itself)", n)
		}
		_, err := w.Write(ctx, tx, newEvent(d, "a", 2))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	wantOutbox(t, pool, "a/0 a/1 a/2")
	err = BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.Write(ctx, tx, newEvent(d, "a", 3), events.WithEventID(id))
		return err
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("duplicate fixed event ID: %v, want a unique violation", err)
	}
}

// TestPipelineTxFailedCommit: a queued row that cannot be inserted fails
// Commit with an error naming the table, nothing of the transaction
// commits, and the connection is clean for its next user.
func TestPipelineTxFailedCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := pipelineFixture(t)
	missing, err := NewWriter(WithTable("no_such_outbox"))
	if err != nil {
		t.Fatal(err)
	}
	d := descriptorFor("failing")
	tx := beginTx(t, pool, pgx.TxOptions{})
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('o-1')`); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, tx, newEvent(d, "a", 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := missing.Write(ctx, tx, newEvent(d, "a", 1)); err != nil {
		t.Fatal(err)
	}
	err = tx.Commit(ctx)
	if err == nil || !strings.Contains(err.Error(), "no_such_outbox") {
		t.Fatalf("Commit: %v, want an error naming the missing table", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox`) + count(t, pool, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("%d rows committed by a failed Commit", n)
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still acquired after a failed Commit", n)
	}
	// A transaction that failed before Commit reports it as pgx does.
	tx = beginTx(t, pool, pgx.TxOptions{})
	if _, err := w.Write(ctx, tx, newEvent(d, "a", 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES (NULL)`); err == nil {
		t.Fatal("NULL primary key accepted")
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("Commit of a failed transaction: %v, want ErrTxCommitRollback", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox`); n != 0 {
		t.Fatalf("%d rows committed by a failed transaction", n)
	}
}

// TestPipelineTxOnConn: BeginConn runs on the caller's connection and
// leaves it open and idle.
func TestPipelineTxOnConn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := pipelineFixture(t)
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	tx, err := BeginConn(ctx, c.Conn(), pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	var iso string
	if err := tx.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&iso); err != nil || iso != "repeatable read" {
		t.Fatalf("isolation %q (%v), want repeatable read", iso, err)
	}
	if _, err := w.Write(ctx, tx, newEvent(descriptorFor("conn"), "a", 0)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Conn().IsClosed() || c.Conn().PgConn().TxStatus() != 'I' {
		t.Fatal("the caller's connection is closed or still in a transaction")
	}
	if n := count(t, c.Conn(), `SELECT count(*) FROM outbox`); n != 1 {
		t.Fatalf("%d outbox rows, want 1", n)
	}
}

// TestPipelineTxRawSavepoints: savepoints sent as SQL text (by Exec or in
// a batch, as some libraries and the consumer's per-event isolation do)
// decide the fate of the queued rows as they would decide an INSERT's.
func TestPipelineTxRawSavepoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := pipelineFixture(t)
	d := descriptorFor("raw")
	err := BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		exec := func(sql string) {
			t.Helper()
			if _, err := tx.Exec(ctx, sql); err != nil {
				t.Fatal(err)
			}
		}
		write := func(key string, seq int) {
			t.Helper()
			if _, err := w.Write(ctx, tx, newEvent(d, key, seq)); err != nil {
				t.Fatal(err)
			}
		}
		write("a", 0)
		exec("SAVEPOINT s1")
		write("dropped", 0)
		exec("rollback to savepoint s1")
		write("a", 1)
		exec(" Savepoint s2")
		write("a", 2)
		exec("RELEASE SAVEPOINT s2")
		write("a", 3) // queued when the batch below opens a savepoint
		b := &pgx.Batch{}
		b.Queue("SAVEPOINT s3")
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		write("dropped", 1)
		exec("ROLLBACK TO SAVEPOINT s3")
		write("a", 4)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wantOutbox(t, pool, "a/0 a/1 a/2 a/3 a/4")
}

func TestScopeStatement(t *testing.T) {
	for sql, want := range map[string]bool{
		"SAVEPOINT sp": true, " rollback to savepoint sp": true, "ROLLBACK": true, "release sp": true,
		"commit": true, "END": true, "abort;": true,
		"INSERT INTO orders VALUES (1)": false, "SELECT 1": false, "savepoints_table": false,
		"ending": false, "UPDATE x SET rollback = 1": false,
		"/* orm */ savepoint s": true, "-- note\nRELEASE s": true, "-- only a comment": false,
	} {
		if got := scopeStatement(sql); got != want {
			t.Errorf("scopeStatement(%q) = %v, want %v", sql, got, want)
		}
	}
}

// TestPipelineTxFailedFlushCannotCommit: when queued rows may not have
// reached the database (here a savepoint opened on a cancelled context),
// the transaction refuses to commit rather than keep the business change
// without its events, and later writes are refused too.
func TestPipelineTxFailedFlushCannotCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := pipelineFixture(t)
	d := descriptorFor("lost")
	tx := beginTx(t, pool, pgx.TxOptions{})
	if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ('o-1')`); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, tx, newEvent(d, "a", 0)); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := tx.Begin(cancelled); err == nil {
		t.Fatal("savepoint on a cancelled context succeeded")
	}
	if _, err := w.Write(ctx, tx, newEvent(d, "a", 1)); err == nil {
		t.Fatal("Write after a failed flush succeeded")
	}
	if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("Commit after a failed flush: %v, want ErrTxCommitRollback", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox`) + count(t, pool, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("%d rows committed after events were lost", n)
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Fatalf("%d connections still acquired", n)
	}
}

// wrappedTx is a pgx.Tx decorator (tracing, logging) around a PipelineTx.
type wrappedTx struct{ pgx.Tx }

// TestPipelineTxWrappedWritesKeepOrder: a Writer handed a wrapper of the
// transaction inserts at once; the rows queued before are sent ahead of
// that INSERT, so ids keep the order of the writes.
func TestPipelineTxWrappedWritesKeepOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := pipelineFixture(t)
	d := descriptorFor("wrapped")
	err := BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := w.Write(ctx, tx, newEvent(d, "a", 0)); err != nil {
			return err
		}
		if _, err := w.Write(ctx, wrappedTx{tx}, newEvent(d, "a", 1)); err != nil {
			return err
		}
		if _, err := w.WriteBatch(ctx, tx, []events.Event{newEvent(d, "a", 2)}); err != nil {
			return err
		}
		_, err := w.WriteBatch(ctx, wrappedTx{tx}, []events.Event{newEvent(d, "a", 3), newEvent(d, "a", 4)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	wantOutbox(t, pool, "a/0 a/1 a/2 a/3 a/4")
}

// TestPipelineTxCommentedAndMultiStatementSavepoints: savepoint statements
// behind a comment are recognised, and several statements in one Exec
// still run.
func TestPipelineTxCommentedAndMultiStatementSavepoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := pipelineFixture(t)
	d := descriptorFor("commented")
	err := BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, step := range []struct {
			key string
			seq int
			sql string
		}{
			{"a", 0, "/* orm */ SAVEPOINT s1"},
			{"dropped", 0, "-- undo\nROLLBACK TO SAVEPOINT s1"},
			{"a", 1, "SAVEPOINT s2; SELECT 1"},
			{"dropped", 1, "ROLLBACK TO SAVEPOINT s2"},
		} {
			if _, err := w.Write(ctx, tx, newEvent(d, step.key, step.seq)); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, step.sql); err != nil {
				return fmt.Errorf("%s: %w", step.sql, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wantOutbox(t, pool, "a/0 a/1")
}
