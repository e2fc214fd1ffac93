package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
)

// partitionOf is the partition the test producer (kafka.Hash over three
// partitions) sends key to.
func partitionOf(key string) int {
	return (&kafka.Hash{}).Balance(kafka.Message{Key: []byte(key)}, 0, 1, 2)
}

// TestRetryBlocksOnlyItsPartition: while one partition retries a failing
// message, the other partitions are consumed to the end, and nothing behind
// the failing message on its own partition is applied before it settles.
func TestRetryBlocksOnlyItsPartition(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	const n = 300
	blockedPart := partitionOf("k0")
	var msgs []kafka.Message
	others, behind := 0, 0
	for i := range n {
		k := "k" + strconv.Itoa(i%30)
		msgs = append(msgs, message(t, b.event(t, k, i), nil))
		switch {
		case partitionOf(k) != blockedPart:
			others++
		case i > 0:
			behind++
		}
	}
	if others == 0 || behind == 0 {
		t.Fatal("keys do not spread over the partitions")
	}
	b.produce(t, msgs...)
	// The first message fails until the other partitions are done (however
	// slow the machine), then once more, and dead-letters on its last attempt.
	var dead, othersDone atomic.Int64
	h := b.handler("block", func(ev testEvent, meta events.Meta) error {
		if ev.Seq() != 0 {
			return nil
		}
		if othersDone.Load() == 0 {
			return errors.New("failing, the partition must wait")
		}
		return Permanent(errors.New("failing for good"))
	})
	r := start(t, b.newConsumer(t, "block", h, WithMaxAttempts(1000), WithBackoff(20*time.Millisecond, 50*time.Millisecond),
		WithHooks(Hooks{DeadLettered: func(DeadLetter) { dead.Add(1) }})))
	testenv.WaitFor(t, 30*time.Second, "the other partitions", func() (bool, string) {
		got := query(t, b.pool, `SELECT count(*) FROM effects WHERE part <> $1`, blockedPart)
		return got == int64(others), fmt.Sprintf("%d of %d", got, others)
	})
	if got := query(t, b.pool, `SELECT count(*) FROM effects WHERE part = $1`, blockedPart); got != 0 || dead.Load() != 0 {
		t.Fatalf("%d events behind the failing one were applied (%d dead letters) before it settled", got, dead.Load())
	}
	othersDone.Store(1)
	b.effectsAtLeast(t, n-1, 30*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if dead.Load() != 1 || query(t, b.pool, `SELECT count(*) FROM effects WHERE part = $1`, blockedPart) != int64(behind) {
		t.Fatalf("after the DLQ: %d dead letters, want 1, and all %d events behind it applied", dead.Load(), behind)
	}
}

// TestConcurrencyBound: WithConcurrency(1) runs one handler at a time over
// three partitions; without it the partitions run in parallel.
func TestConcurrencyBound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		opts  []Option
		check func(maxInFlight int64) bool
	}{
		{"bounded", []Option{WithConcurrency(1)}, func(m int64) bool { return m == 1 }},
		{"unbounded", nil, func(m int64) bool { return m > 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, 3)
			var msgs []kafka.Message
			for i := range 90 {
				msgs = append(msgs, message(t, b.event(t, "k"+strconv.Itoa(i%9), i), nil))
			}
			b.produce(t, msgs...)
			var inFlight, maxInFlight atomic.Int64
			h := b.handler(tc.name, func(testEvent, events.Meta) error {
				cur := inFlight.Add(1)
				defer inFlight.Add(-1)
				for {
					m := maxInFlight.Load()
					if cur <= m || maxInFlight.CompareAndSwap(m, cur) {
						break
					}
				}
				time.Sleep(3 * time.Millisecond)
				return nil
			})
			r := start(t, b.newConsumer(t, tc.name, h, tc.opts...))
			b.effectsAtLeast(t, 90, 30*time.Second)
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			if !tc.check(maxInFlight.Load()) {
				t.Fatalf("at most %d handlers ran at once", maxInFlight.Load())
			}
		})
	}
}

// TestShutdownCommitsOffsets: a clean stop commits what was handled, even
// within the commit interval, so the next run redelivers nothing.
func TestShutdownCommitsOffsets(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	var msgs []kafka.Message
	for i := range 60 {
		msgs = append(msgs, message(t, b.event(t, "k"+strconv.Itoa(i%6), i), nil))
	}
	b.produce(t, msgs...)
	r := start(t, b.newConsumer(t, "clean", b.handler("clean", nil), WithCommitInterval(time.Hour)))
	b.effectsAtLeast(t, 60, 20*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	var dups counter
	r2 := start(t, b.newConsumer(t, "clean", b.handler("clean", nil), WithHooks(Hooks{
		Duplicate: func(events.Delivery, string) { dups.inc() },
	})))
	b.produce(t, message(t, b.event(t, "k0", 60), nil))
	b.effectsAtLeast(t, 61, 20*time.Second)
	if err := r2.stop(); err != nil {
		t.Fatal(err)
	}
	if dups.get() != 0 {
		t.Fatalf("%d events redelivered after a clean stop", dups.get())
	}
}

// TestBackgroundPruning: WithPruning deletes old dedup rows while the
// consumer runs and leaves new ones.
func TestBackgroundPruning(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `INSERT INTO consumed_events (consumer, event_id, consumed_at)
		SELECT 'old', gen_random_uuid(), now() - interval '3 hours' FROM generate_series(1, 20)`); err != nil {
		t.Fatal(err)
	}
	// The topic keeps its messages for less than the dedup rows, as the
	// retention guard requires.
	b.setTopicConfig(t, b.topic, "retention.ms", "1800000")
	b.produce(t, message(t, b.event(t, "a", 0), nil))
	r := start(t, b.newConsumer(t, "pruner", b.handler("pruner", nil),
		WithRetentionFloor(time.Hour), WithPruning(20*time.Millisecond, time.Hour)))
	b.effectsAtLeast(t, 1, 20*time.Second)
	testenv.WaitFor(t, 10*time.Second, "old rows pruned", func() (bool, string) {
		n := query(t, b.pool, `SELECT count(*) FROM consumed_events WHERE consumer = 'old'`)
		return n == 0, fmt.Sprint(n)
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if n := query(t, b.pool, `SELECT count(*) FROM consumed_events WHERE consumer = 'pruner'`); n != 1 {
		t.Fatalf("pruner deleted a fresh row: %d left", n)
	}
}
