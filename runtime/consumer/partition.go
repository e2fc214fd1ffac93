package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/internal/health"
)

// partition is the state of one assigned partition during one generation.
// Only its goroutine touches it.
type partition struct {
	c         *Consumer
	r         *route
	soft      context.Context // ends when the partition must stop taking new messages
	gen       *kafka.Generation
	topic     string
	id        int
	log       *slog.Logger
	pending   int64 // next offset to commit: last handled offset + 1
	hwm       int64 // highest high watermark of the fetches so far
	committed int64 // last offset committed to the group
	lastFlush time.Time
}

// errAbort marks errors that must stop the whole consumer (the crash test
// seam), as opposed to ending the generation.
type abortError struct{ err error }

func (e *abortError) Error() string { return e.err.Error() }
func (e *abortError) Unwrap() error { return e.err }

// infraError marks a failure of the consumer's own database steps (begin,
// dedup insert): not the message's fault, so retried without counting
// towards MaxAttempts.
type infraError struct{ err error }

func (e *infraError) Error() string { return e.err.Error() }
func (e *infraError) Unwrap() error { return e.err }

// runPartition consumes one partition until the generation ends. It has
// two contexts, both carrying the values of Run's context: soft ends when
// Run's context or the generation ends, and stops fetching, retrying and
// backing off; ctx (hard) ends the drain timeout later and abandons the
// message in flight. Run ends the generation by closing the group, so
// partitions never end (and so restart) a generation on their own during
// shutdown. started is called once the partition is consuming (or gave
// up). It returns an error only when the consumer must stop.
func (c *Consumer) runPartition(runCtx, gctx context.Context, gen *kafka.Generation, topic string, a kafka.PartitionAssignment, started func()) error {
	started = sync.OnceFunc(started)
	defer started()
	c.health.partitions.Add(1)
	defer c.health.partitions.Add(-1)
	soft, cancelSoft := context.WithCancel(context.WithoutCancel(runCtx))
	defer cancelSoft()
	ctx, cancel := context.WithCancel(context.WithoutCancel(runCtx))
	defer cancel()
	stop := context.AfterFunc(gctx, cancelSoft)
	defer stop()
	stopRun := context.AfterFunc(runCtx, cancelSoft)
	defer stopRun()
	stopSoft := context.AfterFunc(soft, func() {
		// An abort is a simulated crash: like a dying process, every
		// partition stops at once, without finishing anything.
		if c.aborted.Load() || c.s.drainTimeout <= 0 {
			cancel()
			return
		}
		t := time.AfterFunc(c.s.drainTimeout, cancel)
		context.AfterFunc(ctx, func() { t.Stop() })
	})
	defer stopSoft()

	p := &partition{
		c: c, r: c.routes[topic], soft: soft, gen: gen, topic: topic, id: a.ID,
		log:     c.log.With("topic", topic, "partition", a.ID),
		pending: -1, committed: -1, lastFlush: time.Now(),
	}
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:       c.brokers,
		Topic:         topic,
		Partition:     a.ID,
		Dialer:        c.s.dialer,
		MinBytes:      1,
		MaxBytes:      c.s.fetchMaxBytes,
		QueueCapacity: c.s.queued,
		MaxWait:       c.s.maxWait,
		ErrorLogger:   kafka.LoggerFunc(func(msg string, args ...any) { p.log.Debug(fmt.Sprintf(msg, args...)) }),
	})
	defer func() {
		if err := r.Close(); err != nil {
			p.log.Debug("consumer: close reader", "err", err)
		}
	}()
	if err := r.SetOffset(a.Offset); err != nil {
		p.log.Warn("consumer: set offset", "offset", a.Offset, "err", err)
		return nil
	}
	p.log.Debug("consumer: partition assigned", "offset", a.Offset, "generation", gen.ID)
	started()
	for {
		m, err := p.next(soft, r)
		if err == nil {
			var batch []kafka.Message
			var ferr error
			batch, ferr = p.fill(soft, r, m)
			err = p.settleAll(ctx, batch)
			if err == nil {
				err = ferr
			}
		}
		if err != nil {
			var ab *abortError
			if errors.As(err, &ab) {
				return ab.err
			}
			if soft.Err() == nil {
				// Fetch or offset-commit failure: end the generation; the
				// group rejoins and the dedup table absorbs redeliveries.
				p.log.Warn("consumer: partition stopped", "err", err)
			}
			break
		}
	}
	if !c.aborted.Load() {
		if err := p.flush(); err != nil {
			p.log.Debug("consumer: final offset commit", "err", err)
		}
	}
	return nil
}

