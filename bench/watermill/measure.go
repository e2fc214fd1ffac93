package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
)

// publishFunc adds one system's event to the business transaction.
type publishFunc func(ctx context.Context, tx pgx.Tx, o *ordersv1.OrderPlaced) error

// beginFunc runs fn in one transaction on pool, committing if it returns
// nil: pgx.BeginFunc, or outbox.BeginFunc (whose outbox rows travel with
// the COMMIT).
type beginFunc func(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error

// pgxBegin is pgx.BeginFunc as a beginFunc: the plain pgx transaction.
func pgxBegin(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, pool, fn)
}

// producer is one system's side of a business transaction: how it opens
// the transaction and what it adds to it.
type producer struct {
	begin   beginFunc   // nil: pgxBegin
	publish publishFunc // nil: the business insert alone
}

// businessTx is one business transaction: the order row and, unless
// p.publish is nil, its event.
func businessTx(ctx context.Context, s *schema, n int, p producer) error {
	begin := p.begin
	if begin == nil {
		begin = pgxBegin
	}
	return begin(ctx, s.pool, func(tx pgx.Tx) error {
		o := order(n)
		if err := insertOrder(ctx, tx, o); err != nil {
			return err
		}
		if p.publish == nil {
			return nil
		}
		return p.publish(ctx, tx, o)
	})
}

// writeSlices is how many turns each variant gets in a write measurement:
// the variants take turns in a rotating order, so drift in the machine's
// speed (this VM's fsync latency swings 2× within a minute) falls on all
// of them alike instead of on whichever ran during a slow stretch.
const writeSlices = 6

// writeCosts runs business transactions from clients goroutines with each
// producer in turn, dur in all per producer, and returns the wall time per
// transaction in ns for each (at 8 clients, the inverse of throughput).
func writeCosts(ctx context.Context, s *schema, clients int, dur time.Duration, ps []producer) ([]float64, error) {
	var seq atomic.Int64 // shared: order numbers never repeat
	// Warm up the connections and the statement caches.
	for _, p := range ps {
		for range 2 * clients {
			if err := businessTx(ctx, s, -int(seq.Add(1)), p); err != nil {
				return nil, err
			}
		}
	}
	done, spent := make([]int64, len(ps)), make([]time.Duration, len(ps))
	for k := range writeSlices {
		for j := range ps {
			i := (j + k) % len(ps)
			n, elapsed, err := writeRun(ctx, s, clients, dur/writeSlices, ps[i], &seq)
			if err != nil {
				return nil, err
			}
			done[i] += n
			spent[i] += elapsed
		}
	}
	ns := make([]float64, len(ps))
	for i := range ps {
		ns[i] = float64(spent[i].Nanoseconds()) / float64(done[i])
	}
	return ns, nil
}

// writeRun runs business transactions from clients goroutines for dur and
// returns how many it completed and the time it took.
func writeRun(ctx context.Context, s *schema, clients int, dur time.Duration, p producer, seq *atomic.Int64) (int64, time.Duration, error) {
	var (
		done  atomic.Int64
		wg    sync.WaitGroup
		first error
		mu    sync.Mutex
	)
	start := time.Now()
	deadline := start.Add(dur)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if err := businessTx(ctx, s, int(seq.Add(1)), p); err != nil {
					mu.Lock()
					first = err
					mu.Unlock()
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	return done.Load(), time.Since(start), first
}

// claimAndMark is the database's own ceiling for a relay: conns plain SQL
// loops (as many as the relay has lane workers, so that both put the same
// number of sessions to work) that each claim the oldest pending rows,
// reading what a relay sends, and mark them published in one statement per
// batch of 500 (UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED)
// RETURNING), without Kafka.
func claimAndMark(ctx context.Context, o *ours, n, conns int) (float64, error) {
	if err := o.prefill(ctx, descriptorFor("claim-"+suffix()), n); err != nil {
		return 0, err
	}
	// The baseline's own best index, built before the clock starts: its
	// claim takes the oldest pending rows of all lanes, which the outbox's
	// pending index (lane, id) does not give in order.
	if _, err := o.s.pool.Exec(ctx, `CREATE INDEX outbox_claim_idx ON outbox (id) WHERE published_at IS NULL`); err != nil {
		return 0, fmt.Errorf("claim-and-mark index: %w", err)
	}
	if err := o.s.analyze(ctx); err != nil {
		return 0, err
	}
	// Its connections are opened before the clock starts, as the relay's
	// set-up is left out of its rate.
	held := make([]*pgxpool.Conn, conns)
	for i := range held {
		c, err := o.s.pool.Acquire(ctx)
		if err != nil {
			return 0, fmt.Errorf("claim and mark: %w", err)
		}
		held[i] = c
	}
	for _, c := range held {
		c.Release()
	}
	var (
		total atomic.Int64
		wg    sync.WaitGroup
		errs  = make(chan error, conns)
	)
	start := time.Now()
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				rows, err := o.s.pool.Query(ctx, `UPDATE outbox SET published_at = now()
					WHERE id IN (SELECT id FROM outbox WHERE published_at IS NULL ORDER BY id LIMIT 500 FOR UPDATE SKIP LOCKED)
					RETURNING id, topic, key, value, headers::text`)
				if err != nil {
					errs <- err
					return
				}
				claimed := 0
				for rows.Next() {
					var (
						id             int64
						topic, headers string
						key, value     []byte
					)
					if err := rows.Scan(&id, &topic, &key, &value, &headers); err != nil {
						rows.Close()
						errs <- err
						return
					}
					claimed++
				}
				if err := rows.Err(); err != nil {
					errs <- err
					return
				}
				if claimed == 0 {
					return
				}
				total.Add(int64(claimed))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return 0, fmt.Errorf("claim and mark: %w", err)
	}
	if got := total.Load(); got != int64(n) {
		return 0, fmt.Errorf("claim and mark: %d rows, want %d", got, n)
	}
	return float64(n) / elapsed.Seconds(), nil
}

