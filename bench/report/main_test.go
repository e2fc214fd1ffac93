package main

import (
	"bytes"
	"strings"
	"testing"
)

const sample = `goos: linux
BenchmarkRelay/batched-500-2         	       3	  1000 ns/op	     50000 events/s
BenchmarkRelay/naive-2               	       3	  9000 ns/op	      1000 events/s
BenchmarkRelay/batched-500-2         	       3	  1000 ns/op	     30000 events/s
BenchmarkRelay/naive-2               	       3	  9000 ns/op	      2000 events/s
BenchmarkProducer/business-only-2    	     100	  2000 ns/op
BenchmarkProducer/business+outbox-2  	     100	  3000 ns/op
BenchmarkConsumer/per-event-2        	       1	   100 ns/op	      800 events/s
BenchmarkConsumer/no-dedup-2         	       1	   100 ns/op	     1000 events/s
BenchmarkConsumer/batched-2          	       1	   100 ns/op	     3200 events/s
BenchmarkWireSize/json-2         	     100	     20702 ns/op	       750.0 bytes/record	       450.0 value-bytes/record
BenchmarkWireSize/proto-2        	     100	     10695 ns/op	       507.0 bytes/record	       203.0 value-bytes/record
BenchmarkWireSize/ce-json-2      	     100	      7028 ns/op	       454.0 bytes/record	       179.0 value-bytes/record
BenchmarkWireSize/ce-proto-2     	     100	      2760 ns/op	       335.0 bytes/record	        56.00 value-bytes/record
BenchmarkBacklog/no-policy-2         	    2494	    491679 ns/op	       399.0 p50-µs	      2431 p99-µs	         0 refused-%
BenchmarkBacklog/under-bound-2       	    2389	    538722 ns/op	       449.0 p50-µs	      2152 p99-µs	         0 refused-%
BenchmarkBacklog/at-bound-2          	   10686	     95783 ns/op	        86.00 p50-µs	       244.0 p99-µs	       100.0 refused-%
BenchmarkBurstMemory/bounded-2         	       1	2053624839 ns/op	       868.0 handled	         8.691 peak-rss-MB
BenchmarkBurstMemory/unbounded-2       	       1	2071553324 ns/op	       319.0 handled	       217.5 peak-rss-MB
PASS
`

