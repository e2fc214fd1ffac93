package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/events"
)

// prefill writes n events over 100 keys into the bundle's outbox, in
// transactions of 1000.
func prefill(b *testing.B, bb *bundle, n int) {
	b.Helper()
	evs, _ := sequence(bb.d, n, 100)
	for i := 0; i < n; i += 1000 {
		bb.write(b, evs[i:min(i+1000, n)])
	}
}

// BenchmarkRelay compares our relay with the naive per-row relay over the
// same pre-filled outbox and the same broker (kfake over TCP), both with
// acks=all; events/s is rows published and marked per second.
func BenchmarkRelay(b *testing.B) {
	b.Run("batched-500", func(b *testing.B) {
		bb := setup(b, false, 6)
		prefill(b, bb, b.N)
		var published atomic.Int64
		done := make(chan struct{})
		var once sync.Once
		r, err := NewRelay(bb.pool, bb.brokers, WithBatchSize(500), WithLogger(quietLogger()),
			WithHooks(Hooks{Published: func(n int) {
				if published.Add(int64(n)) >= int64(b.N) {
					once.Do(func() { close(done) })
				}
			}}))
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		stopped := make(chan error, 1)
		b.ResetTimer()
		start := time.Now()
		go func() { stopped <- r.Run(ctx) }()
		select {
		case <-done:
		case err := <-stopped:
			b.Fatalf("relay stopped: %v", err)
		}
		elapsed := time.Since(start)
		b.StopTimer()
		cancel()
		if err := <-stopped; err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	})
	b.Run("naive", func(b *testing.B) {
		bb := setup(b, false, 6)
		prefill(b, bb, b.N)
		w := &kafka.Writer{Addr: kafka.TCP(bb.brokers...), Balancer: kafka.Murmur2Balancer{}, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
		defer w.Close()
		ctx := context.Background()
		b.ResetTimer()
		start := time.Now()
		for range b.N {
			if err := naiveRelayOne(ctx, bb, w); err != nil {
				b.Fatal(err)
			}
		}
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	})
}

// naiveRelayOne is the per-row relay of the design notes: select one
// pending row, publish it, mark it, commit.
func naiveRelayOne(ctx context.Context, bb *bundle, w *kafka.Writer) error {
	tx, err := bb.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	var (
		id         int64
		topic, hdr string
		key, value []byte
	)
	err = tx.QueryRow(ctx, `SELECT id, topic, key, value, headers::text FROM outbox
		WHERE published_at IS NULL ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED`).Scan(&id, &topic, &key, &value, &hdr)
	if err != nil {
		return fmt.Errorf("naive relay: select: %w", err)
	}
	hs, err := decodeHeaders(hdr)
	if err != nil {
		return err
	}
	if err := w.WriteMessages(ctx, kafka.Message{Topic: topic, Key: key, Value: value, Headers: hs}); err != nil {
		return fmt.Errorf("naive relay: publish: %w", err)
	}
	if _, err := tx.Exec(ctx, `UPDATE outbox SET published_at = now(), attempts = attempts + 1 WHERE id = $1`, id); err != nil {
		return fmt.Errorf("naive relay: mark: %w", err)
	}
	return tx.Commit(ctx)
}

// BenchmarkProducer measures what the outbox adds to a business
// transaction: one business insert per transaction, with and without
// Writer.Write of one event in the same transaction.
func BenchmarkProducer(b *testing.B) {
	for _, withOutbox := range []bool{false, true} {
		name := "business-only"
		if withOutbox {
			name = "business+outbox"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			bb := setup(b, false, 1)
			if _, err := bb.pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, customer text NOT NULL,
				amount_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				err := pgx.BeginFunc(ctx, bb.pool, func(tx pgx.Tx) error {
					customer := fmt.Sprintf("customer-%d", i%100)
					if _, err := tx.Exec(ctx, `INSERT INTO orders (customer, amount_cents) VALUES ($1, $2)`, customer, 1250+i); err != nil {
						return err
					}
					if withOutbox {
						_, err := bb.writer.Write(ctx, tx, newEvent(bb.d, customer, i))
						return err
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkWriteBatch measures WriteBatch (one INSERT … SELECT FROM unnest)
// against pgx's CopyFrom for the same rows, the alternative the design
// considered; events/s is rows inserted per second.
func BenchmarkWriteBatch(b *testing.B) {
	for _, size := range []int{10, 100, 1000} {
		for _, method := range []string{"unnest", "copyfrom"} {
			b.Run(fmt.Sprintf("%s-%d", method, size), func(b *testing.B) {
				ctx := context.Background()
				bb := setup(b, false, 1)
				evs, _ := sequence(bb.d, size, 10)
				b.ResetTimer()
				for range b.N {
					err := pgx.BeginFunc(ctx, bb.pool, func(tx pgx.Tx) error {
						if method == "unnest" {
							_, err := bb.writer.WriteBatch(ctx, tx, evs)
							return err
						}
						return copyFromBatch(ctx, bb.writer, tx, evs)
					})
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*size)/b.Elapsed().Seconds(), "events/s")
			})
		}
	}
}

// copyFromBatch is the CopyFrom variant of WriteBatch, for the benchmark.
func copyFromBatch(ctx context.Context, w *Writer, tx pgx.Tx, evs []events.Event) error {
	rows := make([][]any, len(evs))
	for i, ev := range evs {
		r, err := w.encode(ev, events.PublishOptions{})
		if err != nil {
			return err
		}
		rows[i] = []any{r.id.String(), r.eventType, r.topic, r.key, r.value, r.headers}
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"outbox"}, []string{"event_id", "event_type", "topic", "key", "value", "headers"}, pgx.CopyFromRows(rows))
	return err
}

// BenchmarkBacklog measures what a producer sees of WithBacklogPolicy,
// each op one transaction that writes one event (pgx.BeginFunc) on an
// outbox no relay drains (as with the brokers cut):
//
//   - no-policy: the Writer without a policy;
//   - under-bound: a bound the backlog never reaches (the sample, once a
//     second, counts every pending row);
//   - at-bound: the backlog already over a bound of 100 rows, so every
//     write is refused with a *BacklogError, fail fast.
//
// Besides ns/op it reports the median and 99th percentile latency of one
// transaction and the share of writes refused.
func BenchmarkBacklog(b *testing.B) {
	for _, bc := range []struct {
		name   string
		policy *BacklogPolicy
	}{
		{"no-policy", nil},
		{"under-bound", &BacklogPolicy{Table: BacklogBound{MaxPending: 1 << 40}}},
		{"at-bound", &BacklogPolicy{Table: BacklogBound{MaxPending: 100}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			bb := setup(b, true, 1)
			w := bb.writer
			if bc.policy != nil {
				var err error
				if w, err = NewWriter(WithBacklogPolicy(*bc.policy)); err != nil {
					b.Fatal(err)
				}
			}
			prefill(b, bb, 200)
			took := make([]time.Duration, 0, b.N)
			refused := 0
			b.ResetTimer()
			for i := range b.N {
				start := time.Now()
				err := pgx.BeginFunc(ctx, bb.pool, func(tx pgx.Tx) error {
					_, err := w.Write(ctx, tx, newEvent(bb.d, fmt.Sprintf("k%d", i%100), i))
					return err
				})
				took = append(took, time.Since(start))
				switch {
				case errors.Is(err, ErrBacklog):
					refused++
				case err != nil:
					b.Fatal(err)
				}
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(took[min(len(took)-1, len(took)*99/100)].Microseconds()), "p99-µs")
			b.ReportMetric(100*float64(refused)/float64(b.N), "refused-%")
		})
	}
}
