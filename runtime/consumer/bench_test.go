package consumer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/runtime/events"
)

// BenchmarkConsumer measures consumer throughput over pre-produced messages
// on 3 partitions, with the same handler (one INSERT in the transaction),
// on a server with durable commits:
//
//   - batched: the default, consecutive fetched messages of a partition in
//     one transaction (WithMaxBatch(DefaultMaxBatch)), with dedup;
//   - per-event: one transaction per message (WithMaxBatch(1)), with dedup;
//   - no-dedup: one transaction per message without the dedup insert.
//
// batched/per-event is the gain of batching, no-dedup/per-event the cost of
// exactly-once. events/s is measured from the first handled event to the
// last, so group join time is left out.
func BenchmarkConsumer(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts []Option
	}{
		{"batched", nil},
		{"per-event", []Option{WithMaxBatch(1)}},
		{"no-dedup", []Option{WithMaxBatch(1), withoutDedup()}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			bd := setup(b, 3)
			msgs := make([]kafka.Message, b.N)
			for i := range msgs {
				msgs[i] = message(b, bd.event(b, "key-"+strconv.Itoa(i%64), i), nil)
			}
			bd.produce(b, msgs...)
			var (
				count       atomic.Int64
				first, last atomic.Int64
				doneOnce    sync.Once
				done        = make(chan struct{})
			)
			hooks := Hooks{Processed: func(events.Delivery, string, time.Duration) {
				now := time.Now().UnixNano()
				first.CompareAndSwap(0, now)
				if count.Add(1) == int64(b.N) {
					last.Store(now)
					doneOnce.Do(func() { close(done) })
				}
			}}
			c := bd.newConsumer(b, "bench", bd.handler("bench", nil), append(bc.opts, WithHooks(hooks))...)
			b.ResetTimer()
			r := start(b, c)
			select {
			case <-done:
			case <-time.After(5 * time.Minute):
				b.Fatalf("only %d of %d events handled", count.Load(), b.N)
			}
			b.StopTimer()
			if err := r.stop(); err != nil {
				b.Fatal(err)
			}
			if b.N > 1 {
				elapsed := time.Duration(last.Load() - first.Load())
				b.ReportMetric(float64(b.N-1)/elapsed.Seconds(), "events/s")
			}
		})
	}
}

// BenchmarkBurstMemory measures the resident memory of a consumer whose
// handler is ten times slower than its input: a burst of 10,000 events of
// 2 KB (20 MB) is on the topic when the consumer starts, and the handler
// takes a millisecond an event, so the burst is about ten seconds of work.
// The consumer runs in a child process (the broker stays in this one, so
// its buffers are not counted), which samples its resident set every
// 20 ms until two seconds after it handled its first event and reports
// the peak over its size before the consumer started:
//
//   - bounded: the default fetch limits (WithFetchLimits: 100 messages
//     queued per partition), so the partition pauses fetching;
//   - unbounded: the limits lifted (a million messages, 64 MiB a fetch),
//     so the partition reads the whole burst into memory.
func BenchmarkBurstMemory(b *testing.B) {
	for _, bc := range []struct {
		name           string
		queued, maxMiB int
	}{
		{"bounded", DefaultQueuedMessages, DefaultFetchMaxBytes >> 20},
		{"unbounded", 1_000_000, 64},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var peak, handled float64
			for range b.N {
				p, n := burstMemory(b, bc.queued, bc.maxMiB<<20)
				peak, handled = max(peak, p), handled+n
			}
			b.ReportMetric(peak/(1<<20), "peak-rss-MB")
			b.ReportMetric(handled/float64(b.N), "handled")
		})
	}
}

// Environment of the burst child (BenchmarkBurstMemory); it shares the
// crash test's database, broker and topic variables.
const (
	envBurstChild  = "PROTOEVENTS_CONSUMER_BURST_CHILD"
	envBurstQueued = "PROTOEVENTS_CONSUMER_BURST_QUEUED"
	envBurstBytes  = "PROTOEVENTS_CONSUMER_BURST_BYTES"
)

// burstMemory runs one burst (BenchmarkBurstMemory) and returns the
// child's peak resident memory over its size before it consumed, in bytes,
// and how many events it handled meanwhile.
func burstMemory(b *testing.B, queued, maxBytes int) (peak, handled float64) {
	b.StopTimer()
	bd := setup(b, 1)
	pad := strings.Repeat("x", 2000)
	msgs := make([]kafka.Message, 10_000)
	for i := range msgs {
		ev := bd.event(b, "key-"+strconv.Itoa(i%64), i)
		ev.Fields["pad"] = structpb.NewStringValue(pad)
		msgs[i] = message(b, ev, nil)
	}
	bd.produce(b, msgs...)
	cmd := exec.Command(os.Args[0], "-test.run=^TestBurstChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(),
		envBurstChild+"=1",
		envBurstQueued+"="+strconv.Itoa(queued),
		envBurstBytes+"="+strconv.Itoa(maxBytes),
		envChildDB+"="+servers.ServerURL(b),
		envChildSchema+"="+bd.schema,
		envChildBrokers+"="+strings.Join(bd.kafka.Brokers, ","),
		envChildTopic+"="+bd.topic,
		envChildNamespace+"="+bd.kafka.Namespace(),
	)
	var errs bytes.Buffer
	cmd.Stderr = &errs
	b.StartTimer()
	out, err := cmd.Output()
	b.StopTimer()
	if err != nil {
		b.Fatalf("burst child: %v\n%s%s", err, out, errs.String())
	}
	if _, err := fmt.Sscanf(burstLine.FindString(string(out)), "burst: peak-rss %g handled %g", &peak, &handled); err != nil {
		b.Fatalf("burst child printed no result (%v):\n%s%s", err, out, errs.String())
	}
	return peak, handled
}

var burstLine = regexp.MustCompile(`burst: peak-rss \S+ handled \S+`)

// TestBurstChild is the consumer process of BenchmarkBurstMemory.
func TestBurstChild(t *testing.T) {
	if os.Getenv(envBurstChild) != "1" {
		t.Skip("child process of BenchmarkBurstMemory")
	}
	queued, err1 := strconv.Atoi(os.Getenv(envBurstQueued))
	maxBytes, err2 := strconv.Atoi(os.Getenv(envBurstBytes))
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := childBundle(t, ctx)
	var count atomic.Int64
	h := bind(b.d, func(context.Context, pgx.Tx, events.Meta, testEvent) error {
		count.Add(1)
		time.Sleep(time.Millisecond)
		return nil
	})
	c := b.newConsumer(t, "burst", h, WithMaxBatch(1), WithFetchLimits(queued, maxBytes), WithLogger(slog.New(slog.DiscardHandler)))
	base := residentBytes(t)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	// The two seconds start with the first event handled (the group join
	// and the first fetch take their own time); the samples before count
	// towards the peak as well.
	var peak int64
	for deadline := time.Now().Add(2 * time.Minute); count.Load() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no event handled within two minutes")
		}
		peak = max(peak, residentBytes(t)-base)
	}
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		peak = max(peak, residentBytes(t)-base)
	}
	n := count.Load()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	fmt.Printf("burst: peak-rss %d handled %d\n", peak, n)
}

// residentBytes is the process's resident set (VmRSS).
func residentBytes(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}
