package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/faultinject"
)

// TestDuplicateDelivery sends one event twice (the relay re-sending after a
// crash): the handler's effect happens once, the copy is a duplicate.
func TestDuplicateDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	first := message(t, b.event(t, "a", 1), nil)
	b.produce(t, first, first, message(t, b.event(t, "a", 2), nil))
	var dups, processed counter
	c := b.newConsumer(t, "dup", b.handler("dup", nil), WithHooks(Hooks{
		Duplicate: func(events.Delivery, string) { dups.inc() },
		Processed: func(events.Delivery, string, time.Duration) { processed.inc() },
	}))
	r := start(t, c)
	b.effectsAtLeast(t, 2, 20*time.Second)
	testenv.WaitFor(t, 10*time.Second, "duplicate hook", func() (bool, string) { return dups.get() == 1, fmt.Sprint(dups.get()) })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if n := query(t, b.pool, `SELECT count(*) FROM effects WHERE n = 1`); n != 1 {
		t.Fatalf("event applied %d times, want once", n)
	}
	if n := query(t, b.pool, `SELECT count(*) FROM effects`); n != 2 {
		t.Fatalf("%d effects, want 2", n)
	}
	if processed.get() != 2 || dups.get() != 1 {
		t.Fatalf("processed %d, duplicates %d; want 2, 1", processed.get(), dups.get())
	}
	if n := query(t, b.pool, `SELECT count(*) FROM consumed_events WHERE consumer = 'dup'`); n != 2 {
		t.Fatalf("%d dedup rows, want 2", n)
	}
}

