package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
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
// giving up extra ones when nothing is in flight and taking free ones. All
// of a relay's locks and its claims live on one connection, so a crashed or
// partitioned relay loses its lanes exactly when its session ends.
//
// # Finding rows: adaptive polling
//
// The relay polls its lanes' pending rows (a partial index on id): right
// after work a millisecond after its last look, doubling the delay on every
// empty poll up to the poll interval (WithPollInterval, default 100ms). A
// Writer in the same process wakes it at once (Writer.Notify): a PipelineTx
// right after its COMMIT, when one poll finds the rows; a Write on another
// transaction right after its insert, followed by quick polls that catch the
// caller's commit. There is no NOTIFY trigger: it would serialise the
// commits of all outbox writers (docs/design.md).
//
// # Pipelined batches
//
// A batch is claimed (the first rows of the owned lanes in id order,
// without a transaction: the lanes are exclusive), published with one
// kafka-go WriteMessages call (per-message topic, key = event key,
// acks=all, murmur2 partitioning like the Java client) and marked
// published in one UPDATE. While a batch is in flight the relay marks the
// previous one and claims the next (excluding the rows in flight), so the
// database work overlaps the produce round trip: at once when rows are
// known or likely to wait (the last claim left some, a wake-up came, or the
// poll delay passed), else as soon as a wake-up comes before the
// acknowledgement. At most one batch is in
// flight: the next is sent only once the previous one is acknowledged, and
// without the rows of keys that failed in it, so a key's events never
// overtake each other. The batch size adapts to the backlog: it starts at
// 64 rows, doubles while batches come back full, up to WithBatchSize
// (default 500), and halves when they come back mostly empty.
//
// With WithWorkers(n) one Run holds n such pipelines, each with its own
// session and its own share of the lanes, exactly as n relays would: the
// database work of n batches overlaps, and order holds as across relays.
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
// # Shutdown and takeover
//
// When ctx ends, the batch in flight gets the shutdown grace
// (WithShutdownGrace, default 5s) to be acknowledged and marked; only a
// batch still unacknowledged after it is abandoned (its rows stay pending
// and are re-sent). If a relay's database session dies while its publish is
// still in flight, the lanes' next owner re-sends from the same first
// pending row. Both batches are contiguous runs of each key's events, each
// appended atomically per partition, so after deduplication by event_id
// every key is still in order, although the raw log may then hold a stale
// duplicate after newer events.
//
// # Health
//
// Health, LiveHandler and ReadyHandler report whether the relay runs, can
// reach the database and the brokers (checked every WithHealthInterval and
// by its own work) and makes progress. Run waits for both at start, with
// backoff, and never returns on an outage; repeated identical errors are
// logged once and then summarised (WithLogInterval), recoveries are logged.
//
// # Known limits
//
// Rows for a topic that does not exist (and is not auto-created, see
// WithKafkaWriter) stay pending, the topic parked and retried with backoff
// (up to WithBackoff's maximum), until the topic is created; other topics
// flow meanwhile and the error is in TableStatus.LastError. The lane count
// is fixed per table.
type Relay struct {
	pool    *pgxpool.Pool
	brokers []string
	table   tableName
	cfg     relayConfig
	log     *slog.Logger
	running atomic.Bool
	health  healthState
	folds   folder
	tracer  batchTracer
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
	for _, b := range brokers {
		if b == "" {
			return nil, errors.New("outbox: relay: empty Kafka broker address: give host:port")
		}
	}
	c := relayConfig{
		table:             DefaultTable,
		batchSize:         defaultBatchSize,
		workers:           defaultWorkers,
		maxBatchBytes:     900 << 10,
		pollInterval:      defaultPollInterval,
		rebalanceInterval: 2 * time.Second,
		statusInterval:    10 * time.Second,
		retention:         24 * time.Hour,
		cleanupInterval:   time.Minute,
		cleanupBatch:      1000,
		backoffMin:        100 * time.Millisecond,
		backoffMax:        30 * time.Second,
		logger:            slog.Default(),
		shutdownGrace:     5 * time.Second,
		healthInterval:    5 * time.Second,
		stallTimeout:      time.Minute,
		logInterval:       30 * time.Second,
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
	log := c.logger.With("outbox", t.String())
	r := &Relay{pool: pool, brokers: append([]string(nil), brokers...), table: t, cfg: c, log: log}
	r.folds = folder{log: log, every: c.logInterval}
	r.tracer = newBatchTracer(c.tracerProvider)
	return r, nil
}

// Defaults of the adaptive batch size: it starts at minBatch (or the
// configured maximum, if smaller) and grows up to the maximum.
const (
	defaultBatchSize = 500
	minBatch         = 64
)

// crashError is a hook's simulated crash; Run returns it.
type crashError struct{ err error }

func (e *crashError) Error() string { return "outbox: relay: hook: " + e.err.Error() }
func (e *crashError) Unwrap() error { return e.err }

// Run relays until ctx is canceled, then returns nil after shutting down:
// the batch in flight gets the shutdown grace (WithShutdownGrace) to be
// acknowledged and marked. It waits for the database and the brokers at
// start and retries their failures with backoff (each failure is logged,
// folded when repeated, and reported to Metrics.PublishFailed); it returns
// an error only if the table does not exist (ErrNoTable) or is not an
// outbox, or a hook simulated a crash. A Relay runs at most once at a time.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("outbox: relay: already running")
	}
	defer r.running.Store(false)
	r.health.start()
	defer r.health.stop()

	w := r.newKafkaWriter()
	kc := &kafka.Client{Addr: w.Addr, Transport: w.Transport}
	probeCtx, stopProbe := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.probe(probeCtx, kc)
	}()
	defer func() {
		stopProbe()
		wg.Wait()
	}()

	// The batch in flight at shutdown keeps going for the grace period.
	graceCtx, cancelGrace := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelGrace()
	stopGrace := context.AfterFunc(ctx, func() { time.AfterFunc(r.cfg.shutdownGrace, cancelGrace) })
	defer stopGrace()

	rt, err := r.resolveTable(ctx)
	if err != nil {
		_ = w.Close()
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	r.health.setTable(rt)
	r.waitKafka(ctx, kc)

	// Every worker is a loop with its own session and lanes; the first one
	// also runs the periodic cleanup and the pending-rows metric. A hook's
	// simulated crash in one stops them all.
	loops := make([]*loop, r.cfg.workers)
	errs := make([]error, len(loops))
	loopCtx, stopLoops := context.WithCancel(ctx)
	defer stopLoops()
	var lwg sync.WaitGroup
	start := newStartBarrier(len(loops))
	q := newQueries(rt.qualified())
	for i := range loops {
		wake, unregister := registerWake(rt.schema, rt.name)
		defer unregister()
		// Each worker has a writer of its own: send sets its batch size
		// for every call.
		lw := w
		if i > 0 {
			lw = r.newKafkaWriter()
		}
		l := &loop{r: r, worker: i, t: rt, q: q, w: lw, wake: wake, grace: graceCtx,
			bo: backoff{min: r.cfg.backoffMin, max: r.cfg.backoffMax}, limit: min(minBatch, r.cfg.batchSize), poll: pollMin,
			start: start}
		loops[i] = l
		lwg.Add(1)
		go func() {
			defer lwg.Done()
			if errs[i] = l.run(loopCtx); errs[i] != nil {
				stopLoops()
			}
		}()
	}
	lwg.Wait()

	// Shut down in an order that keeps lane ownership airtight: first let
	// kafka-go finish any produce request still in flight, then drop the
	// sessions, which frees the lanes for the other relays.
	for _, l := range loops {
		if cerr := l.w.Close(); cerr != nil {
			r.log.Warn("outbox relay: close kafka writer", "err", cerr)
		}
	}
	for _, l := range loops {
		if l.s != nil {
			l.s.close(ctx)
		}
	}
	return errors.Join(errs...)
}

