package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
)

// otherDescriptor is a second event type for the service tests, on its own
// topic and DLQ.
func otherDescriptor(topic string) *events.Descriptor {
	d := testenv.Descriptor(topic)
	d.Type = "test.Other"
	d.New = func() events.Event { return testEvent{Struct: &structpb.Struct{}, Desc: d} }
	return d
}

// logSink records log records, for tests that check what is logged.
type logSink struct {
	mu   sync.Mutex
	recs []string // "LEVEL msg attrs"
}

func (s *logSink) Enabled(context.Context, slog.Level) bool { return true }
func (s *logSink) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	s.mu.Lock()
	s.recs = append(s.recs, b.String())
	s.mu.Unlock()
	return nil
}
func (s *logSink) WithAttrs(as []slog.Attr) slog.Handler { return &attrSink{s, as} }
func (s *logSink) WithGroup(string) slog.Handler         { return s }

// count returns how many records contain every one of subs.
func (s *logSink) count(subs ...string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.recs {
		ok := true
		for _, sub := range subs {
			ok = ok && strings.Contains(r, sub)
		}
		if ok {
			n++
		}
	}
	return n
}

type attrSink struct {
	s  *logSink
	as []slog.Attr
}

func (a *attrSink) Enabled(context.Context, slog.Level) bool { return true }
func (a *attrSink) Handle(ctx context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(a.as...)
	return a.s.Handle(ctx, r)
}
func (a *attrSink) WithAttrs(as []slog.Attr) slog.Handler {
	return &attrSink{a.s, append(slices.Clip(a.as), as...)}
}
func (a *attrSink) WithGroup(string) slog.Handler { return a }

