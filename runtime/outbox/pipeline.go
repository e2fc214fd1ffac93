package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PipelineTx is a pgx transaction that sends its outbox rows together with
// its COMMIT, in one pipeline: an event costs the business transaction no
// round trip of its own. Write and WriteBatch (and so the generated
// producers) recognise it and queue the encoded rows instead of inserting
// them at once; Commit sends the queued INSERTs and the COMMIT in one
// network flight, so a row is written and committed atomically with the
// business change exactly as with any other transaction.
//
// Its BEGIN likewise travels with the first statement (pgx.Batch.BeginTx),
// where pgx.BeginTx spends a round trip on it: a transaction with one
// business statement and its events is two round trips, one fewer than
// the same transaction without events on pgx. Begin sends nothing.
//
// Everything else is a plain pgx.Tx: run the business statements on it,
// hand it to code that takes a pgx.Tx, open savepoints with Begin. What
// differs, all documented on the methods:
//
//   - the first statement goes to the database as a batch (a pgx tracer
//     sees a batch), unless pgx would send it otherwise than a batch does:
//     a statement without arguments, with pgx options other than a
//     QueryRewriter (pgx.NamedArgs), holding several statements, or naming
//     a prepared statement; those, CopyFrom, Conn and LargeObjects (the
//     last two under the context given to Begin, without its
//     cancellation), and a BeginQuery of several statements, send the
//     BEGIN alone first, as pgx does (a CommitQuery of several statements
//     likewise goes alone, after the queued rows);
//   - a BEGIN the database refuses (a malformed BeginQuery) is reported by
//     the first statement, which then has not run, and by every later one;
//     a first statement that fails before the BEGIN took effect (it cannot
//     be prepared, its named arguments are refused, its context is done)
//     is sent again the ordinary way and fails as on a pgx transaction;
//     one whose batch pgx abandons midway (an argument it cannot encode, a
//     lost connection) loses the connection, as any pgx batch does, and
//     the transaction with it; a transaction that ran nothing sends
//     nothing at Commit or Rollback;
//   - the outbox rows are inserted at Commit, so a query on the outbox
//     table inside the transaction does not see them, and their ids (the
//     publish order) are taken at Commit, in the order they were written;
//   - a write with a fixed event ID (events.WithEventID) is inserted at
//     once, with the rows queued before it, so a duplicate ID is refused
//     by Write, as on any transaction;
//   - rolling back a savepoint drops the rows queued since it was opened;
//     savepoints opened with Begin cost nothing extra, and savepoint
//     statements sent as SQL text (as some libraries do), like any text of
//     several statements, first send the queued rows (a ROLLBACK [TO]
//     drops them, as it would once they were sent), so either way the rows
//     share the fate of the statements around them;
//   - what the database refuses about a row (a missing table, say), or a
//     transaction that already failed, is reported by Commit, not by
//     Write; if queued rows may not have reached the database (a savepoint
//     opened on a cancelled context, say), the transaction refuses to
//     commit and Commit rolls it back;
//   - a Writer handed a wrapper of the transaction (a tracing decorator)
//     inserts at once; the queued rows are sent ahead of that INSERT, so
//     ids keep the order of the writes.
//
// A PipelineTx is not safe for concurrent use, like a pgx.Tx. Begin it
// with Begin (a pool) or BeginConn (a connection), or run a function in
// one with BeginFunc.
type PipelineTx struct {
	conn    *pgx.Conn
	opts    pgx.TxOptions
	release func() // returns a pool connection; nil for BeginConn
	commit  string // the COMMIT statement (pgx.TxOptions.CommitQuery)
	// tx is pgx's transaction once the BEGIN has been sent (with the first
	// statement, by pgx.Batch.BeginTx, or alone); nil before that.
	tx pgx.Tx
	// beginCtx is the context given to Begin: the BEGIN goes out under it
	// when a method without a context (Conn, LargeObjects) needs the
	// transaction open at once.
	beginCtx context.Context
	// carryBegin, carryCommit: the BEGIN, the COMMIT may go in a batch
	// (each is one statement; pgx sends several as a simple query).
	carryBegin, carryCommit bool
	// handedLargeObjects: LargeObjects gave out a handle bound to tx.
	handedLargeObjects bool
	queue              []queuedRow
	nextSP             int64
	closed             bool
	// broken is why the BEGIN failed: the transaction never opened, and
	// every later use reports it.
	broken error
	// lost is set when queued rows may not have reached the database (a
	// flush or a savepoint rollback that failed, say on a cancelled
	// context): the transaction must not commit without them.
	lost error
	// sent are the outbox tables rows were sent to: their relays in this
	// process are woken once the COMMIT has made the rows visible.
	sent []tableName
}