// resolveTable looks the outbox table up, retrying with backoff while the
// database cannot be reached or fails; only a table that does not exist, or
// is not an outbox, ends it with an error (or ctx, with ctx's error).
func (r *Relay) resolveTable(ctx context.Context) (resolvedTable, error) {
	bo := backoff{min: r.cfg.backoffMin, max: r.cfg.backoffMax}
	for {
		r.health.alive() // waiting for a dependency is not being stuck
		rt, err := resolve(ctx, r.pool, r.table)
		if err == nil {
			r.dep(depDatabase, nil)
			return rt, nil
		}
		if ctx.Err() != nil {
			return rt, ctx.Err()
		}
		if errors.Is(err, ErrNoTable) || errors.Is(err, errNotOutbox) {
			return rt, err
		}
		r.dep(depDatabase, err)
		d := bo.next()
		r.folds.warn(depDatabase, "outbox relay: waiting for the database", err, "backoff", d)
		if f := r.cfg.metrics.PublishFailed; f != nil {
			f(err)
		}
		sleep(ctx, d)
	}
}

// waitKafka returns once the brokers answer (or ctx ends), retrying with
// backoff: a relay that cannot reach them would only fail its batches.
func (r *Relay) waitKafka(ctx context.Context, kc *kafka.Client) {
	bo := backoff{min: r.cfg.backoffMin, max: r.cfg.backoffMax}
	for ctx.Err() == nil {
		r.health.alive()
		err := r.pingKafka(ctx, kc)
		if ctx.Err() != nil {
			return
		}
		r.dep(depKafka, err)
		if err == nil {
			return
		}
		d := bo.next()
		r.folds.warn(depKafka, "outbox relay: waiting for the Kafka brokers", err, "brokers", r.brokers, "backoff", d)
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
		BatchTimeout:    time.Nanosecond,
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
// included) for a dedicated connection outside the pool: session locks must
// not leak into pooled connections.
func (r *Relay) connConfig(appName string) *pgx.ConnConfig {
	cc := r.pool.Config().ConnConfig
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	cc.RuntimeParams["application_name"] = appName
	return cc
}

// defaultWorkers is the lane workers a relay runs unless WithWorkers says
// otherwise. One: every worker is a database connection, and with several
// relay processes of several workers each the sessions can outnumber half
// the lanes, so that the even split leaves a process without any
// (docs/design.md, "Lane workers").
const defaultWorkers = 1

// farFuture is the next run of a periodic task a worker never runs.
var farFuture = time.Unix(1<<40, 0)

// loop is the state of one worker of a Run.
type loop struct {
	r *Relay
	// worker numbers the loop among the relay's workers (WithWorkers);
	// worker 0 also runs the periodic cleanup and pending-rows metric.
	worker int
	t      resolvedTable
	q      queries
	w      *kafka.Writer
	wake   *waker
	// grace is canceled the shutdown grace after Run's ctx: the batch in
	// flight is published and marked under it.
	grace context.Context
	s     *session
	bo    backoff
	// fast counts the polls at pollMin left after a wake-up (wakeFastPolls)
	// before the idle poll delay doubles again.
	fast int
	// limit is the adaptive batch size; poll the next idle poll delay.
	limit int
	// lastLook is when the last claim ended (or a pump found no lanes to
	// claim from); the next idle poll comes the poll delay after it.
	// backlog says the last claim left rows behind in the lanes (some
	// lane gave its whole quota).
	lastLook time.Time
	backlog  bool
	// demand is what each owned lane gave the last claim, which the next
	// quotas follow; turn is where the lanes taken in turn start.
	demand map[int]laneDemand
	turn   int
	poll   time.Duration
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
	// cleaned is set once worker 0 ran its first cleanup.
	cleaned bool

	// start lets the first lane split wait until every worker has
	// announced itself, so that one worker does not take every lane for a
	// rebalance interval.
	start     *startBarrier
	announced bool
}

// startBarrier is passed once every worker of a Run has announced itself.
type startBarrier struct {
	left atomic.Int32
	all  chan struct{}
}

func newStartBarrier(workers int) *startBarrier {
	b := &startBarrier{all: make(chan struct{})}
	b.left.Store(int32(workers))
	return b
}

// arrive counts one worker in; the last one opens the barrier.
func (b *startBarrier) arrive() {
	if b.left.Add(-1) == 0 {
		close(b.all)
	}
}

// wait returns once every worker arrived, ctx ended or d passed (a worker
// that cannot connect must not hold up the others).
func (b *startBarrier) wait(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-b.all:
	case <-ctx.Done():
	case <-t.C:
	}
}

func (l *loop) run(ctx context.Context) error {
	cfg := &l.r.cfg
	now := time.Now()
	// The first cleanup waits until the relay has caught up (or for one
	// cleanup interval): a relay starting on a backlog, after an outage or
	// a deploy, publishes first.
	l.nextCleanup, l.nextStatus = now.Add(cfg.cleanupInterval), now
	if l.worker > 0 {
		l.nextCleanup, l.nextStatus = farFuture, farFuture
	}
	for ctx.Err() == nil {
		l.r.health.alive()
		if l.s == nil {
			s, err := connectSession(ctx, l.r.connConfig("protoevents-relay"), l.t)
			if err != nil {
				l.failed(ctx, dbErr(err))
				continue
			}
			l.s, l.nextRebalance = s, time.Time{}
			if !l.announced {
				l.announced = true
				l.start.arrive()
				l.start.wait(ctx, l.r.cfg.rebalanceInterval)
			}
		}
		now := time.Now()
		if !now.Before(l.nextRebalance) {
			changed, err := l.s.rebalance(ctx)
			if err != nil {
				l.dropSession(ctx)
				l.failed(ctx, dbErr(err))
				continue
			}
			l.r.dep(depDatabase, nil)
			if changed {
				l.r.log.Debug("outbox relay: lanes", "owned", l.s.owned)
				total := l.r.health.setLanes(l.worker, l.s.owned)
				if f := cfg.metrics.Lanes; f != nil {
					f(total)
				}
			}
			l.nextRebalance = now.Add(cfg.rebalanceInterval)
		}
		if !now.Before(l.nextCleanup) {
			l.cleanup(ctx)
			l.cleaned = true
			l.nextCleanup = now.Add(cfg.cleanupInterval)
		}
		if !now.Before(l.nextStatus) && cfg.metrics.Pending != nil {
			var st TableStatus
			if err := scanPending(ctx, l.s.conn, l.q, &st); err == nil {
				cfg.metrics.Pending(st.Pending, st.OldestPending)
			}
			l.nextStatus = now.Add(cfg.statusInterval)
		}
		n, err := l.pump(ctx)
		if err != nil {
			var crash *crashError
			if errors.As(err, &crash) {
				return err
			}
			if ctx.Err() != nil {
				return nil
			}
			if l.s.conn.IsClosed() {
				l.dropSession(ctx)
			}
			l.failed(ctx, err)
			continue
		}
		l.bo.reset()
		switch {
		case n > 0:
			// Right after work (claim has reset the poll delay) the next
			// poll comes pollMin after the last look, sooner on a
			// wake-up; a backlog goes on at once.
			if l.backlog {
				continue
			}
		case l.worker == 0 && !l.cleaned:
			l.nextCleanup = time.Now() // caught up: the first cleanup is due
			continue
		}
		l.idle(ctx)
	}
	return nil
}

// due reports whether a periodic task waits: the pipeline then drains so
// that it runs with nothing in flight.
func (l *loop) due() bool {
	now := time.Now()
	return !now.Before(l.nextRebalance) || !now.Before(l.nextCleanup) ||
		(l.r.cfg.metrics.Pending != nil && !now.Before(l.nextStatus))
}

// idle waits for a wake-up, the adaptive poll delay or the next periodic
// task, whichever comes first. The poll delay doubles after every empty
// poll, up to the poll interval; a wake-up or work resets it.
func (l *loop) idle(ctx context.Context) {
	if l.woken() {
		return
	}
	d := min(l.poll-time.Since(l.lastLook), time.Until(l.nextRebalance), time.Until(l.nextCleanup))
	if l.fast > 0 {
		l.fast-- // just woken: the rows come with the writer's commit, any moment now
	} else {
		l.poll = min(2*l.poll, l.r.cfg.pollInterval)
	}
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
	case <-l.wake.ch:
		l.gotWake()
	case <-t.C:
	}
}

