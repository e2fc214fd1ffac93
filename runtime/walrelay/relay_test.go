package walrelay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// TestWALRelayPublishesCommittedEventsOnly: events of committed
// transactions arrive once each, in per-key order; a rolled-back
// transaction's never do.
func TestWALRelayPublishesCommittedEventsOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, 3)
	phantom, _ := sequence(testenv.Descriptor(b.topic), 20, 4)
	errRollback := errors.New("roll back")
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := b.writer.WriteBatch(ctx, tx, phantom); err != nil {
			return err
		}
		return errRollback
	}); !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	evs, want := sequence(b.d, 300, 7)
	b.write(t, evs[:150], 10) // written before the relay starts
	rr := b.startRelay(t)
	b.write(t, evs[150:], 1)
	b.waitConfirmed(t)
	if dups := testenv.CheckDelivery(t, b.readAll(t), want); dups != 0 {
		t.Fatalf("%d duplicates without any failure", dups)
	}
	if got := rr.published.Load(); got != int64(len(evs)) {
		t.Fatalf("published %d records, want %d", got, len(evs))
	}
}

// TestWALRelaySendsWhatThePollingRelaySends: the same event written to the
// outbox table and relayed by the polling relay, and written as a WAL
// message and relayed by the WAL relay, is the same Kafka record — key,
// value, every header, partition — so consumers cannot tell the relays
// apart.
func TestWALRelaySendsWhatThePollingRelaySends(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, 3)
	if err := outbox.Migrate(ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	table, err := outbox.NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for i, w := range []*outbox.Writer{table, b.writer} {
		id := envelope.NewEventID()
		ev := testenv.NewEvent(b.d, "same-key", 0)
		if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := w.Write(ctx, tx, ev, events.WithEventID(id), events.WithOccurredAt(at),
				events.WithCorrelationID("corr-1"), events.WithCausationID("cause-1"), events.WithProducer("checkout"))
			return err
		}); err != nil {
			t.Fatalf("writer %d: %v", i, err)
		}
	}
	poll, err := outbox.NewRelay(b.pool, b.brokers, outbox.WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	pctx, stopPoll := context.WithCancel(ctx)
	polled := make(chan error, 1)
	go func() { polled <- poll.Run(pctx) }()
	b.startRelay(t)
	b.waitConfirmed(t)
	waitFor(t, "the polling relay to publish its row", func() bool {
		st, err := outbox.Status(ctx, b.pool)
		return err == nil && st.Pending == 0
	})
	stopPoll()
	if err := <-polled; err != nil {
		t.Fatal(err)
	}

	var got []kafka.Message
	for p := range b.parts {
		msgs, err := testenv.FetchPartition(ctx, b.kafka.Client(), b.topic, p, lastOffset(t, b, p))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, msgs...)
	}
	if len(got) != 2 {
		t.Fatalf("%d records in Kafka, want 2 (one per relay)", len(got))
	}
	a, w := got[0], got[1]
	if a.Partition != w.Partition || !bytes.Equal(a.Key, w.Key) {
		t.Fatalf("key %q on partition %d vs key %q on partition %d", a.Key, a.Partition, w.Key, w.Partition)
	}
	if idA, idW := header(a, envelope.HeaderID), header(w, envelope.HeaderID); idA == idW {
		t.Fatalf("both records carry event ID %s; the test wrote two", idA)
	}
	// The event IDs differ by construction; everything else must not.
	if !bytes.Equal(a.Value, w.Value) && !bytes.Equal(replaceID(a), replaceID(w)) {
		t.Fatalf("values differ:\n%s\n%s", a.Value, w.Value)
	}
	if ha, hw := headerText(a), headerText(w); ha != hw {
		t.Fatalf("headers differ:\n%s\n%s", ha, hw)
	}
}

