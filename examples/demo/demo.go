// Package demo runs the protoevents example end to end: the orders service
// places orders (business row + outbox rows in one transaction), the relay
// publishes the outbox to Kafka, and the shipping service consumes
// OrderPlaced idempotently. Along the way it injects the failures the
// library exists for: a poison order that ends in the DLQ, a relay crash
// between publishing and marking (so events are sent twice), and a
// consumer crash between its DB commit and its offset commit (so events
// are delivered twice). It then checks the invariants and reports.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	ordersv2 "github.com/protoevents/protoevents/examples/gen/shop/orders/v2"
	shippingv1 "github.com/protoevents/protoevents/examples/gen/shop/shipping/v1"
	"github.com/protoevents/protoevents/examples/orders"
	"github.com/protoevents/protoevents/examples/shipping"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/faultinject"
	"github.com/protoevents/protoevents/runtime/outbox"
	"github.com/protoevents/protoevents/runtime/topics"
	"github.com/protoevents/protoevents/runtime/walrelay"
)

// Config says how big the run is and where it runs.
type Config struct {
	// DB is the database the services share (each has its own tables).
	DB *pgxpool.Pool
	// Brokers is the Kafka cluster.
	Brokers []string
	// Orders is how many orders to place, poison included.
	Orders int
	// PoisonCountry is the shipping country no carrier serves: the one
	// order shipped there fails until an operator fixes the configuration.
	PoisonCountry string
	// Progress receives one line per second while the run goes on; nil
	// discards.
	Progress io.Writer
	// Log receives the runtime's logs; nil discards.
	Log *slog.Logger
	// Timeout bounds the whole run.
	Timeout time.Duration
	// Relay is "table" (the default: the polling relay reads the outbox
	// table) or "wal" (the producers write logical decoding messages and
	// the WAL relay reads them from a replication slot; the database needs
	// wal_level = logical).
	Relay string
}

// Report is what the run observed.
type Report struct {
	OrdersPlaced       int
	EventsWritten      int   // outbox rows written by the orders service (v1 + v2)
	OrdersCancelled    int   // orders cancelled once shipped (an OrderCancelled each)
	CancelsApplied     int64 // cancellations shipping applied (its second event type)
	Relay              string
	Published          int64 // rows the relays marked published (re-sent rows count once); records the WAL relay published (re-sent ones count again)
	RelayCrashes       int
	ConsumerCrashes    int
	Applied            int64 // OrderPlaced v1 events whose effect is in the shipping tables
	AppliedV2          int64 // OrderPlaced v2 events the revenue consumer applied
	ShipmentEvents     int64 // ShipmentCreated events shipping wrote to its outbox
	DuplicatesAbsorbed int64 // redeliveries the dedup table absorbed
	Retries            int64
	DeadLettered       int64
	DLQEntries         []consumer.DLQEntry
	PoisonOrderID      string
	Violations         []string
	Elapsed            time.Duration
}

// OK reports whether every invariant held.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

// Print writes the report.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "\nprotoevents demo report (%s)\n", r.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(w, "  orders placed                 %6d  (1 to an unserved country: the poison order)\n", r.OrdersPlaced)
	fmt.Fprintf(w, "  events written to the outbox  %6d  (OrderPlaced v2 and, side by side, v1)\n", r.EventsWritten)
	fmt.Fprintf(w, "  published by the relay        %6d  (those + %d OrderCancelled + %d ShipmentCreated from shipping's outbox; after %d relay crash between publish and mark)\n", r.Published, r.OrdersCancelled, r.ShipmentEvents, r.RelayCrashes)
	fmt.Fprintf(w, "  consumed once (applied)       %6d  (shipping, OrderPlaced v1)\n", r.Applied)
	fmt.Fprintf(w, "  consumed once (applied)       %6d  (revenue, OrderPlaced v2: migrated already)\n", r.AppliedV2)
	fmt.Fprintf(w, "  cancellations applied         %6d  of %d (shipping, OrderCancelled: the same service consumer)\n", r.CancelsApplied, r.OrdersCancelled)
	fmt.Fprintf(w, "  duplicates absorbed           %6d  (re-sent by the relay, redelivered after %d consumer crash)\n", r.DuplicatesAbsorbed, r.ConsumerCrashes)
	fmt.Fprintf(w, "  retries                       %6d\n", r.Retries)
	fmt.Fprintf(w, "  dead-lettered                 %6d  (%s)\n", r.DeadLettered, ordersv1.OrderPlacedDLQTopic)
	for _, e := range r.DLQEntries {
		fmt.Fprintf(w, "    DLQ %d@%d  event %s  order %s  after %d attempts: %s\n", e.Partition, e.Offset, e.EventID, e.Key, e.Attempts, firstLine(e.Error))
	}
	if r.OK() {
		fmt.Fprintln(w, "  invariants: OK (no lost event, no phantom event, each event applied exactly once, poison in its DLQ)")
		return
	}
	fmt.Fprintln(w, "  invariants VIOLATED:")
	for _, v := range r.Violations {
		fmt.Fprintln(w, "   -", v)
	}
}