// woken reports whether a wake-up came since the last look, taking it.
func (l *loop) woken() bool {
	select {
	case <-l.wake.ch:
		l.gotWake()
		return true
	default:
		return false
	}
}

// gotWake resets the poll delay on a wake-up; one sent before the writer's
// commit keeps the polls quick for a while, since the rows come with that
// commit, any moment now.
func (l *loop) gotWake() {
	l.poll = pollMin
	if l.wake.uncommitted.Swap(false) {
		l.fast = wakeFastPolls
	}
}

// claimDue reports whether the claim of the next batch should run while a
// batch is in flight: when the last claim left rows behind (a backlog),
// a wake-up announced rows, or the poll delay passed since the last look.
// Otherwise the pipeline drains and the rows that come meanwhile are found
// by the next wake-up or poll, which saves the database a claim per batch
// when rows trickle in.
func (l *loop) claimDue() bool {
	return l.backlog || l.woken() || time.Since(l.lastLook) >= l.poll
}

// failed reports err, records it in the health and sleeps for the next
// backoff delay.
func (l *loop) failed(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	dep := depOf(err)
	if dep == depDatabase || dep == depKafka {
		l.r.dep(dep, err)
	}
	d := l.bo.next()
	l.r.folds.warn(dep, "outbox relay: retrying", err, "backoff", d)
	if f := l.r.cfg.metrics.PublishFailed; f != nil {
		f(err)
	}
	sleep(ctx, d)
}

