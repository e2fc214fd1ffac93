package walrelay

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/internal/faults"
	"github.com/protoevents/protoevents/runtime/internal/health"
	"github.com/protoevents/protoevents/runtime/internal/kafkawriter"
	"github.com/protoevents/protoevents/runtime/internal/walrecord"
)

// Relay publishes the events outbox Writers with outbox.WithWALSource
// emitted, reading them from a logical replication slot. Build it with New
// and call Run. Several relays may run on one slot: Postgres lets one at a
// time stream from it, the others wait as standbys and take over when it
// stops or dies.
type Relay struct {
	pool    *pgxpool.Pool
	brokers []string
	cfg     config
	state   state
	// dbWatch and kafkaWatch are the dependencies as Run's checks see
	// them: checked when a session or a publish fails, then often until
	// they answer, which ends the backoff of the work waiting for them
	// (docs/design.md, "Recovery at the speed of the dependency").
	dbWatch, kafkaWatch health.Watch
	// guard is the partitioner of every session's writers: one per Relay,
	// so a topic that grows while a session reconnects is still reported.
	guard *kafkawriter.Guard
}

// New returns a WAL relay that reads the slot (WithSlot) in the pool's
// database and publishes to brokers. The pool's connection settings are
// used for the replication connection too (as replication=database); the
// role needs the REPLICATION attribute.
func New(pool *pgxpool.Pool, brokers []string, opts ...Option) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("walrelay: nil pool")
	}
	if len(brokers) == 0 {
		return nil, errors.New("walrelay: no brokers")
	}
	c, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	r := &Relay{pool: pool, brokers: brokers, cfg: c}
	r.guard = &kafkawriter.Guard{Changed: func(topic string, was, now int) {
		r.cfg.log.Error("walrelay: "+kafkawriter.PartitionsMessage, "topic", topic, "partitions", now, "were", was)
	}}
	return r, nil
}

// errStandby is a session's end when another relay holds the slot.
var errStandby = errors.New("the slot is held by another relay")

// Run streams until ctx is done, then lets the batch in flight finish
// (WithShutdownGrace), confirms what was acknowledged and returns nil.
// Through database and broker outages it waits and retries; it returns an
// error only for what an operator must fix: wal_level not logical
// (ErrWALLevel), the slot missing (ErrNoSlot) or invalidated
// (ErrSlotInvalidated).
func (r *Relay) Run(ctx context.Context) error {
	r.state.running(true)
	defer r.state.running(false)
	tr := kafkawriter.Transport(r.cfg.tls, r.cfg.sasl)
	if tr != nil {
		defer tr.CloseIdleConnections()
	}
	points := faults.WALRelayFrom(ctx)

	// The checks run only after a failure, until the dependency answers
	// (health.Watch.Run with no interval): the relay has no periodic
	// health check of its own.
	checkCtx, stopChecks := context.WithCancel(ctx)
	var checks sync.WaitGroup
	defer func() {
		stopChecks()
		checks.Wait()
	}()
	kc := &kafka.Client{Addr: kafka.TCP(r.brokers...)}
	if tr != nil {
		kc.Transport = tr // not a nil *Transport in the interface
	}
	checks.Go(func() { r.dbWatch.Run(checkCtx, 0, r.pingDatabase) })
	checks.Go(func() { r.kafkaWatch.Run(checkCtx, 0, func(ctx context.Context) error { return pingKafka(ctx, kc) }) })

	backoff := r.cfg.sessionRetryMin
	for {
		// Taken before the session, so that the database coming back
		// while it fails still ends the sleep after it.
		dbBack := r.dbWatch.Back()
		err := r.session(ctx, tr, points)
		var crash *crashError
		if errors.As(err, &crash) {
			return crash.err // a simulated crash ends Run, as a real one would
		}
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case errors.Is(err, errStandby):
			r.state.standby(err)
			backoff = r.cfg.sessionRetryMin
			if !sleep(ctx, r.cfg.standbyRetry) {
				return nil
			}
			continue
		case errors.Is(err, ErrWALLevel), errors.Is(err, ErrNoSlot), errors.Is(err, ErrSlotInvalidated):
			r.state.failed(err)
			return err
		}
		r.state.failed(err)
		r.cfg.log.Warn("walrelay: session ended; reconnecting", "slot", r.cfg.slot, "retry_in", backoff, "err", err)
		r.dbWatch.Suspect()
		if health.Sleep(ctx, backoff, dbBack) != nil {
			return nil
		}
		backoff = min(2*backoff, r.cfg.sessionRetryMax)
	}
}

