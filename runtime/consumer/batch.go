package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
)

// Batched transactions: consecutive messages of a partition that the
// reader has already fetched are applied in one database transaction, so
// the cost of a durable commit (and of BEGIN and the dedup insert) is
// shared by the batch:
//
//	BEGIN
//	INSERT INTO consumed_events … SELECT unnest($ids) ON CONFLICT DO NOTHING RETURNING event_id
//	for each new event, in offset order:
//	    SAVEPOINT; handler; RELEASE (or ROLLBACK TO SAVEPOINT on failure)
//	COMMIT
//	mark the offsets, fire the hooks
//
// The first event whose handler fails ends the batch: its savepoint is
// rolled back, the dedup rows of it and of the events after it are
// deleted, the events before it commit, and it is then settled alone, on
// the one-transaction-per-message path (retries, backoff, DLQ) before the
// events after it are batched again: a failing event is retried or
// dead-lettered alone and per-partition (so per-key) order is kept. Any
// failure of the batch's own statements (begin, dedup, savepoint, commit)
// rolls the batch back and falls back to that path for its first message,
// which retries database faults without counting attempts.

// maxQueuedWait bounds the wait for a message the reader reports queued.
const maxQueuedWait = 50 * time.Millisecond

// fill extends batch with messages the reader has already fetched, up to
// the batch size, without waiting for new ones. A fetch error ends the
// batch and is returned after it.
func (p *partition) fill(ctx context.Context, r *kafka.Reader, first kafka.Message) ([]kafka.Message, error) {
	batch := []kafka.Message{first}
	for len(batch) < p.c.s.maxBatch && r.Stats().QueueLength > 0 {
		fctx, cancel := context.WithTimeout(ctx, maxQueuedWait)
		m, err := r.FetchMessage(fctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				break
			}
			return batch, err
		}
		p.lag(m, nil)
		batch = append(batch, m)
	}
	return batch, nil
}

// plain is a message that decoded and that this consumer handles.
type plain struct {
	m   kafka.Message
	env *envelope.Envelope
}

// settleAll settles msgs in order: runs of plain messages in batches, the
// others (redrives for other consumers, undecodable or foreign envelopes)
// and the failing ones alone.
func (p *partition) settleAll(ctx context.Context, msgs []kafka.Message) error {
	for len(msgs) > 0 {
		var run []plain
		for _, m := range msgs {
			if target, ok := envelope.Header(m, HeaderRedriveFor); ok && target != p.c.name {
				break
			}
			env, err := envelope.Decode(m)
			if err == nil {
				err = p.r.check(env)
			}
			if err != nil {
				break
			}
			run = append(run, plain{m: m, env: env})
		}
		if len(run) < 2 {
			if err := p.settle(ctx, msgs[0]); err != nil {
				return err
			}
			msgs = msgs[1:]
			continue
		}
		n, failed, herr, err := p.applyBatch(ctx, run)
		if err != nil {
			return err
		}
		msgs = msgs[n:]
		if !failed && n < len(run) {
			return p.soft.Err() // stopping: the rest is redelivered
		}
		if failed {
			// herr, if set, was the message's first attempt.
			if err := p.settleAfter(ctx, msgs[0], herr); err != nil {
				return err
			}
			msgs = msgs[1:]
		}
	}
	return nil
}