func lastOffset(t testing.TB, b *bundle, p int) int64 {
	t.Helper()
	resp, err := b.kafka.Client().ListOffsets(context.Background(), &kafka.ListOffsetsRequest{
		Topics: map[string][]kafka.OffsetRequest{b.topic: {kafka.LastOffsetOf(p)}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Topics[b.topic][0].LastOffset
}

func header(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// headerText lists the headers in order, the event ID masked.
func headerText(m kafka.Message) string {
	var b strings.Builder
	for _, h := range m.Headers {
		v := string(h.Value)
		if h.Key == envelope.HeaderID {
			v = "<id>"
		}
		fmt.Fprintf(&b, "%s=%s\n", h.Key, v)
	}
	return b.String()
}

// replaceID masks the event ID wherever the value carries it.
func replaceID(m kafka.Message) []byte {
	return bytes.ReplaceAll(m.Value, []byte(header(m, envelope.HeaderID)), []byte("<id>"))
}

// TestWALRelayResumesFromItsConfirmedPosition: a relay stopped mid-stream
// — gracefully, or abandoning its batch in flight — and started again
// delivers everything, in per-key order; only what was in flight may come
// twice.
func TestWALRelayResumesFromItsConfirmedPosition(t *testing.T) {
	t.Parallel()
	for _, grace := range []time.Duration{5 * time.Second, 0} {
		t.Run(fmt.Sprintf("grace=%v", grace), func(t *testing.T) {
			t.Parallel()
			b := setup(t, 3)
			evs, want := sequence(b.d, 2000, 9)
			b.write(t, evs[:1500], 5)
			first := b.startRelay(t, WithShutdownGrace(grace), WithBatchSize(50))
			waitFor(t, "some events published", func() bool { return first.published.Load() >= 200 })
			if err := first.stop(t); err != nil {
				t.Fatal(err)
			}
			stoppedAt := first.published.Load()
			b.write(t, evs[1500:], 1)
			b.startRelay(t)
			b.waitConfirmed(t)
			dups := testenv.CheckDelivery(t, b.readAll(t), want)
			t.Logf("stopped after %d of %d; %d duplicates", stoppedAt, len(evs), dups)
			if grace > 0 && dups != 0 {
				t.Fatalf("%d duplicates after a graceful stop: the acknowledged position was not confirmed", dups)
			}
		})
	}
}

// TestWALRelayStandbyTakesOver: of two relays on one slot one streams, the
// other waits (and says so on /readyz); when the active one stops, the
// standby takes over and nothing is lost.
func TestWALRelayStandbyTakesOver(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	a := b.startRelay(t)
	waitFor(t, "the first relay to stream", func() bool { return a.r.Status().Active })
	s := b.startRelay(t)
	waitFor(t, "the second relay to wait as a standby", func() bool { return s.r.Status().Standby })
	rec := httptest.NewRecorder()
	s.r.ReadyHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "standby") {
		t.Fatalf("standby /readyz: %d %q", rec.Code, rec.Body.String())
	}
	evs, want := sequence(b.d, 600, 5)
	b.write(t, evs[:300], 3)
	waitFor(t, "the active relay to publish", func() bool { return a.published.Load() > 0 })
	if err := a.stop(t); err != nil {
		t.Fatal(err)
	}
	b.write(t, evs[300:], 3)
	waitFor(t, "the standby to take over", func() bool { return s.r.Status().Active })
	b.waitConfirmed(t)
	testenv.CheckDelivery(t, b.readAll(t), want)
	if s.published.Load() == 0 {
		t.Fatal("the standby published nothing")
	}
}

// TestWALSourceRefusesWritesNoRelayWouldRead: a WAL-source write is refused
// while its slot does not exist, and on a server below wal_level = logical
// (where Postgres itself would accept the message); Setup and Run refuse
// that server too, naming the fix.
func TestWALSourceRefusesWritesNoRelayWouldRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, pool := logicalDB(t)
	w, err := outbox.NewWriter(outbox.WithWALSource("not_created"))
	if err != nil {
		t.Fatal(err)
	}
	ev := testenv.NewEvent(testenv.Descriptor("t"), "k", 0)
	write := func(pool *pgxpool.Pool) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := w.Write(ctx, tx, ev); return err })
	}
	if err := write(pool); !errors.Is(err, outbox.ErrWALNotReady) || !strings.Contains(err.Error(), "eventsctl wal setup") {
		t.Fatalf("write without a slot: %v, want ErrWALNotReady naming the fix", err)
	}
	if err := Setup(ctx, pool, WithSlot("not_created")); err != nil {
		t.Fatal(err)
	}
	if err := Setup(ctx, pool, WithSlot("not_created")); err != nil {
		t.Fatalf("second Setup: %v", err)
	}
	if err := write(pool); err != nil {
		t.Fatalf("write after Setup: %v", err)
	}
	r, err := New(pool, []string{"127.0.0.1:1"}, WithSlot("other_slot"), WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("Run on a missing slot: %v, want ErrNoSlot", err)
	}

	replica, _ := servers.DB(t) // the shared server: wal_level = replica unless logical
	var level string
	if err := replica.QueryRow(ctx, `SHOW wal_level`).Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level == "logical" {
		t.Skip("the shared test server runs wal_level = logical: nothing to refuse")
	}
	// A Writer trusts a successful check for a minute: a fresh one for
	// the other server.
	if w, err = outbox.NewWriter(outbox.WithWALSource("not_created")); err != nil {
		t.Fatal(err)
	}
	if err := write(replica); !errors.Is(err, outbox.ErrWALNotReady) || !strings.Contains(err.Error(), "wal_level") {
		t.Fatalf("write at wal_level %s: %v, want ErrWALNotReady naming wal_level", level, err)
	}
	if err := Setup(ctx, replica); !errors.Is(err, ErrWALLevel) || !strings.Contains(err.Error(), "ALTER SYSTEM SET wal_level = logical") {
		t.Fatalf("Setup at wal_level %s: %v, want ErrWALLevel with the fix", level, err)
	}
	r, err = New(replica, []string{"127.0.0.1:1"}, WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); !errors.Is(err, ErrWALLevel) {
		t.Fatalf("Run at wal_level %s: %v, want ErrWALLevel", level, err)
	}
}
