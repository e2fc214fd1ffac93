package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
)

// Relay publishes outbox rows to Kafka: at least once, in order per key,
// from any number of instances at the same time.
//
// # Order across instances: key-hash lanes
//
// Every row has a lane, hash(key) mod the table's lane count, computed by
// Postgres when the row is inserted. A relay works only the lanes it owns,
// each strictly in id order; it owns a lane by holding a session-level
// advisory lock on (table OID, lane). Relays announce themselves with a
// shared lock on (table OID, 2^31-1) and every rebalance interval each one
// counts the announced relays and keeps at most ceil(lanes/relays) lanes,
// giving up extra ones between batches and taking free ones. All of a
// relay's locks and its claim transactions live on one connection, so a
// crashed or partitioned relay loses its lanes exactly when its in-flight
// claim is rolled back, never before.
//
// # One batch
//
// In one transaction on that connection: claim the first rows of the owned
// lanes in id order (FOR UPDATE: lanes are exclusive, so SKIP LOCKED would
// skip nothing of ours, and waiting on a foreign lock keeps order where
// skipping would break it), publish them with one kafka-go
// WriteMessages call (per-message topic, key = event key, acks=all,
// murmur2 partitioning like the Java client), mark the acknowledged rows
// published in one UPDATE, commit.
//
// # Partial failures
//
// kafka-go splits a call by partition and writes each partition's share as
// a sequence of produce requests. The relay sizes those (BatchSize = batch
// size, BatchBytes above the batch byte cap WithMaxBatchBytes) so that each
// share is exactly one request, which the broker appends or refuses as a
// whole: a key's events in one batch are never half written. When some
// partitions fail (kafka.WriteErrors), the relay marks a row only if it was
// acknowledged and no earlier row of the same topic and key in the batch
// failed; the others stay pending with attempts/last_error recorded. Their
// keys are parked: the claim skips every row of a parked key until the
// key's own exponential, jittered backoff ends, so a key is never published
// past one of its own unpublished events, while the keys behind it in the
// lanes (on healthy partitions) keep flowing. A topic the broker refuses as
// a whole (unknown, invalid or not authorized: kafka-go fails the entire
// call for it, before sending anything) is parked the same way, with its
// own backoff: the claim skips all of its rows, so however many of them
// fill the head of the lanes, the other topics' rows behind them flow; a
// key lives on one topic, so this keeps every key's order. When a batch
// gets nothing through and parks no topic, the whole relay backs off. Rows
// re-sent after a failure or crash are duplicates with the same event_id,
// which consumers deduplicate.
//
// # Takeover
//
// If a relay's database session dies while its publish is still in flight,
// the lanes' next owner re-sends from the same first pending row. Both
// batches are contiguous runs of each key's events, each appended
// atomically per partition, so after deduplication by event_id every key is
// still in order, although the raw log may then hold a stale duplicate after
// newer events.
//
// # Known limits
//
// Rows for a topic that does not exist (and is not auto-created, see
// WithKafkaWriter) stay pending, the topic parked and retried with backoff
// (up to WithBackoff's maximum), until the topic is created; other topics
// flow meanwhile and the error is in TableStatus.LastError. A row larger
// than the broker's message.max.bytes is refused by the broker and holds up
// its key forever: an operator has to delete it. The lane count is fixed
// per table.
type Relay struct {
	pool    *pgxpool.Pool
	brokers []string
	table   tableName
	cfg     relayConfig
	log     *slog.Logger
	running atomic.Bool
}