// applyBatch applies a prefix of run in one transaction and returns its
// length n. failed reports that run[n]'s handler failed with herr (its
// first attempt), or that the batch's own statements failed (herr nil, n
// 0): the caller settles run[n] alone. n < len(run) without failed means
// the partition is stopping.
func (p *partition) applyBatch(ctx context.Context, run []plain) (n int, failed bool, herr, err error) {
	c := p.c
	start := time.Now()
	release, err := c.acquire(ctx)
	if err != nil {
		return 0, false, nil, err
	}
	defer release()
	tx, err := c.begin(ctx, p.r)
	if err != nil {
		return 0, true, nil, nil
	}
	owned := true // false once an abandoned handler's goroutine owns tx
	defer func() {
		if owned {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = tx.Rollback(rctx) // a no-op after Commit
		}
	}()
	fresh := map[events.EventID]bool{}
	if c.s.noDedup {
		for _, pm := range run {
			fresh[pm.env.EventID] = true
		}
	} else {
		ids := make([]pgtype.UUID, len(run))
		for i, pm := range run {
			ids[i] = pgtype.UUID{Bytes: pm.env.EventID, Valid: true}
		}
		rows, err := tx.Query(ctx, c.sql.batch, c.name, ids)
		if err != nil {
			return 0, true, nil, nil
		}
		for rows.Next() {
			var id pgtype.UUID
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return 0, true, nil, nil
			}
			fresh[id.Bytes] = true
		}
		if rows.Err() != nil {
			return 0, true, nil, nil
		}
	}
	applied := make([]bool, len(run))
	n = len(run)
	for i, pm := range run {
		if p.soft.Err() != nil {
			n = i
			break
		}
		if !fresh[pm.env.EventID] {
			continue // applied before, or earlier in this batch
		}
		ok, abandoned, hErr, err := p.applyOne(ctx, tx, pm)
		if abandoned {
			owned = false
			if ctx.Err() != nil {
				return 0, false, nil, ctx.Err()
			}
			if i == 0 {
				return 0, true, fmt.Errorf("consumer: attempt timed out after %s (WithAttemptTimeout): handler did not return after its context ended; abandoned", c.s.attemptTimeout), nil
			}
			return 0, true, nil, nil // the events before it are settled again
		}
		if err != nil {
			if ctx.Err() != nil {
				return 0, false, nil, ctx.Err()
			}
			return 0, true, nil, nil // the batch's own statement failed
		}
		if !ok {
			n, failed, herr = i, true, hErr
			break
		}
		delete(fresh, pm.env.EventID)
		applied[i] = true
	}
	if n == 0 {
		return 0, failed, herr, nil
	}
	if n < len(run) && !c.s.noDedup {
		var undo []pgtype.UUID
		for _, pm := range run[n:] {
			if fresh[pm.env.EventID] {
				undo = append(undo, pgtype.UUID{Bytes: pm.env.EventID, Valid: true})
			}
		}
		if len(undo) > 0 {
			if _, err := tx.Exec(ctx, c.sql.undo, c.name, undo); err != nil {
				return 0, true, nil, nil
			}
		}
	}
	err = tx.Commit(ctx)
	if err == nil && c.s.lostCommitAck != nil {
		err = c.s.lostCommitAck()
	}
	if err != nil && committedAfterAll(ctx, c, run[:n], applied) {
		err = nil
	}
	if err != nil {
		// Settled alone, each message finds out from the dedup table
		// whether it was applied after all.
		p.log.Warn("consumer: batch commit failed; settling its messages one by one", "offset", run[0].m.Offset, "messages", n, "err", err)
		return 0, true, nil, nil
	}
	took := time.Since(start)
	for i, pm := range run[:n] {
		if c.faults.AfterDBCommit != nil {
			if err := c.faults.AfterDBCommit(pm.m); err != nil {
				return 0, false, nil, &abortError{err}
			}
		}
		if err := p.done(pm.m); err != nil {
			return 0, false, nil, err
		}
		d := events.Delivery{Topic: pm.m.Topic, Partition: pm.m.Partition, Offset: pm.m.Offset, Attempt: 1}
		switch {
		case applied[i] && c.s.hooks.Processed != nil:
			c.s.hooks.Processed(d, pm.env.Type, took)
		case !applied[i] && c.s.hooks.Duplicate != nil:
			c.s.hooks.Duplicate(d, pm.env.Type)
		}
	}
	return n, failed, herr, nil
}

// savepointSQL sets the savepoint that isolates one handler call of a
// batch; rollbackSQL returns to it when the handler fails.
const (
	savepointSQL = "SAVEPOINT protoevents_event"
	rollbackSQL  = "ROLLBACK TO SAVEPOINT protoevents_event"
)

