// Command report (bench/report, `make bench`) runs the project's
// benchmarks and prints each performance target as a ratio against a
// baseline measured in the same run, so the numbers mean something on a
// shared, noisy machine.
//
//	go run ./bench/report [-count 5] [-benchtime 1x] [-watermill-rounds 3] [-raw bench.txt]
//
// Besides the Go benchmarks it runs the side-by-side comparison with
// Watermill (the separate module in bench/watermill, `go run . -rounds N`),
// whose BenchmarkWatermill/… lines it reads the same way; -watermill-rounds
// 0 leaves it out.
//
// Each ratio pairs two Go benchmarks that the same test binary runs back to
// back; the rounds are interleaved across packages, and the report gives the
// median of the per-round ratios, their spread, and whether the target
// holds. It exits non-zero when
// a benchmark is missing; a missed target is reported, not fatal, since
// one noisy run must not break a build.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// ratio is one reported number: Num's metric over Den's metric.
type ratio struct {
	Name    string
	Pkg     string
	Num     string // benchmark name (without -GOMAXPROCS)
	Den     string
	Metric  string // "events/s" or "ns/op"
	Target  float64
	AtLeast bool // target is a floor (true) or a ceiling (false)
	Explain string
	// DenConst, when set, is the denominator instead of a benchmark: an
	// absolute target (a rate to sustain, a latency bound) as a ratio.
	DenConst float64
}

var ratios = []ratio{
	{Name: "relay throughput, batched(500) / naive per-row", Pkg: "./runtime/outbox", Num: "BenchmarkRelay/batched-500", Den: "BenchmarkRelay/naive", Metric: "events/s", Target: 20, AtLeast: true,
		Explain: "events/s of our relay over the naive select-one/publish-one/update-one relay"},
	{Name: "producer overhead, business+outbox / business-only", Pkg: "./runtime/outbox", Num: "BenchmarkProducer/business+outbox", Den: "BenchmarkProducer/business-only", Metric: "ns/op",
		Explain: "time per business transaction with the outbox insert over without it"},
	{Name: "consumer dedup overhead, no-dedup / per-event", Pkg: "./runtime/consumer", Num: "BenchmarkConsumer/no-dedup", Den: "BenchmarkConsumer/per-event", Metric: "events/s",
		Explain: "events/s without the dedup insert over with it, one transaction per event (1.25 means dedup costs 20% throughput)"},
	{Name: "consumer batching, batched / per-event (both with dedup, durable commits)", Pkg: "./runtime/consumer", Num: "BenchmarkConsumer/batched", Den: "BenchmarkConsumer/per-event", Metric: "events/s", Target: 3, AtLeast: true,
		Explain: "events/s applying consecutive fetched messages of a partition in one transaction (savepoint per event) over one transaction per event"},
	{Name: "record size, CloudEvents binary JSON / JSON envelope", Pkg: "./runtime/envelope", Num: "BenchmarkWireSize/ce-json", Den: "BenchmarkWireSize/json", Metric: "bytes/record",
		Explain: "bytes per Kafka record (key + value + headers) of the demo's OrderPlaced: payload-only value over the envelope"},
	{Name: "record size, CloudEvents binary Protobuf / Protobuf envelope", Pkg: "./runtime/envelope", Num: "BenchmarkWireSize/ce-proto", Den: "BenchmarkWireSize/proto", Metric: "bytes/record",
		Explain: "bytes per Kafka record of the same event, binary Protobuf payload alone over the Protobuf envelope"},
	{Name: "producer backpressure, under the bound / no policy", Pkg: "./runtime/outbox", Num: "BenchmarkBacklog/under-bound", Den: "BenchmarkBacklog/no-policy", Metric: "ns/op", Target: 1.1,
		Explain: "time per one-event transaction with a WithBacklogPolicy bound the backlog never reaches (sampled once a second) over the Writer without one"},
	{Name: "producer backpressure, refused at the bound / a write", Pkg: "./runtime/outbox", Num: "BenchmarkBacklog/at-bound", Den: "BenchmarkBacklog/no-policy", Metric: "ns/op", Target: 1,
		Explain: "time per transaction refused with a *BacklogError (the backlog over the bound: fail fast) over a transaction that writes"},
	{Name: "producer backpressure, refused at the bound, p99 / a write's p99", Pkg: "./runtime/outbox", Num: "BenchmarkBacklog/at-bound", Den: "BenchmarkBacklog/no-policy", Metric: "p99-µs",
		Explain: "99th percentile latency of a refused transaction over that of a write (context)"},
	{Name: "producer backpressure, share of writes refused at the bound / 100%", Pkg: "./runtime/outbox", Num: "BenchmarkBacklog/at-bound", DenConst: 100, Metric: "refused-%", Target: 1, AtLeast: true,
		Explain: "every write over the bound is refused, none slips through on a stale sample"},
	{Name: "consumer memory under a 10x burst, bounded / unbounded", Pkg: "./runtime/consumer", Num: "BenchmarkBurstMemory/bounded", Den: "BenchmarkBurstMemory/unbounded", Metric: "peak-rss-MB", Target: 0.25,
		Explain: "peak resident memory of a consumer process over a 20 MB burst its handler takes ten seconds to work through: default WithFetchLimits over the limits lifted"},
}