// TestConsumerHandlesSeveralEvents: one consumer (one group, one
// dedup name) handles two event types on two topics, each failure going to
// its own topic's DLQ; middleware runs outermost first around every
// handler, and can turn an error into a permanent one.
func TestConsumerHandlesSeveralEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	d2 := otherDescriptor(b.topic + "-other")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := b.kafka.CreateTopics(ctx, 2, d2.Topic, d2.DLQTopic); err != nil {
		t.Fatal(err)
	}
	errFlaky := errors.New("flaky")
	var (
		mu    sync.Mutex
		trace = map[string][]string{} // by event ID: partitions run concurrently
		seen  = map[string]int{}
	)
	record := func(meta events.Meta, s string) {
		mu.Lock()
		trace[meta.EventID.String()] = append(trace[meta.EventID.String()], s)
		mu.Unlock()
	}
	outer := func(next HandlerFunc) HandlerFunc {
		return func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev events.Event) error {
			record(meta, "outer>")
			mu.Lock()
			seen[meta.Type]++
			mu.Unlock()
			err := next(ctx, tx, meta, ev)
			record(meta, "<outer")
			return err
		}
	}
	permanent := func(next HandlerFunc) HandlerFunc {
		return func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev events.Event) error {
			record(meta, "permanent>")
			err := next(ctx, tx, meta, ev)
			record(meta, "<permanent")
			if errors.Is(err, errFlaky) {
				return Permanent(err)
			}
			return err
		}
	}
	var retries counter
	s, err := New(b.pool, b.kafka.Brokers, "svc",
		append(fastOptions(), WithGroupID(b.kafka.Group("svc")), WithMiddleware(outer), WithMiddleware(permanent), WithHooks(Hooks{
			Retry: func(events.Delivery, error, time.Duration) { retries.inc() },
		}))...)
	if err != nil {
		t.Fatal(err)
	}
	if s.GroupID() != b.kafka.Group("svc") {
		t.Fatalf("GroupID %q, want %q", s.GroupID(), b.kafka.Group("svc"))
	}
	insert := func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testEvent) error {
		record(meta, "handler")
		_, err := tx.Exec(ctx, `INSERT INTO effects (consumer, event_id, k, n, part, off) VALUES ($1, $2, $3, $4, $5, $6)`,
			meta.Type, meta.EventID.String(), string(ev.EventKey()), ev.Seq(), meta.Partition, meta.Offset)
		return err
	}
	if err := Handle(s, b.d, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testEvent) error {
		if ev.Seq() == 3 {
			return errFlaky
		}
		return insert(ctx, tx, meta, ev)
	}); err != nil {
		t.Fatal(err)
	}
	if err := Handle(s, d2, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testEvent) error {
		if ev.Seq() == 4 {
			return Permanent(errors.New("bad other"))
		}
		return insert(ctx, tx, meta, ev)
	}); err != nil {
		t.Fatal(err)
	}
	if err := Handle(s, b.d, insert); err == nil || !strings.Contains(err.Error(), "already has a handler") {
		t.Fatalf("second handler for one topic: %v, want a refusal", err)
	}
	var msgs, others []kafka.Message
	for i := range 6 {
		msgs = append(msgs, message(t, b.event(t, fmt.Sprint("k", i%2), i), nil))
		others = append(others, message(t, testenv.NewEvent(d2, fmt.Sprint("o", i%2), i), nil))
	}
	b.produce(t, msgs...)
	w := &kafka.Writer{Addr: kafka.TCP(b.kafka.Brokers...), Topic: d2.Topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	if err := w.WriteMessages(ctx, others...); err != nil {
		t.Fatal(err)
	}
	r := &running{errc: make(chan error, 1)}
	rctx, rcancel := context.WithCancel(context.Background())
	r.cancel = rcancel
	go func() { r.errc <- s.Run(rctx) }()
	t.Cleanup(func() { _ = r.stop() })
	b.effectsAtLeast(t, 10, 30*time.Second)
	dl1 := b.dlqEntries(t, 1, 30*time.Second)
	var dl2 []DLQEntry
	testenv.WaitFor(t, 30*time.Second, "other DLQ entry", func() (bool, string) {
		dl2, err = ListDLQ(ctx, b.kafka.Brokers, d2.DLQTopic)
		return err == nil && len(dl2) == 1, fmt.Sprint(len(dl2), err)
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if dl1[0].EventType != b.d.Type || dl1[0].Attempts != 1 || !strings.Contains(dl1[0].Error, "flaky") {
		t.Fatalf("DLQ of %s: %+v; want the flaky event after 1 attempt (made permanent by middleware)", b.topic, dl1[0])
	}
	if dl2[0].EventType != d2.Type || !strings.Contains(dl2[0].Error, "bad other") {
		t.Fatalf("DLQ of %s: %+v", d2.Topic, dl2[0])
	}
	if retries.get() != 0 {
		t.Fatalf("%d retries, want 0", retries.get())
	}
	for typ, want := range map[string]int64{b.d.Type: 5, d2.Type: 5} {
		if n := query(t, b.pool, `SELECT count(*) FROM effects WHERE consumer = $1`, typ); n != want {
			t.Fatalf("%d effects of %s, want %d", n, typ, want)
		}
	}
	if n := query(t, b.pool, `SELECT count(*) FROM consumed_events WHERE consumer = 'svc'`); n != 10 {
		t.Fatalf("%d dedup rows under the service's name, want 10", n)
	}
	mu.Lock()
	defer mu.Unlock()
	applied := 0
	for id, got := range trace {
		if !slices.Contains(got, "handler") {
			continue // a failing event: its handler returned before recording
		}
		applied++
		if want := []string{"outer>", "permanent>", "handler", "<permanent", "<outer"}; !slices.Equal(got, want) {
			t.Fatalf("middleware order of %s: %v, want %v", id, got, want)
		}
	}
	if applied != 10 {
		t.Fatalf("%d events traced through the handler, want 10", applied)
	}
	if seen[b.d.Type] != 6 || seen[d2.Type] != 6 {
		t.Fatalf("middleware saw %v, want 6 of each type", seen)
	}
}

// TestMissingTopicsRefused: Run refuses to start while a consumed topic or
// its DLQ is missing, naming each and the fix.
func TestMissingTopicsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	d2 := otherDescriptor(b.topic + "-absent")
	s, err := New(b.pool, b.kafka.Brokers, "missing", append(fastOptions(), WithGroupID(b.kafka.Group("missing")))...)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []*events.Descriptor{b.d, d2} {
		if err := Handle(s, d, func(context.Context, pgx.Tx, events.Meta, testEvent) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err = s.Run(ctx)
	var mt *MissingTopicsError
	if !errors.As(err, &mt) {
		t.Fatalf("Run = %v, want a *MissingTopicsError", err)
	}
	if want := []string{d2.Topic, d2.DLQTopic}; !slices.Equal(mt.Topics, want) {
		t.Fatalf("missing %v, want %v", mt.Topics, want)
	}
	if msg := err.Error(); !strings.Contains(msg, "eventsctl topics create --topic "+d2.Topic) || !strings.Contains(msg, d2.DLQTopic) {
		t.Fatalf("error %q does not name the topics and the fix", msg)
	}
}

// TestWaitForTopics: with WithWaitForTopics, Run warns repeatedly, naming
// the missing topics, and consumes once they are created.
func TestWaitForTopics(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	d2 := otherDescriptor(b.topic + "-later")
	sink := &logSink{}
	s, err := New(b.pool, b.kafka.Brokers, "waiter",
		append(fastOptions(), WithGroupID(b.kafka.Group("waiter")), WithLogger(slog.New(sink)), WithWaitForTopics(), WithWarnInterval(50*time.Millisecond), withTopicPoll(20*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	if err := Handle(s, d2, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testEvent) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (consumer, event_id, k, n, part, off) VALUES ('waiter', $1, $2, $3, $4, $5)`,
			meta.EventID.String(), string(ev.EventKey()), ev.Seq(), meta.Partition, meta.Offset)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	testenv.WaitFor(t, 30*time.Second, "two warnings", func() (bool, string) {
		n := sink.count("WARN", "waiting for topics", d2.Topic, d2.DLQTopic)
		return n >= 2, fmt.Sprint(n)
	})
	select {
	case <-s.Ready():
		t.Fatal("ready while its topics are missing")
	default:
	}
	if code, body := probeHandler(t, s.ReadyHandler()); code != http.StatusServiceUnavailable || !strings.Contains(body, "waiting for missing topics") {
		t.Fatalf("readiness while topics are missing: %d %q", code, body)
	}
	if code, body := probeHandler(t, s.LiveHandler()); code != http.StatusOK {
		t.Fatalf("liveness while waiting for topics: %d %q", code, body)
	}
	cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
	defer ccancel()
	if err := b.kafka.CreateTopics(cctx, 1, d2.Topic, d2.DLQTopic); err != nil {
		t.Fatal(err)
	}
	w := &kafka.Writer{Addr: kafka.TCP(b.kafka.Brokers...), Topic: d2.Topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	if err := w.WriteMessages(cctx, message(t, testenv.NewEvent(d2, "a", 1), nil)); err != nil {
		t.Fatal(err)
	}
	b.effectsAtLeast(t, 1, 30*time.Second)
	testenv.WaitFor(t, 30*time.Second, "ready once the topics exist", func() (bool, string) {
		code, body := probeHandler(t, s.ReadyHandler())
		return code == http.StatusOK, body
	})
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if code, body := probeHandler(t, s.LiveHandler()); code != http.StatusServiceUnavailable || !strings.Contains(body, "not live") {
		t.Fatalf("liveness after Run returned: %d %q", code, body)
	}
}

// probeHandler calls a health handler and returns its status code and body.
func probeHandler(t *testing.T, h http.Handler) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	return rec.Code, rec.Body.String()
}

// TestUnassignedTopicWarns: two members of one group on a one-partition
// topic; the one holding no partition of it says so, once per interval,
// and both are ready.
func TestUnassignedTopicWarns(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	sinks := []*logSink{{}, {}}
	var cs []*Consumer
	for _, sink := range sinks {
		c := b.newConsumer(t, "pair", b.handler("pair", nil), WithLogger(slog.New(sink)), WithWarnInterval(100*time.Millisecond))
		cs = append(cs, c)
		start(t, c)
	}
	for _, c := range cs {
		select {
		case <-c.Ready():
		case <-time.After(60 * time.Second):
			t.Fatal("not ready")
		}
	}
	// Warnings from before the join do not count: one member must keep
	// warning while the other holds the partition.
	warns := func(i int) int { return sinks[i].count("WARN", "no partition of topic assigned", b.topic) }
	before := []int{warns(0), warns(1)}
	testenv.WaitFor(t, 60*time.Second, "repeated unassigned-topic warnings", func() (bool, string) {
		return warns(0)-before[0] >= 2 || warns(1)-before[1] >= 2, fmt.Sprint(before, warns(0), warns(1))
	})
}