// next fetches the next message, committing handled offsets whenever the
// commit interval has passed, also while waiting for new messages.
func (p *partition) next(ctx context.Context, r *kafka.Reader) (kafka.Message, error) {
	for {
		if p.pending <= p.committed {
			m, err := r.FetchMessage(ctx)
			p.lag(m, err)
			return m, err
		}
		wait := p.c.s.commitInterval - time.Since(p.lastFlush)
		if wait <= 0 {
			if err := p.flush(); err != nil {
				return kafka.Message{}, err
			}
			continue
		}
		fctx, cancel := context.WithTimeout(ctx, wait)
		m, err := r.FetchMessage(fctx)
		cancel()
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			continue // idle: loop round to commit
		}
		p.lag(m, err)
		return m, err
	}
}

// lag reports how far behind the partition is at m, the oldest message
// not yet handled (see Hooks.Lag), and records the highest watermark seen.
func (p *partition) lag(m kafka.Message, err error) {
	if err != nil {
		return
	}
	p.hwm = max(p.hwm, m.HighWaterMark)
	if p.c.s.hooks.Lag != nil {
		var age time.Duration
		if !m.Time.IsZero() { // a record without a timestamp has no age
			age = max(time.Since(m.Time), 0)
		}
		p.c.s.hooks.Lag(p.topic, p.id, max(p.hwm-m.Offset-1, 0), age)
	}
}

// done marks m handled: its offset may now be committed. Handling the
// last message the partition was known to hold (the highest watermark of
// every fetch, so not an earlier message of a batch) leaves nothing
// behind.
func (p *partition) done(m kafka.Message) error {
	p.pending = m.Offset + 1
	if p.c.s.hooks.Lag != nil && p.hwm > 0 && m.Offset+1 >= p.hwm {
		p.c.s.hooks.Lag(p.topic, p.id, 0, 0)
	}
	if p.c.s.commitInterval == 0 {
		return p.flush()
	}
	return nil
}

// flush commits the handled offset, if it moved.
func (p *partition) flush() error {
	if p.pending <= p.committed {
		return nil
	}
	if err := p.gen.CommitOffsets(map[string]map[int]int64{p.topic: {p.id: p.pending}}); err != nil {
		return fmt.Errorf("consumer: commit offset %d of %s/%d: %w", p.pending, p.topic, p.id, err)
	}
	p.committed = p.pending
	p.lastFlush = time.Now()
	return nil
}

// settle takes one message to a final state (applied, duplicate or
// dead-lettered) and marks its offset, or returns an error with the offset
// left alone: ctx ended, or the commit failed.
func (p *partition) settle(ctx context.Context, m kafka.Message) error {
	return p.settleAfter(ctx, m, nil)
}

