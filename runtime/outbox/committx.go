package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// CommitTx is a pgx transaction that holds the outbox rows written in it
// and sends them with the next statement's round trip — or, when the event
// is the transaction's last write, together with its COMMIT, in one
// network flight. Any other pgx.Tx works with a Writer too (every row is
// then inserted at once); a CommitTx only saves that round trip.
//
// The one rule: held rows are sent before anything else goes through the
// CommitTx. Every method that sends a statement — Exec, Query, QueryRow,
// SendBatch, CopyFrom, Prepare, Begin (a savepoint), and Commit and
// Rollback of a savepoint — first sends the rows held so far, so every
// statement sees the database exactly as if the rows had been inserted by
// the Write itself: savepoints (through Begin or as SQL text), CTEs, DO
// blocks and prepared statements all behave as on a plain pgx.Tx. The
// rows written last travel with the COMMIT. The two exceptions are the
// handles that reach the connection without the CommitTx — Conn and
// LargeObjects: call Flush before using them if what they send must see
// the rows.
//
// If held rows cannot be sent (the database refuses them, the context
// ends), the statement that would have sent them reports the error and
// does not run, and the transaction refuses to commit: Commit rolls it
// back and returns the error. Rolling back a savepoint opened before the
// failure clears it, as rolling back to it discards the failed rows.
//
// A CommitTx is not safe for concurrent use, like a pgx.Tx. Begin it on a
// pool with Begin or BeginFunc, or on a connection with BeginConn.
type CommitTx struct {
	tx    pgx.Tx // pgx's transaction, or a savepoint of it
	root  *commitRoot
	depth int  // 0 for the transaction, n for its n-th nested savepoint
	done  bool // a savepoint released or rolled back
}

// commitRoot is what a transaction and its savepoints share.
type commitRoot struct {
	conn    *pgx.Conn
	release func() // returns a pool connection; nil for BeginConn
	held    []heldRow
	// failed is why held rows could not be sent, with the savepoint depth
	// at that moment: the transaction must not commit without them.
	failed      error
	failedDepth int
	closed      bool
	// written are the outbox tables that got rows: their relays in this
	// process are woken once the COMMIT made the rows visible.
	written []tableName
}

// heldRow is one encoded event waiting to be sent, with its Writer.
type heldRow struct {
	w *Writer
	r row
}

// Begin acquires a connection from pool and begins a CommitTx on it with
// the given options (as pgx's BeginTx); Commit or Rollback returns the
// connection to the pool. opts.CommitQuery must be empty: the CommitTx
// sends its own COMMIT, with the rows.
func Begin(ctx context.Context, pool *pgxpool.Pool, opts pgx.TxOptions) (*CommitTx, error) {
	if pool == nil {
		return nil, errors.New("outbox: begin: nil pool")
	}
	if err := checkTxOptions(opts); err != nil {
		return nil, err
	}
	c, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("outbox: begin: acquire a connection: %w", err)
	}
	t, err := BeginConn(ctx, c.Conn(), opts)
	if err != nil {
		c.Release()
		return nil, err
	}
	t.root.release = c.Release
	return t, nil
}

// BeginConn begins a CommitTx on conn with the given options (as pgx's
// BeginTx). The connection stays the caller's: it is not closed or
// released at the end.
func BeginConn(ctx context.Context, conn *pgx.Conn, opts pgx.TxOptions) (*CommitTx, error) {
	if conn == nil {
		return nil, errors.New("outbox: begin: nil connection")
	}
	if err := checkTxOptions(opts); err != nil {
		return nil, err
	}
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("outbox: begin: %w", err)
	}
	return &CommitTx{tx: tx, root: &commitRoot{conn: conn}}, nil
}

func checkTxOptions(opts pgx.TxOptions) error {
	if opts.CommitQuery != "" {
		return errors.New("outbox: begin: pgx.TxOptions.CommitQuery is not supported: a CommitTx sends its own COMMIT, with the outbox rows")
	}
	return nil
}

// BeginFunc runs fn in a CommitTx on a connection from pool: it commits if
// fn returns nil and rolls back otherwise, like pgx.BeginFunc, which it
// replaces where the transaction writes events.
func BeginFunc(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	t, err := Begin(ctx, pool, pgx.TxOptions{})
	if err != nil {
		return err
	}
	defer func() { _ = t.Rollback(ctx) }() // after Commit: ErrTxClosed, ignored
	if err := fn(t); err != nil {
		return err
	}
	return t.Commit(ctx)
}

// Held is the number of outbox rows written and not sent yet.
func (t *CommitTx) Held() int { return len(t.root.held) }