// report records a failure that needs no pause.
func (l *loop) report(err error) {
	l.r.folds.warn(depPublish, "outbox relay: partial failure; failing keys and topics parked", err, "parked_keys", len(l.parked), "parked_topics", len(l.parkedTopics))
	if f := l.r.cfg.metrics.PublishFailed; f != nil {
		f(err)
	}
}

// publishError is a publish in which rows failed. Its text sums the
// per-message errors up (each distinct error once, with its row count and
// topics) where kafka.WriteErrors repeats one text per message.
type publishError struct{ out *outcome }

func (e *publishError) Error() string {
	out := e.out
	var werrs kafka.WriteErrors
	if !errors.As(out.pubErr, &werrs) || len(werrs) != len(out.batch) {
		return fmt.Sprintf("outbox: relay: publish %d rows: %v", len(out.batch), out.pubErr)
	}
	type group struct {
		rows   int
		topics []string
	}
	var order []string
	groups := map[string]*group{}
	for i, err := range werrs {
		if err == nil {
			continue
		}
		text := err.Error()
		g := groups[text]
		if g == nil {
			g = &group{}
			groups[text] = g
			order = append(order, text)
		}
		g.rows++
		if t := out.batch[i].Topic; !slices.Contains(g.topics, t) {
			g.topics = append(g.topics, t)
		}
	}
	parts := make([]string, len(order))
	for i, text := range order {
		g := groups[text]
		parts[i] = fmt.Sprintf("%s (%d rows, topics %q)", text, g.rows, g.topics)
	}
	return fmt.Sprintf("outbox: relay: publish: %d of %d rows failed: %s", len(out.failed), len(out.batch), strings.Join(parts, "; "))
}