// NewRelay returns a relay for the outbox table (default "outbox") reached
// through pool, publishing to the Kafka cluster at brokers. Run starts it.
func NewRelay(pool *pgxpool.Pool, brokers []string, opts ...RelayOption) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("outbox: relay: nil pool")
	}
	if len(brokers) == 0 {
		return nil, errors.New("outbox: relay: no Kafka brokers")
	}
	c := relayConfig{
		table:             DefaultTable,
		batchSize:         500,
		maxBatchBytes:     900 << 10,
		pollInterval:      5 * time.Second,
		rebalanceInterval: 2 * time.Second,
		statusInterval:    10 * time.Second,
		retention:         24 * time.Hour,
		cleanupInterval:   time.Minute,
		cleanupBatch:      1000,
		backoffMin:        100 * time.Millisecond,
		backoffMax:        30 * time.Second,
		logger:            slog.Default(),
	}
	for _, o := range opts {
		if o != nil {
			o.applyRelay(&c)
		}
	}
	if c.err != nil {
		return nil, c.err
	}
	t, err := parseTable(c.table)
	if err != nil {
		return nil, err
	}
	return &Relay{pool: pool, brokers: append([]string(nil), brokers...), table: t, cfg: c, log: c.logger.With("outbox", t.String())}, nil
}

// crashError is a hook's simulated crash; Run returns it.
type crashError struct{ err error }

func (e *crashError) Error() string { return "outbox: relay: hook: " + e.err.Error() }
func (e *crashError) Unwrap() error { return e.err }

// Run relays until ctx is canceled, then returns nil after shutting down:
// an in-flight publish is abandoned (its rows stay pending and are re-sent
// later) but a batch the broker already acknowledged is still marked. It
// retries database and broker failures with backoff, also while looking the
// table up at start (each failure is logged and reported to
// Metrics.PublishFailed); it returns an error only if the table does not
// exist (ErrNoTable) or is not an outbox, or a hook simulated a crash.
// A Relay runs at most once at a time.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("outbox: relay: already running")
	}
	defer r.running.Store(false)

	rt, err := r.resolveTable(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	w := r.newKafkaWriter()
	wake := make(chan struct{}, 1)
	listenCtx, stopListen := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.listen(listenCtx, rt.channel(), wake)
	}()

	l := &loop{r: r, t: rt, q: newQueries(rt.qualified()), w: w, wake: wake, bo: backoff{min: r.cfg.backoffMin, max: r.cfg.backoffMax}}
	err = l.run(ctx)

	// Shut down in an order that keeps lane ownership airtight: first let
	// kafka-go finish any produce request still in flight, then drop the
	// session, which frees the lanes for the other relays.
	if cerr := w.Close(); cerr != nil {
		r.log.Warn("outbox relay: close kafka writer", "err", cerr)
	}
	if l.s != nil {
		l.s.close(ctx)
	}
	stopListen()
	wg.Wait()
	return err
}

// resolveTable looks the outbox table up, retrying with backoff while the
// database cannot be reached or fails; only a table that does not exist, or
// is not an outbox, ends it with an error (or ctx, with ctx's error).
func (r *Relay) resolveTable(ctx context.Context) (resolvedTable, error) {
	bo := backoff{min: r.cfg.backoffMin, max: r.cfg.backoffMax}
	for {
		rt, err := resolve(ctx, r.pool, r.table)
		if err == nil {
			return rt, nil
		}
		if ctx.Err() != nil {
			return rt, ctx.Err()
		}
		if errors.Is(err, ErrNoTable) || errors.Is(err, errNotOutbox) {
			return rt, err
		}
		d := bo.next()
		r.log.Warn("outbox relay: look up table: retrying", "err", err, "backoff", d)
		if f := r.cfg.metrics.PublishFailed; f != nil {
			f(err)
		}
		sleep(ctx, d)
	}
}

// newKafkaWriter builds the producer, applying the caller's adjustments and
// then restoring the settings the relay's guarantees rest on.
func (r *Relay) newKafkaWriter() *kafka.Writer {
	w := &kafka.Writer{
		Addr:            kafka.TCP(r.brokers...),
		Balancer:        kafka.Murmur2Balancer{},
		BatchTimeout:    time.Millisecond,
		MaxAttempts:     3,
		WriteBackoffMin: 50 * time.Millisecond,
		WriteBackoffMax: 500 * time.Millisecond,
		WriteTimeout:    10 * time.Second,
	}
	for _, fn := range r.cfg.kafka {
		fn(w)
	}
	w.Topic = ""
	w.Async = false
	w.RequiredAcks = kafka.RequireAll
	w.BatchSize = r.cfg.batchSize
	w.BatchBytes = 1 << 30 // never split a partition's share; the relay caps the batch itself
	if w.Balancer == nil {
		w.Balancer = kafka.Murmur2Balancer{}
	}
	return w
}

