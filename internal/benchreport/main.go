// Command benchreport runs the project's benchmarks and prints each
// performance target as a ratio against a baseline measured in the same
// run, so the numbers mean something on a shared, noisy machine.
//
//	go run ./internal/benchreport [-count 5] [-benchtime 1x] [-raw bench.txt]
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
}

// wireFormats are the sub-benchmarks of BenchmarkWireSize, one per
// envelope.Format, listed in the bytes-per-record table.
var wireFormats = []string{"json", "proto", "ce-json", "ce-proto"}

func main() {
	count := flag.Int("count", 5, "rounds of each benchmark")
	benchtime := flag.String("benchtime", "", "go test -benchtime value (default: go's)")
	raw := flag.String("raw", "", "read benchmark output from this file instead of running go test")
	flag.Parse()

	var out bytes.Buffer
	if *raw != "" {
		b, err := os.ReadFile(*raw)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			os.Exit(2)
		}
		out.Write(b)
	} else if err := runRounds(&out, *count, *benchtime); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(2)
	}
	results := parse(&out)
	ok := report(os.Stdout, results)
	sizeTable(os.Stdout, results)
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
	dir, err := os.MkdirTemp("", "benchreport-")
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
			fmt.Fprintf(os.Stderr, "benchreport: round %d/%d: %s %s\n", round, count, pkg, strings.Join(args, " "))
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
func report(w io.Writer, res results) bool {
	ok := true
	fmt.Fprintln(w, "\nprotoevents benchmark ratios (median over rounds; each round's ratio uses that round's own baseline)")
	for _, r := range ratios {
		num, den := res[r.Num][r.Metric], res[r.Den][r.Metric]
		fmt.Fprintf(w, "\n%s\n  %s\n", r.Name, r.Explain)
		if len(num) == 0 || len(den) == 0 {
			fmt.Fprintf(w, "  MISSING: need %s and %s with metric %s\n", r.Num, r.Den, r.Metric)
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
		sort.Float64s(rs)
		fmt.Fprintf(w, "  %-40s %12.0f %s (median)\n", r.Num, median(num), r.Metric)
		fmt.Fprintf(w, "  %-40s %12.0f %s (median)\n", r.Den, median(den), r.Metric)
		verdict := ""
		if r.Target > 0 {
			holds := median(rs) >= r.Target
			if !r.AtLeast {
				holds = median(rs) <= r.Target
			}
			verdict = fmt.Sprintf("  target %s %.1f: %s", map[bool]string{true: ">=", false: "<="}[r.AtLeast], r.Target, map[bool]string{true: "met", false: "NOT MET"}[holds])
		}
		fmt.Fprintf(w, "  ratio %.2fx (min %.2f, max %.2f, %d rounds)%s\n", median(rs), rs[0], rs[len(rs)-1], len(rs), verdict)
	}
	return ok
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