func firstLine(s string) string {
	for i, c := range s {
		if c == '\n' {
			return s[:i]
		}
	}
	return s
}

// counters are updated by the consumer hooks.
type counters struct {
	duplicates, retries, deadLettered atomic.Int64
	published                         atomic.Int64
}

func (c *counters) hooks() consumer.Hooks {
	return consumer.Hooks{
		Duplicate:    func(events.Delivery, string) { c.duplicates.Add(1) },
		Retry:        func(events.Delivery, error, time.Duration) { c.retries.Add(1) },
		DeadLettered: func(consumer.DeadLetter) { c.deadLettered.Add(1) },
	}
}

// revenueSchema is the table of the demo's second consumer, which already
// reads OrderPlaced v2 while shipping still reads v1.
const revenueSchema = `CREATE TABLE IF NOT EXISTS revenue (
	order_id text PRIMARY KEY,
	currency text NOT NULL,
	units    bigint NOT NULL
)`

// recordRevenue is the v2 consumer's handler.
func recordRevenue(ctx context.Context, tx pgx.Tx, _ events.Meta, ev *ordersv2.OrderPlaced) error {
	_, err := tx.Exec(ctx, `INSERT INTO revenue (order_id, currency, units) VALUES ($1, $2, $3)`,
		ev.GetOrderId(), ev.GetTotal().GetCurrency(), ev.GetTotal().GetUnits())
	return err
}

// Setup creates the tables and topics the demo needs.
func Setup(ctx context.Context, pool *pgxpool.Pool, brokers []string) error {
	if err := outbox.Migrate(ctx, pool); err != nil {
		return err
	}
	if err := consumer.Migrate(ctx, pool); err != nil {
		return err
	}
	if err := orders.Migrate(ctx, pool); err != nil {
		return err
	}
	if err := shipping.Migrate(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, revenueSchema); err != nil {
		return fmt.Errorf("demo: migrate revenue: %w", err)
	}
	// Every event of the example's schemas, from the generated per-file
	// registries: its topic and its DLQ.
	all := append(append(append([]*events.Descriptor{}, ordersv1.OrdersEvents...), ordersv2.OrdersEvents...), shippingv1.ShippingEvents...)
	_, err := topics.Ensure(ctx, brokers, topics.Config{Partitions: 3}, all...)
	return err
}