// connConfig returns the pool's connection settings (search_path
// included) for a dedicated connection outside the pool: session locks and
// LISTEN must not leak into pooled connections.
func (r *Relay) connConfig(appName string) *pgx.ConnConfig {
	cc := r.pool.Config().ConnConfig
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	cc.RuntimeParams["application_name"] = appName
	return cc
}

// loop is the state of one Run.
type loop struct {
	r    *Relay
	t    resolvedTable
	q    queries
	w    *kafka.Writer
	wake chan struct{}
	s    *session
	bo   backoff
	// parked are keys whose partition refused them recently: the claim
	// leaves all their rows alone until the key's own backoff ends, so the
	// keys behind them in the lanes keep flowing while their order is kept.
	parked map[topicKey]*parkedKey
	// parkedTopics are topics the broker refused as a whole (missing,
	// invalid, not authorized): the claim leaves every row of them alone
	// until the topic's own backoff ends, so they cannot fill the head of
	// the lanes and hold up the other topics.
	parkedTopics map[string]*parkedKey

	nextRebalance, nextCleanup, nextStatus time.Time
}

func (l *loop) run(ctx context.Context) error {
	cfg := &l.r.cfg
	now := time.Now()
	l.nextCleanup, l.nextStatus = now, now
	for ctx.Err() == nil {
		if l.s == nil {
			s, err := connectSession(ctx, l.r.connConfig("protoevents-relay"), l.t)
			if err != nil {
				l.failed(ctx, err)
				continue
			}
			l.s, l.nextRebalance = s, time.Time{}
		}
		now := time.Now()
		if !now.Before(l.nextRebalance) {
			changed, err := l.s.rebalance(ctx)
			if err != nil {
				l.dropSession(ctx)
				l.failed(ctx, err)
				continue
			}
			if changed {
				l.r.log.Debug("outbox relay: lanes", "owned", l.s.owned)
				if f := cfg.metrics.Lanes; f != nil {
					f(len(l.s.owned))
				}
			}
			l.nextRebalance = now.Add(cfg.rebalanceInterval)
		}
		if !now.Before(l.nextCleanup) {
			l.cleanup(ctx)
			l.nextCleanup = now.Add(cfg.cleanupInterval)
		}
		if !now.Before(l.nextStatus) && cfg.metrics.Pending != nil {
			var st TableStatus
			if err := scanPending(ctx, l.s.conn, l.q, &st); err == nil {
				cfg.metrics.Pending(st.Pending, st.OldestPending)
			}
			l.nextStatus = now.Add(cfg.statusInterval)
		}
		more, err := l.batch(ctx)
		if err != nil {
			var crash *crashError
			if errors.As(err, &crash) {
				return err
			}
			if ctx.Err() != nil {
				return nil
			}
			var partial *partialError
			if errors.As(err, &partial) && (partial.acked > 0 || partial.topics > 0) {
				// Some partitions took their share, or the failure was
				// confined to topics now parked: the failing keys and
				// topics wait, the rest can go on at once.
				l.report(err)
				continue
			}
			if l.s.conn.IsClosed() {
				l.dropSession(ctx)
			}
			l.failed(ctx, err)
			continue
		}
		l.bo.reset()
		if !more {
			l.idle(ctx)
		}
	}
	return nil
}

// idle waits for a notification, the poll interval or the next periodic
// task, whichever comes first.
func (l *loop) idle(ctx context.Context) {
	d := min(l.r.cfg.pollInterval, time.Until(l.nextRebalance), time.Until(l.nextCleanup))
	if l.r.cfg.metrics.Pending != nil {
		d = min(d, time.Until(l.nextStatus))
	}
	for _, p := range l.parked {
		if u := time.Until(p.until); u > 0 {
			d = min(d, u) // retry a parked key when its backoff ends
		}
	}
	for _, p := range l.parkedTopics {
		if u := time.Until(p.until); u > 0 {
			d = min(d, u)
		}
	}
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-l.wake:
	case <-t.C:
	}
}