// hold keeps rows written by w until the next statement or the COMMIT. A
// fixed event ID (only ever on a lone row) is sent at once, so that a
// duplicate is refused by the write itself.
func (t *CommitTx) hold(ctx context.Context, w *Writer, rows []row) error {
	if t.root.closed || t.done {
		return pgx.ErrTxClosed
	}
	if t.root.failed != nil {
		return t.root.failed
	}
	for _, r := range rows {
		t.root.held = append(t.root.held, heldRow{w: w, r: r})
	}
	if rows[0].fixed {
		return t.Flush(ctx)
	}
	return nil
}

// Flush sends the held outbox rows now. The methods that send statements
// call it first; call it yourself before sending statements through Conn
// or LargeObjects that must see the rows.
func (t *CommitTx) Flush(ctx context.Context) error {
	r := t.root
	if r.closed {
		return pgx.ErrTxClosed
	}
	if r.failed != nil {
		return r.failed
	}
	if len(r.held) == 0 {
		return nil
	}
	runs := t.runs(ctx)
	br := t.tx.SendBatch(ctx, runs.batch(""))
	err := runs.read(br)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	r.held = r.held[:0]
	if err != nil {
		r.failed, r.failedDepth = fmt.Errorf("outbox: send the held outbox rows: %w", err), t.depth
		return r.failed
	}
	runs.wake() // the rows land when the caller commits
	return nil
}

// insertRun is one INSERT of held rows: consecutive rows of one Writer and
// one kind (fixed IDs or not).
type insertRun struct {
	w    *Writer
	n    int
	sql  string
	args []any
}

// insertRuns are the INSERTs of all the held rows, in the order written.
type insertRuns []insertRun

// batch queues the runs, then last unless it is empty.
func (rs insertRuns) batch(last string) *pgx.Batch {
	b := &pgx.Batch{}
	for _, s := range rs {
		b.Queue(s.sql, s.args...)
	}
	if last != "" {
		b.Queue(last)
	}
	return b
}

// read reads the results of the runs, sent first in br, explaining an
// insert's failure as the Writer does.
func (rs insertRuns) read(br pgx.BatchResults) error {
	for _, s := range rs {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("%s %d events into %s: %w", s.w.verb(), s.n, s.w.target(), s.w.failed(err))
		}
	}
	return nil
}

// wake tells the relays of this process about rows sent before the
// COMMIT: they poll quickly until the caller commits.
func (rs insertRuns) wake() {
	for _, s := range rs {
		s.w.wake()
	}
}

// runs groups the held rows into INSERTs, in the order they were written
// (which is their publish order), and notes their tables for the wake-up.
func (t *CommitTx) runs(ctx context.Context) insertRuns {
	var out insertRuns
	held := t.root.held
	for i := 0; i < len(held); {
		j := i + 1
		for j < len(held) && held[j].w == held[i].w && !held[i].r.fixed && !held[j].r.fixed {
			j++
		}
		w := held[i].w
		rows := make([]row, 0, j-i)
		for _, h := range held[i:j] {
			rows = append(rows, h.r)
		}
		sql, args := w.statement(ctx, t.tx, rows)
		out = append(out, insertRun{w: w, n: len(rows), sql: sql, args: args})
		if !w.walSource() {
			t.root.noteWritten(w.table)
		}
		i = j
	}
	return out
}

func (r *commitRoot) noteWritten(t tableName) {
	for _, w := range r.written {
		if w == t {
			return
		}
	}
	r.written = append(r.written, t)
}

// Commit commits the transaction, sending the held rows in the same
// flight as the COMMIT; on a savepoint it sends them and releases the
// savepoint. A transaction whose held rows could not be sent is rolled
// back and the error returned. Relays of the written tables in this
// process are woken once the rows are committed.
func (t *CommitTx) Commit(ctx context.Context) error {
	if t.depth > 0 {
		if err := t.Flush(ctx); err != nil {
			return err
		}
		if err := t.tx.Commit(ctx); err != nil {
			return err
		}
		t.done = true
		return nil
	}
	r := t.root
	if r.closed {
		return pgx.ErrTxClosed
	}
	if r.failed != nil {
		err := r.failed
		_ = t.Rollback(ctx)
		return fmt.Errorf("%w (the transaction was rolled back)", err)
	}
	var err error
	if len(r.held) == 0 {
		err = t.tx.Commit(ctx)
	} else {
		err = t.commitWithRows(ctx)
	}
	if err != nil {
		t.end(ctx)
		return err
	}
	t.end(ctx)
	for _, tbl := range r.written {
		wakeTable(tbl, true)
	}
	return nil
}