// watermillDir is the module of the side-by-side comparison with
// Watermill, relative to the repository root.
const watermillDir = "bench/watermill"

// watermillRatios are read from the bench/watermill module's output: ours
// against Watermill's outbox (watermill-sql Forwarder → watermill-kafka)
// and against bare baselines, measured in the same interleaved rounds. The
// targets are issue 10's; the Watermill-against-baseline rows are context.
var watermillRatios = []ratio{
	{Name: "relay drain, ours / Watermill Forwarder", Num: "BenchmarkWatermill/drain/ours", Den: "BenchmarkWatermill/drain/watermill", Metric: "events/s", Target: 4, AtLeast: true,
		Explain: "events/s delivering a pre-filled outbox to Kafka and marking it, relay start included"},
	{Name: "relay drain, ours / the database's claim-and-mark", Num: "BenchmarkWatermill/drain/ours", Den: "BenchmarkWatermill/drain/db-claim-mark", Metric: "events/s", Target: 0.7, AtLeast: true,
		Explain: "our relay over plain SQL claiming and marking the same rows 500 at a time on as many connections as the relay has workers (2), no Kafka, with its own pending index on id and fresh statistics"},
	{Name: "outbox write, 1 client, ours / bare insert", Num: "BenchmarkWatermill/write-1/ours", Den: "BenchmarkWatermill/write-1/bare", Metric: "ns/op", Target: 1.2,
		Explain: "time per business transaction with the event (outbox.BeginFunc, a CommitTx: the row goes with the COMMIT) over the business insert alone in the same BEGIN/COMMIT shape"},
	{Name: "outbox write, 1 client, ours on a plain pgx.Tx / bare insert", Num: "BenchmarkWatermill/write-1/ours-plain", Den: "BenchmarkWatermill/write-1/bare", Metric: "ns/op",
		Explain: "the same with pgx.BeginFunc: the row's INSERT is a round trip of its own, whose floor is raw-plain below; issue 31's 1.2× for this shape is the WAL source's row (context)"},
	{Name: "outbox write, 1 client, Watermill / bare insert", Num: "BenchmarkWatermill/write-1/watermill", Den: "BenchmarkWatermill/write-1/bare", Metric: "ns/op",
		Explain: "the same for watermill-sql's publisher in the transaction (context)"},
	{Name: "outbox write, 8 clients, ours / bare insert", Num: "BenchmarkWatermill/write-8/ours", Den: "BenchmarkWatermill/write-8/bare", Metric: "ns/op", Target: 1.3,
		Explain: "wall time per transaction at 8 concurrent clients (inverse throughput), outbox.BeginFunc, over the bare insert in the same shape"},
	{Name: "outbox write, 8 clients, ours on a plain pgx.Tx / bare insert", Num: "BenchmarkWatermill/write-8/ours-plain", Den: "BenchmarkWatermill/write-8/bare", Metric: "ns/op",
		Explain: "the same at 8 clients (context)"},
	{Name: "outbox write, 8 clients, Watermill / bare insert", Num: "BenchmarkWatermill/write-8/watermill", Den: "BenchmarkWatermill/write-8/bare", Metric: "ns/op",
		Explain: "the same for Watermill (context)"},
	{Name: "outbox write, 1 client, the same row with raw pgx, INSERT on a plain pgx.Tx / bare insert", Num: "BenchmarkWatermill/write-1/raw-plain", Den: "BenchmarkWatermill/write-1/bare", Metric: "ns/op",
		Explain: "the floor under ours-plain: the Writer's INSERT of an envelope-sized row with pgx alone, no protoevents code (context)"},
	{Name: "outbox write, 1 client, the same row with raw pgx, INSERT and COMMIT in one pgx.Batch / bare insert", Num: "BenchmarkWatermill/write-1/raw-batch", Den: "BenchmarkWatermill/write-1/bare", Metric: "ns/op",
		Explain: "the floor under ours (a CommitTx sends this batch) (context)"},
	{Name: "outbox write, 8 clients, the same row with raw pgx, INSERT on a plain pgx.Tx / bare insert", Num: "BenchmarkWatermill/write-8/raw-plain", Den: "BenchmarkWatermill/write-8/bare", Metric: "ns/op",
		Explain: "the floor under ours-plain at 8 clients (context)"},
	{Name: "outbox write, 8 clients, the same row with raw pgx, INSERT and COMMIT in one pgx.Batch / bare insert", Num: "BenchmarkWatermill/write-8/raw-batch", Den: "BenchmarkWatermill/write-8/bare", Metric: "ns/op",
		Explain: "the floor under ours at 8 clients (context)"},
	{Name: "outbox write, 1 client, a SELECT 1 round trip on a plain pgx.Tx / bare insert", Num: "BenchmarkWatermill/write-1/raw-roundtrip", Den: "BenchmarkWatermill/write-1/bare", Metric: "ns/op",
		Explain: "the floor under any event written by a statement of its own on a plain pgx.Tx: one more round trip, no row (context)"},
	{Name: "outbox write, 8 clients, a SELECT 1 round trip on a plain pgx.Tx / bare insert", Num: "BenchmarkWatermill/write-8/raw-roundtrip", Den: "BenchmarkWatermill/write-8/bare", Metric: "ns/op",
		Explain: "the same at 8 clients (context)"},
	{Name: "consumer with dedup, ours / Watermill", Num: "BenchmarkWatermill/consume/ours", Den: "BenchmarkWatermill/consume/watermill", Metric: "events/s",
		Explain: "events/s, each event deduplicated and applied in one transaction; Watermill: router + hand-written dedup handler"},
	{Name: "end to end at 500/s, p50 ours / Watermill", Num: "BenchmarkWatermill/e2e-500/ours", Den: "BenchmarkWatermill/e2e-500/watermill", Metric: "p50-ms", Target: 1,
		Explain: "median latency from the business transaction's start to a Kafka consumer"},
	{Name: "end to end at 500/s, p99 ours / Watermill", Num: "BenchmarkWatermill/e2e-500/ours", Den: "BenchmarkWatermill/e2e-500/watermill", Metric: "p99-ms", Target: 0.5,
		Explain: "99th percentile of the same"},
	{Name: "end to end at 1000/s, p50 ours / Watermill", Num: "BenchmarkWatermill/e2e-1000/ours", Den: "BenchmarkWatermill/e2e-1000/watermill", Metric: "p50-ms", Target: 1,
		Explain: "median latency at 1,000 events/s"},
	{Name: "end to end at 1000/s, p99 ours / Watermill", Num: "BenchmarkWatermill/e2e-1000/ours", Den: "BenchmarkWatermill/e2e-1000/watermill", Metric: "p99-ms", Target: 0.5,
		Explain: "99th percentile at 1,000 events/s"},
	{Name: "end to end at 500/s, polling relay in its own process, p50 ours / Watermill", Num: "BenchmarkWatermill/e2e-500/ours-apart", Den: "BenchmarkWatermill/e2e-500/watermill", Metric: "p50-ms",
		Explain: "plain pgx.BeginFunc producers, the polling relay in a separate OS process (no in-process wake-up); issue 31's 0.5× for this shape is the WAL relay's row (context)"},
	{Name: "end to end at 500/s, polling relay in its own process, p99 ours / Watermill", Num: "BenchmarkWatermill/e2e-500/ours-apart", Den: "BenchmarkWatermill/e2e-500/watermill", Metric: "p99-ms",
		Explain: "99th percentile of the same (context)"},
	{Name: "end to end at 1000/s, polling relay in its own process, p50 ours / Watermill", Num: "BenchmarkWatermill/e2e-1000/ours-apart", Den: "BenchmarkWatermill/e2e-1000/watermill", Metric: "p50-ms",
		Explain: "median latency at 1,000 events/s, polling relay apart (context)"},
	{Name: "end to end at 1000/s, polling relay in its own process, p99 ours / Watermill", Num: "BenchmarkWatermill/e2e-1000/ours-apart", Den: "BenchmarkWatermill/e2e-1000/watermill", Metric: "p99-ms",
		Explain: "99th percentile at 1,000 events/s, polling relay apart (context)"},
	{Name: "WAL source write, 1 client, CommitTx / bare insert (logical server)", Num: "BenchmarkWatermill/wal-write-1/wal", Den: "BenchmarkWatermill/wal-write-1/bare", Metric: "ns/op", Target: 1.05,
		Explain: "issue 29: the event as a logical decoding message sent with the COMMIT (outbox.WithWALSource on outbox.BeginFunc), over the bare business transaction, on a server with wal_level = logical"},
	{Name: "WAL source write, 8 clients, CommitTx / bare insert (logical server)", Num: "BenchmarkWatermill/wal-write-8/wal", Den: "BenchmarkWatermill/wal-write-8/bare", Metric: "ns/op", Target: 1.05,
		Explain: "the same at 8 clients"},
	{Name: "WAL source write, 1 client, plain pgx.Tx / bare insert (logical server)", Num: "BenchmarkWatermill/wal-write-1/wal-plain", Den: "BenchmarkWatermill/wal-write-1/bare", Metric: "ns/op", Target: 1.2,
		Explain: "issue 31, the deployed shape: the message on pgx.BeginFunc, a round trip of its own and no row"},
	{Name: "WAL source write, 8 clients, plain pgx.Tx / bare insert (logical server)", Num: "BenchmarkWatermill/wal-write-8/wal-plain", Den: "BenchmarkWatermill/wal-write-8/bare", Metric: "ns/op", Target: 1.2,
		Explain: "the same at 8 clients"},
	{Name: "WAL source write, 1 client, plain pgx.Tx / Watermill (logical server)", Num: "BenchmarkWatermill/wal-write-1/wal-plain", Den: "BenchmarkWatermill/wal-write-1/watermill", Metric: "ns/op", Target: 1,
		Explain: "the deployed shape against watermill-sql's publisher in the same transaction, on the same server"},
	{Name: "WAL source write, 8 clients, plain pgx.Tx / Watermill (logical server)", Num: "BenchmarkWatermill/wal-write-8/wal-plain", Den: "BenchmarkWatermill/wal-write-8/watermill", Metric: "ns/op", Target: 1,
		Explain: "the same at 8 clients"},
	{Name: "Watermill write, 1 client / bare insert (logical server)", Num: "BenchmarkWatermill/wal-write-1/watermill", Den: "BenchmarkWatermill/wal-write-1/bare", Metric: "ns/op",
		Explain: "watermill-sql's publisher on the logical server (context)"},
	{Name: "Watermill write, 8 clients / bare insert (logical server)", Num: "BenchmarkWatermill/wal-write-8/watermill", Den: "BenchmarkWatermill/wal-write-8/bare", Metric: "ns/op",
		Explain: "the same at 8 clients (context)"},
	{Name: "raw pgx message with the COMMIT, 1 client / bare insert (logical server)", Num: "BenchmarkWatermill/wal-write-1/raw-wal", Den: "BenchmarkWatermill/wal-write-1/bare", Metric: "ns/op",
		Explain: "the floor under the WAL source: a message of the record's size sent with the COMMIT by pgx alone (context)"},
	{Name: "raw pgx message with the COMMIT, 8 clients / bare insert (logical server)", Num: "BenchmarkWatermill/wal-write-8/raw-wal", Den: "BenchmarkWatermill/wal-write-8/bare", Metric: "ns/op",
		Explain: "the same at 8 clients (context)"},
	{Name: "a SELECT 1 round trip on a plain pgx.Tx, 1 client / bare insert (logical server)", Num: "BenchmarkWatermill/wal-write-1/raw-roundtrip", Den: "BenchmarkWatermill/wal-write-1/bare", Metric: "ns/op",
		Explain: "the floor under the WAL source on a plain pgx.Tx: one more round trip, no message (context)"},
	{Name: "a SELECT 1 round trip on a plain pgx.Tx, 8 clients / bare insert (logical server)", Num: "BenchmarkWatermill/wal-write-8/raw-roundtrip", Den: "BenchmarkWatermill/wal-write-8/bare", Metric: "ns/op",
		Explain: "the same at 8 clients (context)"},
	{Name: "table write on the logical server, 8 clients, CommitTx / bare insert", Num: "BenchmarkWatermill/wal-write-8/table", Den: "BenchmarkWatermill/wal-write-8/bare", Metric: "ns/op",
		Explain: "the outbox row on the same server, for comparison (context)"},
	{Name: "WAL relay drain / polling relay drain (same 20,000 events)", Num: "BenchmarkWatermill/wal-drain/wal", Den: "BenchmarkWatermill/wal-drain/table", Metric: "events/s", Target: 2, AtLeast: true,
		Explain: "events/s to Kafka once set up: the WAL relay reading the slot over the polling relay (2 lane workers) reading the table"},
	{Name: "WAL relay drain / raw decoding of the same WAL (no Kafka)", Num: "BenchmarkWatermill/wal-drain/wal", Den: "BenchmarkWatermill/wal-drain/raw-decode", Metric: "events/s", Target: 0.7, AtLeast: true,
		Explain: "the WAL relay over a pglogrepl reader that decodes the same slot's messages and publishes nothing (pg_recvlogical to /dev/null)"},
	{Name: "end to end at 500/s, p50 WAL relay / polling relay (both in their own process)", Num: "BenchmarkWatermill/wal-e2e-500/wal-apart", Den: "BenchmarkWatermill/wal-e2e-500/table-apart", Metric: "p50-ms", Target: 1,
		Explain: "plain pgx.BeginFunc producers; the relay in a separate OS process; logical server"},
	{Name: "end to end at 500/s, p99 WAL relay / polling relay (both in their own process)", Num: "BenchmarkWatermill/wal-e2e-500/wal-apart", Den: "BenchmarkWatermill/wal-e2e-500/table-apart", Metric: "p99-ms", Target: 1,
		Explain: "99th percentile of the same"},
	{Name: "end to end at 1000/s, p50 WAL relay / polling relay (both in their own process)", Num: "BenchmarkWatermill/wal-e2e-1000/wal-apart", Den: "BenchmarkWatermill/wal-e2e-1000/table-apart", Metric: "p50-ms", Target: 1,
		Explain: "median at 1,000 events/s"},
	{Name: "end to end at 1000/s, p99 WAL relay / polling relay (both in their own process)", Num: "BenchmarkWatermill/wal-e2e-1000/wal-apart", Den: "BenchmarkWatermill/wal-e2e-1000/table-apart", Metric: "p99-ms", Target: 1,
		Explain: "99th percentile at 1,000 events/s"},
	{Name: "end to end at 500/s, p50 WAL relay in its own process / Watermill", Num: "BenchmarkWatermill/wal-e2e-500/wal-apart", Den: "BenchmarkWatermill/wal-e2e-500/watermill", Metric: "p50-ms", Target: 0.5,
		Explain: "issue 31, the deployed shape: plain pgx.BeginFunc producers with the WAL source, the WAL relay in a separate OS process, against Watermill on the same logical server"},
	{Name: "end to end at 500/s, p99 WAL relay in its own process / Watermill", Num: "BenchmarkWatermill/wal-e2e-500/wal-apart", Den: "BenchmarkWatermill/wal-e2e-500/watermill", Metric: "p99-ms", Target: 0.5,
		Explain: "99th percentile of the same"},
	{Name: "end to end at 1000/s, p50 WAL relay in its own process / Watermill", Num: "BenchmarkWatermill/wal-e2e-1000/wal-apart", Den: "BenchmarkWatermill/wal-e2e-1000/watermill", Metric: "p50-ms", Target: 0.5,
		Explain: "median at 1,000 events/s"},
	{Name: "end to end at 1000/s, p99 WAL relay in its own process / Watermill", Num: "BenchmarkWatermill/wal-e2e-1000/wal-apart", Den: "BenchmarkWatermill/wal-e2e-1000/watermill", Metric: "p99-ms", Target: 0.5,
		Explain: "99th percentile at 1,000 events/s"},
	{Name: "4 producers aiming at 2000/s, sustained rate / 2000", Num: "BenchmarkWatermill/e2e-2000/ours", DenConst: 2000, Metric: "events/s", Target: 0.99, AtLeast: true,
		Explain: "events/s the 4 producers committed while the relay ran, over the 2,000 aimed at"},
	{Name: "4 producers aiming at 2000/s, p99 / 50 ms", Num: "BenchmarkWatermill/e2e-2000/ours", DenConst: 50, Metric: "p99-ms", Target: 1,
		Explain: "99th percentile end-to-end latency over the 50 ms bound"},
}