// settleAfter is settle for a message whose first attempt, in a batch,
// already failed with prior (nil: no attempt made yet).
func (p *partition) settleAfter(ctx context.Context, m kafka.Message, prior error) error {
	c := p.c
	d := events.Delivery{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}
	if target, ok := envelope.Header(m, HeaderRedriveFor); ok && target != c.name {
		// A redrive is addressed to the consumer that dead-lettered the
		// message. The others applied the event long ago, and their dedup
		// rows may be pruned by now: they skip it like a duplicate.
		if err := p.done(m); err != nil {
			return err
		}
		if c.s.hooks.Duplicate != nil {
			typ, _ := envelope.Header(m, envelope.HeaderType)
			c.s.hooks.Duplicate(d, typ)
		}
		return nil
	}
	env, err := envelope.Decode(m)
	if err == nil {
		err = p.r.check(env)
	}
	if err != nil {
		now := time.Now()
		d.Attempt = 1
		return p.deadLetter(ctx, m, env, d, Permanent(err), now, now)
	}
	var first, last time.Time
	infra := 0
	// recovered ends a streak of transient failures: logged, and no longer
	// counted against the consumer's readiness.
	recovered := func() {
		if infra > 0 {
			p.log.Info("consumer: database reachable again", "offset", m.Offset, "transient_failures", infra)
			c.health.failing.Add(-1)
			infra = 0
		}
	}
	defer func() {
		if infra > 0 {
			c.health.failing.Add(-1)
		}
	}()
	for attempt := 1; ; {
		d.Attempt = attempt
		start := time.Now()
		// Taken before the attempt, so that the database coming back while
		// it fails still ends the sleep after it (health.Watch.Back).
		dbBack := c.health.db.Back()
		var (
			dup bool
			err error
		)
		if prior != nil {
			err, prior = prior, nil
		} else {
			dup, err = p.attempt(ctx, env, d)
		}
		if err == nil {
			recovered()
			if c.faults.AfterDBCommit != nil {
				if herr := c.faults.AfterDBCommit(m); herr != nil {
					return &abortError{herr}
				}
			}
			if err := p.done(m); err != nil {
				return err
			}
			if dup {
				if c.s.hooks.Duplicate != nil {
					c.s.hooks.Duplicate(d, env.Type)
				}
			} else if c.s.hooks.Processed != nil {
				c.s.hooks.Processed(d, env.Type, time.Since(start))
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if p.soft.Err() != nil {
			// Shutting down or rebalancing: no retries; the message is
			// redelivered, and this failure does not count.
			return p.soft.Err()
		}
		if isInfra(err) {
			infra++
			if infra == 1 {
				c.health.failing.Add(1)
			}
			wait := c.backoff(infra)
			level := slog.LevelWarn
			if infra > 5 {
				level = slog.LevelError
			}
			p.log.Log(ctx, level, "consumer: transient database failure, retrying without counting an attempt", "offset", m.Offset, "event_id", env.EventID, "failures", infra, "err", err, "backoff", wait)
			// The background check looks at once, then often while the
			// database is down; seeing it back, it ends this sleep.
			c.health.db.Suspect()
			if err := health.Sleep(p.soft, wait, dbBack); err != nil {
				return err
			}
			continue
		}
		recovered()
		last = time.Now()
		if first.IsZero() {
			first = last
		}
		if IsPermanent(err) || attempt >= p.r.maxAttempts {
			return p.deadLetter(ctx, m, env, d, err, first, last)
		}
		wait := c.backoff(attempt)
		p.log.Info("consumer: handler failed, retrying", "offset", m.Offset, "event_id", env.EventID, "attempt", attempt, "err", err, "backoff", wait)
		if c.s.hooks.Retry != nil {
			c.s.hooks.Retry(d, err, wait)
		}
		// A retrying message is the oldest unhandled one, and ageing: say so
		// at each attempt, not only when it was fetched.
		p.lag(m, nil)
		if err := sleep(p.soft, wait); err != nil {
			return err
		}
		attempt++
	}
}

// check refuses envelopes the handler cannot read: another event type, or
// a schema version newer than the one the consumer was generated from.
func (r *route) check(env *envelope.Envelope) error {
	if env.Type != r.d.Type {
		return fmt.Errorf("consumer: event type %q on topic %s, but the consumer handles %q", env.Type, r.d.Topic, r.d.Type)
	}
	if env.SchemaVersion > r.d.Version {
		return fmt.Errorf("consumer: %s schema_version %d is newer than the consumer's %d: regenerate and redeploy the consumer, then redrive", env.Type, env.SchemaVersion, r.d.Version)
	}
	return nil
}

// attempt runs one try of a message: dedup insert, handler and commit in
// one transaction. dup reports an event already applied.
func (p *partition) attempt(ctx context.Context, env *envelope.Envelope, d events.Delivery) (dup bool, err error) {
	c := p.c
	ev := p.r.d.New()
	if err := env.UnmarshalPayload(ev); err != nil {
		return false, Permanent(err)
	}
	release, err := c.acquire(ctx)
	if err != nil {
		return false, err
	}
	defer release()
	// The attempt's own deadline: a handler stuck on a lock or a slow call
	// fails (and is retried, then dead-lettered) instead of holding its
	// partition and a transaction forever.
	actx := ctx
	if c.s.attemptTimeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(ctx, c.s.attemptTimeout)
		defer cancel()
	}
	timedOut := func(err error) error {
		if ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("consumer: attempt timed out after %s (WithAttemptTimeout): %w", c.s.attemptTimeout, err)
		}
		return err
	}
	tx, err := c.begin(actx, p.r)
	if err != nil {
		return false, &infraError{timedOut(fmt.Errorf("consumer: begin: %w", err))}
	}
	abandoned := false
	defer func() {
		if abandoned {
			return // the handler's goroutine owns tx now
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx) // a no-op after Commit
	}()
	if !c.s.noDedup {
		tag, err := tx.Exec(actx, c.sql.dedup, c.name, pgtype.UUID{Bytes: env.EventID, Valid: true})
		if err != nil {
			return false, &infraError{timedOut(fmt.Errorf("consumer: dedup insert: %w", err))}
		}
		if tag.RowsAffected() == 0 {
			return true, nil
		}
	}
	meta := events.Meta{Metadata: env.Metadata, Delivery: d}
	err, abandoned = p.guardedHandler(actx, tx, tx, meta, ev)
	if abandoned {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		return false, timedOut(errors.New("consumer: handler did not return after its context ended; abandoned"))
	}
	if err != nil {
		return false, timedOut(err)
	}
	err = tx.Commit(actx)
	if err == nil && c.s.lostCommitAck != nil {
		err = c.s.lostCommitAck()
	}
	if err != nil {
		// A commit that failed in transit may have succeeded on the server:
		// look before counting the attempt as failed, so an applied event is
		// never dead-lettered (or its effect attempted again).
		if applied, qerr := c.applied(ctx, env.EventID); qerr == nil && applied {
			return false, nil
		}
		return false, timedOut(fmt.Errorf("consumer: commit: %w", err))
	}
	return false, nil
}

