package demo

// The saga part of the demo: the order saga (reserve stock → charge card →
// schedule shipping, compensated in reverse) across the stock, payments
// and shipping-scheduler services, with the orchestrator crashing between
// a transition's commit and its offset commit, the payments service down
// long enough for charges to time out, declined cards, out-of-stock SKUs,
// unserved countries, a refund that fails twice and one that fails until
// an operator retries the parked saga.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	paymentsv1 "github.com/protoevents/protoevents/examples/gen/shop/payments/v1"
	"github.com/protoevents/protoevents/examples/ordersaga"
	"github.com/protoevents/protoevents/examples/payments"
	"github.com/protoevents/protoevents/examples/scheduling"
	"github.com/protoevents/protoevents/examples/stock"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/faultinject"
	"github.com/protoevents/protoevents/runtime/outbox"
	"github.com/protoevents/protoevents/runtime/saga"
	"github.com/protoevents/protoevents/runtime/topics"
)

// SagaConfig says how big the saga run is and where it runs.
type SagaConfig struct {
	DB      *pgxpool.Pool
	Brokers []string
	// Orders is how many order sagas to start (at least 20).
	Orders int
	// ChargeTimeout bounds the wait for payments; the payments service is
	// down for longer than that once.
	ChargeTimeout time.Duration
	Progress      io.Writer
	Log           *slog.Logger
	Timeout       time.Duration
}

// SagaReport is what the saga run observed.
type SagaReport struct {
	Placed                                  int
	Completed, Compensated, Parked          int64 // before the operator's retry
	RetriedByOperator                       int
	Declined, Unavailable, Refused, Timed   int64 // why sagas compensated
	CompensationRetries, LateRepliesIgnored int64
	OrchestratorCrashes, PaymentsCrashes    int
	DuplicatesAbsorbed                      int64
	ParkedID                                string
	ParkedPath                              []saga.Entry
	Violations                              []string
	Elapsed                                 time.Duration
}

// OK reports whether every saga invariant held.
func (r *SagaReport) OK() bool { return len(r.Violations) == 0 }

