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
PASS
`

func TestParseAndReport(t *testing.T) {
	res := parse(strings.NewReader(sample))
	if got := res["BenchmarkRelay/batched-500"]["events/s"]; len(got) != 2 || got[0] != 50000 || got[1] != 30000 {
		t.Fatalf("batched events/s = %v", got)
	}
	var out bytes.Buffer
	if !report(&out, res) {
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
	if report(&out, parse(strings.NewReader("BenchmarkRelay/naive-2 1 1 ns/op 1 events/s\n"))) {
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