// Run executes the demo on a set-up database and cluster.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	start := time.Now()
	if cfg.Orders < 2 {
		cfg.Orders = 2
	}
	if cfg.PoisonCountry == "" {
		cfg.PoisonCountry = "ZZ"
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	// The supervisors and the main loop all report progress.
	cfg.Progress = &lockedWriter{w: cfg.Progress}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	rep := &Report{}
	var cnt counters

	if cfg.Relay == "" {
		cfg.Relay = "table"
	}
	rep.Relay = cfg.Relay
	w, err := NewWriter(cfg.Relay)
	if err != nil {
		return nil, err
	}
	orderSvc := orders.New(cfg.DB, w)
	shipSvc := shipping.New(w, cfg.PoisonCountry)

	var wg sync.WaitGroup
	errc := make(chan error, 8)
	runCtx, stop := context.WithCancel(ctx)
	defer func() { stop(); wg.Wait() }()

	// The relay: the first instance crashes after its second published
	// batch, before marking (or confirming) it; a second instance takes
	// over and re-sends.
	first, next, armed, err := relays(runCtx, cfg, &cnt)
	if err != nil {
		return nil, err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		superviseOnce(armed, cfg.Progress, "relay", &rep.RelayCrashes, first, next, errc)
	}()

	// The shipping consumer: the first instance crashes after committing
	// its 25th transaction but before committing the Kafka offset; the
	// restarted one gets those messages again and the dedup table absorbs
	// them.
	copts := []consumer.Option{consumer.WithHooks(cnt.hooks()), consumer.WithLogger(cfg.Log),
		consumer.WithBackoff(20*time.Millisecond, 200*time.Millisecond), consumer.WithMaxAttempts(4)}
	var commits atomic.Int64
	consumerCrash := faultinject.ConsumerPoints{AfterDBCommit: func(kafka.Message) error {
		if commits.Add(1) == 25 {
			return errors.New("demo: consumer crash between DB commit and offset commit")
		}
		return nil
	}}
	firstConsumer, err := shipSvc.NewConsumer(cfg.DB, cfg.Brokers, copts...)
	if err != nil {
		return nil, err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		// The crash is armed through the consumers' Run context; it fires
		// once, at the 25th commit.
		superviseOnce(faultinject.Consumer(runCtx, consumerCrash), cfg.Progress, "consumer", &rep.ConsumerCrashes, firstConsumer, func() (runner, error) {
			return shipSvc.NewConsumer(cfg.DB, cfg.Brokers, copts...)
		}, errc)
	}()

	// The revenue consumer has migrated to OrderPlaced v2 already.
	revenue, err := consumer.New(cfg.DB, cfg.Brokers, "revenue", consumer.WithLogger(cfg.Log))
	if err != nil {
		return nil, err
	}
	if err := ordersv2.HandleOrderPlaced(revenue, recordRevenue); err != nil {
		return nil, err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := revenue.Run(runCtx); err != nil && runCtx.Err() == nil {
			errc <- fmt.Errorf("revenue consumer: %w", err)
		}
	}()

	// The orders service places orders for 20 customers; one ships to the
	// unserved country.
	poison := cfg.Orders / 2
	for i := 0; i < cfg.Orders; i++ {
		country := []string{"DE", "FR", "NL", "SE"}[i%4]
		if i == poison {
			country = cfg.PoisonCountry
		}
		id := fmt.Sprintf("ord-%05d", i)
		if i == poison {
			rep.PoisonOrderID = id
		}
		ids, err := orderSvc.PlaceOrder(ctx, orders.Order{
			ID: id, CustomerID: fmt.Sprintf("cust-%02d", i%20), TotalCents: int64(1000 + i), Currency: "EUR", Country: country,
			Items: []*ordersv2.LineItem{{Sku: "sku-1", Quantity: uint32(1 + i%3)}}, CorrelationID: "demo-" + id,
		})
		if err != nil {
			return nil, err
		}
		rep.OrdersPlaced++
		rep.EventsWritten += len(ids)
	}
	fmt.Fprintf(cfg.Progress, "  placed %d orders (%d outbox rows)\n", rep.OrdersPlaced, rep.EventsWritten)

	// Wait until every good order is applied and the poison is in the DLQ;
	// then cancel every 100th shipped order and wait for shipping (the same
	// service consumer, its second event type) to cancel those shipments.
	want := int64(cfg.Orders - 1)
	cancelSent := false
	walTarget := "" // the WAL relay's catch-up point (Relay "wal")
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for ticks, done := 0, false; !done; {
		select {
		case err := <-errc:
			return nil, err
		case <-ctx.Done():
			rep.Violations = append(rep.Violations, fmt.Sprintf("timed out after %s: applied %d of %d, dead-lettered %d", cfg.Timeout, effects(context.Background(), cfg.DB), want, cnt.deadLettered.Load()))
			done = true
		case <-tick.C:
			var revenueRows, pending int64
			if cfg.Relay == "wal" {
				// No table: everything written before the previous tick
				// is published once the slot confirmed the WAL position
				// read then.
				caughtUp := false
				if walTarget != "" {
					_ = cfg.DB.QueryRow(ctx, `SELECT coalesce(bool_and(confirmed_flush_lsn >= $1::pg_lsn), false) FROM pg_replication_slots WHERE slot_name = $2`,
						walTarget, walrelay.DefaultSlot).Scan(&caughtUp)
				}
				_ = cfg.DB.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&walTarget)
				if !caughtUp {
					pending = 1
				}
			} else if st, err := outbox.Status(ctx, cfg.DB); err == nil {
				pending = st.Pending
			}
			_ = cfg.DB.QueryRow(ctx, `SELECT count(*) FROM revenue`).Scan(&revenueRows)
			applied := effects(ctx, cfg.DB)
			shipped := applied >= want && cnt.deadLettered.Load() >= 1 && revenueRows >= int64(cfg.Orders)
			if shipped && !cancelSent {
				if err := cancelOrders(ctx, orderSvc, cfg.Orders, rep); err != nil {
					return nil, err
				}
				cancelSent = true
				continue
			}
			done = shipped && pending == 0 && cancelsApplied(ctx, cfg.DB) >= int64(rep.OrdersCancelled)
			if ticks++; ticks%4 == 0 || done {
				fmt.Fprintf(cfg.Progress, "  published %d, shipping applied %d/%d, revenue applied %d/%d, duplicates absorbed %d, retries %d, dead-lettered %d\n",
					cnt.published.Load(), applied, want, revenueRows, cfg.Orders, cnt.duplicates.Load(), cnt.retries.Load(), cnt.deadLettered.Load())
			}
		}
	}
	stop()
	wg.Wait()

	// The run may have timed out: what follows gets a fresh deadline.
	ctx, cancelReport := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancelReport()
	rep.Published = cnt.published.Load()
	// The hook's count misses an event whose transaction committed just
	// before a crash; the database is the truth.
	rep.Applied = effects(ctx, cfg.DB)
	if err := cfg.DB.QueryRow(ctx, `SELECT count(*) FROM revenue`).Scan(&rep.AppliedV2); err != nil {
		return nil, fmt.Errorf("demo: count revenue: %w", err)
	}
	if err := cfg.DB.QueryRow(ctx, `SELECT count(*) FROM shipments`).Scan(&rep.ShipmentEvents); err != nil {
		return nil, fmt.Errorf("demo: count shipments: %w", err)
	}
	rep.CancelsApplied = cancelsApplied(ctx, cfg.DB)
	rep.DuplicatesAbsorbed = cnt.duplicates.Load()
	rep.Retries = cnt.retries.Load()
	rep.DeadLettered = cnt.deadLettered.Load()
	rep.DLQEntries, err = consumer.ListDLQ(ctx, cfg.Brokers, ordersv1.OrderPlacedDLQTopic)
	if err != nil {
		return nil, err
	}
	rep.Violations = append(rep.Violations, Check(ctx, cfg.DB, rep)...)
	rep.Elapsed = time.Since(start)
	return rep, nil
}