// queuedRow is one encoded event waiting for Commit, with its table.
type queuedRow struct {
	w *Writer
	r row
}

// rowQueue is what Write looks for in a transaction: a PipelineTx or one of
// its savepoints. Only this package implements it.
type rowQueue interface {
	pipeline() (*PipelineTx, error)
}

// Begin acquires a connection from pool and begins a PipelineTx on it with
// the given options (as pgx's BeginTx); Commit or Rollback returns the
// connection to the pool. The BEGIN goes out with the first statement.
func Begin(ctx context.Context, pool *pgxpool.Pool, opts pgx.TxOptions) (*PipelineTx, error) {
	if pool == nil {
		return nil, errors.New("outbox: begin: nil pool")
	}
	c, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("outbox: begin: acquire a connection: %w", err)
	}
	t, err := begin(ctx, c.Conn(), opts)
	if err != nil {
		c.Release()
		return nil, err
	}
	t.release = c.Release
	return t, nil
}

// BeginConn begins a PipelineTx on conn with the given options (as pgx's
// BeginTx). The connection is the caller's: it is not closed at the end,
// unless it cannot be used as it stands — rows or a batch left open, a
// batch pgx abandoned midway, a failed BEGIN sent by Conn or LargeObjects
// (see Conn) — as pgx closes it in those cases too. A connection already in
// a transaction is refused: the pipeline's COMMIT would end that
// transaction too.
func BeginConn(ctx context.Context, conn *pgx.Conn, opts pgx.TxOptions) (*PipelineTx, error) {
	if conn == nil {
		return nil, errors.New("outbox: begin: nil connection")
	}
	return begin(ctx, conn, opts)
}

// begin prepares a PipelineTx on conn; nothing is sent yet: the BEGIN goes
// out with the transaction's first statement.
func begin(ctx context.Context, conn *pgx.Conn, opts pgx.TxOptions) (*PipelineTx, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("outbox: begin: %w", err)
	}
	if conn.PgConn().IsClosed() {
		return nil, errors.New("outbox: begin: the connection is closed")
	}
	if conn.PgConn().TxStatus() != 'I' {
		// pgx would send BEGIN and have Postgres warn; a transaction
		// already open here would take the pipeline's COMMIT for its own.
		return nil, errors.New("outbox: begin: the connection is already in a transaction")
	}
	commit := opts.CommitQuery
	if commit == "" {
		commit = sqlCommit
	}
	return &PipelineTx{conn: conn, opts: opts, commit: commit, beginCtx: ctx,
		carryBegin: !severalStatements(opts.BeginQuery), carryCommit: !severalStatements(commit)}, nil
}

// BeginFunc runs fn in a PipelineTx on a connection from pool: it commits
// if fn returns nil and rolls back otherwise, like pgx.BeginFunc, which it
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

func (t *PipelineTx) pipeline() (*PipelineTx, error) {
	if err := t.usable(); err != nil {
		return nil, err
	}
	if t.lost != nil {
		return nil, t.lost
	}
	return t, nil
}

// usable refuses a transaction that ended or never opened.
func (t *PipelineTx) usable() error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	return t.broken
}

// open sends the BEGIN on its own, unless it went out already: for the
// statements that cannot carry it (CopyFrom, a statement with pgx options
// a batch does not take) and for the methods that hand the connection out.
func (t *PipelineTx) open(ctx context.Context) error {
	if t.broken != nil {
		return t.broken
	}
	if t.tx != nil {
		return nil
	}
	if err := ctx.Err(); err != nil {
		// pgx would close the connection; nothing was sent, so the
		// transaction can still begin with a live context.
		return err
	}
	tx, err := t.conn.BeginTx(ctx, t.opts)
	if err != nil {
		return t.beginFailed(err)
	}
	t.tx = tx
	return nil
}

// beginFailed records that the BEGIN failed: the transaction never opened,
// so the statements meant for it must not run outside it.
func (t *PipelineTx) beginFailed(err error) error {
	t.broken = fmt.Errorf("outbox: begin: %w", err)
	return t.broken
}

// errBeginAlone reports that a batch carrying the BEGIN failed before the
// BEGIN took effect, with the connection still usable: the BEGIN is then
// sent alone and the statement the ordinary way, so that the failure (an
// argument a QueryRewriter refuses, a statement Postgres cannot prepare, a
// refused BEGIN, a context already done) is reported as pgx reports it.
var errBeginAlone = errors.New("outbox: send the BEGIN alone")