// failed reports err and sleeps for the next backoff delay.
func (l *loop) failed(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	d := l.bo.next()
	l.r.log.Warn("outbox relay: retrying", "err", err, "backoff", d)
	if f := l.r.cfg.metrics.PublishFailed; f != nil {
		f(err)
	}
	sleep(ctx, d)
}

// report records a failure that needs no pause.
func (l *loop) report(err error) {
	l.r.log.Warn("outbox relay: partial failure; failing keys and topics parked", "err", err, "parked_keys", len(l.parked), "parked_topics", len(l.parkedTopics))
	if f := l.r.cfg.metrics.PublishFailed; f != nil {
		f(err)
	}
}

// partialError is a publish in which some rows failed; acked counts those
// the broker took, topics the topics parked because of it.
type partialError struct {
	acked  int
	topics int
	err    error
}

func (e *partialError) Error() string { return e.err.Error() }
func (e *partialError) Unwrap() error { return e.err }

type topicKey struct{ topic, key string }

// parkedKey is the backoff state of one failing key.
type parkedKey struct {
	until time.Time
	fails int
}

// maxParked bounds the parked-key memory; past it, parking is forgotten
// (which costs only extra retries).
const maxParked = 100000

// park holds the keys back for their next backoff delay.
func (l *loop) park(keys []topicKey) {
	if l.parked == nil || len(l.parked) > maxParked {
		l.parked = map[topicKey]*parkedKey{}
	}
	now := time.Now()
	for _, k := range keys {
		p := l.parked[k]
		if p == nil {
			p = &parkedKey{}
			l.parked[k] = p
		}
		b := backoff{min: l.r.cfg.backoffMin, max: l.r.cfg.backoffMax, n: p.fails}
		p.fails++
		p.until = now.Add(b.next())
	}
}

// parkTopics holds every row of the topics back for the topic's next
// backoff delay.
func (l *loop) parkTopics(topics []string) {
	if l.parkedTopics == nil || len(l.parkedTopics) > maxParked {
		l.parkedTopics = map[string]*parkedKey{}
	}
	now := time.Now()
	for _, t := range topics {
		p := l.parkedTopics[t]
		if p == nil {
			p = &parkedKey{}
			l.parkedTopics[t] = p
		}
		b := backoff{min: l.r.cfg.backoffMin, max: l.r.cfg.backoffMax, n: p.fails}
		p.fails++
		p.until = now.Add(b.next())
	}
}

// parkedNow returns the keys (as topic and key arrays) and the topics still
// parked, as claim parameters; never nil, since a NULL array would make
// the claim skip every row.
func (l *loop) parkedNow() (keyTopics []string, keys [][]byte, topics []string) {
	now := time.Now()
	keyTopics, keys, topics = []string{}, [][]byte{}, []string{}
	for k, p := range l.parked {
		if now.Before(p.until) {
			keyTopics = append(keyTopics, k.topic)
			keys = append(keys, []byte(k.key))
		}
	}
	for t, p := range l.parkedTopics {
		if now.Before(p.until) {
			topics = append(topics, t)
		}
	}
	return keyTopics, keys, topics
}

func (l *loop) dropSession(ctx context.Context) {
	l.s.close(ctx)
	l.s = nil
	if f := l.r.cfg.metrics.Lanes; f != nil {
		f(0)
	}
}

// claimed is one claimed row with what publishing needs.
type claimed struct {
	Row
	value   []byte
	headers string
}

