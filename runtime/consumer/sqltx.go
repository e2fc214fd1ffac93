package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// HandleSQL registers fn, a handler written against database/sql, as the
// handler of event type d on c: like Handle, but fn gets the dedup
// transaction as a *sql.Tx, for code on sqlx, sqlc's database/sql mode,
// ent or GORM (their underlying *sql.Tx). The transaction runs on a
// connection of the consumer's pool through pgx's stdlib driver, so the
// dedup row and fn's writes commit together. fn must not commit or roll
// back tx.
func HandleSQL[T events.Event](c *Consumer, d *events.Descriptor, fn func(ctx context.Context, tx *sql.Tx, meta events.Meta, ev T) error, opts ...HandlerOption) error {
	if fn == nil {
		return errors.New("consumer: HandleSQL: nil handler function")
	}
	h := typed(d, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev T) error {
		st, err := sqlTxOf(ctx, tx)
		if err != nil {
			return err
		}
		return fn(ctx, st, meta, ev)
	})
	return c.register(d, h, append(opts, func(r *route) error { r.sql = true; return nil }))
}

// sqlTxOf returns the *sql.Tx behind a database/sql handler's transaction;
// in a batch it first sets the event's savepoint, which the handler's own
// statements (sent through database/sql) would not.
func sqlTxOf(ctx context.Context, tx pgx.Tx) (*sql.Tx, error) {
	if et, ok := tx.(*eventTx); ok {
		if err := et.ensure(ctx); err != nil {
			return nil, err
		}
		tx = et.Tx
	}
	b, ok := tx.(*bridgeTx)
	if !ok {
		return nil, Permanent(fmt.Errorf("consumer: database/sql handler got a %T, not the consumer's bridge transaction (middleware must pass tx on unchanged)", tx))
	}
	return b.tx, nil
}

// sqlDB returns the database/sql handle over the consumer's pool, opened on first
// use. It keeps no idle connections, so every connection goes back to the
// pool when its transaction ends.
func (c *Consumer) sqlDB() *sql.DB {
	c.sqlOnce.Do(func() {
		c.sqldb = stdlib.OpenDBFromPool(c.db)
		c.sqldb.SetMaxIdleConns(0)
	})
	return c.sqldb
}

// begin starts the dedup transaction of route r: an outbox.CommitTx on a
// connection of the pool, or for a database/sql handler a *sql.Tx seen
// through a bridgeTx. The CommitTx sends the events the handler writes
// with an outbox.Writer together with the COMMIT, saving a round trip.
func (c *Consumer) begin(ctx context.Context, r *route) (pgx.Tx, error) {
	if !r.sql {
		return outbox.Begin(ctx, c.db, pgx.TxOptions{})
	}
	conn, err := c.sqlDB().Conn(ctx)
	if err != nil {
		return nil, err
	}
	var pc *pgx.Conn
	if err := conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("consumer: database/sql connection is a %T, not pgx's stdlib driver", dc)
		}
		pc = sc.Conn()
		return nil
	}); err != nil {
		_ = conn.Close()
		return nil, err
	}
	// The consumer ends the transaction itself: a context that database/sql
	// watches would roll it back from another goroutine.
	tx, err := conn.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return &bridgeTx{conn: conn, tx: tx, pc: pc}, nil
}

// rawConn is tx's connection, without opening the transaction.
func rawConn(tx pgx.Tx) *pgx.Conn {
	return tx.Conn() // a CommitTx or a bridgeTx: each has its connection at hand
}

// bridgeTx is a database/sql transaction seen as a pgx.Tx: the consumer's
// own statements (dedup, savepoints) run on the pgx connection under the
// *sql.Tx, in the same server transaction; the handler gets the *sql.Tx.
type bridgeTx struct {
	conn *sql.Conn
	tx   *sql.Tx
	pc   *pgx.Conn
	once sync.Once
}

var errBridgeNested = errors.New("consumer: nested transactions are not available on a database/sql handler's transaction: use SAVEPOINT through the *sql.Tx")

func (b *bridgeTx) release() { b.once.Do(func() { _ = b.conn.Close() }) }

// Begin is refused: the *sql.Tx is the handler's transaction.
func (b *bridgeTx) Begin(context.Context) (pgx.Tx, error) { return nil, errBridgeNested }

// Commit commits the *sql.Tx and returns the connection.
func (b *bridgeTx) Commit(context.Context) error {
	defer b.release()
	return b.tx.Commit()
}

// Rollback rolls the *sql.Tx back (a no-op after Commit) and returns the
// connection.
func (b *bridgeTx) Rollback(context.Context) error {
	defer b.release()
	if err := b.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

func (b *bridgeTx) CopyFrom(ctx context.Context, t pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	return b.pc.CopyFrom(ctx, t, cols, src)
}
func (b *bridgeTx) SendBatch(ctx context.Context, batch *pgx.Batch) pgx.BatchResults {
	return b.pc.SendBatch(ctx, batch)
}
func (b *bridgeTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }
func (b *bridgeTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return b.pc.Prepare(ctx, name, sql)
}
func (b *bridgeTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return b.pc.Exec(ctx, sql, args...)
}
func (b *bridgeTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return b.pc.Query(ctx, sql, args...)
}
func (b *bridgeTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return b.pc.QueryRow(ctx, sql, args...)
}
func (b *bridgeTx) Conn() *pgx.Conn { return b.pc }
