package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/topics"
)

// TestRedriveIsOnlyForTheConsumerThatFailed: consumer "a" dead-letters an
// event that consumer "b" applied. Eight days later b's dedup rows are
// (legally) pruned and an operator redrives a's entry: a applies it, and b
// skips it as addressed to a, instead of applying the old event again.
func TestRedriveIsOnlyForTheConsumerThatFailed(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(t, message(t, b.event(t, "a", 0), nil), message(t, b.event(t, "b", 1), nil), message(t, b.event(t, "c", 2), nil))
	var broken atomic.Bool
	broken.Store(true)
	ha := b.handler("a", func(ev testEvent, _ events.Meta) error {
		if ev.Seq() == 1 && broken.Load() {
			return errors.New("bug in a")
		}
		return nil
	})
	var dupB counter
	start(t, b.newConsumer(t, "a", ha, WithMaxAttempts(1)))
	start(t, b.newConsumer(t, "b", b.handler("b", nil), WithHooks(Hooks{Duplicate: func(events.Delivery, string) { dupB.inc() }})))
	entries := b.dlqEntries(t, 1, 20*time.Second)
	b.effectsAtLeast(t, 5, 20*time.Second) // a: 2, b: 3
	broken.Store(false)
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, `UPDATE consumed_events SET consumed_at = now() - interval '8 days'`); err != nil {
		t.Fatal(err)
	}
	if n, err := Prune(ctx, b.pool, 7*24*time.Hour); err != nil || n != 5 {
		t.Fatalf("prune: %d rows, %v; want the 5 aged rows", n, err)
	}
	redriven, err := Redrive(ctx, b.kafka.Brokers, b.d.DLQTopic, SelectOffsets(0, entries[0].Offset))
	if err != nil || len(redriven) != 1 {
		t.Fatalf("redrive: %v, %v", redriven, err)
	}
	testenv.WaitFor(t, 20*time.Second, "a applies the redriven event", func() (bool, string) {
		n := query(t, b.pool, `SELECT count(*) FROM effects WHERE consumer = 'a' AND n = 1`)
		return n == 1, fmt.Sprint(n)
	})
	testenv.WaitFor(t, 20*time.Second, "b skips the redriven event", func() (bool, string) { return dupB.get() == 1, fmt.Sprint(dupB.get()) })
	if n := query(t, b.pool, `SELECT count(*) FROM effects WHERE consumer = 'b' AND n = 1`); n != 1 {
		t.Fatalf("consumer b applied the event %d times, want once", n)
	}
}

// TestOversizedPoisonIsDeadLetteredWithoutItsValue: when the DLQ topic
// refuses the dead-letter copy (here its max.message.bytes is below the
// message's size), the entry is written without the value, pointing at the
// original, and the partition goes on; Redrive refuses that entry and says
// where the original is.
func TestOversizedPoisonIsDeadLetteredWithoutItsValue(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.d.DLQTopic = b.topic + ".small-dlq"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := topics.Create(ctx, b.kafka.Brokers, topics.Config{Partitions: 1, Configs: map[string]string{"max.message.bytes": "2000"}}, b.d.DLQTopic); err != nil {
		t.Fatal(err)
	}
	big := message(t, b.event(t, "big", 0), func(e *envelope.Envelope) {
		e.Payload = []byte(`{"key":"big","seq":0,"pad":"` + strings.Repeat("x", 5000) + `"}`)
	})
	b.produce(t, big, message(t, b.event(t, "next", 1), nil))
	var dead counter
	h := b.handler("big", func(ev testEvent, _ events.Meta) error {
		if ev.Seq() == 0 {
			return Permanent(errors.New("cannot handle this one"))
		}
		return nil
	})
	start(t, b.newConsumer(t, "big", h, WithHooks(Hooks{DeadLettered: func(DeadLetter) { dead.inc() }})))
	b.effectsAtLeast(t, 1, 20*time.Second)
	entries := b.dlqEntries(t, 1, 20*time.Second)
	e := entries[0]
	if e.ValueDropped != len(big.Value) || len(e.Message.Value) != 0 || e.OriginalTopic != b.topic || e.OriginalOffset != 0 ||
		!strings.Contains(e.Error, "cannot handle this one") || e.EventID == "" || dead.get() != 1 {
		t.Fatalf("entry %+v (value %d bytes), dead letters %d; want the headers without the %d-byte value", e, len(e.Message.Value), dead.get(), len(big.Value))
	}
	_, err := Redrive(ctx, b.kafka.Brokers, b.d.DLQTopic, SelectAll())
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("the original is at %s/0/0", b.topic)) {
		t.Fatalf("redrive of a valueless entry: %v", err)
	}
}