// batch relays one batch of the owned lanes. It reports whether more rows
// are probably waiting (the batch was full).
func (l *loop) batch(ctx context.Context) (more bool, err error) {
	if len(l.s.owned) == 0 {
		return false, nil
	}
	cfg := &l.r.cfg
	tx, err := l.s.conn.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("outbox: relay: begin: %w", err)
	}
	defer func() {
		if err != nil || ctx.Err() != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = tx.Rollback(rctx)
		}
	}()
	var rows pgx.Rows
	if keyTopics, keys, topics := l.parkedNow(); len(keys) > 0 || len(topics) > 0 {
		rows, err = tx.Query(ctx, l.q.claimUnparked, l.s.owned, cfg.batchSize, keyTopics, keys, topics)
	} else {
		rows, err = tx.Query(ctx, l.q.claim, l.s.owned, cfg.batchSize)
	}
	if err != nil {
		return false, fmt.Errorf("outbox: relay: claim: %w", err)
	}
	var batch []claimed
	var c claimed
	_, err = pgx.ForEachRow(rows, []any{&c.ID, &c.EventID, &c.EventType, &c.Topic, &c.Key, &c.Lane, &c.value, &c.headers, &c.Attempts}, func() error {
		batch = append(batch, c)
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("outbox: relay: claim: %w", err)
	}
	if len(batch) == 0 {
		if err := tx.Commit(ctx); err != nil {
			return false, fmt.Errorf("outbox: relay: commit: %w", err)
		}
		return false, nil
	}
	full := len(batch) == cfg.batchSize
	msgs := make([]kafka.Message, 0, len(batch))
	size := 0
	for i, row := range batch {
		hs, err := decodeHeaders(row.headers)
		if err != nil {
			return false, fmt.Errorf("outbox: relay: row %d (%s): %w", row.ID, row.EventID, err)
		}
		m := kafka.Message{Topic: row.Topic, Key: row.Key, Value: row.value, Headers: hs}
		// Cap the batch in bytes so every partition's share fits one
		// produce request; the rest stays pending for the next batch.
		if size += estimateSize(&m); i > 0 && size > cfg.maxBatchBytes {
			batch, full = batch[:i], true
			break
		}
		msgs = append(msgs, m)
	}
	if f := cfg.metrics.Batch; f != nil {
		f(len(batch))
	}

	pubErr := l.w.WriteMessages(ctx, msgs...)
	if pubErr != nil && ctx.Err() == nil {
		pubErr = l.retryByTopic(ctx, msgs, pubErr)
	}
	if pubErr != nil && ctx.Err() != nil {
		// Shutting down mid-publish: abandon; nothing is marked, the rows
		// are re-sent by whoever owns the lanes next.
		return false, ctx.Err()
	}
	acked, failed, failing := ackedRows(batch, pubErr)
	downTopics := refusedTopics(batch, pubErr)
	if len(downTopics) > 0 {
		// The topic's rows wait as a whole; parking its keys as well
		// would only grow the claim's parameters.
		down := make(map[string]bool, len(downTopics))
		for _, t := range downTopics {
			down[t] = true
		}
		failing = slices.DeleteFunc(failing, func(k topicKey) bool { return down[k.topic] })
	}
	if pubErr == nil && cfg.hooks.AfterPublish != nil {
		rows := make([]Row, len(batch))
		for i := range batch {
			rows[i] = batch[i].Row
		}
		if herr := cfg.hooks.AfterPublish(ctx, rows); herr != nil {
			return false, &crashError{err: herr}
		}
	}
	// The broker has the acknowledged rows: mark them even if ctx is being
	// canceled, to spare the consumers duplicates.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if len(acked) > 0 {
		if _, err := tx.Exec(mctx, l.q.markPublished, acked); err != nil {
			return false, fmt.Errorf("outbox: relay: mark published: %w", err)
		}
	}
	if len(failed) > 0 {
		if _, err := tx.Exec(mctx, l.q.markFailed, failed, failureText(pubErr)); err != nil {
			return false, fmt.Errorf("outbox: relay: record failure: %w", err)
		}
	}
	if err := tx.Commit(mctx); err != nil {
		return false, fmt.Errorf("outbox: relay: commit: %w", err)
	}
	if f := cfg.metrics.Published; f != nil && len(acked) > 0 {
		f(len(acked))
	}
	if len(l.parked) > 0 && len(acked) > 0 {
		// Keys that got through are no longer parked.
		still := make(map[topicKey]bool, len(failing))
		for _, k := range failing {
			still[k] = true
		}
		for i := range batch {
			if k := (topicKey{batch[i].Topic, string(batch[i].Key)}); !still[k] {
				delete(l.parked, k)
			}
		}
	}
	if len(l.parkedTopics) > 0 && len(acked) > 0 {
		// Topics that got through are no longer parked.
		ok := make(map[int64]bool, len(acked))
		for _, id := range acked {
			ok[id] = true
		}
		for i := range batch {
			if ok[batch[i].ID] {
				delete(l.parkedTopics, batch[i].Topic)
			}
		}
	}
	if pubErr != nil {
		l.park(failing)
		l.parkTopics(downTopics)
		return false, &partialError{acked: len(acked), topics: len(downTopics), err: fmt.Errorf("outbox: relay: publish %d of %d rows failed: %w", len(failed), len(batch), pubErr)}
	}
	return full, nil
}