// TestRedeliveryAfterCrashBetweenCommits stops the consumer after a
// message's transaction committed but before its offset was committed:
// the restarted consumer gets the message again and skips it.
func TestRedeliveryAfterCrashBetweenCommits(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	var msgs []kafka.Message
	for i := range 5 {
		msgs = append(msgs, message(t, b.event(t, "k", i), nil))
	}
	b.produce(t, msgs...)
	crash := errors.New("simulated crash")
	var crashed atomic.Bool
	// One transaction per message: the seam fires between one message's
	// commit and its offset.
	c1 := b.newConsumer(t, "crashy", b.handler("crashy", nil), WithCommitInterval(0), WithMaxBatch(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fctx := faultinject.Consumer(ctx, faultinject.ConsumerPoints{AfterDBCommit: func(m kafka.Message) error {
		if m.Offset == 2 && crashed.CompareAndSwap(false, true) {
			return crash
		}
		return nil
	}})
	if err := c1.Run(fctx); !errors.Is(err, crash) {
		t.Fatalf("Run = %v, want the simulated crash", err)
	}
	if n := query(t, b.pool, `SELECT count(*) FROM effects`); n != 3 {
		t.Fatalf("%d effects before restart, want 3 (offsets 0-2)", n)
	}
	var dups []int64
	var dupOffsets atomic.Value
	dupOffsets.Store(dups)
	c2 := b.newConsumer(t, "crashy", b.handler("crashy", nil), WithHooks(Hooks{
		Duplicate: func(d events.Delivery, _ string) { dupOffsets.Store(append(dupOffsets.Load().([]int64), d.Offset)) },
	}))
	r := start(t, c2)
	b.effectsAtLeast(t, 5, 20*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	// Offsets 0 and 1 were committed (interval 0), 2 was not: exactly it
	// is redelivered, and it is a duplicate.
	if got := dupOffsets.Load().([]int64); len(got) != 1 || got[0] != 2 {
		t.Fatalf("duplicates at offsets %v, want [2]", got)
	}
	if n := query(t, b.pool, `SELECT count(DISTINCT n) FROM effects`); n != 5 || query(t, b.pool, `SELECT count(*) FROM effects`) != 5 {
		t.Fatalf("effects not exactly once: %d distinct", n)
	}
}

// TestRetriesThenDLQ: handler errors and panics are retried MaxAttempts
// times, malformed and too-new messages not at all; all four end in the
// DLQ with the original message and the dlq_* headers, and the partition
// goes on with the next message.
func TestRetriesThenDLQ(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	msgs := []kafka.Message{
		message(t, b.event(t, "ok", 0), nil),
		message(t, b.event(t, "err", 1), nil),
		message(t, b.event(t, "panic", 2), nil),
		{Key: []byte("garbage"), Value: []byte("{not an envelope"), Headers: []kafka.Header{{Key: "x-trace", Value: []byte("t1")}}},
		message(t, b.event(t, "new", 4), func(e *envelope.Envelope) { e.SchemaVersion = 2 }),
		message(t, b.event(t, "ok", 5), nil),
	}
	b.produce(t, msgs...)
	var retries, lagCalls counter
	var dead atomic.Int64
	h := b.handler("dlq", func(ev testEvent, _ events.Meta) error {
		switch string(ev.EventKey()) {
		case "err":
			return errors.New("boom: the handler refused")
		case "panic":
			panic("kaboom")
		}
		return nil
	})
	c := b.newConsumer(t, "dlq", h, WithMaxAttempts(3), WithHooks(Hooks{
		Retry:        func(events.Delivery, error, time.Duration) { retries.inc() },
		DeadLettered: func(DeadLetter) { dead.Add(1) },
		Lag:          func(string, int, int64, time.Duration) { lagCalls.inc() },
	}))
	r := start(t, c)
	entries := b.dlqEntries(t, 4, 30*time.Second)
	b.effectsAtLeast(t, 2, 10*time.Second)
	testenv.WaitFor(t, 10*time.Second, "alert hooks", func() (bool, string) { return dead.Load() == 4, fmt.Sprint(dead.Load()) })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if n := query(t, b.pool, `SELECT count(*) FROM effects WHERE n IN (0, 5)`); n != 2 || query(t, b.pool, `SELECT count(*) FROM effects`) != 2 {
		t.Fatalf("effects: want exactly events 0 and 5 applied")
	}
	if retries.get() != 4 {
		t.Fatalf("%d retries, want 2 per retried message (3 attempts) = 4", retries.get())
	}
	if lagCalls.get() < 6 {
		t.Fatalf("lag hook called %d times, want once per fetch", lagCalls.get())
	}
	if len(entries) != 4 {
		t.Fatalf("%d DLQ entries, want 4", len(entries))
	}
	want := []struct {
		offset   int64
		attempts int
		errPart  string
	}{
		{1, 3, "boom: the handler refused"},
		{2, 3, "handler panicked: kaboom"},
		{3, 1, "not a JSON envelope"},
		{4, 1, "schema_version 2 is newer than the consumer's 1"},
	}
	for i, e := range entries {
		w := want[i]
		orig := msgs[w.offset]
		if e.OriginalTopic != b.topic || e.OriginalPartition != 0 || e.OriginalOffset != w.offset {
			t.Errorf("entry %d: original %s/%d/%d, want %s/0/%d", i, e.OriginalTopic, e.OriginalPartition, e.OriginalOffset, b.topic, w.offset)
		}
		if e.Attempts != w.attempts || !strings.Contains(e.Error, w.errPart) {
			t.Errorf("entry %d: attempts %d error %q; want %d, containing %q", i, e.Attempts, e.Error, w.attempts, w.errPart)
		}
		if e.Consumer != "dlq" || e.FirstFailure.IsZero() || e.LastFailure.Before(e.FirstFailure) {
			t.Errorf("entry %d: consumer %q failures %v..%v", i, e.Consumer, e.FirstFailure, e.LastFailure)
		}
		if string(e.Message.Key) != string(orig.Key) || string(e.Message.Value) != string(orig.Value) {
			t.Errorf("entry %d: key/value changed", i)
		}
		// The original headers come first, unchanged.
		for j, h := range orig.Headers {
			if got := e.Message.Headers[j]; got.Key != h.Key || string(got.Value) != string(h.Value) {
				t.Errorf("entry %d: header %d = %s=%s, want %s=%s", i, j, got.Key, got.Value, h.Key, h.Value)
			}
		}
		if id, ok := envelope.Header(orig, envelope.HeaderID); ok && e.EventID != id {
			t.Errorf("entry %d: event id %q, want %q", i, e.EventID, id)
		}
	}
	if !strings.Contains(entries[1].Error, "goroutine") || !strings.Contains(entries[1].Error, "consumer_test.go") {
		t.Errorf("panic entry lacks the stack: %q", entries[1].Error)
	}
	if len(entries[1].Error) > DefaultMaxErrorBytes {
		t.Errorf("panic error is %d bytes, want it truncated to %d", len(entries[1].Error), DefaultMaxErrorBytes)
	}
}

// TestPoisonAmongThousand: one message that always fails among 1,000 on one
// partition: the other 999 are applied in order, the poison is in the DLQ.
func TestPoisonAmongThousand(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	const n, poison = 1000, 437
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = message(t, b.event(t, "k"+strconv.Itoa(i%7), i), nil)
	}
	b.produce(t, msgs...)
	h := b.handler("poison", func(ev testEvent, _ events.Meta) error {
		if ev.Seq() == poison {
			return errors.New("poison")
		}
		return nil
	})
	r := start(t, b.newConsumer(t, "poison", h))
	b.effectsAtLeast(t, n-1, 60*time.Second)
	entries := b.dlqEntries(t, 1, 10*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	rows, err := b.pool.Query(context.Background(), `SELECT n FROM effects ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		got = append(got, v)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(got) != n-1 {
		t.Fatalf("%d effects, want %d", len(got), n-1)
	}
	want := 0
	for _, v := range got {
		if want == poison {
			want++
		}
		if v != want {
			t.Fatalf("applied %d where %d was due: order broken", v, want)
		}
		want++
	}
	if len(entries) != 1 || entries[0].OriginalOffset != poison || entries[0].Attempts != DefaultMaxAttempts {
		t.Fatalf("DLQ = %+v, want the poison (offset %d) after %d attempts", entries, poison, DefaultMaxAttempts)
	}
}

// TestRebalance: a second consumer joins the group mid-stream; every event
// is applied exactly once, and both members did some of the work.
func TestRebalance(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	const n = 1200
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = message(t, b.event(t, "key-"+strconv.Itoa(i%40), i), nil)
	}
	b.produce(t, msgs[:n/2]...)
	slow := func(testEvent, events.Meta) error { time.Sleep(time.Millisecond); return nil }
	var processedB counter
	ra := start(t, b.newConsumer(t, "rebal", b.handler("rebal", slow)))
	b.effectsAtLeast(t, 100, 30*time.Second)
	rb := start(t, b.newConsumer(t, "rebal", b.handler("rebal", slow), WithHooks(Hooks{
		Processed: func(events.Delivery, string, time.Duration) { processedB.inc() },
	})))
	b.produce(t, msgs[n/2:]...)
	b.effectsAtLeast(t, n, 60*time.Second)
	time.Sleep(300 * time.Millisecond) // let any stray double application show
	if err := ra.stop(); err != nil {
		t.Fatal(err)
	}
	if err := rb.stop(); err != nil {
		t.Fatal(err)
	}
	if total, distinct := query(t, b.pool, `SELECT count(*) FROM effects`), query(t, b.pool, `SELECT count(DISTINCT event_id) FROM effects`); total != n || distinct != n {
		t.Fatalf("%d effects of %d distinct events, want %d of %d", total, distinct, n, n)
	}
	if processedB.get() == 0 {
		t.Fatal("the second consumer never got a partition: no rebalance happened")
	}
	// Per key, events were applied in the order they were produced.
	if bad := query(t, b.pool, `SELECT count(*) FROM (
		SELECT n < lag(n) OVER (PARTITION BY k ORDER BY seq) AS backwards FROM effects) x WHERE backwards`); bad != 0 {
		t.Fatalf("%d events applied before an older event of their key", bad)
	}
}

// TestRedrive: a message dead-lettered while the handler was broken is
// applied once after the fix and a redrive; redriving it again is a no-op.
func TestRedrive(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(t, message(t, b.event(t, "a", 0), nil), message(t, b.event(t, "b", 1), nil), message(t, b.event(t, "c", 2), nil))
	var broken atomic.Bool
	broken.Store(true)
	var dups counter
	h := b.handler("redrive", func(ev testEvent, _ events.Meta) error {
		if ev.Seq() == 1 && broken.Load() {
			return errors.New("bug in the handler")
		}
		return nil
	})
	r := start(t, b.newConsumer(t, "redrive", h, WithMaxAttempts(2), WithHooks(Hooks{
		Duplicate: func(events.Delivery, string) { dups.inc() },
	})))
	entries := b.dlqEntries(t, 1, 20*time.Second)
	b.effectsAtLeast(t, 2, 10*time.Second)
	broken.Store(false) // the fix is deployed

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if none, err := Redrive(ctx, b.kafka.Brokers, b.d.DLQTopic, SelectOffsets(0, 99)); err != nil || len(none) != 0 {
		t.Fatalf("redrive of a missing offset: %v, %v", none, err)
	}
	got, err := Redrive(ctx, b.kafka.Brokers, b.d.DLQTopic, SelectOffsets(0, entries[0].Offset))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].EventID != entries[0].EventID {
		t.Fatalf("redrove %+v", got)
	}
	b.effectsAtLeast(t, 3, 20*time.Second)
	// The redriven copy carries the original headers and event ID, no dlq_*.
	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: b.kafka.Brokers, Topic: b.topic, Partition: 0, MaxWait: 50 * time.Millisecond})
	defer rd.Close()
	if err := rd.SetOffset(3); err != nil {
		t.Fatal(err)
	}
	m, err := rd.FetchMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := envelope.Header(m, envelope.HeaderID); id != entries[0].EventID {
		t.Fatalf("redriven ce_id %q, want %q", id, entries[0].EventID)
	}
	if from, _ := envelope.Header(m, HeaderRedrivenFrom); from != fmt.Sprintf("%s/0/%d", b.d.DLQTopic, entries[0].Offset) {
		t.Fatalf("redriven_from = %q", from)
	}
	for _, h := range m.Headers {
		if strings.HasPrefix(h.Key, HeaderDLQPrefix) {
			t.Fatalf("redriven message kept header %s", h.Key)
		}
	}
	// Redriving everything again re-sends the same event: a duplicate.
	if _, err := Redrive(ctx, b.kafka.Brokers, b.d.DLQTopic, SelectAll()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "duplicate of the redriven event", func() (bool, string) { return dups.get() == 1, fmt.Sprint(dups.get()) })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if n := query(t, b.pool, `SELECT count(*) FROM effects WHERE n = 1`); n != 1 {
		t.Fatalf("redriven event applied %d times, want once", n)
	}
}

// TestCancelIsNotAFailure: cancelling Run while a handler runs rolls back,
// retries nothing, dead-letters nothing and commits nothing; the next run
// applies the event.
func TestCancelIsNotAFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	b.produce(t, message(t, b.event(t, "a", 0), nil))
	entered := make(chan struct{})
	var first atomic.Bool
	var retries, dead counter
	blocking := bind(b.d, func(ctx context.Context, _ pgx.Tx, _ events.Meta, _ testEvent) error {
		if first.CompareAndSwap(false, true) {
			close(entered)
		}
		<-ctx.Done()
		return fmt.Errorf("handler: %w", ctx.Err())
	})
	r := start(t, b.newConsumer(t, "cancel", blocking, WithHooks(Hooks{
		Retry:        func(events.Delivery, error, time.Duration) { retries.inc() },
		DeadLettered: func(DeadLetter) { dead.inc() },
	})))
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("handler never ran")
	}
	if err := r.stop(); err != nil {
		t.Fatalf("Run after cancel = %v, want nil", err)
	}
	if retries.get() != 0 || dead.get() != 0 {
		t.Fatalf("cancellation counted as failure: %d retries, %d dead letters", retries.get(), dead.get())
	}
	if n := query(t, b.pool, `SELECT count(*) FROM consumed_events`); n != 0 {
		t.Fatalf("%d dedup rows after a rolled-back attempt", n)
	}
	r2 := start(t, b.newConsumer(t, "cancel", b.handler("cancel", nil)))
	b.effectsAtLeast(t, 1, 20*time.Second)
	if err := r2.stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if es, err := ListDLQ(ctx, b.kafka.Brokers, b.d.DLQTopic); err != nil || len(es) != 0 {
		t.Fatalf("DLQ after cancel: %v, %v", es, err)
	}
}

// TestDLQPublishFailureHoldsOffset: while the DLQ cannot be written (its
// topic is missing), the failed message's offset is not committed and the
// partition waits; once the topic exists, the message lands in the DLQ and
// the partition goes on. A message is never dropped.
func TestDLQPublishFailureHoldsOffset(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	var dead counter
	c := b.newConsumer(t, "late", b.handler("late", nil), WithCommitInterval(0), WithHooks(Hooks{
		DeadLettered: func(DeadLetter) { dead.inc() },
	}))
	r := start(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	<-c.Ready()
	// Run refuses to start without the DLQ: delete it under the running
	// consumer.
	if _, err := b.kafka.Client().DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{b.d.DLQTopic}}); err != nil {
		t.Fatal(err)
	}
	b.produce(t, kafka.Message{Value: []byte("{garbage")}, message(t, b.event(t, "a", 1), nil))
	time.Sleep(time.Second)
	committed := func() int64 {
		resp, err := b.kafka.Client().OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: b.kafka.Group("late"), Topics: map[string][]int{b.topic: {0}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Topics[b.topic][0].CommittedOffset
	}
	if n := query(t, b.pool, `SELECT count(*) FROM effects`); n != 0 || dead.get() != 0 {
		t.Fatalf("partition moved past an undeliverable dead letter: %d effects, %d dead letters", n, dead.get())
	}
	if off := committed(); off >= 0 {
		t.Fatalf("offset %d committed while the DLQ publish was failing", off)
	}
	if err := b.kafka.CreateTopics(ctx, 1, b.d.DLQTopic); err != nil {
		t.Fatal(err)
	}
	entries := b.dlqEntries(t, 1, 30*time.Second)
	b.effectsAtLeast(t, 1, 20*time.Second)
	testenv.WaitFor(t, 10*time.Second, "offset commit", func() (bool, string) { off := committed(); return off == 2, fmt.Sprint(off) })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].OriginalOffset != 0 || dead.get() != 1 {
		t.Fatalf("DLQ %+v, %d alerts; want the garbage message once", entries, dead.get())
	}
}