func (e *publishError) Unwrap() error { return e.out.pubErr }

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
// the claim skip every row. Claims start at the head of the lanes, so a key
// whose backoff ended is claimed from its earliest pending row.
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

// failedIn reports whether a row's key or topic failed in the judged batch:
// its later rows, claimed while that batch was in flight, must wait.
func failedIn(out *outcome, c *claimed) bool {
	return slices.Contains(out.refusedTopics, c.Topic) ||
		slices.Contains(out.failing, topicKey{c.Topic, string(c.Key)})
}

func (l *loop) dropSession(ctx context.Context) {
	l.s.close(ctx)
	l.s = nil
	total := l.r.health.setLanes(l.worker, nil)
	if f := l.r.cfg.metrics.Lanes; f != nil {
		f(total)
	}
}

// claimed is one claimed row with what publishing needs.
type claimed struct {
	Row
	value   []byte
	headers string
}

// claim reads the next batch of the owned lanes: the first pending rows of
// each lane, as many as its quota (quotas), without those in flight and
// those of keys and topics parked now; it returns them in id order and
// adapts the batch size and the quotas.
func (l *loop) claim(ctx context.Context, inFlight []claimed) ([]claimed, error) {
	exclude := make([]int64, len(inFlight))
	for i := range inFlight {
		exclude[i] = inFlight[i].ID
	}
	// The next look is timed from the end of this one: a claim slower
	// than the poll delay must not be followed by another at once.
	defer func() { l.lastLook = time.Now() }()
	lanes, quotas := l.quotas()
	var rows pgx.Rows
	var err error
	if keyTopics, keys, topics := l.parkedNow(); len(keys) > 0 || len(topics) > 0 {
		rows, err = l.s.conn.Query(ctx, l.q.claimUnparked, lanes, quotas, exclude, keyTopics, keys, topics)
	} else {
		rows, err = l.s.conn.Query(ctx, l.q.claim, lanes, quotas, exclude)
	}
	if err != nil {
		return nil, dbErr(fmt.Errorf("outbox: relay: claim: %w", err))
	}
	var batch []claimed
	var c claimed
	_, err = pgx.ForEachRow(rows, []any{&c.ID, &c.EventID, &c.EventType, &c.Topic, &c.Key, &c.Lane, &c.value, &c.headers, &c.Attempts}, func() error {
		batch = append(batch, c)
		return nil
	})
	if err != nil {
		return nil, dbErr(fmt.Errorf("outbox: relay: claim: %w", err))
	}
	l.r.dep(depDatabase, nil)
	// The rows come lane after lane, every lane's in id order. Cut to the
	// batch size in id order, the batch still holds a first part of every
	// lane's rows.
	slices.SortFunc(batch, func(a, b claimed) int { return cmp.Compare(a.ID, b.ID) })
	more := l.noteDemand(batch, lanes, quotas)
	l.backlog = more || len(batch) > l.limit
	if len(batch) > 0 {
		l.poll = pollMin // work resets the poll delay
	}
	if len(batch) > l.limit {
		// Every lane was asked for the whole batch size, and together they
		// hold more: a backlog, so the batch grows to what it may hold at
		// once rather than doubling claim by claim.
		l.limit = min(len(batch), l.r.cfg.batchSize)
		batch = batch[:l.limit]
	}
	switch n := len(batch); {
	case more:
		l.limit = min(2*l.limit, l.r.cfg.batchSize)
	case n < l.limit/4:
		l.limit = max(min(minBatch, l.r.cfg.batchSize), l.limit/2)
	}
	if h := l.r.cfg.hooks.AfterClaim; h != nil && len(batch) > 0 {
		h(ctx, rowsOf(batch))
	}
	return batch, nil
}

