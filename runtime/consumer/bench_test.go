package consumer

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

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