// TestCommitWithLostAckIsNotAFailure: the commit reached the server but its
// answer was lost. The consumer finds the dedup row, counts the event as
// applied and does not retry or dead-letter it (MaxAttempts 1 would).
func TestCommitWithLostAckIsNotAFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(t, message(t, b.event(t, "k", 0), nil), message(t, b.event(t, "k", 1), nil))
	var lost atomic.Bool
	var processed, dead, retries counter
	c := b.newConsumer(t, "ack", b.handler("ack", nil), WithMaxAttempts(1),
		withLostCommitAck(func() error {
			if lost.CompareAndSwap(false, true) {
				return errors.New("conn closed during COMMIT")
			}
			return nil
		}),
		WithHooks(Hooks{
			Processed:    func(events.Delivery, string, time.Duration) { processed.inc() },
			DeadLettered: func(DeadLetter) { dead.inc() },
			Retry:        func(events.Delivery, error, time.Duration) { retries.inc() },
		}))
	r := start(t, c)
	testenv.WaitFor(t, 20*time.Second, "both events processed", func() (bool, string) { return processed.get() == 2, fmt.Sprint(processed.get()) })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if !lost.Load() || dead.get() != 0 || retries.get() != 0 || query(t, b.pool, `SELECT count(*) FROM effects`) != 2 {
		t.Fatalf("lost ack injected %v; dead letters %d, retries %d, effects %d; want 0, 0, 2",
			lost.Load(), dead.get(), retries.get(), query(t, b.pool, `SELECT count(*) FROM effects`))
	}
}

// TestListDLQDoesNotCreateTopics: listing a DLQ that does not exist (a
// typo) is an error, and the topic is still absent afterwards, even on a
// broker that creates topics on demand.
func TestListDLQDoesNotCreateTopics(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	missing := b.topic + ".typo-dlq"
	for i := 0; i < 2; i++ {
		if _, err := ListDLQ(ctx, b.kafka.Brokers, missing); !errors.Is(err, ErrNoTopic) {
			t.Fatalf("ListDLQ of a missing topic (round %d): %v, want ErrNoTopic", i+1, err)
		}
	}
	if _, err := Redrive(ctx, b.kafka.Brokers, missing, SelectAll()); !errors.Is(err, ErrNoTopic) {
		t.Fatalf("Redrive from a missing topic: %v, want ErrNoTopic", err)
	}
	// The existing, empty DLQ lists as empty.
	if entries, err := ListDLQ(ctx, b.kafka.Brokers, b.d.DLQTopic); err != nil || len(entries) != 0 {
		t.Fatalf("ListDLQ of the empty DLQ: %v, %v", entries, err)
	}
}

// TestStuckHandlerTimesOutToTheDLQ: a handler that never returns on its own
// (it waits for its context) is cut off by the attempt timeout, retried, and
// dead-lettered; the partition then goes on.
func TestStuckHandlerTimesOutToTheDLQ(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(t, message(t, b.event(t, "k", 0), nil), message(t, b.event(t, "k", 1), nil))
	h := bind(b.d, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testEvent) error {
		if ev.Seq() == 0 {
			<-ctx.Done() // stuck, e.g. on a lock, until the deadline
			return ctx.Err()
		}
		return b.handler("stuck", nil).fn(ctx, tx, meta, ev)
	})
	start(t, b.newConsumer(t, "stuck", h, WithAttemptTimeout(200*time.Millisecond), WithMaxAttempts(2)))
	entries := b.dlqEntries(t, 1, 20*time.Second)
	if e := entries[0]; e.Attempts != 2 || !strings.Contains(e.Error, "attempt timed out after 200ms") {
		t.Fatalf("DLQ entry: %d attempts, error %q", e.Attempts, e.Error)
	}
	b.effectsAtLeast(t, 1, 20*time.Second)
	if _, err := New(b.pool, []string{"b:1"}, "x", WithAttemptTimeout(-time.Second)); err == nil {
		t.Fatal("a negative attempt timeout was accepted")
	}
}

// TestDLQPartitionsLikeTheRelay: a dead letter goes to the DLQ partition
// murmur2 picks for its key, as the relay does for the original topic, so
// one key's dead letters stay in order in one partition.
func TestDLQPartitionsLikeTheRelay(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	var msgs []kafka.Message
	for i := range 8 {
		msgs = append(msgs, message(t, b.event(t, fmt.Sprint("key-", i), i), nil))
	}
	b.produce(t, msgs...)
	c := b.newConsumer(t, "murmur", b.handler("murmur", func(testEvent, events.Meta) error {
		return Permanent(errors.New("refused"))
	}))
	r := start(t, c)
	entries := b.dlqEntries(t, 8, 30*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	parts := map[int]bool{}
	for _, e := range entries {
		want := kafka.Murmur2Balancer{}.Balance(kafka.Message{Key: e.Message.Key}, 0, 1, 2, 3)
		if e.Partition != want {
			t.Errorf("dead letter of key %s in DLQ partition %d, want %d (murmur2)", e.Message.Key, e.Partition, want)
		}
		parts[e.Partition] = true
	}
	if len(parts) < 2 {
		t.Fatalf("all dead letters in %d partition(s): the keys do not tell balancers apart", len(parts))
	}
}