// applyOne runs one handler of a batch, isolated by a savepoint set lazily
// with its first statement (see eventTx). ok is false when the handler
// failed with herr (its savepoint rolled back); err reports a failure of
// the savepoint statements themselves; abandoned a handler that ignored
// its context, whose goroutine now owns tx.
func (p *partition) applyOne(ctx context.Context, tx pgx.Tx, pm plain) (ok, abandoned bool, herr, err error) {
	c := p.c
	ev := p.r.d.New()
	if err := pm.env.UnmarshalPayload(ev); err != nil {
		return false, false, Permanent(err), nil
	}
	actx := ctx
	if c.s.attemptTimeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, c.s.attemptTimeout)
		defer cancel()
	}
	etx := &eventTx{Tx: tx}
	meta := events.Meta{Metadata: pm.env.Metadata, Delivery: events.Delivery{Topic: pm.m.Topic, Partition: pm.m.Partition, Offset: pm.m.Offset, Attempt: 1}}
	herr, abandoned = p.guardedHandler(actx, tx, etx, meta, ev)
	if abandoned {
		return false, true, nil, nil
	}
	if herr == nil {
		return true, false, nil, nil
	}
	if ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
		herr = fmt.Errorf("consumer: attempt timed out after %s (WithAttemptTimeout): %w", c.s.attemptTimeout, herr)
	}
	if !etx.set {
		if tx.Conn().PgConn().TxStatus() != 'T' {
			// The savepoint itself failed: the batch is lost.
			return false, false, nil, fmt.Errorf("consumer: savepoint: %w", herr)
		}
		return false, false, herr, nil // the handler never touched tx
	}
	if _, err := tx.Exec(ctx, rollbackSQL); err != nil {
		return false, false, nil, fmt.Errorf("consumer: rollback to savepoint: %w", err)
	}
	return false, false, herr, nil
}

// eventTx is the transaction a handler sees in a batch: the batch's
// transaction, with a savepoint set just before the handler's first
// statement, sent in the same round trip as an Exec, so isolating each
// event costs no extra round trip. Savepoints are not released: each
// handler's nests in the previous one's, and the commit ends them all;
// see DefaultMaxBatch. Commit and Rollback are refused: the consumer owns
// the transaction.
type eventTx struct {
	pgx.Tx
	set bool
}

var errHandlerEndsTx = errors.New("consumer: a handler must not commit or roll back the dedup transaction")

// ensure sets the savepoint, if not yet set, in a round trip of its own.
func (t *eventTx) ensure(ctx context.Context) error {
	if t.set {
		return nil
	}
	if _, err := t.Tx.Exec(ctx, savepointSQL); err != nil {
		return fmt.Errorf("consumer: savepoint: %w", err)
	}
	t.set = true
	return nil
}

// Exec sends the savepoint and the statement in one round trip.
func (t *eventTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.set {
		return t.Tx.Exec(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(savepointSQL)
	b.Queue(sql, args...)
	br := t.Tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return pgconn.CommandTag{}, fmt.Errorf("consumer: savepoint: %w", err)
	}
	t.set = true
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query sets the savepoint, then queries.
func (t *eventTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Query(ctx, sql, args...)
}

// QueryRow sets the savepoint, then queries.
func (t *eventTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.ensure(ctx); err != nil {
		return errRow{err}
	}
	return t.Tx.QueryRow(ctx, sql, args...)
}

// SendBatch sets the savepoint, then sends b.
func (t *eventTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.ensure(ctx); err != nil {
		return errBatch{err}
	}
	return t.Tx.SendBatch(ctx, b)
}

// CopyFrom sets the savepoint, then copies.
func (t *eventTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.ensure(ctx); err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(ctx, table, cols, src)
}

// Prepare sets the savepoint, then prepares.
func (t *eventTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Prepare(ctx, name, sql)
}

// Begin sets the savepoint, then starts a nested (pseudo) transaction.
func (t *eventTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.ensure(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Begin(ctx)
}

// Conn sets the savepoint (the handler may use the connection directly),
// then returns the connection.
func (t *eventTx) Conn() *pgx.Conn {
	_ = t.ensure(context.Background())
	return t.Tx.Conn()
}

// LargeObjects sets the savepoint, then returns the large objects API.
func (t *eventTx) LargeObjects() pgx.LargeObjects {
	_ = t.ensure(context.Background())
	return t.Tx.LargeObjects()
}

// Commit is refused.
func (t *eventTx) Commit(context.Context) error { return errHandlerEndsTx }

// Rollback is refused.
func (t *eventTx) Rollback(context.Context) error { return errHandlerEndsTx }

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }

// committedAfterAll reports, after a commit that failed in transit, whether
// it landed on the server: the dedup row of an event the batch applied
// exists. A batch of duplicates only changed nothing either way.
func committedAfterAll(ctx context.Context, c *Consumer, run []plain, applied []bool) bool {
	for i, pm := range run {
		if applied[i] {
			ok, err := c.applied(ctx, pm.env.EventID)
			return err == nil && ok
		}
	}
	return true
}
