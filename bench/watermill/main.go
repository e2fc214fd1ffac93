// Command watermill runs protoevents and Watermill (watermill-sql's
// transactional publisher and Forwarder, watermill-kafka's publisher and
// subscriber) side by side on one Postgres and one in-process Kafka over
// TCP, in interleaved rounds, and prints each measurement as a Go benchmark
// line (BenchmarkWatermill/…) plus the ratios, median and range over the
// rounds. bench/report reads the lines and checks the targets.
//
//	go run . [-rounds 3] [-events 20000] [-workers 2] [-consume 5000] [-write 3s] [-e2e 3s] [-only drain,write,consume,e2e,wal] [-cpuprofile file]
//
// Postgres is $PROTOEVENTS_TEST_DATABASE_URL or, without it, a throwaway
// cluster; Kafka is $PROTOEVENTS_KAFKA_BROKERS (make bench-kafka: a real
// Apache Kafka node) or in-process (kfake). It is its own module so the
// library never depends on Watermill.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	"github.com/protoevents/protoevents/runtime/outbox"
)

type config struct {
	rounds, events, consume int
	workers                 int // the relay's lane workers in the drain
	write, e2e              time.Duration
	only                    map[string]bool
}

func main() {
	var c config
	only := flag.String("only", "drain,write,consume,e2e,wal", "comma-separated measurements to run")
	flag.IntVar(&c.rounds, "rounds", 3, "interleaved rounds")
	flag.IntVar(&c.events, "events", 20000, "events per relay drain")
	flag.IntVar(&c.workers, "workers", 2, "our relay's lane workers in the drain (outbox.WithWorkers), and the claim-and-mark baseline's connections")
	flag.IntVar(&c.consume, "consume", 5000, "events per consumer run")
	flag.DurationVar(&c.write, "write", 3*time.Second, "time each variant of the outbox write gets per round, in interleaved slices")
	flag.DurationVar(&c.e2e, "e2e", 3*time.Second, "duration of each end-to-end run")
	cpuProfile := flag.String("cpuprofile", "", "write the bench process's CPU profile to this file")
	relayProcess := relayProcessFlags()
	flag.Parse()
	if child, err := relayProcess(c.workers); child {
		if err != nil {
			fmt.Fprintln(os.Stderr, "watermill bench:", err)
			os.Exit(1)
		}
		return
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "watermill bench: cpu profile:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	c.only = map[string]bool{}
	for _, s := range strings.Split(*only, ",") {
		c.only[strings.TrimSpace(s)] = true
	}
	if err := run(context.Background(), c); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "watermill bench:", err)
		os.Exit(1)
	}
}

// results holds every round's value of each measurement.
type results map[string][]float64

func (r results) add(name, unit string, v float64) {
	fmt.Printf("BenchmarkWatermill/%s 1 %.3f %s\n", name, v, unit)
	r[name+" "+unit] = append(r[name+" "+unit], v)
}

// addE2E records an end-to-end run: its p50, p99 and rate.
func (r results) addE2E(name string, e e2eResult) {
	r.add(name, "p50-ms", e.p50)
	r.add(name, "p99-ms", e.p99)
	r.add(name, "events/s", e.rate)
}

func run(ctx context.Context, c config) error {
	e, err := startEnv(ctx, wantsWAL(c.only))
	if err != nil {
		return err
	}
	defer e.stop()
	res := results{}
	for round := 1; round <= c.rounds; round++ {
		fmt.Fprintf(os.Stderr, "watermill bench: round %d/%d\n", round, c.rounds)
		// Alternate who goes first, so a slow spell of the machine hits both.
		oursFirst := round%2 == 1
		if c.only["drain"] {
			if err := drainRound(ctx, e, c, res, oursFirst); err != nil {
				return fmt.Errorf("drain: %w", err)
			}
		}
		if c.only["write"] {
			if err := writeRound(ctx, e, c, res, oursFirst); err != nil {
				return fmt.Errorf("write: %w", err)
			}
		}
		if c.only["consume"] {
			if err := consumeRound(ctx, e, c, res, oursFirst); err != nil {
				return fmt.Errorf("consume: %w", err)
			}
		}
		if c.only["e2e"] {
			if err := e2eRound(ctx, e, c, res, oursFirst); err != nil {
				return fmt.Errorf("end to end: %w", err)
			}
		}
		if wantsWAL(c.only) {
			if err := walRound(ctx, e, c, res, oursFirst); err != nil {
				return fmt.Errorf("WAL relay: %w", err)
			}
		}
	}
	summary(res)
	return nil
}

// inTurn runs runs in order when first is set, else starting from the
// last (the others after it in order), stopping at the first error: the
// runs of a round take turns going first.
func inTurn(first bool, runs ...func() error) error {
	if !first {
		runs = slices.Concat(runs[len(runs)-1:], runs[:len(runs)-1])
	}
	for _, run := range runs {
		if err := run(); err != nil {
			return err
		}
	}
	return nil
}