// progress is what a relay (or forwarder) under measurement reports: the
// events it delivered, and when its set-up ended (for our relay, when it
// took its lanes; for the Forwarder, when it handled its first message).
type progress struct {
	delivered atomic.Int64
	ready     atomic.Int64 // Unix ns; 0 until set
}

// markReady records the end of the set-up, the first time only.
func (p *progress) markReady() { p.ready.CompareAndSwap(0, time.Now().UnixNano()) }

// drainResult is one drain: its rate once set up, and how long the set-up
// took.
type drainResult struct {
	rate  float64 // events/s from the end of the set-up to the last delivery
	setup time.Duration
}

// timeDrain starts a relay (or forwarder) on a pre-filled outbox of n
// events for topic and measures the rate at which it delivers them all,
// from the end of its set-up (connections opened, lanes taken): the
// claim-and-mark baseline opens its connections before its clock starts,
// so set-up is left out on every side and reported apart. It then checks
// the records are on the topic. what names the system in errors; timeout
// bounds the wait.
func timeDrain(ctx context.Context, brokers []string, topic string, n int, what string, timeout time.Duration,
	start func(*progress) (func() error, error)) (drainResult, error) {
	var p progress
	began := time.Now()
	stop, err := start(&p)
	if err != nil {
		return drainResult{}, err
	}
	err = waitFor(ctx, timeout, func() bool { return p.delivered.Load() >= int64(n) })
	end := time.Now()
	if serr := stop(); err == nil {
		err = serr
	}
	if err != nil {
		return drainResult{}, fmt.Errorf("%s: %d of %d delivered: %w", what, p.delivered.Load(), n, err)
	}
	if got, err := topicRecords(ctx, brokers, topic); err != nil || got < int64(n) {
		return drainResult{}, fmt.Errorf("%s: %d of %d records on the topic (%v)", what, got, n, err)
	}
	ready := time.Unix(0, p.ready.Load())
	if p.ready.Load() == 0 || ready.Before(began) || !ready.Before(end) {
		return drainResult{}, fmt.Errorf("%s: no end of set-up reported within the drain", what)
	}
	return drainResult{rate: float64(n) / end.Sub(ready).Seconds(), setup: ready.Sub(began)}, nil
}

// e2eResult is one end-to-end run.
type e2eResult struct {
	p50, p99 float64 // milliseconds, from the start of the business transaction to a consumer's receipt
	rate     float64 // events/s committed by the producers
}

