package consumer

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/types/known/structpb"

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

// BenchmarkBurstMemory measures the live heap of a consumer whose handler
// is ten times slower than its input: a burst of 10,000 events of 2 KB
// (20 MB) is on the topic when the consumer starts, and the handler takes
// a millisecond an event, so the burst is about ten seconds of work. For
// two seconds the heap is sampled every 50 ms after a forced collection
// (the live heap, not garbage waiting for the collector) and its peak
// over the heap before the consumer started is reported:
//
//   - bounded: the default fetch limits (WithFetchLimits: 100 messages
//     queued per partition), so the partition pauses fetching;
//   - unbounded: the limits lifted (a million messages, 64 MiB a fetch),
//     so the partition reads the whole burst into memory.
func BenchmarkBurstMemory(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts []Option
	}{
		{"bounded", nil},
		{"unbounded", []Option{WithFetchLimits(1_000_000, 64<<20)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var peak, handled float64
			for range b.N {
				p, n := burstMemory(b, bc.opts)
				peak, handled = max(peak, p), handled+n
			}
			b.ReportMetric(peak/(1<<20), "peak-heap-MB")
			b.ReportMetric(handled/float64(b.N), "handled")
		})
	}
}

// burstMemory runs one burst (BenchmarkBurstMemory) and returns the peak
// live heap over the heap before the consumer started, in bytes, and how
// many events were handled meanwhile.
func burstMemory(b *testing.B, opts []Option) (peak, handled float64) {
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
	msgs = nil
	var count atomic.Int64
	h := bind(bd.d, func(ctx context.Context, _ pgx.Tx, _ events.Meta, _ testEvent) error {
		count.Add(1)
		time.Sleep(time.Millisecond)
		return nil
	})
	c := bd.newConsumer(b, "burst", h, append([]Option{WithMaxBatch(1)}, opts...)...)
	live := func() float64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return float64(ms.HeapAlloc)
	}
	base := live()
	b.StartTimer()
	r := start(b, c)
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		peak = max(peak, live()-base)
	}
	b.StopTimer()
	if err := r.stop(); err != nil {
		b.Fatal(err)
	}
	return peak, float64(count.Load())
}