// inOrder runs a and b, a first when aFirst.
func inOrder(aFirst bool, a, b func() error) error {
	if !aFirst {
		a, b = b, a
	}
	if err := a(); err != nil {
		return err
	}
	return b()
}

func drainRound(ctx context.Context, e *env, c config, res results, oursFirst bool) error {
	oursRun := func() error {
		return e.withOurs(ctx, "wmb_ours", func(o *ours) error {
			r, err := o.drain(ctx, e.brokers, c.events, c.workers)
			if err != nil {
				return err
			}
			res.add("drain/ours", "events/s", r.rate)
			res.add("drain/ours", "setup-ms", float64(r.setup.Microseconds())/1000)
			return nil
		})
	}
	wmRun := func() error {
		return e.withWM(ctx, "wmb_wm", func(w *wm) error {
			r, err := w.drain(ctx, e.brokers, c.events)
			if err != nil {
				return err
			}
			res.add("drain/watermill", "events/s", r.rate)
			res.add("drain/watermill", "setup-ms", float64(r.setup.Microseconds())/1000)
			return nil
		})
	}
	if err := inOrder(oursFirst, oursRun, wmRun); err != nil {
		return err
	}
	return e.withOurs(ctx, "wmb_db", func(o *ours) error {
		v, err := claimAndMark(ctx, o, c.events, c.workers)
		if err != nil {
			return err
		}
		res.add("drain/db-claim-mark", "events/s", v)
		return nil
	})
}

func writeRound(ctx context.Context, e *env, c config, res results, oursFirst bool) error {
	s, err := e.newSchema(ctx, "wmb_write")
	if err != nil {
		return err
	}
	defer s.drop()
	o, err := newOurs(ctx, s)
	if err != nil {
		return err
	}
	w, err := newWM(ctx, s)
	if err != nil {
		return err
	}
	d := descriptorFor("write-" + suffix())
	wmTopic := "write-wm-" + suffix()
	oursPublish := func(ctx context.Context, tx pgx.Tx, ord *ordersv1.OrderPlaced) error {
		return o.publish(ctx, tx, d, ord)
	}
	// ours is outbox.BeginFunc (a CommitTx: the outbox row goes with the
	// COMMIT); ours-plain is Write on a plain pgx transaction, one INSERT
	// round trip of its own. Both BEGIN as bare does, so each ratio over
	// bare is the event's own cost.
	variants := []struct {
		name    string
		publish producer
	}{
		{"bare", producer{}},
		{"ours", producer{begin: outbox.BeginFunc, publish: oursPublish}},
		{"ours-plain", producer{publish: oursPublish}},
		{"watermill", producer{publish: func(ctx context.Context, tx pgx.Tx, ord *ordersv1.OrderPlaced) error {
			return w.publish(ctx, tx, wmTopic, ord)
		}}},
		// The floor under ours: the same row with pgx alone (raw.go).
		{"raw-plain", producer{publish: rawPlain(d.Topic)}},
		{"raw-batch", producer{begin: rawBatchBegin, publish: rawBatchHold(d.Topic)}},
		{"raw-roundtrip", producer{publish: rawRoundTrip}},
	}
	if !oursFirst {
		variants[1], variants[2], variants[3] = variants[3], variants[1], variants[2]
	}
	ps := make([]producer, len(variants))
	for i, v := range variants {
		ps[i] = v.publish
	}
	for _, clients := range []int{1, 8} {
		ns, err := writeCosts(ctx, s, clients, c.write, ps)
		if err != nil {
			return fmt.Errorf("outbox write, %d clients: %w", clients, err)
		}
		for i, v := range variants {
			res.add(fmt.Sprintf("write-%d/%s", clients, v.name), "ns/op", ns[i])
		}
	}
	return nil
}

func consumeRound(ctx context.Context, e *env, c config, res results, oursFirst bool) error {
	s, err := e.newSchema(ctx, "wmb_consume")
	if err != nil {
		return err
	}
	defer s.drop()
	o, err := newOurs(ctx, s)
	if err != nil {
		return err
	}
	w, err := newWM(ctx, s)
	if err != nil {
		return err
	}
	return inOrder(oursFirst, func() error {
		v, err := o.consume(ctx, e.brokers, c.consume)
		if err != nil {
			return fmt.Errorf("ours: %w", err)
		}
		res.add("consume/ours", "events/s", v)
		return nil
	}, func() error {
		v, err := w.consume(ctx, e.brokers, c.consume)
		if err != nil {
			return fmt.Errorf("watermill: %w", err)
		}
		res.add("consume/watermill", "events/s", v)
		return nil
	})
}

