package outbox

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
)

// writeOne writes ev alone in its own committed transaction through w.
func (b *bundle) writeOne(ctx context.Context, w *Writer, ev events.Event) error {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := w.Write(ctx, tx, ev); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// waitUntil is waitFor with the bound every wait on a condition has here:
// it only bounds a hang.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, 3*time.Minute, what, func() (bool, string) { return cond(), "" })
}

// TestBacklogBoundWhileBrokersAreCut: with every produce request refused,
// the relay publishes nothing; producers fill the outbox up to the bound,
// then are refused with a *BacklogError naming the backlog and the bound,
// and the relay's /readyz says why. Nothing written is lost: once the
// brokers answer again the backlog drains, writes are admitted again, and
// every event written before, during and after arrives in order.
func TestBacklogBoundWhileBrokersAreCut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, true, 2)
	var cut atomic.Bool
	cut.Store(true)
	b.kafka.Fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		b.kafka.Fake.KeepControl()
		if !cut.Load() {
			return nil, nil, false
		}
		return nil, errors.New("brokers cut"), true
	})
	bound := BacklogBound{MaxPending: 40}
	w, err := NewWriter(WithBacklogPolicy(BacklogPolicy{Table: bound, Sample: 5 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	relay, err := NewRelay(b.pool, b.brokers, WithReadyBacklog(bound), WithHealthInterval(20*time.Millisecond),
		WithBackoff(10*time.Millisecond, 100*time.Millisecond), WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()

	want := map[string]int{}
	seq := 0
	next := func() events.Event {
		k := []string{"a", "b", "c"}[seq%3]
		return newEvent(b.d, k, want[k])
	}
	accepted := func(ev events.Event) {
		want[string(ev.EventKey())]++
		seq++
	}
	var be *BacklogError
	for {
		ev := next()
		err := b.writeOne(ctx, w, ev)
		if err == nil {
			accepted(ev)
			continue
		}
		if !errors.As(err, &be) || !errors.Is(err, ErrBacklog) {
			t.Fatalf("write %d: %v, want a *BacklogError", seq, err)
		}
		break
	}
	if seq <= int(bound.MaxPending) {
		t.Fatalf("refused after %d writes, below the bound of %d", seq, bound.MaxPending)
	}
	if be.Pending != bound.MaxPending+1 || be.Bound != bound || be.Topic != "" || be.OldestPending <= 0 || be.Waited != 0 {
		t.Fatalf("backlog error %+v, want %d pending (the sample stops there), the bound, no topic, no wait", be, bound.MaxPending+1)
	}
	if msg := be.Error(); !strings.Contains(msg, "more than 40 pending rows") || !strings.Contains(msg, "nothing was written") || !strings.Contains(msg, "WithBacklogPolicy") {
		t.Fatalf("error text: %s", msg)
	}
	st, err := Status(ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != int64(seq) || st.Published != 0 {
		t.Fatalf("after the refusal: %d pending, %d published; want every accepted write (%d) pending", st.Pending, st.Published, seq)
	}
	waitUntil(t, "the relay to report the backlog", func() bool {
		h := relay.Health()
		return !h.Ready && h.Pending > bound.MaxPending
	})
	if code, body := serve(relay.ReadyHandler()); code != http.StatusServiceUnavailable ||
		!strings.Contains(body, "backlog over the bound (40 pending rows)") || !strings.Contains(body, "pending rows: more than 40") {
		t.Fatalf("/readyz: %d\n%s", code, body)
	}

	cut.Store(false)
	waitUntil(t, "a write to be admitted again", func() bool {
		ev := next()
		err := b.writeOne(ctx, w, ev)
		if err == nil {
			accepted(ev)
			return true
		}
		if !errors.Is(err, ErrBacklog) {
			t.Fatalf("write after the brokers returned: %v", err)
		}
		return false
	})
	for range 10 {
		ev := next()
		if err := b.writeOne(ctx, w, ev); err != nil {
			t.Fatalf("write after the backlog drained: %v", err)
		}
		accepted(ev)
	}
	b.waitDrained(t, time.Minute)
	waitUntil(t, "the relay to be ready again", func() bool { return relay.Health().Ready })
	checkDelivery(t, b.readAll(t), want)
}

// TestBacklogPolicyPerTopic: a topic over its own bound is refused while
// other topics are written, and a table bound on the age of the oldest row
// refuses every topic once a row is older than it.
func TestBacklogPolicyPerTopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, true, 1)
	other := descriptorFor(b.topic + "-other")
	w, err := NewWriter(WithBacklogPolicy(BacklogPolicy{
		Topics: map[string]BacklogBound{b.topic: {MaxPending: 3}},
		Sample: time.Millisecond,
	}))
	if err != nil {
		t.Fatal(err)
	}
	// The Writer reads the backlog at most once a millisecond, so a write
	// or two past the bound may be admitted on the reading before.
	var be *BacklogError
	n := 0
	waitUntil(t, "the bounded topic to be refused", func() bool {
		err := b.writeOne(ctx, w, newEvent(b.d, "k", n))
		if err == nil {
			n++
			return false
		}
		if !errors.As(err, &be) {
			t.Fatalf("write %d of the bounded topic: %v", n, err)
		}
		return true
	})
	if n < 4 || be.Topic != b.topic || be.Pending != 4 {
		t.Fatalf("refused after %d writes with %+v, want at least 4 writes, then a refusal for topic %s with 4 pending (the count stops there)", n, be, b.topic)
	}
	if !strings.Contains(be.Error(), `(topic "`+b.topic+`")`) {
		t.Fatalf("error text does not name the topic: %s", be)
	}
	for i := range 10 {
		if err := b.writeOne(ctx, w, newEvent(other, "k", i)); err != nil {
			t.Fatalf("write %d of an unbounded topic: %v", i, err)
		}
	}
	// A batch with one event of the bounded topic is refused as a whole.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteBatch(ctx, tx, []events.Event{newEvent(other, "k", 10), newEvent(b.d, "k", n)}); !errors.As(err, &be) || be.Topic != b.topic {
		t.Fatalf("batch with the bounded topic: %v", err)
	}
	_ = tx.Rollback(ctx)

	aged, err := NewWriter(WithBacklogPolicy(BacklogPolicy{Table: BacklogBound{MaxPending: 1_000_000, MaxAge: 300 * time.Millisecond}, Sample: time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the oldest row to break the age bound", func() bool {
		err := b.writeOne(ctx, aged, newEvent(other, "late", 0))
		if err != nil && !errors.As(err, &be) {
			t.Fatalf("write under an age bound: %v", err)
		}
		return err != nil
	})
	if be.Topic != "" || be.OldestPending <= 300*time.Millisecond || !strings.Contains(be.Error(), "over the bound (1000000 pending rows, oldest 300ms)") {
		t.Fatalf("age refusal: %+v: %s", be, be)
	}
}

// TestBacklogPolicyWaits: with a wait, a write over the bound blocks while
// the backlog drains and then succeeds; one whose context ends first fails
// with the time it waited.
func TestBacklogPolicyWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, true, 1)
	evs, _ := sequence(b.d, 20, 2)
	b.write(t, evs)
	w, err := NewWriter(WithBacklogPolicy(BacklogPolicy{Table: BacklogBound{MaxPending: 10}, Wait: 10 * time.Minute, Sample: 5 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}

	// A write that waits its whole Wait fails with the time it waited.
	brief, err := NewWriter(WithBacklogPolicy(BacklogPolicy{Table: BacklogBound{MaxPending: 10}, Wait: 100 * time.Millisecond, Sample: 5 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	err = b.writeOne(ctx, brief, newEvent(b.d, "k", 0))
	var be *BacklogError
	if !errors.As(err, &be) || be.Waited < 100*time.Millisecond {
		t.Fatalf("write over the bound with a short wait: %v, want a *BacklogError after waiting 100ms", err)
	}
	// A transaction above READ COMMITTED sees one snapshot: it fails at
	// once rather than wait for a backlog it cannot see fall.
	tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, tx, newEvent(b.d, "k", 0)); !errors.As(err, &be) || be.Waited > time.Minute {
		t.Fatalf("write at REPEATABLE READ: %v, want a *BacklogError at once", err)
	}
	_ = tx.Rollback(ctx)

	written := make(chan error, 1)
	go func() { written <- b.writeOne(ctx, w, newEvent(b.d, "late", 0)) }()
	select {
	case err := <-written:
		t.Fatalf("write over the bound returned before the backlog drained: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	b.startRelay(t)
	if err := <-written; err != nil {
		t.Fatalf("waiting write: %v", err)
	}
	b.waitDrained(t, time.Minute)
}

func TestBacklogPolicyRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []WriterOption
		want string
	}{
		{"no bound", []WriterOption{WithBacklogPolicy(BacklogPolicy{})}, "no bound set"},
		{"negative", []WriterOption{WithBacklogPolicy(BacklogPolicy{Table: BacklogBound{MaxPending: -1}})}, "must not be negative"},
		{"negative wait", []WriterOption{WithBacklogPolicy(BacklogPolicy{Table: BacklogBound{MaxPending: 1}, Wait: -time.Second})}, "must not be negative"},
		{"empty topic", []WriterOption{WithBacklogPolicy(BacklogPolicy{Topics: map[string]BacklogBound{"": {MaxPending: 1}}})}, "empty topic name"},
		{"age alone", []WriterOption{WithBacklogPolicy(BacklogPolicy{Table: BacklogBound{MaxAge: time.Minute}})}, "MaxAge 1m0s without MaxPending"},
		{"WAL source", []WriterOption{WithWALSource("s"), WithBacklogPolicy(BacklogPolicy{Table: BacklogBound{MaxPending: 1}})}, "walrelay.WithMaxLagBytes"},
	} {
		if _, err := NewWriter(tc.opts...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	if _, err := NewRelay(nil, []string{"127.0.0.1:1"}, WithReadyBacklog(BacklogBound{MaxAge: -time.Second})); err == nil {
		t.Error("NewRelay accepted a negative backlog bound")
	}
}