// wireFormats are the sub-benchmarks of BenchmarkWireSize, one per
// envelope.Format, listed in the bytes-per-record table.
var wireFormats = []string{"json", "proto", "ce-json", "ce-proto"}

func main() {
	count := flag.Int("count", 5, "rounds of each benchmark")
	benchtime := flag.String("benchtime", "", "go test -benchtime value (default: go's)")
	raw := flag.String("raw", "", "read benchmark output from this file instead of running go test")
	wmRounds := flag.Int("watermill-rounds", 3, "rounds of the side-by-side comparison with Watermill (bench/watermill); 0 skips it")
	flag.Parse()

	var out bytes.Buffer
	if *raw != "" {
		b, err := os.ReadFile(*raw)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench/report:", err)
			os.Exit(2)
		}
		out.Write(b)
	} else {
		if err := runRounds(&out, *count, *benchtime); err != nil {
			fmt.Fprintln(os.Stderr, "bench/report:", err)
			os.Exit(2)
		}
		if *wmRounds > 0 {
			if err := runWatermill(&out, *wmRounds); err != nil {
				fmt.Fprintln(os.Stderr, "bench/report:", err)
				os.Exit(2)
			}
		}
	}
	results := parse(&out)
	ok := report(os.Stdout, results, ratios)
	sizeTable(os.Stdout, results)
	if *wmRounds > 0 {
		fmt.Fprintln(os.Stdout, "\nside by side with Watermill (bench/watermill: one Postgres, one in-process Kafka, interleaved rounds)")
		ok = report(os.Stdout, results, watermillRatios) && ok
	}
	if !ok {
		os.Exit(1)
	}
}