// e2eRates are the end-to-end runs: total rate, 4 producers each.
var e2eRates = []int{500, 1000, 2000}

const e2eProducers = 4

func e2eRound(ctx context.Context, e *env, c config, res results, oursFirst bool) error {
	for _, rate := range e2eRates {
		record := func(name string, r e2eResult) { res.addE2E(fmt.Sprintf("e2e-%d/%s", rate, name), r) }
		// ours: outbox.BeginFunc (a CommitTx) and the relay in this
		// process, woken by the Writer; ours-apart: the shape most users
		// deploy, a plain pgx.BeginFunc and the relay in a process of its
		// own (startRelayProcess), which finds the rows by polling.
		oursRun := func(name string, begin beginFunc, start func(*schema, *progress) (func() error, error)) func() error {
			return func() error {
				return e.withOurs(ctx, "wmb_e2e_ours", func(o *ours) error {
					topic := "e2e-" + name + "-" + suffix()
					if err := createTopics(ctx, e.brokers, topic); err != nil {
						return err
					}
					d := descriptorFor(topic)
					r, err := endToEnd(ctx, e.brokers, topic, rate, e2eProducers, c.e2e, o.s,
						producer{begin: begin, publish: func(ctx context.Context, tx pgx.Tx, ord *ordersv1.OrderPlaced) error {
							return o.publish(ctx, tx, d, ord)
						}},
						func(p *progress) (func() error, error) { return start(o.s, p) })
					if err != nil {
						return fmt.Errorf("%s at %d/s: %w", name, rate, err)
					}
					record(name, r)
					return nil
				})
			}
		}
		runs := []func() error{
			oursRun("ours", outbox.BeginFunc, func(s *schema, p *progress) (func() error, error) {
				return (&ours{s: s}).startRelay(e.brokers, 1, p)
			}),
			oursRun("ours-apart", nil, func(s *schema, p *progress) (func() error, error) {
				return startRelayProcess(s, e.brokers, 1, p)
			}),
			func() error {
				return e.withWM(ctx, "wmb_e2e_wm", func(w *wm) error {
					r, err := w.endToEnd(ctx, e, c, rate)
					if err != nil {
						return err
					}
					record("watermill", r)
					return nil
				})
			},
		}
		if err := inTurn(oursFirst, runs...); err != nil {
			return err
		}
	}
	return nil
}