// send sends b in the transaction. While the BEGIN has not gone out, it
// goes first in the same batch (unless a BeginQuery of several statements
// must go alone, before b). Reading b's results and closing them is the
// caller's.
func (t *PipelineTx) send(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	if t.tx == nil && t.carryBegin {
		opening := &pgx.Batch{}
		opening.BeginTx(t.opts)
		for _, q := range b.QueuedQueries {
			// Copies: pgx rewrites a sent query in place (named
			// arguments, its prepared description), and b must stay as
			// given should it have to go again after the BEGIN.
			c := *q
			opening.QueuedQueries = append(opening.QueuedQueries, &c)
		}
		br, err := t.sendOpening(ctx, opening)
		if !errors.Is(err, errBeginAlone) {
			return br, err
		}
	}
	if err := t.open(ctx); err != nil {
		return nil, err
	}
	return t.conn.SendBatch(ctx, b), nil
}

// sendOpening sends b, whose first query is the BEGIN queued by
// pgx.Batch.BeginTx, and reads the BEGIN's result: the transaction is open
// and the caller reads the rest of b from br, then closes it.
func (t *PipelineTx) sendOpening(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	br := t.conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		// Close would call the caller's callbacks with the error; the
		// queries either go again (and call them then) or fail as a whole.
		for _, q := range b.QueuedQueries {
			q.Fn = nil
		}
		_ = br.Close()
		if pc := t.conn.PgConn(); !pc.IsClosed() && !pc.IsBusy() && pc.TxStatus() == 'I' {
			// The BEGIN did not take effect (the batch stops at the
			// first error), so nothing after it ran either.
			return nil, errBeginAlone
		}
		// pgx closes the connection when a batch fails midway (an
		// argument it cannot encode, a network failure).
		t.broken = fmt.Errorf("outbox: the transaction's first statement failed and left its connection unusable: %w", err)
		return nil, t.broken
	}
	t.tx = br.Tx()
	return br, nil
}

// canCarryBegin reports whether a statement is sent in one batch after the
// BEGIN. Where pgx would send it otherwise than a batch does, it is not: a
// statement without arguments (pgx sends it as a simple query, which a
// batch would prepare), with pgx options a batch does not take (all but a
// QueryRewriter such as pgx.NamedArgs), holding several statements, or a
// single word (the name of a prepared statement, which a batch on the
// simple protocol does not look up).
func canCarryBegin(sql string, args []any) bool {
	if len(args) == 0 {
		return false
	}
	for _, a := range args {
		switch a.(type) {
		case pgx.QueryRewriter:
			continue
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			return false
		}
		break
	}
	return !severalStatements(sql) && strings.ContainsAny(strings.TrimSpace(sql), " \t\r\n")
}

// enqueue adds rows written by w; they are inserted at the next flush.
func (t *PipelineTx) enqueue(w *Writer, rows ...row) {
	for _, r := range rows {
		t.queue = append(t.queue, queuedRow{w: w, r: r})
	}
}

// Queued is the number of outbox rows waiting for Commit.
func (t *PipelineTx) Queued() int { return len(t.queue) }

// runs splits the queue into the runs flush inserts with one statement
// each: the rows bound for one table, in the order they were written (a
// row with a fixed ID on its own).
func (t *PipelineTx) runs() [][]queuedRow {
	var out [][]queuedRow
	for i := 0; i < len(t.queue); {
		j := i + 1
		for j < len(t.queue) && !t.queue[i].r.fixed && !t.queue[j].r.fixed && t.queue[j].w.table == t.queue[i].w.table {
			j++
		}
		out = append(out, t.queue[i:j])
		i = j
	}
	return out
}

