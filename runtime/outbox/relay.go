package outbox

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/internal/faults"
	"github.com/protoevents/protoevents/runtime/internal/health"
	"github.com/protoevents/protoevents/runtime/internal/kafkawriter"
)

// Relay publishes outbox rows to Kafka: at least once, in order per key,
// from any number of instances at the same time. The package documentation
// describes how: key-hash lanes, adaptive polling, pipelined batches,
// partial failures, shutdown, health and known limits.
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
	guard   *kafkawriter.Guard // the writers' partitioner, shared: one warning per change
	// dbWatch and kafkaWatch are the dependencies as Run's health checks
	// see them: a sleep after a failure against one ends when its check
	// sees it back (docs/design.md, "Recovery at the speed of the
	// dependency").
	dbWatch, kafkaWatch health.Watch
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
		maxBatchBytes:     kafkawriter.MaxBatchBytes,
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
		writeTimeout:      10 * time.Second,
		maxAttempts:       3,
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
	r.guard = &kafkawriter.Guard{Changed: func(topic string, was, now int) {
		r.log.Error("outbox relay: "+kafkawriter.PartitionsMessage, "topic", topic, "partitions", now, "were", was)
	}}
	r.folds = folder{log: log, every: c.logInterval}
	r.tracer = newBatchTracer(c.tracerProvider)
	return r, nil
}

// crashError is a fault point's simulated crash; Run returns it.
type crashError struct{ err error }

func (e *crashError) Error() string { return "outbox: relay: fault point: " + e.err.Error() }

func (e *crashError) Unwrap() error { return e.err }

// Run relays until ctx is canceled, then returns nil after shutting down:
// the batch in flight gets the shutdown grace (WithShutdownGrace) to be
// acknowledged and marked. It waits for the database and the brokers at
// start and retries their failures with backoff (each failure is logged,
// folded when repeated, and reported to Hooks.PublishFailed); it returns
// an error only if the table does not exist (ErrNoTable) or is not an
// outbox, or a fault point armed in ctx (runtime/faultinject, in tests)
// simulated a crash. A Relay runs at most once at a time.
func (r *Relay) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("outbox: relay: already running")
	}
	defer r.running.Store(false)
	r.health.start()
	defer r.health.stop()

	// One transport for every worker's producer and the broker checks: it
	// carries the TLS and SASL settings; without them kafka-go's default
	// transport does.
	tr := r.newTransport()
	if tr != nil {
		defer tr.CloseIdleConnections()
	}
	w := r.newKafkaWriter(tr)
	kc := &kafka.Client{Addr: w.Addr, Transport: w.Transport}
	// The health checks: one goroutine per dependency, every health
	// interval, and more often while it is down (health.Watch.Run).
	probeCtx, stopProbe := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { r.dbWatch.Run(probeCtx, r.cfg.healthInterval, r.checkDatabase) })
	wg.Go(func() {
		r.kafkaWatch.Run(probeCtx, r.cfg.healthInterval, func(ctx context.Context) error { return r.checkKafka(ctx, kc) })
	})
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
	// also runs the periodic cleanup and the pending-rows metric. A fault
	// point's simulated crash in one stops them all.
	fp := faults.RelayFrom(ctx)
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
			lw = r.newKafkaWriter(tr)
		}
		l := &loop{r: r, worker: i, t: rt, q: q, w: lw, wake: wake, faults: fp, grace: graceCtx,
			bo: backoff{min: r.cfg.backoffMin, max: r.cfg.backoffMax}, pace: newPacer(r.cfg.batchSize, r.cfg.pollInterval),
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
		back := r.dbWatch.Back()
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
		r.dbWatch.Suspect()
		d := bo.next()
		r.folds.warn(depDatabase, "outbox relay: waiting for the database", err, "backoff", d)
		if f := r.cfg.hooks.PublishFailed; f != nil {
			f(err)
		}
		_ = health.Sleep(ctx, d, back)
	}
}

// waitKafka returns once the brokers answer (or ctx ends), retrying with
// backoff: a relay that cannot reach them would only fail its batches.
func (r *Relay) waitKafka(ctx context.Context, kc *kafka.Client) {
	bo := backoff{min: r.cfg.backoffMin, max: r.cfg.backoffMax}
	for ctx.Err() == nil {
		r.health.alive()
		back := r.kafkaWatch.Back()
		err := r.pingKafka(ctx, kc)
		if ctx.Err() != nil {
			return
		}
		r.dep(depKafka, err)
		if err == nil {
			return
		}
		r.kafkaWatch.Suspect()
		d := bo.next()
		r.folds.warn(depKafka, "outbox relay: waiting for the Kafka brokers", err, "brokers", r.brokers, "backoff", d)
		if f := r.cfg.hooks.PublishFailed; f != nil {
			f(err)
		}
		_ = health.Sleep(ctx, d, back)
	}
}

// newTransport returns the transport that carries WithTLS and WithSASL, or
// nil without them (kafkawriter.Transport).
func (r *Relay) newTransport() *kafka.Transport { return kafkawriter.Transport(r.cfg.tls, r.cfg.sasl) }

// newKafkaWriter builds a lane worker's producer on tr (nil: the default
// transport) with the settings both relays share (kafkawriter.New); send
// sets BatchSize to each call's size.
func (r *Relay) newKafkaWriter(tr *kafka.Transport) *kafka.Writer {
	return kafkawriter.New(kafkawriter.Config{Brokers: r.brokers, Transport: tr, MaxAttempts: r.cfg.maxAttempts,
		WriteTimeout: r.cfg.writeTimeout, BatchSize: r.cfg.batchSize, Guard: r.guard})
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