// retryByTopic handles a call that failed as a whole before sending
// anything (kafka-go checks every message's topic first, so one missing
// topic fails the call): if the batch spans several topics, it publishes
// them one topic at a time, so a bad topic fails alone and its keys get
// parked while the other topics flow. Topics are independent for ordering.
// It returns per-message errors (kafka.WriteErrors), or the original error
// when there is nothing to split.
func (l *loop) retryByTopic(ctx context.Context, msgs []kafka.Message, pubErr error) error {
	var werrs kafka.WriteErrors
	if errors.As(pubErr, &werrs) {
		return pubErr
	}
	var order []string
	byTopic := map[string][]int{}
	for i := range msgs {
		t := msgs[i].Topic
		if _, ok := byTopic[t]; !ok {
			order = append(order, t)
		}
		byTopic[t] = append(byTopic[t], i)
	}
	if len(order) < 2 {
		if isTopicError(pubErr) {
			// The one topic is refused as a whole: say so per message,
			// so the topic gets parked rather than the relay stopped.
			werrs = make(kafka.WriteErrors, len(msgs))
			for i := range werrs {
				werrs[i] = pubErr
			}
			return werrs
		}
		return pubErr
	}
	werrs = make(kafka.WriteErrors, len(msgs))
	failed := false
	for _, t := range order {
		idx := byTopic[t]
		sub := make([]kafka.Message, len(idx))
		for j, i := range idx {
			sub[j] = msgs[i]
		}
		err := l.w.WriteMessages(ctx, sub...)
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return err
		}
		failed = true
		var sw kafka.WriteErrors
		for j, i := range idx {
			if errors.As(err, &sw) && len(sw) == len(idx) {
				werrs[i] = sw[j]
			} else {
				werrs[i] = err
			}
		}
	}
	if !failed {
		return nil
	}
	return werrs
}

// isTopicError reports whether err (possibly wrapped) is the broker refusing
// a topic as a whole: it does not exist, its name is invalid, or the relay
// may not write to it.
func isTopicError(err error) bool {
	var ke kafka.Error
	if !errors.As(err, &ke) {
		return false
	}
	switch ke {
	case kafka.UnknownTopicOrPartition, kafka.InvalidTopic, kafka.TopicAuthorizationFailed:
		return true
	}
	return false
}

// refusedTopics returns the topics of a batch whose every message failed
// with a topic-level error (kafka.WriteErrors, per message): those are
// parked as a whole. A topic with one message through, or failing for
// another reason, is left to key parking.
func refusedTopics(batch []claimed, pubErr error) []string {
	var werrs kafka.WriteErrors
	if pubErr == nil || !errors.As(pubErr, &werrs) || len(werrs) != len(batch) {
		return nil
	}
	refused := map[string]bool{}
	var order []string
	for i := range batch {
		t := batch[i].Topic
		bad, seen := refused[t]
		if !seen {
			order = append(order, t)
			bad = true
		}
		refused[t] = bad && isTopicError(werrs[i])
	}
	return slices.DeleteFunc(order, func(t string) bool { return !refused[t] })
}

// failureText is the error recorded on failed rows: for per-message errors,
// the first of them, which kafka.WriteErrors' own text leaves out.
func failureText(err error) string {
	var werrs kafka.WriteErrors
	if errors.As(err, &werrs) {
		for _, e := range werrs {
			if e != nil {
				return fmt.Sprintf("%v: %v", err, e)
			}
		}
	}
	return err.Error()
}