// cancelOrders cancels every 100th order but the poison one (all shipped
// by now), each with its OrderCancelled in the same transaction.
func cancelOrders(ctx context.Context, orderSvc *orders.Service, n int, rep *Report) error {
	for i := 50; i < n; i += 100 {
		id := fmt.Sprintf("ord-%05d", i)
		if id == rep.PoisonOrderID {
			continue
		}
		if _, err := orderSvc.CancelOrder(ctx, id, "customer changed their mind", "demo", "demo-"+id); err != nil {
			return err
		}
		rep.OrdersCancelled++
	}
	return nil
}

// cancelsApplied counts the cancellations shipping recorded.
func cancelsApplied(ctx context.Context, db *pgxpool.Pool) int64 {
	var n int64
	_ = db.QueryRow(ctx, `SELECT count(*) FROM cancelled_orders`).Scan(&n)
	return n
}

// NewWriter is the producers' outbox Writer for relay ("table" or
// "wal").
func NewWriter(relay string) (*outbox.Writer, error) {
	switch relay {
	case "table", "":
		return outbox.NewWriter()
	case "wal":
		return outbox.NewWriter(outbox.WithWALSource(walrelay.DefaultSlot))
	}
	return nil, fmt.Errorf("demo: relay %q: want table or wal", relay)
}

