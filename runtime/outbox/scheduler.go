package outbox

import (
	"context"
	"errors"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/internal/faults"
	"github.com/protoevents/protoevents/runtime/internal/health"
)

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
	// faults are the test-only fault points armed in Run's context
	// (runtime/faultinject); none in production.
	faults faults.Relay
	// grace is canceled the shutdown grace after Run's ctx: the batch in
	// flight is published and marked under it.
	grace context.Context
	s     *session
	bo    backoff
	// dbBack and kafkaBack close when the health checks see the
	// dependency back (health.Watch.Back), as of the start of the current
	// round: a failure of the round sleeps out its backoff on them.
	dbBack, kafkaBack <-chan struct{}
	// pace is the adaptive batch size and idle poll delay; only its
	// methods change them.
	pace pacer
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
		l.dbBack, l.kafkaBack = l.r.dbWatch.Back(), l.r.kafkaWatch.Back()
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
				if f := cfg.hooks.Lanes; f != nil {
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
		if !now.Before(l.nextStatus) && cfg.hooks.Pending != nil {
			var st TableStatus
			if err := scanPending(ctx, l.s.conn, l.q, &st); err == nil {
				cfg.hooks.Pending(st.Pending, st.OldestPending)
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
		(l.r.cfg.hooks.Pending != nil && !now.Before(l.nextStatus))
}

// idle waits for a wake-up, the adaptive poll delay or the next periodic
// task, whichever comes first. The poll delay doubles after every empty
// poll, up to the poll interval; a wake-up or work resets it.
func (l *loop) idle(ctx context.Context) {
	if l.woken() {
		return
	}
	d := min(l.pace.delay()-time.Since(l.lastLook), time.Until(l.nextRebalance), time.Until(l.nextCleanup))
	l.pace.idled(time.Now())
	if l.r.cfg.hooks.Pending != nil {
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
func (l *loop) gotWake() { l.pace.woken(l.wake.uncommitted.Swap(false)) }

// claimDue reports whether the claim of the next batch should run while a
// batch is in flight: when the last claim left rows behind (a backlog),
// a wake-up announced rows, or the poll delay passed since the last look.
// Otherwise the pipeline drains and the rows that come meanwhile are found
// by the next wake-up or poll, which saves the database a claim per batch
// when rows trickle in.
func (l *loop) claimDue() bool {
	return l.backlog || l.woken() || time.Since(l.lastLook) >= l.pace.delay()
}

// failed reports err, records it in the health and sleeps for the next
// backoff delay. After a failure against the database or the brokers the
// sleep ends early when the health check sees that dependency back (having
// been asked to check at once): the relay resumes at the speed of the
// dependency, not of a backoff grown during the outage.
func (l *loop) failed(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	dep := depOf(err)
	var back <-chan struct{}
	switch dep {
	case depDatabase:
		l.r.dep(dep, err)
		l.r.dbWatch.Suspect()
		back = l.dbBack
	case depKafka:
		l.r.dep(dep, err)
		l.r.kafkaWatch.Suspect()
		back = l.kafkaBack
	}
	d := l.bo.next()
	l.r.folds.warn(dep, "outbox relay: retrying", err, "backoff", d)
	if f := l.r.cfg.hooks.PublishFailed; f != nil {
		f(err)
	}
	_ = health.Sleep(ctx, d, back)
}

// report records a failure that needs no pause.
func (l *loop) report(err error) {
	l.r.folds.warn(depPublish, "outbox relay: partial failure; failing keys and topics parked", err, "parked_keys", len(l.parked), "parked_topics", len(l.parkedTopics))
	if f := l.r.cfg.hooks.PublishFailed; f != nil {
		f(err)
	}
}

func (l *loop) dropSession(ctx context.Context) {
	l.s.close(ctx)
	l.s = nil
	total := l.r.health.setLanes(l.worker, nil)
	if f := l.r.cfg.hooks.Lanes; f != nil {
		f(total)
	}
}