// flush sends the queued rows and then stmt (with args) in one pipeline
// and empties the queue. After an error the rows may be lost, whether or
// not the database saw the batch, so the transaction is marked unable to
// commit.
func (t *PipelineTx) flush(ctx context.Context, stmt string, args ...any) (tag pgconn.CommandTag, err error) {
	queued := len(t.queue) > 0
	defer func() {
		if err != nil && queued && t.lost == nil {
			t.lost = fmt.Errorf("outbox: queued events were not written, so the transaction cannot commit: %w", err)
		}
	}()
	if t.broken != nil {
		return pgconn.CommandTag{}, t.broken
	}
	runs := t.runs()
	ins := make([]*inserts, len(runs))
	for i, run := range runs {
		ins[i] = t.learn(ctx, run[0].w)
	}
	b := &pgx.Batch{}
	for i, run := range runs {
		rows := make([]row, len(run))
		for i, q := range run {
			rows[i] = q.r
		}
		q, args := ins[i].run(rows)
		b.Queue(q, args...)
	}
	b.Queue(stmt, args...)
	t.queue = nil
	br, err := t.send(ctx, b)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	for _, run := range runs {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return pgconn.CommandTag{}, fmt.Errorf("outbox: insert %d queued events into %s: %w", len(run), run[0].w.table, run[0].w.insertFailed(err))
		}
	}
	tag, err = br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		for _, run := range runs {
			if !slices.Contains(t.sent, run[0].w.table) {
				t.sent = append(t.sent, run[0].w.table)
			}
			if stmt != t.commit {
				// Sent ahead of another statement, the rows land when the
				// transaction commits: the relays of this process poll
				// quickly meanwhile, as after a plain Write, and are woken
				// again after the COMMIT (committed).
				wakeTable(run[0].w.table, false)
			}
		}
	}
	return tag, err
}

// committed wakes the relays of this process on every table the
// transaction sent rows to, now that its COMMIT has made them visible: one
// poll finds them.
func (t *PipelineTx) committed() {
	for _, tn := range t.sent {
		wakeTable(tn, true)
	}
	t.sent = nil
}

// learn returns w's statements, reading its table's shape the first time
// (one round trip in the Writer's life) through the transaction itself, so
// that the BEGIN goes first and the table is found as the transaction's
// search_path finds it. The queue is set aside meanwhile: it is what is
// being sent.
func (t *PipelineTx) learn(ctx context.Context, w *Writer) *inserts {
	if ins := w.ins.Load(); ins != nil {
		return ins
	}
	queue := t.queue
	t.queue = nil
	defer func() { t.queue = queue }()
	return w.learn(ctx, insideTx{t})
}

// insideTx runs a PipelineTx's own query — while it sends its rows, even
// during Commit — carrying the BEGIN if it has not gone out yet.
type insideTx struct{ t *PipelineTx }

func (q insideTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	br, err := q.t.carry(ctx, sql, args)
	return q.t.row(ctx, br, err, sql, args)
}

// Commit sends the queued outbox rows and the COMMIT in one pipeline and
// returns the connection to its pool. As with pgx, a transaction that had
// already failed is rolled back and reported with pgx.ErrTxCommitRollback,
// and a closed one with pgx.ErrTxClosed.
func (t *PipelineTx) Commit(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	t.closed = true
	defer t.end(ctx)
	err := t.commitRows(ctx)
	if err == nil {
		t.committed()
	}
	return err
}

// commitRows sends the queued rows and the COMMIT (see Commit).
func (t *PipelineTx) commitRows(ctx context.Context) error {
	if cause := cmp.Or(t.lost, t.broken); cause != nil {
		// end rolls back: committing would keep the business change
		// without its events, or the transaction never opened.
		t.queue = nil
		return fmt.Errorf("%w: %w", pgx.ErrTxCommitRollback, cause)
	}
	if t.tx == nil && len(t.queue) == 0 {
		// Nothing was sent, so there is nothing to commit.
		return nil
	}
	if len(t.queue) == 0 || t.conn.PgConn().TxStatus() == 'E' {
		// Nothing to send along, or nothing can be inserted any more:
		// pgx's own Commit reports a failed transaction as it should.
		t.queue = nil
		return t.commitAlone(ctx)
	}
	if !t.carryCommit {
		// A CommitQuery of several statements goes alone, as pgx sends
		// it; the rows go just before it.
		if err := t.sendQueue(ctx); err != nil {
			return fmt.Errorf("outbox: commit: %w", err)
		}
		return t.commitAlone(ctx)
	}
	tag, err := t.flush(ctx, t.commit)
	if err != nil {
		return fmt.Errorf("outbox: commit: %w", err)
	}
	return commitOutcome(tag)
}