// endToEnd measures latency at a fixed rate: producers goroutines each
// commit business transactions with their event on a shared schedule
// (rate in total, catching up without sleeping when behind), the relay (or
// forwarder) runs, and a plain Kafka consumer stamps each arrival.
func endToEnd(ctx context.Context, brokers []string, topic string, rate, producers int, dur time.Duration, s *schema,
	publish producer, startRelay func(*progress) (func() error, error)) (e2eResult, error) {
	const warm = 20
	total := int(float64(rate) * dur.Seconds())
	sent := make([]atomic.Int64, warm+total)
	var (
		mu       sync.Mutex
		lats     = make([]time.Duration, 0, total)
		received atomic.Int64
	)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		return e2eResult{}, err
	}
	s.checkpoint(ctx)
	cctx, stopConsumer := context.WithCancel(ctx)
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for cctx.Err() == nil {
			fs := cl.PollFetches(cctx)
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				n, err := strconv.Atoi(strings.TrimPrefix(string(r.Key), "o-"))
				if err != nil || n < 0 || n >= len(sent) {
					return
				}
				if n >= warm {
					mu.Lock()
					lats = append(lats, now.Sub(time.Unix(0, sent[n].Load())))
					mu.Unlock()
				}
				received.Add(1)
			})
		}
	}()
	defer func() { stopConsumer(); <-consumed; cl.Close() }()

	var relayed progress
	stop, err := startRelay(&relayed)
	if err != nil {
		return e2eResult{}, err
	}
	defer func() { _ = stop() }()
	// The warm-up runs on the producers' goroutines, so that each has a
	// pooled connection with its statements prepared before the clock
	// starts (one goroutine would warm one connection, and the first
	// transactions of the others would pay for connecting).
	var wwg sync.WaitGroup
	werrs := make([]error, producers)
	for p := range producers {
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			for i := p; i < warm && werrs[p] == nil; i += producers {
				sent[i].Store(time.Now().UnixNano())
				werrs[p] = businessTx(ctx, s, i, publish)
			}
		}()
	}
	wwg.Wait()
	if err := errors.Join(werrs...); err != nil {
		return e2eResult{}, err
	}
	if err := waitFor(ctx, time.Minute, func() bool { return received.Load() >= warm }); err != nil {
		return e2eResult{}, fmt.Errorf("warm-up events not delivered: %w", err)
	}

	var (
		wg      sync.WaitGroup
		errOnce sync.Once
		perr    error
		lastEnd atomic.Int64
	)
	start := time.Now()
	interval := time.Second / time.Duration(rate)
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := p; k < total; k += producers {
				if d := time.Until(start.Add(time.Duration(k) * interval)); d > 0 {
					time.Sleep(d)
				}
				n := warm + k
				sent[n].Store(time.Now().UnixNano())
				if err := businessTx(ctx, s, n, publish); err != nil {
					errOnce.Do(func() { perr = err })
					return
				}
				lastEnd.Store(time.Now().UnixNano())
			}
		}()
	}
	wg.Wait()
	if perr != nil {
		return e2eResult{}, perr
	}
	produced := time.Duration(lastEnd.Load() - start.UnixNano())
	if err := waitFor(ctx, time.Minute, func() bool { return received.Load() >= int64(warm+total) }); err != nil {
		return e2eResult{}, fmt.Errorf("%d of %d events delivered: %w", received.Load(), warm+total, err)
	}
	mu.Lock()
	sorted := append([]time.Duration(nil), lats...)
	mu.Unlock()
	sortDurations(sorted)
	return e2eResult{p50: percentile(sorted, 0.50), p99: percentile(sorted, 0.99), rate: float64(total) / produced.Seconds()}, nil
}

// handledClock counts the events a consumer handled and times the first
// to the last; done closes at the n-th.
type handledClock struct {
	n           int64
	count       atomic.Int64
	first, last atomic.Int64
	once        sync.Once
	done        chan struct{}
}

func newHandledClock(n int) *handledClock {
	return &handledClock{n: int64(n), done: make(chan struct{})}
}

// handled counts one event; handlers call it once the event is applied.
func (c *handledClock) handled() {
	now := time.Now().UnixNano()
	c.first.CompareAndSwap(0, now)
	if c.count.Add(1) == c.n {
		c.last.Store(now)
		c.once.Do(func() { close(c.done) })
	}
}

// consumeRate runs a consumer (run, until its ctx ends) until clock has
// counted every event, then stops it and returns the events/s from the
// first handled event to the last. A consumer that stops on its own or
// has not handled them all within 2 minutes is an error; so is an error
// run returns after the stop. what names the consumer in errors.
func consumeRate(ctx context.Context, what string, clock *handledClock, run func(context.Context) error) (float64, error) {
	cctx, cancel := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- run(cctx) }()
	select {
	case <-clock.done:
	case err := <-stopped:
		cancel()
		return 0, fmt.Errorf("%s stopped: %v", what, err)
	case <-time.After(2 * time.Minute):
		cancel()
		<-stopped
		return 0, fmt.Errorf("%s: %d of %d handled", what, clock.count.Load(), clock.n)
	}
	cancel()
	if err := <-stopped; err != nil {
		return 0, err
	}
	return float64(clock.n-1) / time.Duration(clock.last.Load()-clock.first.Load()).Seconds(), nil
}