// relays returns the demo's first relay, the factory of its replacement
// and the context that arms the first one's crash after its second
// published batch.
func relays(ctx context.Context, cfg Config, cnt *counters) (first runner, next func() (runner, error), armed context.Context, err error) {
	batches := 0
	crashNow := func() error {
		if batches++; batches == 2 {
			return errors.New("demo: relay crash between publish and mark")
		}
		return nil
	}
	if cfg.Relay == "wal" {
		var mu sync.Mutex // the WAL relay's lanes publish side by side
		opts := []walrelay.Option{walrelay.WithBatchSize(50), walrelay.WithLogger(cfg.Log),
			walrelay.WithStatusInterval(100 * time.Millisecond), walrelay.WithStandbyRetry(100 * time.Millisecond), walrelay.WithHeartbeat(100 * time.Millisecond),
			walrelay.WithHooks(walrelay.Hooks{Published: func(n int) { cnt.published.Add(int64(n)) }})}
		next = func() (runner, error) { return walrelay.New(cfg.DB, cfg.Brokers, opts...) }
		armed = faultinject.WALRelay(ctx, faultinject.WALRelayPoints{AfterPublish: func(context.Context, int) error {
			mu.Lock()
			defer mu.Unlock()
			return crashNow()
		}})
	} else {
		opts := []outbox.RelayOption{outbox.WithBatchSize(50), outbox.WithLogger(cfg.Log),
			outbox.WithHooks(outbox.Hooks{Published: func(n int) { cnt.published.Add(int64(n)) }})}
		next = func() (runner, error) { return outbox.NewRelay(cfg.DB, cfg.Brokers, opts...) }
		// The crash is armed through the relays' Run context (the second
		// batch overall crashes: the first instance's; the replacement's
		// batches come later and go through).
		armed = faultinject.Relay(ctx, faultinject.RelayPoints{AfterPublish: func(context.Context, []faultinject.Row) error {
			return crashNow()
		}})
	}
	first, err = next()
	return first, next, armed, err
}

// lockedWriter serialises writes from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// runner is what the demo supervises: a relay or a consumer.
type runner interface{ Run(context.Context) error }

// superviseOnce runs first until ctx ends. If it crashes before, it counts
// the crash in crashes, says so on progress, and runs the replacement from
// next until ctx ends; a failure of the replacement goes to errc.
func superviseOnce(ctx context.Context, progress io.Writer, what string, crashes *int, first runner, next func() (runner, error), errc chan<- error) {
	err := first.Run(ctx)
	if err == nil || ctx.Err() != nil {
		return
	}
	*crashes++
	fmt.Fprintf(progress, "  ! %s crashed (%v); restarting it\n", what, err)
	r, err := next()
	if err == nil {
		err = r.Run(ctx)
	}
	if err != nil && ctx.Err() == nil {
		errc <- fmt.Errorf("%s: %w", what, err)
	}
}

// effects counts the shipping handler's side effects.
func effects(ctx context.Context, db *pgxpool.Pool) int64 {
	var n int64
	_ = db.QueryRow(ctx, `SELECT count(*) FROM shipping_effects`).Scan(&n)
	return n
}