// quotas splits the batch size among the owned lanes: how many rows the
// claim reads from each (lanes with none are left out). Every set of
// per-lane quotas keeps per-key order, since the claim takes each lane's
// first rows; so the quotas follow the demand the last claim saw
// (noteDemand), in three parts that add up to the batch size:
//
//   - one row a lane, so that rows arriving in an idle lane go out at the
//     next claim (with more lanes than the batch holds, half the batch,
//     one row a lane to lanes taken in turn);
//   - to each lane that gave fewer rows than its quota, as many as it gave
//     (what arrives there between claims);
//   - the rest evenly to the lanes that gave their whole quota (they hold
//     more), or to every lane if none did.
//
// So a claim reads its batch and nothing more, a lane that turns busy
// shares the batch with the others at the next claim, and a backlog in
// one lane fills the batch but for one row per other lane. With no demand
// seen (the first claim, or one after an empty claim) every lane gets
// twice its even share (at least minLaneQuota, at most the batch size),
// and claim cuts the rows to the batch size in id order.
func (l *loop) quotas() (lanes, quotas []int) {
	owned := l.s.owned
	n := len(owned)
	if n == 0 {
		return nil, nil
	}
	if len(l.demand) == 0 {
		q := min(l.limit, max(minLaneQuota, (2*l.limit+n-1)/n))
		quotas = make([]int, n)
		for i := range quotas {
			quotas[i] = q
		}
		return owned, quotas
	}
	q := make([]int, n)
	left := l.limit
	reserve := n
	if left < n {
		reserve = left / 2
	}
	for k := range reserve {
		q[(l.turn+k)%n]++
	}
	left -= reserve
	var full []int
	for i, lane := range owned {
		switch d, ok := l.demand[lane]; {
		case ok && d.full:
			full = append(full, i)
		case ok && left > 0:
			give := min(d.got, left)
			q[i] += give
			left -= give
		}
	}
	if len(full) == 0 {
		full = make([]int, n)
		for i := range full {
			full[i] = i
		}
	}
	share, extra := left/len(full), left%len(full)
	for k, i := range full {
		q[i] += share
		if (k+l.turn)%len(full) < extra {
			q[i]++
		}
	}
	l.turn = (l.turn + max(reserve, 1)) % n
	lanes, quotas = make([]int, 0, n), make([]int, 0, n)
	for i, lane := range owned {
		if q[i] > 0 {
			lanes = append(lanes, lane)
			quotas = append(quotas, q[i])
		}
	}
	return lanes, quotas
}

// minLaneQuota is the least a lane is asked for when no demand is known:
// reading a few more rows of each lane costs less than the round trip of
// a claim that a tiny quota would leave short.
const minLaneQuota = 32

// laneDemand is what one lane gave the last claim.
type laneDemand struct {
	got  int
	full bool // it gave its whole quota: it may hold more
}

// noteDemand records what each lane gave the batch, for the next quotas
// (an empty claim forgets the demand); it reports whether any lane gave
// its whole quota, that is whether rows may be waiting beyond the batch.
func (l *loop) noteDemand(batch []claimed, lanes, quotas []int) bool {
	got := make(map[int]int, len(lanes))
	for i := range batch {
		got[batch[i].Lane]++
	}
	clear(l.demand)
	if len(batch) == 0 {
		return false
	}
	if l.demand == nil {
		l.demand = make(map[int]laneDemand, len(lanes))
	}
	more := false
	for i, lane := range lanes {
		d := laneDemand{got: got[lane], full: got[lane] >= quotas[i]}
		more = more || d.full
		l.demand[lane] = d
	}
	return more
}

func rowsOf(batch []claimed) []Row {
	rows := make([]Row, len(batch))
	for i := range batch {
		rows[i] = batch[i].Row
	}
	return rows
}

// flight is a batch being published.
type flight struct {
	batch []claimed
	msgs  []kafka.Message
	done  chan struct{}
	err   error // the publish's outcome, once done is closed
}