// session streams once: connect, take the slot, publish until the
// connection fails or ctx ends.
func (r *Relay) session(ctx context.Context, tr *kafka.Transport, points faults.WALRelay) error {
	if err := checkWALLevel(ctx, r.pool); err != nil {
		return err
	}
	if err := r.checkSlot(ctx); err != nil {
		return err
	}
	cc := r.pool.Config().ConnConfig.Config.Copy()
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	cc.RuntimeParams["replication"] = "database"
	cc.RuntimeParams["application_name"] = "protoevents-walrelay"
	conn, err := pgconn.ConnectConfig(ctx, cc)
	if err != nil {
		return fmt.Errorf("walrelay: replication connection: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: pluginArgs(r.cfg.publication)})
	if err != nil {
		return r.startFailed(ctx, err)
	}
	// Only this session can move the slot now: its confirmed position is
	// where the stream starts, and what status updates must never go
	// below.
	st, err := readSlot(ctx, r.pool, r.cfg.slot)
	if err != nil {
		return err
	}
	start, err := pglogrepl.ParseLSN(st.Confirmed)
	if err != nil {
		return fmt.Errorf("walrelay: slot %q confirmed position %q: %w", r.cfg.slot, st.Confirmed, err)
	}
	wm := &watermark{}
	wm.start(start)
	r.state.active(true)
	if f := r.cfg.hooks.Active; f != nil {
		f(true)
	}
	defer func() {
		r.state.active(false)
		if f := r.cfg.hooks.Active; f != nil {
			f(false)
		}
	}()
	r.cfg.log.Info("walrelay: streaming", "slot", r.cfg.slot, "from", start)

	// The lanes: one publisher each, the keys split between them by hash.
	sctx, cancelStream := context.WithCancel(ctx)
	var helpers sync.WaitGroup
	defer helpers.Wait()
	defer cancelStream()
	stop := make(chan struct{})
	pctx, cancelPublish := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelPublish()
	crashed := make(chan error, 1)
	lanes := make([]chan part, r.cfg.lanes)
	var publishers sync.WaitGroup
	for l := range lanes {
		lanes[l] = make(chan part, 2*r.cfg.batchSize)
		p := &publisher{r: r, w: kafkawriter.New(kafkawriter.Config{Brokers: r.brokers, Transport: tr, MaxAttempts: r.cfg.maxAttempts,
			WriteTimeout: r.cfg.writeTimeout, BatchSize: r.cfg.batchSize, Guard: r.guard}), wm: wm, in: lanes[l], stop: stop, points: points,
			crash: func(err error) {
				select {
				case crashed <- err:
				default:
				}
				cancelStream()
			}}
		publishers.Go(func() {
			defer p.w.Close()
			p.run(pctx)
		})
	}
	published := make(chan struct{})
	go func() { publishers.Wait(); close(published) }()

	if r.cfg.heartbeat > 0 {
		helpers.Go(func() { r.heartbeats(sctx) })
	}
	helpers.Go(func() { r.watchLag(sctx, wm) })
	s := &stream{conn: conn, cfg: &r.cfg, wm: wm, lanes: lanes, drain: pctx}
	err = s.run(sctx)
	select {
	case cerr := <-crashed:
		// A simulated crash: abandon everything, confirm nothing more.
		cancelPublish()
		<-published
		return &crashError{err: cerr}
	default:
	}

	// Let the batches in flight finish, then confirm what they
	// acknowledged.
	close(stop)
	grace := time.NewTimer(r.cfg.grace)
	select {
	case <-published:
	case <-grace.C:
		cancelPublish()
		<-published
	}
	grace.Stop()
	fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if serr := s.status(fctx); serr == nil {
		s.end(fctx)
	}
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// crashError carries a fault point's simulated crash out of a session.
type crashError struct{ err error }

func (e *crashError) Error() string { return e.err.Error() }

// startFailed explains a refused START_REPLICATION.
func (r *Relay) startFailed(ctx context.Context, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case sqlstateObjectInUse:
			return fmt.Errorf("walrelay: slot %q: %w (%s)", r.cfg.slot, errStandby, pgErr.Message)
		case sqlstateUndefinedObject:
			return fmt.Errorf("walrelay: slot %q: %w: create it with eventsctl wal setup (walrelay.Setup)", r.cfg.slot, ErrNoSlot)
		}
	}
	if cerr := r.checkSlot(ctx); cerr != nil {
		return cerr
	}
	return fmt.Errorf("walrelay: start streaming from slot %q: %w", r.cfg.slot, err)
}

// checkSlot refuses a slot that is missing or invalidated.
func (r *Relay) checkSlot(ctx context.Context) error {
	st, err := readSlot(ctx, r.pool, r.cfg.slot)
	switch {
	case err != nil:
		return err
	case !st.Exists:
		return fmt.Errorf("walrelay: slot %q: %w in this database: create it with eventsctl wal setup (walrelay.Setup) before the first WAL-source write", r.cfg.slot, ErrNoSlot)
	case st.WALStatus == "lost":
		return fmt.Errorf("walrelay: slot %q: %w: it fell behind max_slot_wal_keep_size and Postgres removed the WAL it needed; "+
			"events written since its confirmed position %s cannot be read: follow docs/runbook.md, \"WAL relay: an invalidated slot\"", r.cfg.slot, ErrSlotInvalidated, st.Confirmed)
	case st.Plugin != "pgoutput":
		return fmt.Errorf("walrelay: slot %q uses plugin %q, not pgoutput: choose another slot (WithSlot)", r.cfg.slot, st.Plugin)
	}
	return nil
}

// heartbeats writes a heartbeat message every interval while the session
// streams, so the slot's position follows the WAL when no events are
// written.
func (r *Relay) heartbeats(ctx context.Context) {
	t := time.NewTicker(r.cfg.heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := r.pool.Exec(ctx, heartbeat, walrecord.HeartbeatPrefix); err != nil && ctx.Err() == nil {
				r.cfg.log.Debug("walrelay: heartbeat failed", "err", err)
			}
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// LiveHandler serves /livez: 200 while Run runs.
func (r *Relay) LiveHandler() http.Handler { return health.Live(r.check) }

// ReadyHandler serves /readyz: 200 while this relay streams and publishes
// without falling behind (WithStallTimeout), or waits as a standby; 503
// otherwise, with the reason.
func (r *Relay) ReadyHandler() http.Handler { return health.Ready(r.check) }