// summary prints every pair's per-round ratio: median, min and max.
func summary(res results) {
	pairs := [][3]string{
		{"relay drain, ours / Watermill Forwarder", "drain/ours events/s", "drain/watermill events/s"},
		{"relay drain, ours / database claim-and-mark", "drain/ours events/s", "drain/db-claim-mark events/s"},
		{"relay drain, Watermill / database claim-and-mark", "drain/watermill events/s", "drain/db-claim-mark events/s"},
		{"outbox write, 1 client, ours / bare insert", "write-1/ours ns/op", "write-1/bare ns/op"},
		{"outbox write, 1 client, ours-plain / bare insert", "write-1/ours-plain ns/op", "write-1/bare ns/op"},
		{"outbox write, 1 client, Watermill / bare insert", "write-1/watermill ns/op", "write-1/bare ns/op"},
		{"outbox write, 8 clients, ours / bare insert", "write-8/ours ns/op", "write-8/bare ns/op"},
		{"outbox write, 8 clients, ours-plain / bare insert", "write-8/ours-plain ns/op", "write-8/bare ns/op"},
		{"outbox write, 8 clients, Watermill / bare insert", "write-8/watermill ns/op", "write-8/bare ns/op"},
		{"outbox write, 1 client, raw pgx INSERT / bare insert", "write-1/raw-plain ns/op", "write-1/bare ns/op"},
		{"outbox write, 1 client, raw pgx INSERT+COMMIT batch / bare", "write-1/raw-batch ns/op", "write-1/bare ns/op"},
		{"outbox write, 8 clients, raw pgx INSERT / bare insert", "write-8/raw-plain ns/op", "write-8/bare ns/op"},
		{"outbox write, 8 clients, raw pgx INSERT+COMMIT batch / bare", "write-8/raw-batch ns/op", "write-8/bare ns/op"},
		{"outbox write, 1 client, a SELECT 1 round trip / bare", "write-1/raw-roundtrip ns/op", "write-1/bare ns/op"},
		{"outbox write, 8 clients, a SELECT 1 round trip / bare", "write-8/raw-roundtrip ns/op", "write-8/bare ns/op"},
		{"consumer with dedup, ours / Watermill", "consume/ours events/s", "consume/watermill events/s"},
	}
	for _, rate := range e2eRates {
		pre := fmt.Sprintf("e2e-%d/", rate)
		pairs = append(pairs,
			[3]string{fmt.Sprintf("end to end at %d/s, p50 ours / Watermill", rate), pre + "ours p50-ms", pre + "watermill p50-ms"},
			[3]string{fmt.Sprintf("end to end at %d/s, p99 ours / Watermill", rate), pre + "ours p99-ms", pre + "watermill p99-ms"},
			[3]string{fmt.Sprintf("end to end at %d/s, p50 ours-apart / Watermill", rate), pre + "ours-apart p50-ms", pre + "watermill p50-ms"},
			[3]string{fmt.Sprintf("end to end at %d/s, p99 ours-apart / Watermill", rate), pre + "ours-apart p99-ms", pre + "watermill p99-ms"})
	}
	for _, clients := range []int{1, 8} {
		pre := fmt.Sprintf("wal-write-%d/", clients)
		pairs = append(pairs,
			[3]string{fmt.Sprintf("WAL source write, %d client(s), CommitTx / bare", clients), pre + "wal ns/op", pre + "bare ns/op"},
			[3]string{fmt.Sprintf("WAL source write, %d client(s), plain pgx.Tx / bare", clients), pre + "wal-plain ns/op", pre + "bare ns/op"},
			[3]string{fmt.Sprintf("table write on the logical server, %d client(s), CommitTx / bare", clients), pre + "table ns/op", pre + "bare ns/op"},
			[3]string{fmt.Sprintf("table write on the logical server, %d client(s), plain / bare", clients), pre + "table-plain ns/op", pre + "bare ns/op"},
			[3]string{fmt.Sprintf("raw pgx message with the COMMIT, %d client(s) / bare", clients), pre + "raw-wal ns/op", pre + "bare ns/op"},
			[3]string{fmt.Sprintf("a SELECT 1 round trip on the logical server, %d client(s) / bare", clients), pre + "raw-roundtrip ns/op", pre + "bare ns/op"},
			[3]string{fmt.Sprintf("Watermill on the logical server, %d client(s) / bare", clients), pre + "watermill ns/op", pre + "bare ns/op"},
			[3]string{fmt.Sprintf("WAL source write, %d client(s), plain pgx.Tx / Watermill", clients), pre + "wal-plain ns/op", pre + "watermill ns/op"})
	}
	pairs = append(pairs,
		[3]string{"WAL relay drain / polling relay drain", "wal-drain/wal events/s", "wal-drain/table events/s"},
		[3]string{"WAL relay drain / raw decoding of the slot", "wal-drain/wal events/s", "wal-drain/raw-decode events/s"})
	for _, rate := range walE2ERates {
		pre := fmt.Sprintf("wal-e2e-%d/", rate)
		pairs = append(pairs,
			[3]string{fmt.Sprintf("end to end at %d/s, p50 WAL relay / polling relay (both apart)", rate), pre + "wal-apart p50-ms", pre + "table-apart p50-ms"},
			[3]string{fmt.Sprintf("end to end at %d/s, p99 WAL relay / polling relay (both apart)", rate), pre + "wal-apart p99-ms", pre + "table-apart p99-ms"},
			[3]string{fmt.Sprintf("end to end at %d/s, p50 WAL relay apart / Watermill", rate), pre + "wal-apart p50-ms", pre + "watermill p50-ms"},
			[3]string{fmt.Sprintf("end to end at %d/s, p99 WAL relay apart / Watermill", rate), pre + "wal-apart p99-ms", pre + "watermill p99-ms"})
	}
	fmt.Println("\nratios over the rounds (median, min–max):")
	for _, p := range pairs {
		num, den := res[p[1]], res[p[2]]
		n := min(len(num), len(den))
		if n == 0 {
			continue
		}
		var rs []float64
		for i := range n {
			if den[i] > 0 {
				rs = append(rs, num[i]/den[i])
			}
		}
		if len(rs) == 0 {
			continue
		}
		sort.Float64s(rs)
		fmt.Printf("  %-52s %6.2fx  (%.2f–%.2f, %d rounds)\n", p[0], median(rs), rs[0], rs[len(rs)-1], len(rs))
	}
	for _, who := range []string{"ours", "watermill"} {
		rate, p99 := res["e2e-2000/"+who+" events/s"], res["e2e-2000/"+who+" p99-ms"]
		if len(rate) == 0 {
			continue
		}
		lo, hi := minMax(rate)
		fmt.Printf("  %-52s %6.0f/s (%.0f–%.0f), p99 %.1f ms (median)\n",
			fmt.Sprintf("%d producers aiming at 2000/s, %s", e2eProducers, who), median(rate), lo, hi, median(p99))
	}
	fmt.Println("\nabsolute figures (median over the rounds):")
	var names []string
	for k := range res {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Printf("  %-40s %12.1f\n", k, median(res[k]))
	}
}