// Check verifies the invariants against the database and the report.
func Check(ctx context.Context, db *pgxpool.Pool, rep *Report) []string {
	var v []string
	bad := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }
	var twice, missing int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM (SELECT order_id FROM shipping_effects GROUP BY order_id HAVING count(*) > 1) d`).Scan(&twice); err != nil {
		bad("query effects: %v", err)
	}
	if twice > 0 {
		bad("%d orders were applied more than once", twice)
	}
	if err := db.QueryRow(ctx, `SELECT count(*) FROM orders o WHERE o.order_id <> $1
		AND NOT EXISTS (SELECT 1 FROM shipping_effects e WHERE e.order_id = o.order_id)`, rep.PoisonOrderID).Scan(&missing); err != nil {
		bad("query missing: %v", err)
	}
	if missing > 0 {
		bad("%d placed orders never reached shipping (lost events)", missing)
	}
	var poisonApplied int64
	_ = db.QueryRow(ctx, `SELECT count(*) FROM shipping_effects WHERE order_id = $1`, rep.PoisonOrderID).Scan(&poisonApplied)
	if poisonApplied != 0 {
		bad("the poison order was applied %d times", poisonApplied)
	}
	if st, err := outbox.Status(ctx, db); err != nil {
		bad("outbox status: %v", err)
	} else if st.Pending != 0 {
		bad("%d outbox rows still pending", st.Pending)
	}
	// The poison order is in the DLQ at least once. It can be there twice,
	// with one event ID, when the relay crash re-sent its batch: each copy
	// fails on its own. Redriving either applies it once.
	ids := map[string]bool{}
	for _, e := range rep.DLQEntries {
		if string(e.Key) != rep.PoisonOrderID {
			bad("unexpected DLQ entry for key %q: %s", e.Key, e.Error)
			continue
		}
		ids[e.EventID] = true
	}
	if len(ids) != 1 {
		bad("the DLQ holds %d distinct events of the poison order, want 1", len(ids))
	}
	if rep.AppliedV2 != int64(rep.OrdersPlaced) {
		bad("the v2 consumer applied %d events, want one per order (%d)", rep.AppliedV2, rep.OrdersPlaced)
	}
	var cancelled, stillBooked, unasked int64
	if err := db.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM cancelled_orders),
		(SELECT count(*) FROM shipments s JOIN cancelled_orders c USING (order_id) WHERE s.status <> 'cancelled'),
		(SELECT count(*) FROM cancelled_orders c JOIN orders o USING (order_id) WHERE o.cancelled_at IS NULL)`).Scan(&cancelled, &stillBooked, &unasked); err != nil {
		bad("query cancellations: %v", err)
	}
	if cancelled != int64(rep.OrdersCancelled) {
		bad("shipping applied %d cancellations, want %d", cancelled, rep.OrdersCancelled)
	}
	if stillBooked > 0 || unasked > 0 {
		bad("%d cancelled orders still have a booked shipment, %d cancellations were never asked for", stillBooked, unasked)
	}
	written := int64(rep.EventsWritten+rep.OrdersCancelled) + rep.ShipmentEvents
	if rep.Relay == "wal" {
		// The WAL relay counts what it sent: re-sent records count again.
		if rep.Published < written {
			bad("the WAL relay published %d records, but %d events were written", rep.Published, written)
		}
	} else if rep.Published != written {
		bad("the relay marked %d outbox rows published, but %d were written", rep.Published, written)
	}
	if rep.RelayCrashes > 0 && rep.DuplicatesAbsorbed == 0 {
		bad("the relay crashed after publishing, yet the consumer saw no duplicate")
	}
	return v
}

// Redrive republishes the poison order's DLQ entry and waits until the
// (fixed) shipping service applies it; it returns the number of times the
// order's effect exists afterwards, which must be 1.
func Redrive(ctx context.Context, cfg Config, fixed *shipping.Service, poisonOrderID string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := consumer.Redrive(ctx, cfg.Brokers, ordersv1.OrderPlacedDLQTopic, func(e consumer.DLQEntry) bool {
		return string(e.Key) == poisonOrderID
	}); err != nil {
		return 0, err
	}
	return ApplyRedriven(ctx, cfg, fixed, poisonOrderID)
}

// ApplyRedriven runs the shipping consumer (with the fixed configuration)
// until it has handled one more OrderPlaced message (applied, or absorbed as
// a duplicate), then returns how often the order's effect exists, which
// must be 1. The earlier consumers committed every offset, so the next
// message is the redriven one.
func ApplyRedriven(ctx context.Context, cfg Config, fixed *shipping.Service, orderID string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var handled atomic.Int64
	c, err := fixed.NewConsumer(cfg.DB, cfg.Brokers,
		consumer.WithLogger(log), consumer.WithHooks(consumer.Hooks{
			Processed: func(events.Delivery, string, time.Duration) { handled.Add(1) },
			Duplicate: func(events.Delivery, string) { handled.Add(1) },
		}))
	if err != nil {
		return 0, err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	for handled.Load() == 0 && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		return 0, err
	}
	if ctx.Err() != nil {
		return 0, fmt.Errorf("demo: no redriven message for order %s arrived: %w", orderID, ctx.Err())
	}
	var n int64
	if err := cfg.DB.QueryRow(context.Background(), `SELECT count(*) FROM shipping_effects WHERE order_id = $1`, orderID).Scan(&n); err != nil {
		return 0, fmt.Errorf("demo: count effects: %w", err)
	}
	return n, nil
}