// runRounds builds each package's test binary once, then runs the rounds
// interleaved: round 1 of every package, then round 2, and so on, each
// round running a ratio's two benchmarks back to back, so a slow spell of
// the machine hits both sides of a ratio alike.
func runRounds(out io.Writer, count int, benchtime string) error {
	pkgs := map[string][]string{}
	var order []string
	for _, r := range ratios {
		if _, ok := pkgs[r.Pkg]; !ok {
			order = append(order, r.Pkg)
		}
		pkgs[r.Pkg] = append(pkgs[r.Pkg], r.Num, r.Den)
	}
	dir, err := os.MkdirTemp("", "bench-report-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bins := map[string]string{}
	for i, pkg := range order {
		bin := filepath.Join(dir, fmt.Sprintf("pkg%d.test", i))
		build := exec.Command("go", "test", "-c", "-o", bin, pkg)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("build %s: %w", pkg, err)
		}
		bins[pkg] = bin
	}
	for round := 1; round <= count; round++ {
		for _, pkg := range order {
			args := []string{"-test.run", "^$", "-test.bench", benchRegexp(pkgs[pkg]), "-test.count", "1"}
			if benchtime != "" {
				args = append(args, "-test.benchtime", benchtime)
			}
			fmt.Fprintf(os.Stderr, "bench/report: round %d/%d: %s %s\n", round, count, pkg, strings.Join(args, " "))
			cmd := exec.Command(bins[pkg], args...)
			cmd.Dir = pkg // tests run in their package's directory
			cmd.Stdout = io.MultiWriter(out, os.Stderr)
			cmd.Stderr = os.Stderr
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("%s round %d: %w", pkg, round, err)
			}
		}
	}
	return nil
}