// closeLargeObjects marks pgx's transaction (which the large-object handles
// are bound to) closed, so that a handle used after the end reports
// pgx.ErrTxClosed instead of running on the connection, which by then is
// outside the transaction or back in the pool. Nothing is sent: pgconn
// refuses a context already done before writing, and pgx's Commit marks
// its transaction closed whatever the outcome (it closes the connection
// only if it is still in a transaction; end has left it outside one or
// closed it).
func (t *PipelineTx) closeLargeObjects() {
	if pc := t.conn.PgConn(); !pc.IsClosed() && pc.TxStatus() != 'I' {
		return
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_ = t.tx.Commit(done)
}

// commitAlone sends the COMMIT on its own, as pgx's Commit does (which
// would report a connection lost in the first batch as ErrTxClosed).
func (t *PipelineTx) commitAlone(ctx context.Context) error {
	tag, err := t.conn.Exec(ctx, t.commit)
	if err != nil {
		return err
	}
	return commitOutcome(tag)
}

// commitOutcome reads a COMMIT's command tag as pgx does: Postgres answers
// ROLLBACK to the COMMIT of a transaction that had failed.
func commitOutcome(tag pgconn.CommandTag) error {
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// end leaves the connection outside any transaction (rolling back, or
// closing it if that fails) and returns it to its pool.
func (t *PipelineTx) end(ctx context.Context) {
	switch pc := t.conn.PgConn(); {
	case pc.IsClosed():
	case pc.IsBusy():
		// Rows or a batch left open: its transaction status is not known
		// yet, and the connection must not be used as it stands.
		_ = t.conn.Close(ctx)
	case pc.TxStatus() != 'I':
		if _, err := t.conn.Exec(ctx, sqlRollback); err != nil {
			_ = t.conn.Close(ctx)
		}
	}
	if t.handedLargeObjects {
		t.closeLargeObjects()
	}
	if t.release != nil {
		t.release()
		t.release = nil
	}
}

// Rollback drops the queued rows, rolls the transaction back and returns
// the connection to its pool. After Commit it returns pgx.ErrTxClosed, so
// `defer tx.Rollback(ctx)` is safe.
func (t *PipelineTx) Rollback(ctx context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	t.closed = true
	t.queue = nil
	defer t.end(ctx)
	if t.tx == nil {
		// The BEGIN never went out (or failed): nothing to roll back.
		return nil
	}
	if _, err := t.conn.Exec(ctx, sqlRollback); err != nil {
		return fmt.Errorf("outbox: rollback: %w", err) // end closes the connection
	}
	return nil
}

// Begin opens a savepoint (a pseudo-nested transaction, as pgx's). The rows
// queued so far are sent with the SAVEPOINT statement, so that rolling the
// savepoint back drops exactly the rows written after it.
func (t *PipelineTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.usable(); err != nil {
		return nil, err
	}
	t.nextSP++
	name := "sp_" + strconv.FormatInt(t.nextSP, 10)
	if _, err := t.flush(ctx, sqlSavepoint+name); err != nil {
		return nil, fmt.Errorf("outbox: savepoint: %w", err)
	}
	return &pipelineSavepoint{root: t, name: name}, nil
}

// Exec runs sql in the transaction. A savepoint statement sent as SQL
// text (SAVEPOINT, RELEASE), any text of several statements, and an outbox
// INSERT that reached the transaction some other way (a Writer given a
// wrapper of it) first have the queued rows sent, so that savepoints decide
// their fate as they would an INSERT's and ids keep the order of the
// writes. A single ROLLBACK [TO] drops them instead, which is what it would
// do to them once sent, and works in a transaction a failed statement
// aborted; should it fail without running, the transaction refuses to
// commit.
//
// The transaction's first statement carries its BEGIN, in one batch
// (pgx.Batch.BeginTx), which saves the round trip pgx.BeginTx spends on it.
func (t *PipelineTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.usable(); err != nil {
		return pgconn.CommandTag{}, err
	}
	if len(t.queue) > 0 && discardsQueue(sql) {
		// Dropping the rows is what sending them and then rolling back
		// would do (rows sent now land after every existing savepoint),
		// without sending them into a transaction a failed statement
		// aborted, where they would fail and keep the rollback from
		// running at all.
		t.queue = nil
		tag, err := t.exec(ctx, sql, args)
		if err != nil {
			t.droppedFor(err)
		}
		return tag, err
	}
	if err := t.before(ctx, sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := t.exec(ctx, sql, args)
	if err == nil && tag.String() == "COMMIT" {
		t.committed() // a COMMIT sent as text
	}
	return tag, err
}

// droppedFor records that queued rows were dropped for a rollback that
// failed with err. If the rollback never ran (a cancelled context) and the
// transaction is still open, the statements made with the rows stand
// without them: the transaction must not commit. If the database refused it,
// the transaction is aborted and only a later rollback (which undoes those
// statements too) or the end can follow, so nothing is lost.
func (t *PipelineTx) droppedFor(err error) {
	if t.lost == nil && t.conn.PgConn().TxStatus() != 'E' {
		t.lost = fmt.Errorf("outbox: queued events were dropped for a rollback that failed, so the transaction cannot commit: %w", err)
	}
}

// exec runs sql on the connection, with the BEGIN if it has not gone out.
func (t *PipelineTx) exec(ctx context.Context, sql string, args []any) (pgconn.CommandTag, error) {
	br, err := t.carry(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	if br == nil {
		return t.conn.Exec(ctx, sql, args...)
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// carry readies the transaction for the statement sql: while the BEGIN has
// not gone out, it sends the BEGIN and the statement together (see
// canCarryBegin) and returns the batch to read the statement's result from,
// or sends the BEGIN alone; nil: run the statement on the connection.
func (t *PipelineTx) carry(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	if t.tx != nil {
		return nil, nil
	}
	if !canCarryBegin(sql, args) {
		return nil, t.open(ctx)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	return t.send(ctx, b)
}

// before sends the queued rows ahead of sql when sql must not overtake
// them (see Exec).
func (t *PipelineTx) before(ctx context.Context, sql string) error {
	if len(t.queue) == 0 || !(scopeStatement(sql) || outboxInsert(sql)) {
		return nil
	}
	if discardsQueue(sql) && t.conn.PgConn().TxStatus() == 'E' {
		// A rollback in an aborted transaction (by Query or a batch; Exec
		// drops the rows in any state): the rows could not be sent, and
		// the rollback undoes them (see Exec).
		t.queue = nil
		return nil
	}
	return t.sendQueue(ctx)
}

// sendQueue sends the queued rows now, in a flight of their own.
func (t *PipelineTx) sendQueue(ctx context.Context) error {
	_, err := t.flush(ctx, sqlNoop)
	return err
}

// scopeStatement reports whether sql, after any leading comments, opens or
// ends a savepoint or the transaction, after which queued rows would land
// in the wrong scope. A text of several statements counts as one, whatever
// they are: any of them might.
func scopeStatement(sql string) bool {
	return severalStatements(sql) ||
		startsWithKeyword(sql, "savepoint", "release", "rollback", "commit", "end", "abort", "prepare")
}

// discardsQueue reports whether sql is one statement that rolls back the
// transaction or to a savepoint (ROLLBACK [TO], ABORT), which undoes every
// queued row.
func discardsQueue(sql string) bool {
	if severalStatements(sql) {
		return false
	}
	return startsWithKeyword(sql, "rollback", "abort")
}

// startsWithKeyword reports whether sql, after any leading comments, starts
// with one of the keywords (lower case), in any case.
func startsWithKeyword(sql string, keywords ...string) bool {
	s := skipComments(sql)
	for _, kw := range keywords {
		if len(s) >= len(kw) && strings.EqualFold(s[:len(kw)], kw) && (len(s) == len(kw) || !isIdentByte(s[len(kw)])) {
			return true
		}
	}
	return false
}

// severalStatements reports whether sql may hold more than one statement:
// a semicolon before its end (perhaps inside a literal: then the rows are
// only sent early).
func severalStatements(sql string) bool {
	return strings.Contains(strings.TrimRight(sql, " \t\r\n;"), ";")
}

// outboxInsert reports whether sql is one of the Writer's INSERTs.
func outboxInsert(sql string) bool { return strings.Contains(sql, insertColumns) }

// skipComments drops leading white space, parentheses and SQL comments.
func skipComments(s string) string {
	for {
		s = strings.TrimLeft(s, " \t\r\n(")
		switch {
		case strings.HasPrefix(s, "--"):
			i := strings.IndexByte(s, '\n')
			if i < 0 {
				return ""
			}
			s = s[i+1:]
		case strings.HasPrefix(s, "/*"):
			i := strings.Index(s, "*/")
			if i < 0 {
				return ""
			}
			s = s[i+2:]
		default:
			return s
		}
	}
}

func isIdentByte(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// Query runs sql in the transaction (see Exec for the queued rows and the
// BEGIN).
func (t *PipelineTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	br, err := t.prepareQuery(ctx, sql, args)
	if err != nil {
		return closedRows{err: err}, err
	}
	if br == nil {
		return t.conn.Query(ctx, sql, args...)
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return closedRows{err: err}, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// QueryRow runs sql in the transaction (see Exec for the queued rows and
// the BEGIN).
func (t *PipelineTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	br, err := t.prepareQuery(ctx, sql, args)
	return t.row(ctx, br, err, sql, args)
}

// row is the row of sql: from br, the batch that carried the BEGIN, or
// from the connection when br is nil; err is how readying it failed.
func (t *PipelineTx) row(ctx context.Context, br pgx.BatchResults, err error, sql string, args []any) pgx.Row {
	switch {
	case err != nil:
		return closedRows{err: err}
	case br == nil:
		return t.conn.QueryRow(ctx, sql, args...)
	}
	return batchRow{row: br.QueryRow(), br: br}
}

// prepareQuery readies the transaction for a query: it sends the queued
// rows if sql must not overtake them and, while the BEGIN has not gone out,
// sends the BEGIN and the query together and returns the batch to read
// the query's rows from (nil: run the query on the connection).
func (t *PipelineTx) prepareQuery(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	if err := t.usable(); err != nil {
		return nil, err
	}
	if err := t.before(ctx, sql); err != nil {
		return nil, err
	}
	return t.carry(ctx, sql, args)
}

// batchRows are the rows of a query sent in a batch after the BEGIN: the
// batch, and with it the connection, is released when the rows are closed,
// by Close or by Next reaching their end, as with pgx's own rows.
type batchRows struct {
	pgx.Rows
	br  pgx.BatchResults
	err error // from closing the batch
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if err := r.br.Close(); err != nil && r.err == nil {
		r.err = err
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// batchRow is the row of a QueryRow sent in a batch after the BEGIN: Scan
// reads it and releases the batch.
type batchRow struct {
	row pgx.Row
	br  pgx.BatchResults
}

func (r batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

// SendBatch sends b in the transaction. The queued outbox rows stay
// queued, unless b holds a savepoint statement or an outbox INSERT (see
// Exec): then they are sent first, in a round trip of their own.
//
// While the BEGIN has not gone out, it is sent first in the same batch.
func (t *PipelineTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.usable(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	for _, q := range b.QueuedQueries {
		if err := t.before(ctx, q.SQL); err != nil {
			return pgx.FailedBatchResults(b, err)
		}
	}
	if pgx.FailedBatchResults(b, pgx.ErrTxClosed).Tx() != nil {
		return pgx.FailedBatchResults(b, errors.New("Batch.BeginTx cannot be used within a transaction"))
	}
	if len(b.QueuedQueries) == 0 {
		return t.conn.SendBatch(ctx, b) // sends nothing, as pgx's
	}
	br, err := t.send(ctx, b)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return txless{br}
}

// txless are the results of a caller's batch that went out with the BEGIN:
// like any batch sent in a transaction, they have no transaction of their
// own to hand out.
type txless struct{ pgx.BatchResults }

func (txless) Tx() pgx.Tx { return nil }

// CopyFrom copies rows into a table in the transaction.
func (t *PipelineTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.usable(); err != nil {
		return 0, err
	}
	if err := t.open(ctx); err != nil {
		return 0, err
	}
	return t.conn.CopyFrom(ctx, table, columns, src)
}

// Prepare prepares a statement on the transaction's connection.
func (t *PipelineTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.closed {
		return nil, pgx.ErrTxClosed
	}
	return t.conn.Prepare(ctx, name, sql)
}

// LargeObjects gives access to large objects in the transaction. It sends
// the BEGIN as Conn does, if it has not gone out; if that fails, the
// connection is closed, so that nothing runs outside the transaction, and
// the large objects' calls report the failure. As with pgx, the handle
// reports pgx.ErrTxClosed once the transaction has ended.
func (t *PipelineTx) LargeObjects() pgx.LargeObjects {
	t.openNow()
	if t.tx == nil || t.closed {
		return closedLargeObjects()
	}
	t.handedLargeObjects = true
	return t.tx.LargeObjects()
}

// Conn is the connection the transaction runs on. It sends the BEGIN, under
// the context given to Begin (without its cancellation), if it has not gone
// out, so that statements run on the connection are in the transaction; if
// that fails, the connection is closed, so that they fail instead of
// running outside it.
func (t *PipelineTx) Conn() *pgx.Conn {
	t.openNow()
	return t.conn
}

// closedLargeObjects are large objects on pgx's closed transaction: every
// call reports pgx.ErrTxClosed.
func closedLargeObjects() pgx.LargeObjects {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(b, pgx.ErrTxClosed).Tx().LargeObjects()
}

// openNowTimeout bounds the BEGIN that Conn and LargeObjects send, which
// have no context of their own to bound it.
const openNowTimeout = time.Minute

// openNow opens the transaction for a method without a context; see Conn.
func (t *PipelineTx) openNow() {
	if t.closed || t.tx != nil {
		return
	}
	// Begin's context, without its cancellation: it only affects the
	// BEGIN, as with pgx; bounded, so that a dead network cannot hold
	// the call forever.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.beginCtx), openNowTimeout)
	defer cancel()
	if err := t.open(ctx); err != nil {
		_ = t.conn.Close(ctx)
	}
}

// pipelineSavepoint is a savepoint of a PipelineTx: a pgx.Tx whose rows go
// to the same queue.
type pipelineSavepoint struct {
	root   *PipelineTx
	name   string
	closed bool
}

func (s *pipelineSavepoint) pipeline() (*PipelineTx, error) {
	if s.closed {
		return nil, pgx.ErrTxClosed
	}
	return s.root.pipeline()
}

// Begin opens a savepoint inside this one.
func (s *pipelineSavepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := s.open(); err != nil {
		return nil, err
	}
	return s.root.Begin(ctx)
}

// Commit releases the savepoint; its queued rows stay queued.
func (s *pipelineSavepoint) Commit(ctx context.Context) error {
	if err := s.open(); err != nil {
		return err
	}
	s.closed = true
	if _, err := s.root.conn.Exec(ctx, sqlReleaseSavepoint+s.name); err != nil {
		return fmt.Errorf("outbox: release savepoint: %w", err)
	}
	return nil
}

// Rollback rolls back to the savepoint and drops the rows queued since it
// was opened: the queue holds only those, since opening a savepoint sends
// the rows queued before it.
func (s *pipelineSavepoint) Rollback(ctx context.Context) error {
	if err := s.open(); err != nil {
		return err
	}
	s.closed = true
	s.root.queue = nil
	if _, err := s.root.conn.Exec(ctx, sqlRollbackToSavepoint+s.name); err != nil {
		err = fmt.Errorf("outbox: roll back to savepoint: %w", err)
		s.root.droppedFor(err)
		return err
	}
	return nil
}

// open refuses a savepoint that ended or whose transaction did.
func (s *pipelineSavepoint) open() error {
	if s.closed || s.root.closed {
		return pgx.ErrTxClosed
	}
	return nil
}

// Exec runs sql in the transaction.
func (s *pipelineSavepoint) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := s.open(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return s.root.Exec(ctx, sql, args...)
}

// Query runs sql in the transaction.
func (s *pipelineSavepoint) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := s.open(); err != nil {
		return closedRows{}, err
	}
	return s.root.Query(ctx, sql, args...)
}

// QueryRow runs sql in the transaction.
func (s *pipelineSavepoint) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := s.open(); err != nil {
		return closedRows{}
	}
	return s.root.QueryRow(ctx, sql, args...)
}

// SendBatch sends b in the transaction.
func (s *pipelineSavepoint) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := s.open(); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return s.root.SendBatch(ctx, b)
}

// CopyFrom copies rows into a table in the transaction.
func (s *pipelineSavepoint) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := s.open(); err != nil {
		return 0, err
	}
	return s.root.CopyFrom(ctx, table, columns, src)
}

// Prepare prepares a statement on the transaction's connection.
func (s *pipelineSavepoint) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := s.open(); err != nil {
		return nil, err
	}
	return s.root.Prepare(ctx, name, sql)
}

// LargeObjects gives access to large objects in the transaction (see
// PipelineTx.LargeObjects); those of an ended savepoint report
// pgx.ErrTxClosed.
func (s *pipelineSavepoint) LargeObjects() pgx.LargeObjects {
	if s.closed {
		return closedLargeObjects()
	}
	return s.root.LargeObjects()
}

// Conn is the connection the transaction runs on.
func (s *pipelineSavepoint) Conn() *pgx.Conn { return s.root.conn }

// closedRows is the result of a query on a closed transaction. The
// embedded interface is nil: it only keeps closedRows a pgx.Rows should
// pgx add methods.
type closedRows struct {
	pgx.Rows
	err error // nil: pgx.ErrTxClosed
}

func (r closedRows) reason() error {
	if r.err != nil {
		return r.err
	}
	return pgx.ErrTxClosed
}

func (closedRows) Close()                                       {}
func (r closedRows) Err() error                                 { return r.reason() }
func (closedRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (closedRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (closedRows) Next() bool                                   { return false }
func (r closedRows) Scan(...any) error                          { return r.reason() }
func (r closedRows) Values() ([]any, error)                     { return nil, r.reason() }
func (closedRows) RawValues() [][]byte                          { return nil }
func (closedRows) Conn() *pgx.Conn                              { return nil }
func (closedRows) TypeMap() *pgtype.Map                         { return nil }

var (
	_ pgx.Tx = (*PipelineTx)(nil)
	_ pgx.Tx = (*pipelineSavepoint)(nil)
)