func TestParseAndReport(t *testing.T) {
	res := parse(strings.NewReader(sample))
	if got := res["BenchmarkRelay/batched-500"]["events/s"]; len(got) != 2 || got[0] != 50000 || got[1] != 30000 {
		t.Fatalf("batched events/s = %v", got)
	}
	var out bytes.Buffer
	if !report(&out, res, ratios) {
		t.Fatalf("report says a benchmark is missing:\n%s", out.String())
	}
	for _, want := range []string{
		"ratio 32.50x (min 15.00, max 50.00, 2 rounds)  target >= 20.0: met", // median of 50 and 15
		"ratio 1.50x",
		"ratio 1.25x",
		"ratio 4.00x (min 4.00, max 4.00, 1 rounds)  target >= 3.0: met", // batched / per-event
		"ratio 0.61x", // 454 / 750
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestSizeTable(t *testing.T) {
	var out bytes.Buffer
	sizeTable(&out, parse(strings.NewReader(sample)))
	if want := "ce-proto    335 bytes/record (value   56)  0.45x of json"; !strings.Contains(out.String(), want) {
		t.Errorf("size table lacks %q:\n%s", want, out.String())
	}
}

func TestMissingBenchmarkFails(t *testing.T) {
	var out bytes.Buffer
	if report(&out, parse(strings.NewReader("BenchmarkRelay/naive-2 1 1 ns/op 1 events/s\n")), ratios) {
		t.Fatal("report passed with benchmarks missing")
	}
	if !strings.Contains(out.String(), "MISSING") {
		t.Fatalf("no MISSING line:\n%s", out.String())
	}
}

func TestBenchRegexp(t *testing.T) {
	got := benchRegexp([]string{"BenchmarkRelay/batched-500", "BenchmarkRelay/naive"})
	if want := `^(BenchmarkRelay)$/^(batched-500|naive)$`; got != want {
		t.Fatalf("benchRegexp = %q, want %q", got, want)
	}
}

// wmSample is two rounds of bench/watermill's output, with a summary line
// the parser must skip.
const wmSample = `BenchmarkWatermill/drain/ours 1 20000.000 events/s
BenchmarkWatermill/drain/watermill 1 10000.000 events/s
BenchmarkWatermill/drain/db-claim-mark 1 40000.000 events/s
BenchmarkWatermill/write-1/bare 1 200000.000 ns/op
BenchmarkWatermill/write-1/ours 1 220000.000 ns/op
BenchmarkWatermill/write-1/ours-plain 1 300000.000 ns/op
BenchmarkWatermill/write-1/watermill 1 260000.000 ns/op
BenchmarkWatermill/write-8/bare 1 50000.000 ns/op
BenchmarkWatermill/write-8/ours 1 60000.000 ns/op
BenchmarkWatermill/write-8/ours-plain 1 80000.000 ns/op
BenchmarkWatermill/write-1/raw-plain 1 260000.000 ns/op
BenchmarkWatermill/write-1/raw-batch 1 230000.000 ns/op
BenchmarkWatermill/write-8/raw-plain 1 70000.000 ns/op
BenchmarkWatermill/write-8/raw-batch 1 62000.000 ns/op
BenchmarkWatermill/write-8/watermill 1 70000.000 ns/op
BenchmarkWatermill/write-1/raw-roundtrip 1 250000.000 ns/op
BenchmarkWatermill/write-8/raw-roundtrip 1 63000.000 ns/op
BenchmarkWatermill/wal-write-1/raw-roundtrip 1 240000.000 ns/op
BenchmarkWatermill/wal-write-8/raw-roundtrip 1 61000.000 ns/op
BenchmarkWatermill/consume/ours 1 9000.000 events/s
BenchmarkWatermill/consume/watermill 1 8000.000 events/s
BenchmarkWatermill/e2e-500/ours 1 3.000 p50-ms
BenchmarkWatermill/e2e-500/ours 1 8.000 p99-ms
BenchmarkWatermill/e2e-500/watermill 1 5.000 p50-ms
BenchmarkWatermill/e2e-500/watermill 1 12.000 p99-ms
BenchmarkWatermill/e2e-500/ours-apart 1 2.000 p50-ms
BenchmarkWatermill/e2e-500/ours-apart 1 5.000 p99-ms
BenchmarkWatermill/e2e-1000/ours 1 4.000 p50-ms
BenchmarkWatermill/e2e-1000/ours 1 9.000 p99-ms
BenchmarkWatermill/e2e-1000/watermill 1 5.000 p50-ms
BenchmarkWatermill/e2e-1000/watermill 1 20.000 p99-ms
BenchmarkWatermill/e2e-1000/ours-apart 1 3.000 p50-ms
BenchmarkWatermill/e2e-1000/ours-apart 1 8.000 p99-ms
BenchmarkWatermill/e2e-2000/ours 1 1999.000 events/s
BenchmarkWatermill/e2e-2000/ours 1 40.000 p99-ms
BenchmarkWatermill/wal-write-1/bare 1 200000.000 ns/op
BenchmarkWatermill/wal-write-1/wal 1 204000.000 ns/op
BenchmarkWatermill/wal-write-1/wal-plain 1 250000.000 ns/op
BenchmarkWatermill/wal-write-1/raw-wal 1 202000.000 ns/op
BenchmarkWatermill/wal-write-8/bare 1 50000.000 ns/op
BenchmarkWatermill/wal-write-8/wal 1 55000.000 ns/op
BenchmarkWatermill/wal-write-8/wal-plain 1 60000.000 ns/op
BenchmarkWatermill/wal-write-8/raw-wal 1 51000.000 ns/op
BenchmarkWatermill/wal-write-8/table 1 62000.000 ns/op
BenchmarkWatermill/wal-write-1/watermill 1 270000.000 ns/op
BenchmarkWatermill/wal-write-8/watermill 1 70000.000 ns/op
BenchmarkWatermill/wal-drain/wal 1 90000.000 events/s
BenchmarkWatermill/wal-drain/table 1 50000.000 events/s
BenchmarkWatermill/wal-drain/raw-decode 1 100000.000 events/s
BenchmarkWatermill/wal-e2e-500/wal-apart 1 1.500 p50-ms
BenchmarkWatermill/wal-e2e-500/wal-apart 1 6.000 p99-ms
BenchmarkWatermill/wal-e2e-500/table-apart 1 3.000 p50-ms
BenchmarkWatermill/wal-e2e-500/table-apart 1 10.000 p99-ms
BenchmarkWatermill/wal-e2e-1000/wal-apart 1 2.000 p50-ms
BenchmarkWatermill/wal-e2e-1000/wal-apart 1 12.000 p99-ms
BenchmarkWatermill/wal-e2e-1000/table-apart 1 4.000 p50-ms
BenchmarkWatermill/wal-e2e-1000/table-apart 1 10.000 p99-ms
BenchmarkWatermill/wal-e2e-500/watermill 1 5.000 p50-ms
BenchmarkWatermill/wal-e2e-500/watermill 1 14.000 p99-ms
BenchmarkWatermill/wal-e2e-1000/watermill 1 4.000 p50-ms
BenchmarkWatermill/wal-e2e-1000/watermill 1 18.000 p99-ms
BenchmarkWatermill/drain/ours 1 30000.000 events/s
BenchmarkWatermill/drain/watermill 1 6000.000 events/s
  relay drain, ours / Watermill Forwarder                2.00x  (2.00–2.00, 1 rounds)
`

func TestWatermillRatios(t *testing.T) {
	res := parse(strings.NewReader(wmSample))
	var out bytes.Buffer
	if !report(&out, res, watermillRatios) {
		t.Fatalf("report says a measurement is missing:\n%s", out.String())
	}
	for _, want := range []string{
		"ratio 3.50x (min 2.00, max 5.00, 2 rounds)  target >= 4.0: NOT MET", // drain: 20000/10000, 30000/6000
		"ratio 0.50x (min 0.50, max 0.50, 1 rounds)  target >= 0.7: NOT MET", // drain / claim-and-mark, one round of the baseline
		"ratio 1.10x (min 1.10, max 1.10, 1 rounds)  target <= 1.2: met",
		"ratio 1.20x (min 1.20, max 1.20, 1 rounds)  target <= 1.3: met",
		"ratio 1.50x (min 1.50, max 1.50, 1 rounds)\n",                        // write-1 ours-plain / bare: context, no target
		"ratio 1.25x (min 1.25, max 1.25, 1 rounds)  target <= 1.2: NOT MET",  // wal-write-1 wal-plain / bare: 250000 / 200000
		"ratio 0.93x (min 0.93, max 0.93, 1 rounds)  target <= 1.0: met",      // wal-write-1 wal-plain / watermill: 250000 / 270000
		"ratio 0.67x (min 0.67, max 0.67, 1 rounds)  target <= 0.5: NOT MET",  // 8 / 12
		"ratio 0.45x (min 0.45, max 0.45, 1 rounds)  target <= 0.5: met",      // 9 / 20
		"ratio 0.42x (min 0.42, max 0.42, 1 rounds)\n",                        // e2e-500 ours-apart p99 / watermill: context
		"ratio 0.30x (min 0.30, max 0.30, 1 rounds)  target <= 0.5: met",      // wal-e2e-500 wal-apart p50 / watermill: 1.5 / 5
		"ratio 0.67x (min 0.67, max 0.67, 1 rounds)  target <= 0.5: NOT MET",  // wal-e2e-1000 wal-apart p99 / watermill: 12 / 18
		"ratio 1.00x (min 1.00, max 1.00, 1 rounds)  target >= 0.99: met",     // 1999 / 2000
		"ratio 0.80x (min 0.80, max 0.80, 1 rounds)  target <= 1.0: met",      // 40 ms / 50 ms
		"ratio 1.02x (min 1.02, max 1.02, 1 rounds)  target <= 1.05: met",     // wal-write-1: 204000 / 200000
		"ratio 1.10x (min 1.10, max 1.10, 1 rounds)  target <= 1.05: NOT MET", // wal-write-8: 55000 / 50000
		"ratio 1.80x (min 1.80, max 1.80, 1 rounds)  target >= 2.0: NOT MET",  // wal drain / table drain
		"ratio 0.90x (min 0.90, max 0.90, 1 rounds)  target >= 0.7: met",      // wal drain / raw decoding
		"ratio 1.20x (min 1.20, max 1.20, 1 rounds)  target <= 1.0: NOT MET",  // wal e2e-1000 p99: 12 / 10
		"target                                          50.00 p99-ms (median)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	var missing bytes.Buffer
	if report(&missing, parse(strings.NewReader("BenchmarkWatermill/drain/ours 1 1 events/s\n")), watermillRatios) {
		t.Fatal("report passed with the Watermill measurements missing")
	}
}