// guardedHandler runs the handler in its own goroutine, so that a handler
// ignoring its context cannot hold the partition (and Run) forever: once
// ctx ends and the handler has not returned within the grace period, it is
// reported at ERROR and abandoned. Its connection is closed, so the server
// rolls its transaction back; the goroutine releases tx whenever the
// handler returns. abandoned reports that case; tx must then not be used.
// htx is the handler's view of tx (tx itself, or a batch's eventTx).
func (p *partition) guardedHandler(ctx context.Context, tx, htx pgx.Tx, meta events.Meta, ev events.Event) (err error, abandoned bool) {
	var (
		mu       sync.Mutex
		finished bool
		gaveUp   bool
		done     = make(chan error, 1)
	)
	// The connection, taken without asking tx, whose Conn would send the
	// BEGIN if it has not gone out (dedup off).
	conn := rawConn(tx)
	go func() {
		err := p.c.traceHandler(ctx, htx, meta, ev, p.r)
		mu.Lock()
		finished = true
		owner := gaveUp
		mu.Unlock()
		if owner {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = tx.Rollback(rctx)
			return
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err, false
	case <-ctx.Done():
	}
	grace := time.NewTimer(p.c.s.handlerGrace)
	defer grace.Stop()
	select {
	case err := <-done:
		return err, false
	case <-grace.C:
	}
	mu.Lock()
	if finished {
		mu.Unlock()
		return <-done, false
	}
	gaveUp = true
	// Closing the socket is safe while the handler's goroutine uses the
	// connection: its next call fails and the pool discards the connection.
	// It happens under mu, before the handler's goroutine can see gaveUp,
	// roll back and return the connection to the pool, where the socket
	// would be another transaction's.
	if pc := conn.PgConn(); pc != nil {
		_ = pc.Conn().Close()
	}
	mu.Unlock()
	p.log.Error("consumer: handler ignored its context and is still running; abandoning it and closing its database connection (its transaction rolls back)",
		"event_id", meta.EventID, "event_type", meta.Type, "offset", meta.Offset, "attempt", meta.Attempt, "cause", context.Cause(ctx))
	return nil, true
}

// applied reports whether the dedup table records the event as applied by
// this consumer.
func (c *Consumer) applied(ctx context.Context, id events.EventID) (bool, error) {
	var ok bool
	err := c.db.QueryRow(ctx, c.sql.applied, c.name, pgtype.UUID{Bytes: id, Valid: true}).Scan(&ok)
	return ok, err
}

// traceHandler runs the handler in a consumer span whose parent is the
// producer's span (the envelope's traceparent), so a trace follows an event
// from the business transaction that wrote it to every handler.
func (c *Consumer) traceHandler(ctx context.Context, tx pgx.Tx, meta events.Meta, ev events.Event, r *route) error {
	ctx = events.ContextWithTraceParent(ctx, meta.TraceParent)
	ctx, span := c.s.tracer.Start(ctx, meta.Topic+" process", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", meta.Topic),
			attribute.String("messaging.destination.partition.id", strconv.Itoa(meta.Partition)),
			attribute.Int64("messaging.kafka.offset", meta.Offset),
			attribute.String("messaging.consumer.group.name", c.groupID),
			attribute.String("messaging.message.id", meta.EventID.String()),
			attribute.String("protoevents.event_type", meta.Type),
			attribute.Int("protoevents.attempt", meta.Attempt),
		))
	defer span.End()
	err := c.callHandler(ctx, tx, meta, ev, r)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return err
}

// callHandler runs the handler with its middleware, turning a panic into a
// *PanicError.
func (c *Consumer) callHandler(ctx context.Context, tx pgx.Tx, meta events.Meta, ev events.Event, r *route) (err error) {
	defer func() {
		if rec := recover(); rec != nil {
			err = &PanicError{Value: rec, Stack: []byte(truncate(string(debug.Stack()), c.s.maxErrorBytes))}
		}
	}()
	return r.fn(ctx, tx, meta, ev)
}

// backoff returns the wait after the n-th failure: base·2^(n-1) capped at
// max, of which the upper half is random ("equal jitter"), so partitions
// failing together do not retry in lockstep.
func (c *Consumer) backoff(n int) time.Duration {
	d := c.s.maxBackoff
	if n < 32 {
		if e := c.s.baseBackoff << (n - 1); e > 0 && e < d {
			d = e
		}
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