// Print writes the report.
func (r *SagaReport) Print(w io.Writer) {
	fmt.Fprintf(w, "\nprotoevents order-saga report (%s)\n", r.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "  sagas started                 %6d\n", r.Placed)
	fmt.Fprintf(w, "  completed                     %6d  (stock reserved, card charged, pickup booked, order confirmed)\n", r.Completed)
	fmt.Fprintf(w, "  compensated                   %6d  (%d card declined, %d out of stock, %d shipping refused, %d charge timed out)\n", r.Compensated, r.Declined, r.Unavailable, r.Refused, r.Timed)
	fmt.Fprintf(w, "  parked                        %6d  (refund failing past its budget; %d retried by the operator, then compensated)\n", r.Parked, r.RetriedByOperator)
	fmt.Fprintf(w, "  compensation retries          %6d  (RefundFailed → RefundCard sent again after backoff)\n", r.CompensationRetries)
	fmt.Fprintf(w, "  late replies ignored          %6d  (a reply after its step timed out and was compensated)\n", r.LateRepliesIgnored)
	fmt.Fprintf(w, "  crashes                       %6d orchestrator (between DB commit and offset commit), %d payments (down past the charge timeout)\n", r.OrchestratorCrashes, r.PaymentsCrashes)
	fmt.Fprintf(w, "  duplicates absorbed           %6d\n", r.DuplicatesAbsorbed)
	if len(r.ParkedPath) > 0 {
		fmt.Fprintf(w, "  path of the parked saga %s (eventsctl saga show --id %s):\n", r.ParkedID, r.ParkedID)
		for _, e := range r.ParkedPath {
			fmt.Fprintf(w, "    %s  %-22s %-18s %-12s event %-26s command %-26s %s\n", e.At.Format("15:04:05.000"), e.Transition, e.StepName, e.Status, orDash(e.EventID), orDash(e.CommandID), e.Detail)
		}
	}
	if r.OK() {
		fmt.Fprintln(w, "  invariants: OK (every saga completed or compensated; stock reserved and released balance; no compensated order charged and not refunded; no step or compensation applied twice)")
		return
	}
	fmt.Fprintln(w, "  invariants VIOLATED:")
	for _, v := range r.Violations {
		fmt.Fprintln(w, "   -", v)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// The demo's stock: plenty of sku-1, two units of sku-rare.
const (
	plentySKU   = "sku-1"
	rareSKU     = "sku-rare"
	plentyUnits = 1_000_000
	rareUnits   = 2
)

// SetupSaga creates the tables and topics of the saga demo.
func SetupSaga(ctx context.Context, pool *pgxpool.Pool, brokers []string) error {
	migrateOutbox := func(ctx context.Context, p *pgxpool.Pool) error { return outbox.Migrate(ctx, p) }
	migrateConsumer := func(ctx context.Context, p *pgxpool.Pool) error { return consumer.Migrate(ctx, p) }
	for _, m := range []func(context.Context, *pgxpool.Pool) error{migrateOutbox, migrateConsumer, stock.Migrate, payments.Migrate, scheduling.Migrate, ordersaga.Migrate} {
		if err := m(ctx, pool); err != nil {
			return err
		}
	}
	if err := stock.Fill(ctx, pool, plentySKU, plentyUnits); err != nil {
		return err
	}
	if err := stock.Fill(ctx, pool, rareSKU, rareUnits); err != nil {
		return err
	}
	_, err := topics.Ensure(ctx, brokers, topics.Config{Partitions: 3}, ordersaga.Events()...)
	return err
}

// sagaRunner is what the saga demo supervises. It and restartAfter are the
// saga demo's own, so the rest of the demo can change freely.
type sagaRunner interface{ Run(context.Context) error }

// runFunc adapts a function to a sagaRunner.
type runFunc func(context.Context) error

func (f runFunc) Run(ctx context.Context) error { return f(ctx) }

// restartAfter runs first until ctx ends. If it crashes before, it counts
// the crash, says so, waits down (the time the process stays dead) and
// runs next until ctx ends; a failure of next goes to errc.
func restartAfter(ctx context.Context, progress io.Writer, what string, crashes *int, down time.Duration, first, next sagaRunner, errc chan<- error) {
	err := first.Run(ctx)
	if err == nil || ctx.Err() != nil {
		return
	}
	*crashes++
	if down > 0 {
		fmt.Fprintf(progress, "  ! %s crashed (%v); down for %s\n", what, err, down)
	} else {
		fmt.Fprintf(progress, "  ! %s crashed (%v); restarting it\n", what, err)
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(down):
	}
	if err := next.Run(ctx); err != nil && ctx.Err() == nil {
		errc <- fmt.Errorf("%s: %w", what, err)
	}
}

// RunSaga runs the saga demo on a set-up database and cluster.
func RunSaga(ctx context.Context, cfg SagaConfig) (*SagaReport, error) {
	start := time.Now()
	if cfg.Orders < 20 {
		cfg.Orders = 20
	}
	if cfg.ChargeTimeout <= 0 {
		cfg.ChargeTimeout = 2 * time.Second
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	rep := &SagaReport{}
	var duplicates atomic.Int64
	hooks := consumer.Hooks{Duplicate: func(events.Delivery, string) { duplicates.Add(1) }}
	copts := []consumer.Option{consumer.WithLogger(cfg.Log), consumer.WithHooks(hooks), consumer.WithBackoff(20*time.Millisecond, 200*time.Millisecond)}

	w, err := outbox.NewWriter()
	if err != nil {
		return nil, err
	}
	stockSvc := stock.New(w)
	paySvc := payments.New(w)
	paySvc.Declines = func(c *paymentsv1.ChargeCard) bool { return c.GetCustomerId() == "cust-broke" }
	shipSvc := scheduling.New(w, "ZZ")
	orch, err := ordersaga.New(cfg.DB, w, cfg.ChargeTimeout, saga.WithLogger(cfg.Log),
		saga.WithCompensationRetries(4, 100*time.Millisecond, 400*time.Millisecond), saga.WithPollInterval(100*time.Millisecond))
	if err != nil {
		return nil, err
	}

	var wg sync.WaitGroup
	errc := make(chan error, 16)
	runCtx, stop := context.WithCancel(ctx)
	defer func() { stop(); wg.Wait() }()
	goRun := func(what string, r sagaRunner) {
		wg.Go(func() {
			if err := r.Run(runCtx); err != nil && runCtx.Err() == nil {
				errc <- fmt.Errorf("%s: %w", what, err)
			}
		})
	}

	relay, err := outbox.NewRelay(cfg.DB, cfg.Brokers, outbox.WithLogger(cfg.Log), outbox.WithPollInterval(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	goRun("relay", relay)
	stockCons, err := stockSvc.Consumers(cfg.DB, cfg.Brokers, copts...)
	if err != nil {
		return nil, err
	}
	shipCons, err := shipSvc.NewConsumer(cfg.DB, cfg.Brokers, copts...)
	if err != nil {
		return nil, err
	}
	for _, c := range append(stockCons, shipCons) {
		goRun("participant", c)
	}

	// Payments crashes after its 20th transaction, before the offset
	// commit, and stays down longer than the charge timeout.
	var payCommits atomic.Int64
	payFault := faultinject.ConsumerPoints{AfterDBCommit: func(kafka.Message) error {
		if payCommits.Add(1) == 20 {
			return errors.New("demo: payments crash between DB commit and offset commit")
		}
		return nil
	}}
	// runPayments runs the payments consumers; arm, if set, adds fault
	// points to their Run context.
	runPayments := func(arm func(context.Context) context.Context) sagaRunner {
		return runFunc(func(ctx context.Context) error {
			cs, err := paySvc.Consumers(cfg.DB, cfg.Brokers, copts...)
			if err != nil {
				return err
			}
			if arm != nil {
				ctx = arm(ctx)
			}
			return runAll(ctx, cs)
		})
	}
	armPayments := func(ctx context.Context) context.Context { return faultinject.Consumer(ctx, payFault) }
	wg.Go(func() {
		// Down longer than the charge timeout: some charges time out.
		restartAfter(runCtx, cfg.Progress, "payments", &rep.PaymentsCrashes, cfg.ChargeTimeout+time.Second, runPayments(armPayments), runPayments(nil), errc)
	})

	// The orchestrator crashes after its 15th committed transition, before
	// the offset commit; its replacement gets those replies again and the
	// dedup table absorbs them.
	var orchCommits atomic.Int64
	orchFault := faultinject.ConsumerPoints{AfterDBCommit: func(kafka.Message) error {
		if orchCommits.Add(1) == 15 {
			return errors.New("demo: orchestrator crash between DB commit and offset commit")
		}
		return nil
	}}
	// orchestrator runs the saga's reply consumer and timeout runner; arm,
	// if set, adds fault points to their Run context.
	orchestrator := func(arm func(context.Context) context.Context) sagaRunner {
		return runFunc(func(ctx context.Context) error {
			if arm != nil {
				ctx = arm(ctx)
			}
			return orch.Saga.Run(ctx, cfg.DB, cfg.Brokers, copts...)
		})
	}
	armOrchestrator := func(ctx context.Context) context.Context { return faultinject.Consumer(ctx, orchFault) }
	wg.Go(func() {
		restartAfter(runCtx, cfg.Progress, "orchestrator", &rep.OrchestratorCrashes, 0, orchestrator(armOrchestrator), orchestrator(nil), errc)
	})

	// Orders: every 7th (from 3) by a customer whose card is declined,
	// every 10th (from 5) to a country no carrier serves, every 6th (from
	// 4) of the rare SKU (two on the shelf). The first refund of order 5
	// fails twice; the one of order 15 fails until the operator steps in.
	refundOutage := fmt.Sprintf("saga-%04d", 15)
	paySvc.FailRefunds(fmt.Sprintf("saga-%04d", 5), 2)
	paySvc.FailRefunds(refundOutage, -1)
	for i := 0; i < cfg.Orders; i++ {
		o := ordersaga.Order{ID: fmt.Sprintf("saga-%04d", i), CustomerID: fmt.Sprintf("cust-%02d", i%20), SKU: plentySKU, Quantity: uint32(1 + i%3),
			AmountCents: int64(1000 + 10*i), Currency: "EUR", Country: "DE"}
		if i%7 == 3 {
			o.CustomerID = "cust-broke"
		}
		if i%10 == 5 {
			o.Country = "ZZ"
		}
		if i%6 == 4 {
			o.SKU, o.Quantity = rareSKU, 1
		}
		if err := orch.Place(ctx, o); err != nil {
			return nil, err
		}
		rep.Placed++
	}
	fmt.Fprintf(cfg.Progress, "  started %d order sagas\n", rep.Placed)

	waitFinal := func(what string) error {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for ticks := 0; ; ticks++ {
			select {
			case err := <-errc:
				return err
			case <-ctx.Done():
				counts, _ := saga.Counts(context.Background(), cfg.DB, ordersaga.Name)
				return fmt.Errorf("demo: %s: timed out with sagas %v", what, counts)
			case <-tick.C:
			}
			counts, err := saga.Counts(ctx, cfg.DB, ordersaga.Name)
			if err != nil {
				return err
			}
			moving := counts[saga.StatusPending] + counts[saga.StatusCompensating]
			if ticks%4 == 0 || moving == 0 {
				fmt.Fprintf(cfg.Progress, "  sagas: %d pending, %d compensating, %d completed, %d compensated, %d parked\n",
					counts[saga.StatusPending], counts[saga.StatusCompensating], counts[saga.StatusCompleted], counts[saga.StatusCompensated], counts[saga.StatusParked])
			}
			if moving == 0 {
				return nil
			}
		}
	}
	if err := waitFinal("sagas"); err != nil {
		return nil, err
	}
	counts, err := saga.Counts(ctx, cfg.DB, ordersaga.Name)
	if err != nil {
		return nil, err
	}
	rep.Completed, rep.Compensated, rep.Parked = counts[saga.StatusCompleted], counts[saga.StatusCompensated], counts[saga.StatusParked]
	if rep.Parked > 0 {
		rep.ParkedID = refundOutage
		if rep.ParkedPath, err = saga.Path(ctx, cfg.DB, refundOutage); err != nil {
			return nil, err
		}
	}

	// The operator: the card network is back; retry every parked saga.
	paySvc.FailRefunds(refundOutage, 0)
	parked, err := saga.List(ctx, cfg.DB, saga.Filter{Type: ordersaga.Name, Status: saga.StatusParked})
	if err != nil {
		return nil, err
	}
	for _, p := range parked {
		fmt.Fprintf(cfg.Progress, "  operator: saga %s parked (%s); card network fixed, retrying\n", p.ID, p.Failure)
		if err := saga.Retry(ctx, cfg.DB, p.ID); err != nil {
			return nil, err
		}
		rep.RetriedByOperator++
	}
	if err := waitFinal("after the operator's retry"); err != nil {
		return nil, err
	}
	// Let late replies (charges that arrive after payments came back) land.
	if err := waitQuiet(ctx, cfg.DB); err != nil {
		return nil, err
	}
	stop()
	wg.Wait()

	ctx, cancelReport := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancelReport()
	rep.DuplicatesAbsorbed = duplicates.Load()
	for _, q := range []struct {
		dst *int64
		sql string
	}{
		{&rep.Declined, `SELECT count(DISTINCT saga_id) FROM sagas_history WHERE transition = 'step-failed' AND detail LIKE '%CardDeclined%'`},
		{&rep.Unavailable, `SELECT count(DISTINCT saga_id) FROM sagas_history WHERE transition = 'step-failed' AND detail LIKE '%StockUnavailable%'`},
		{&rep.Refused, `SELECT count(DISTINCT saga_id) FROM sagas_history WHERE transition = 'step-failed' AND detail LIKE '%ShippingRefused%'`},
		{&rep.Timed, `SELECT count(DISTINCT saga_id) FROM sagas_history WHERE transition = 'timed-out'`},
		{&rep.CompensationRetries, `SELECT count(*) FROM sagas_history WHERE transition = 'compensation-failed'`},
		{&rep.LateRepliesIgnored, `SELECT count(*) FROM sagas_history WHERE transition = 'late-reply-ignored'`},
	} {
		if err := cfg.DB.QueryRow(ctx, q.sql).Scan(q.dst); err != nil {
			return nil, fmt.Errorf("demo: saga report: %w", err)
		}
	}
	rep.Violations = CheckSaga(ctx, cfg.DB, rep)
	rep.Elapsed = time.Since(start)
	return rep, nil
}

// waitQuiet waits until the outbox has nothing pending, twice in a row a
// moment apart, so every late reply was relayed and handled.
func waitQuiet(ctx context.Context, db *pgxpool.Pool) error {
	quiet := 0
	for quiet < 4 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		st, err := outbox.Status(ctx, db)
		if err != nil {
			return err
		}
		if st.Pending == 0 {
			quiet++
		} else {
			quiet = 0
		}
	}
	return nil
}

// runAll runs consumers until ctx ends or one fails, then stops the rest.
func runAll(ctx context.Context, cs []*consumer.Consumer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, c := range cs {
		wg.Go(func() {
			if err := c.Run(ctx); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// CheckSaga verifies the saga invariants against the database.
func CheckSaga(ctx context.Context, db *pgxpool.Pool, rep *SagaReport) []string {
	var v []string
	count := func(what, sql string, args ...any) int64 {
		var n int64
		if err := db.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			v = append(v, fmt.Sprintf("%s: %v", what, err))
		}
		return n
	}
	if n := count("unfinished", `SELECT count(*) FROM sagas WHERE saga_type = $1 AND status NOT IN ('completed', 'compensated')`, ordersaga.Name); n != 0 {
		v = append(v, fmt.Sprintf("%d sagas neither completed nor compensated after the operator's retry", n))
	}
	if n := count("sagas", `SELECT count(*) FROM sagas WHERE saga_type = $1`, ordersaga.Name); n != int64(rep.Placed) {
		v = append(v, fmt.Sprintf("%d sagas recorded, %d started", n, rep.Placed))
	}
	// No step or compensation took effect twice.
	if n := count("double stock", `SELECT count(*) FROM (SELECT 1 FROM stock_effects GROUP BY order_id, action HAVING count(*) > 1) d`); n != 0 {
		v = append(v, fmt.Sprintf("%d orders reserved or released twice", n))
	}
	if n := count("double payment", `SELECT count(*) FROM (SELECT 1 FROM payment_effects GROUP BY order_id, action HAVING count(*) > 1) d`); n != 0 {
		v = append(v, fmt.Sprintf("%d orders charged or refunded twice", n))
	}
	// Stock reserved and released balance exactly: what left the shelf is
	// what the completed orders hold.
	reserved := count("reserved", `SELECT coalesce(sum(quantity), 0) FROM stock_effects WHERE action = 'reserve'`)
	released := count("released", `SELECT coalesce(sum(quantity), 0) FROM stock_effects WHERE action = 'release'`)
	held := count("held", `SELECT coalesce(sum((s.data->>'quantity')::bigint), 0) FROM sagas s WHERE s.saga_type = $1 AND s.status = 'completed'`, ordersaga.Name)
	taken := count("taken", `SELECT coalesce(sum(CASE sku WHEN $1 THEN $2::bigint ELSE $3::bigint END - on_hand), 0) FROM stock_levels WHERE sku IN ($1, $4)`,
		plentySKU, int64(plentyUnits), int64(rareUnits), rareSKU)
	if reserved-released != held || taken != held {
		v = append(v, fmt.Sprintf("stock: reserved %d, released %d, off the shelf %d, held by completed orders %d: they must balance", reserved, released, taken, held))
	}
	if n := count("unbalanced", `SELECT count(*) FROM sagas s WHERE s.saga_type = $1 AND s.status = 'compensated' AND
		(SELECT count(*) FROM stock_effects e WHERE e.order_id = s.saga_id AND e.action = 'reserve') <>
		(SELECT count(*) FROM stock_effects e WHERE e.order_id = s.saga_id AND e.action = 'release')`, ordersaga.Name); n != 0 {
		v = append(v, fmt.Sprintf("%d compensated orders still hold stock", n))
	}
	// No card charged for a compensated order that was not refunded.
	if n := count("charged", `SELECT count(*) FROM sagas s WHERE s.saga_type = $1 AND s.status = 'compensated'
		AND EXISTS (SELECT 1 FROM payment_effects e WHERE e.order_id = s.saga_id AND e.action = 'charge')
		AND NOT EXISTS (SELECT 1 FROM payment_effects e WHERE e.order_id = s.saga_id AND e.action = 'refund')`, ordersaga.Name); n != 0 {
		v = append(v, fmt.Sprintf("%d compensated orders were charged and not refunded", n))
	}
	// Completed orders: charged once, never refunded, a pickup, confirmed.
	if n := count("completed", `SELECT count(*) FROM sagas s WHERE s.saga_type = $1 AND s.status = 'completed' AND NOT (
		EXISTS (SELECT 1 FROM payment_effects e WHERE e.order_id = s.saga_id AND e.action = 'charge')
		AND NOT EXISTS (SELECT 1 FROM payment_effects e WHERE e.order_id = s.saga_id AND e.action = 'refund')
		AND EXISTS (SELECT 1 FROM pickups p WHERE p.order_id = s.saga_id)
		AND EXISTS (SELECT 1 FROM saga_orders o WHERE o.order_id = s.saga_id AND o.status = 'confirmed'))`, ordersaga.Name); n != 0 {
		v = append(v, fmt.Sprintf("%d completed orders lack their charge, pickup or confirmation", n))
	}
	if n := count("cancelled", `SELECT count(*) FROM sagas s WHERE s.saga_type = $1 AND s.status = 'compensated' AND (
		EXISTS (SELECT 1 FROM pickups p WHERE p.order_id = s.saga_id)
		OR NOT EXISTS (SELECT 1 FROM saga_orders o WHERE o.order_id = s.saga_id AND o.status = 'cancelled'))`, ordersaga.Name); n != 0 {
		v = append(v, fmt.Sprintf("%d compensated orders have a pickup or are not cancelled", n))
	}
	if rep.Parked != 1 || rep.RetriedByOperator != 1 {
		v = append(v, fmt.Sprintf("%d sagas parked and %d retried; want the one whose refund kept failing", rep.Parked, rep.RetriedByOperator))
	}
	// Which orders decline, run out or are refused depends on which
	// charges the payments outage turns into timeouts; the retried refund
	// does not.
	if rep.CompensationRetries == 0 {
		v = append(v, "no compensation was retried, though one refund fails until the operator steps in")
	}
	if rep.OrchestratorCrashes != 1 || rep.PaymentsCrashes != 1 {
		v = append(v, fmt.Sprintf("crashes: orchestrator %d, payments %d; want 1 each", rep.OrchestratorCrashes, rep.PaymentsCrashes))
	}
	return v
}