// ackedRows splits a published batch into the rows to mark published and
// those to retry: a row is marked only if the broker acknowledged it and no
// earlier row with the same topic and key failed, so a key never gets ahead
// of one of its own unpublished events. failing lists the keys refused per
// message (kafka.WriteErrors), to be parked; it is empty when the whole
// call failed.
func ackedRows(batch []claimed, pubErr error) (acked, failed []int64, failing []topicKey) {
	if pubErr == nil {
		acked = make([]int64, len(batch))
		for i := range batch {
			acked[i] = batch[i].ID
		}
		return acked, nil, nil
	}
	var werrs kafka.WriteErrors
	if !errors.As(pubErr, &werrs) || len(werrs) != len(batch) {
		failed = make([]int64, len(batch))
		for i := range batch {
			failed[i] = batch[i].ID
		}
		return nil, failed, nil
	}
	blocked := map[topicKey]bool{}
	for i := range batch {
		k := topicKey{batch[i].Topic, string(batch[i].Key)}
		if werrs[i] != nil || blocked[k] {
			if !blocked[k] {
				failing = append(failing, k)
			}
			blocked[k] = true
			failed = append(failed, batch[i].ID)
			continue
		}
		acked = append(acked, batch[i].ID)
	}
	return acked, failed, failing
}

// estimateSize bounds the bytes a message takes in a produce request
// (record overhead, varints, headers) from above.
func estimateSize(m *kafka.Message) int {
	n := 64 + len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += 16 + len(h.Key) + len(h.Value)
	}
	return n
}

// cleanup deletes published rows older than the retention, a batch at a
// time, until none is left or ctx ends. Errors are only logged: cleanup can
// wait for the next round.
func (l *loop) cleanup(ctx context.Context) {
	secs := l.r.cfg.retention.Seconds()
	total := int64(0)
	for ctx.Err() == nil {
		tag, err := l.s.conn.Exec(ctx, l.q.cleanup, secs, l.r.cfg.cleanupBatch)
		if err != nil {
			if ctx.Err() == nil {
				l.r.log.Warn("outbox relay: cleanup", "err", err)
			}
			return
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(l.r.cfg.cleanupBatch) {
			break
		}
	}
	if total > 0 {
		l.r.log.Debug("outbox relay: cleaned up published rows", "rows", total)
	}
}

// listen keeps a LISTEN connection on the table's channel and turns
// notifications into wake-ups, reconnecting (with backoff) when the
// connection dies. Each (re)connect also wakes the relay, in case a
// notification was missed meanwhile.
func (r *Relay) listen(ctx context.Context, channel string, wake chan<- struct{}) {
	bo := backoff{min: r.cfg.backoffMin, max: r.cfg.backoffMax}
	for ctx.Err() == nil {
		err := r.listenOnce(ctx, channel, wake, &bo)
		if ctx.Err() != nil {
			return
		}
		d := bo.next()
		r.log.Warn("outbox relay: listen connection lost", "err", err, "backoff", d)
		signal(wake)
		sleep(ctx, d)
	}
}

func (r *Relay) listenOnce(ctx context.Context, channel string, wake chan<- struct{}, bo *backoff) error {
	conn, err := pgx.ConnectConfig(ctx, r.connConfig("protoevents-relay-listen"))
	if err != nil {
		return fmt.Errorf("outbox: relay: listen: connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return fmt.Errorf("outbox: relay: listen: %w", err)
	}
	bo.reset()
	signal(wake)
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return fmt.Errorf("outbox: relay: wait for notification: %w", err)
		}
		signal(wake)
	}
}

// signal wakes the loop without blocking; one pending wake-up is enough.
func signal(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// backoff yields exponentially growing delays with jitter (each in
// [d/2, d]), so relays that failed together do not retry together.
type backoff struct {
	min, max time.Duration
	n        int
}

func (b *backoff) next() time.Duration {
	d := b.min << min(b.n, 30)
	if d <= 0 || d > b.max {
		d = b.max
	}
	b.n++
	return d/2 + rand.N(d/2+1)
}

func (b *backoff) reset() { b.n = 0 }