// outcome is a published batch, split into what to mark.
type outcome struct {
	batch          []claimed
	pubErr         error
	acked, failed  []int64
	failing        []topicKey
	refusedTopics  []string
	abandoned      bool // shutdown grace ran out: nothing to mark
	wholeCallError bool // nothing went through and no topic was parked
}

// pump relays batches, pipelined, until no row is left to claim, a
// periodic task is due, ctx ends or a failure needs a pause; it returns
// with nothing in flight, and the number of rows published.
func (l *loop) pump(ctx context.Context) (int, error) {
	if len(l.s.owned) == 0 {
		l.lastLook = time.Now() // nothing to look at: idle waits its poll delay
		return 0, nil
	}
	// The claims run under the grace context: canceling a query makes pgx
	// close the connection, which would also lose the marks of the batch
	// in flight. ctx is checked between the steps instead.
	cur, err := l.claim(l.grace, nil)
	if err != nil || len(cur) == 0 || ctx.Err() != nil {
		return 0, err
	}
	total := 0
	var prev *outcome
	for {
		l.r.health.alive()
		fl, err := l.send(cur)
		if err != nil {
			n, serr := l.settle(prev)
			return total + n, errors.Join(err, serr)
		}
		// While the batch is in flight: mark the previous one and claim
		// the next, at once when rows are known or likely (claimDue), or
		// as soon as a wake-up announces some before the acknowledgement.
		var next []claimed
		n, dberr := l.settle(prev)
		total += n
		prev = nil
		mayClaim := func() bool { return dberr == nil && ctx.Err() == nil && !l.due() }
		if mayClaim() && l.claimDue() {
			next, dberr = l.claim(l.grace, fl.batch)
		} else {
			select {
			case <-fl.done:
			case <-l.wake.ch:
				l.gotWake()
				if mayClaim() {
					next, dberr = l.claim(l.grace, fl.batch)
				}
			}
		}
		<-fl.done
		out := l.judge(fl)
		if out.abandoned {
			return total, ctx.Err()
		}
		if h := l.r.cfg.hooks.AfterPublish; h != nil && out.pubErr == nil {
			if herr := h(ctx, rowsOf(out.batch)); herr != nil {
				return total, &crashError{err: herr}
			}
		}
		if dberr != nil {
			n, _ := l.settle(out)
			return total + n, dberr
		}
		if out.wholeCallError {
			n, serr := l.settle(out)
			perr := error(&depError{dep: depKafka, err: &publishError{out: out}})
			var werrs kafka.WriteErrors
			if errors.As(out.pubErr, &werrs) {
				// The brokers answered, refusing every row: they are
				// reachable, the rows are the problem.
				perr = &depError{dep: depPublish, err: &publishError{out: out}}
			}
			return total + n, errors.Join(perr, serr)
		}
		if out.pubErr != nil {
			l.report(&publishError{out: out})
		}
		prev = out
		if ctx.Err() != nil {
			break
		}
		// The next batch goes out only now that this one is acknowledged,
		// and without the keys and topics that just failed (parked).
		if out.pubErr != nil {
			next = slices.DeleteFunc(next, func(c claimed) bool { return failedIn(out, &c) })
		}
		if len(next) == 0 {
			break
		}
		cur = next
	}
	n, err := l.settle(prev)
	return total + n, err
}

// send starts publishing batch (up to the batch byte cap: the rest is
// dropped from it and claimed again later) and returns the flight.
func (l *loop) send(batch []claimed) (*flight, error) {
	msgs := make([]kafka.Message, 0, len(batch))
	size := 0
	for i, row := range batch {
		hs, err := decodeHeaders(row.headers)
		if err != nil {
			return nil, fmt.Errorf("outbox: relay: row %d (%s): %w", row.ID, row.EventID, err)
		}
		hs = publishedHeaders(hs, row.EventID, row.EventType)
		m := kafka.Message{Topic: row.Topic, Key: row.Key, Value: row.value, Headers: hs}
		// Cap the batch in bytes so every partition's share fits one
		// produce request; the rest stays pending for the next batch.
		if size += estimateSize(&m); i > 0 && size > l.r.cfg.maxBatchBytes {
			batch = batch[:i]
			// Claim no more than fits next time: the rest would be read
			// again and again only to be dropped here. The rest waits:
			// claim it at once.
			l.limit = max(min(minBatch, l.r.cfg.batchSize), i)
			l.backlog = true
			break
		}
		msgs = append(msgs, m)
	}
	if f := l.r.cfg.metrics.Batch; f != nil {
		f(len(batch))
	}
	fl := &flight{batch: batch, msgs: msgs, done: make(chan struct{})}
	// kafka-go gives every new partition batch room for BatchSize messages
	// up front (76 KB at 500), whatever the call holds: sized to the call,
	// a trickle of one-row batches no longer allocates a full batch each,
	// which drove the garbage collector, and a partition's share still
	// fits one batch, so one produce request. The loop's writer is its own
	// and one call runs at a time (the flight; retryByTopic sends subsets
	// of it), so nothing reads the field meanwhile.
	l.w.BatchSize = max(1, len(msgs))
	go func() {
		defer close(fl.done)
		ctx, end := l.r.tracer.start(l.grace, fl)
		fl.err = l.w.WriteMessages(ctx, fl.msgs...)
		if fl.err != nil && l.grace.Err() == nil {
			fl.err = l.retryByTopic(ctx, fl.msgs, fl.err)
		}
		end(fl.err)
	}()
	return fl, nil
}