// commitWithRows sends the held rows and the COMMIT in one batch. pgx's
// transaction object then is done with, never used again: the COMMIT went
// through the connection, as a batch may carry transaction control.
func (t *CommitTx) commitWithRows(ctx context.Context) error {
	runs := t.runs(ctx)
	t.root.held = t.root.held[:0]
	br := t.root.conn.SendBatch(ctx, runs.batch(sqlCommit))
	err := runs.read(br)
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil && tag.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	if err == nil {
		return nil
	}
	if pc := t.root.conn.PgConn(); !pc.IsClosed() && pc.TxStatus() != 'I' {
		// The batch stopped at the failure: the COMMIT did not run.
		_ = t.tx.Rollback(ctx)
	}
	return fmt.Errorf("outbox: commit: %w", err)
}

// end closes the transaction and returns a pool connection.
func (t *CommitTx) end(ctx context.Context) {
	r := t.root
	r.closed = true
	r.held = nil
	if r.conn.PgConn().TxStatus() != 'I' && !r.conn.PgConn().IsClosed() {
		// Commit or Rollback failed midway; pgx closes such a connection
		// too, rather than hand back one in an unknown state.
		_ = r.conn.Close(ctx)
	}
	if r.release != nil {
		r.release()
		r.release = nil
	}
}

// Rollback rolls the transaction back, dropping the held rows; on a
// savepoint it rolls back to it, dropping the rows held since it was
// opened (all of them: opening it sent the earlier ones).
func (t *CommitTx) Rollback(ctx context.Context) error {
	r := t.root
	if t.depth > 0 {
		if r.closed {
			return pgx.ErrTxClosed
		}
		if err := t.tx.Rollback(ctx); err != nil {
			return err
		}
		t.done = true
		r.held = r.held[:0]
		if r.failed != nil && r.failedDepth >= t.depth {
			r.failed = nil
		}
		return nil
	}
	if r.closed {
		return pgx.ErrTxClosed
	}
	err := t.tx.Rollback(ctx)
	t.end(ctx)
	return err
}

// Begin opens a savepoint (a pseudo nested transaction, as pgx's Begin),
// after sending the held rows; writes on it are held like the
// transaction's own.
func (t *CommitTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.Flush(ctx); err != nil {
		return nil, err
	}
	sp, err := t.tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &CommitTx{tx: sp, root: t.root, depth: t.depth + 1}, nil
}

// Exec sends the held rows, then runs sql as pgx.Tx's Exec does.
func (t *CommitTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.Flush(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.tx.Exec(ctx, sql, args...)
}

// Query sends the held rows, then runs sql as pgx.Tx's Query does.
func (t *CommitTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.Flush(ctx); err != nil {
		return errRows{err: err}, err
	}
	return t.tx.Query(ctx, sql, args...)
}

// QueryRow sends the held rows, then runs sql as pgx.Tx's QueryRow does.
func (t *CommitTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.Flush(ctx); err != nil {
		return errRows{err: err}
	}
	return t.tx.QueryRow(ctx, sql, args...)
}

// SendBatch sends the held rows, then b, as pgx.Tx's SendBatch does.
func (t *CommitTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.Flush(ctx); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return t.tx.SendBatch(ctx, b)
}

// CopyFrom sends the held rows, then copies as pgx.Tx's CopyFrom does.
func (t *CommitTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.Flush(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, columns, src)
}

// Prepare sends the held rows, then prepares as pgx.Tx's Prepare does.
func (t *CommitTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.Flush(ctx); err != nil {
		return nil, err
	}
	return t.tx.Prepare(ctx, name, sql)
}

// LargeObjects returns pgx's large-object handle of the transaction. It
// reaches the connection without the CommitTx: call Flush first if its
// statements must see the held rows.
func (t *CommitTx) LargeObjects() pgx.LargeObjects { return t.tx.LargeObjects() }

// Conn returns the transaction's connection. Statements sent on it do not
// go through the CommitTx: call Flush first if they must see the held
// rows.
func (t *CommitTx) Conn() *pgx.Conn { return t.root.conn }

// errRows are the rows of a statement that was not sent because the held
// rows before it failed: empty, reporting err.
type errRows struct{ err error }

func (e errRows) Close()                                       {}
func (e errRows) Err() error                                   { return e.err }
func (e errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (e errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (e errRows) Next() bool                                   { return false }
func (e errRows) Scan(...any) error                            { return e.err }
func (e errRows) Values() ([]any, error)                       { return nil, e.err }
func (e errRows) RawValues() [][]byte                          { return nil }
func (e errRows) Conn() *pgx.Conn                              { return nil }
func (e errRows) TypeMap() *pgtype.Map                         { return nil }