// runWatermill runs the bench/watermill module's own interleaved rounds;
// its BenchmarkWatermill lines go to out.
func runWatermill(out io.Writer, rounds int) error {
	fmt.Fprintf(os.Stderr, "bench/report: %s: go run -mod=mod . -rounds %d\n", watermillDir, rounds)
	// -mod=mod: the module follows the library through its replace directive,
	// so a dependency the library adds must not stop the run.
	cmd := exec.Command("go", "run", "-mod=mod", ".", "-rounds", strconv.Itoa(rounds))
	cmd.Dir = watermillDir
	cmd.Stdout = io.MultiWriter(out, os.Stderr)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", watermillDir, err)
	}
	return nil
}

// benchRegexp matches exactly the named benchmarks (go test splits -bench
// on "/" and matches each level separately).
func benchRegexp(names []string) string {
	tops, subs := map[string]bool{}, map[string]bool{}
	for _, n := range names {
		top, sub, _ := strings.Cut(n, "/")
		tops[regexp.QuoteMeta(top)] = true
		if sub != "" {
			subs[regexp.QuoteMeta(sub)] = true
		}
	}
	re := "^(" + strings.Join(sortedKeys(tops), "|") + ")$"
	if len(subs) > 0 {
		re += "/^(" + strings.Join(sortedKeys(subs), "|") + ")$"
	}
	return re
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// results maps benchmark name → metric → one value per round, in order.
type results map[string]map[string][]float64

var procSuffix = regexp.MustCompile(`-\d+$`)

// parse reads `go test -bench` output lines: name, iterations, then
// value/unit pairs.
func parse(r io.Reader) results {
	res := results{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := procSuffix.ReplaceAllString(f[0], "")
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		if res[name] == nil {
			res[name] = map[string][]float64{}
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			res[name][f[i+1]] = append(res[name][f[i+1]], v)
		}
	}
	return res
}

// report prints one block per ratio and returns false if a benchmark is
// missing.
func report(w io.Writer, res results, rs []ratio) bool {
	ok := true
	fmt.Fprintln(w, "\nprotoevents benchmark ratios (median over rounds; each round's ratio uses that round's own baseline)")
	for _, r := range rs {
		num, den := res[r.Num][r.Metric], res[r.Den][r.Metric]
		denName := r.Den
		if r.DenConst > 0 {
			den = make([]float64, len(num))
			for i := range den {
				den[i] = r.DenConst
			}
			denName = "target"
		}
		fmt.Fprintf(w, "\n%s\n  %s\n", r.Name, r.Explain)
		if len(num) == 0 || len(den) == 0 {
			fmt.Fprintf(w, "  MISSING: need %s and %s with metric %s\n", r.Num, denName, r.Metric)
			ok = false
			continue
		}
		n := min(len(num), len(den))
		var rs []float64
		for i := 0; i < n; i++ {
			if den[i] > 0 {
				rs = append(rs, num[i]/den[i])
			}
		}
		if len(rs) == 0 {
			fmt.Fprintf(w, "  MISSING: %s is zero in every round\n", denName)
			ok = false
			continue
		}
		sort.Float64s(rs)
		fmt.Fprintf(w, "  %-40s %12s %s (median)\n", r.Num, figure(median(num)), r.Metric)
		fmt.Fprintf(w, "  %-40s %12s %s (median)\n", denName, figure(median(den)), r.Metric)
		verdict := ""
		if r.Target > 0 {
			holds := median(rs) >= r.Target
			if !r.AtLeast {
				holds = median(rs) <= r.Target
			}
			verdict = fmt.Sprintf("  target %s %s: %s", map[bool]string{true: ">=", false: "<="}[r.AtLeast], targetText(r.Target), map[bool]string{true: "met", false: "NOT MET"}[holds])
		}
		fmt.Fprintf(w, "  ratio %.2fx (min %.2f, max %.2f, %d rounds)%s\n", median(rs), rs[0], rs[len(rs)-1], len(rs), verdict)
	}
	return ok
}

// targetText prints a target with at least one decimal: 20.0, 1.2, 0.99.
func targetText(t float64) string {
	s := strconv.FormatFloat(t, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

// figure prints a measurement: whole numbers for large values, two
// decimals for small ones (milliseconds).
func figure(v float64) string {
	if v < 100 {
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

// sizeTable prints the bytes per record of every wire format against the
// JSON envelope, the default.
func sizeTable(w io.Writer, res results) {
	base := median(res["BenchmarkWireSize/json"]["bytes/record"])
	if base == 0 {
		return
	}
	fmt.Fprintln(w, "\nbytes per record by wire format (the demo's OrderPlaced, with correlation ID and traceparent)")
	for _, f := range wireFormats {
		b := res["BenchmarkWireSize/"+f]
		fmt.Fprintf(w, "  %-9s %5.0f bytes/record (value %4.0f)  %.2fx of json\n", f, median(b["bytes/record"]), median(b["value-bytes/record"]), median(b["bytes/record"])/base)
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