// judge splits a finished flight into what to mark and parks the keys and
// topics that failed.
func (l *loop) judge(fl *flight) *outcome {
	out := &outcome{batch: fl.batch, pubErr: fl.err}
	if fl.err != nil && l.grace.Err() != nil {
		// The shutdown grace ran out mid-publish: abandon; nothing is
		// marked, the rows are re-sent by whoever owns the lanes next.
		out.abandoned = true
		return out
	}
	out.acked, out.failed, out.failing = ackedRows(fl.batch, fl.err)
	out.refusedTopics = refusedTopics(fl.batch, fl.err)
	if len(out.refusedTopics) > 0 {
		// The topic's rows wait as a whole; parking its keys as well
		// would only grow the claim's parameters.
		down := make(map[string]bool, len(out.refusedTopics))
		for _, t := range out.refusedTopics {
			down[t] = true
		}
		out.failing = slices.DeleteFunc(out.failing, func(k topicKey) bool { return down[k.topic] })
	}
	if len(out.acked) > 0 {
		l.r.dep(depKafka, nil)
	}
	if fl.err == nil {
		l.r.folds.recovered(depPublish)
	}
	if len(l.parked) > 0 && len(out.acked) > 0 {
		// Keys that got through are no longer parked.
		still := make(map[topicKey]bool, len(out.failing))
		for _, k := range out.failing {
			still[k] = true
		}
		for i := range fl.batch {
			if k := (topicKey{fl.batch[i].Topic, string(fl.batch[i].Key)}); !still[k] {
				delete(l.parked, k)
			}
		}
	}
	if len(l.parkedTopics) > 0 && len(out.acked) > 0 {
		// Topics that got through are no longer parked.
		ok := make(map[int64]bool, len(out.acked))
		for _, id := range out.acked {
			ok[id] = true
		}
		for i := range fl.batch {
			if ok[fl.batch[i].ID] {
				delete(l.parkedTopics, fl.batch[i].Topic)
			}
		}
	}
	if fl.err != nil {
		l.park(out.failing)
		l.parkTopics(out.refusedTopics)
		// Nothing went through and no topic was parked: the relay backs
		// off as a whole (the failing keys stay parked as well).
		out.wholeCallError = len(out.acked) == 0 && len(out.refusedTopics) == 0
	}
	return out
}

// settle marks a judged batch: the acknowledged rows published, the failed
// ones with their error. The broker has the acknowledged rows, so this runs
// even while ctx is being canceled, to spare the consumers duplicates. It
// returns the number of rows marked published.
func (l *loop) settle(out *outcome) (int, error) {
	if out == nil || out.abandoned {
		return 0, nil
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(l.grace), 10*time.Second)
	defer cancel()
	if len(out.acked) > 0 {
		if _, err := l.s.conn.Exec(mctx, l.q.markPublished, out.acked); err != nil {
			return 0, dbErr(fmt.Errorf("outbox: relay: mark published: %w", err))
		}
	}
	if len(out.failed) > 0 {
		if _, err := l.s.conn.Exec(mctx, l.q.markFailed, out.failed, failureText(out.pubErr)); err != nil {
			return 0, dbErr(fmt.Errorf("outbox: relay: record failure: %w", err))
		}
	}
	if len(out.acked) > 0 {
		l.r.health.progress()
		if f := l.r.cfg.metrics.Published; f != nil {
			f(len(out.acked))
		}
	}
	return len(out.acked), nil
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
		l.r.health.alive()
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
