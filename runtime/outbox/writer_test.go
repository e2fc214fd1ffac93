package outbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
)

func TestWriterRowsCommitWithTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := servers.DB(t)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter(WithProducer("orders"), WithFormat(envelope.FormatProto))
	if err != nil {
		t.Fatal(err)
	}
	d := descriptorFor("orders")
	d.Producer = ""

	// Rolled back: no row.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, tx, newEvent(d, "a", 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteBatch(ctx, tx, []events.Event{newEvent(d, "a", 1), newEvent(d, "b", 0)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d rows after rollback, want 0", n)
	}

	// Committed: exactly the rows, in call order, with decodable envelopes.
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first, err := w.Write(ctx, tx, newEvent(d, "a", 0), events.WithCorrelationID("c-1"))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := w.WriteBatch(ctx, tx, []events.Event{newEvent(d, "a", 1), newEvent(d, "b", 0), newEvent(d, "a", 2)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want := append([]events.EventID{first}, batch...)
	rows, err := pool.Query(ctx, `SELECT event_id, event_type, topic, key, lane, value, headers::text, published_at IS NULL FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type dbRow struct {
		EventID, Type, Topic string
		Key                  []byte
		Lane                 int
		Value                []byte
		Headers              string
		Pending              bool
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[dbRow])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d", len(got), len(want))
	}
	lanes := map[string]int{}
	for i, r := range got {
		if r.EventID != want[i].String() || r.Topic != "orders" || r.Type != d.Type || !r.Pending {
			t.Fatalf("row %d = %+v, want event %s on orders, pending", i, r, want[i])
		}
		if l, ok := lanes[string(r.Key)]; ok && l != r.Lane {
			t.Fatalf("key %s in lanes %d and %d", r.Key, l, r.Lane)
		}
		lanes[string(r.Key)] = r.Lane
		hs, err := decodeHeaders(r.Headers)
		if err != nil {
			t.Fatal(err)
		}
		env, err := envelope.Decode(kafka.Message{Key: r.Key, Value: r.Value, Headers: hs})
		if err != nil {
			t.Fatalf("row %d does not decode: %v", i, err)
		}
		if env.EventID != want[i] || env.Producer != "orders" || env.Format != envelope.FormatProto {
			t.Fatalf("row %d envelope: %+v", i, env.Metadata)
		}
		if (i == 0) != (env.CorrelationID == "c-1") {
			t.Fatalf("row %d correlation id %q", i, env.CorrelationID)
		}
	}
}

func TestWriterRefusesBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := servers.DB(t)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	d := descriptorFor("x")
	if _, err := w.WriteBatch(ctx, tx, []events.Event{newEvent(d, "a", 0), newEvent(d, "a", 1)}, events.WithEventID(envelope.NewEventID())); err == nil {
		t.Fatal("a batch sharing one fixed event ID was accepted")
	}
	if _, err := w.Write(ctx, tx, newEvent(&events.Descriptor{Type: "x"}, "a", 0)); err == nil || !strings.Contains(err.Error(), "no topic") {
		t.Fatalf("event without topic: %v", err)
	}
	if _, err := w.Write(ctx, tx, newEvent(d, "", 0)); !errors.Is(err, ErrEmptyKey) || !strings.Contains(err.Error(), `key field "key" is unset or empty`) {
		t.Fatalf("event with an empty key: %v", err)
	}
	if _, err := w.WriteBatch(ctx, tx, []events.Event{newEvent(d, "a", 0), newEvent(d, "", 1)}); !errors.Is(err, ErrEmptyKey) || !strings.Contains(err.Error(), "event 1") {
		t.Fatalf("batch with an empty key: %v", err)
	}
	if ids, err := w.WriteBatch(ctx, tx, nil); err != nil || ids != nil {
		t.Fatalf("empty batch: %v %v", ids, err)
	}
	if _, err := NewWriter(WithTable("no such; table")); err == nil {
		t.Fatal("invalid table name accepted")
	}
	// The same fixed ID twice violates the unique event_id.
	id := envelope.NewEventID()
	if _, err := w.Write(ctx, tx, newEvent(d, "a", 0), events.WithEventID(id)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, tx, newEvent(d, "a", 1), events.WithEventID(id)); err == nil {
		t.Fatal("duplicate event ID accepted")
	}
}

// TestWriterCarriesTraceContext checks that the span in the producer's
// context reaches the envelope's traceparent (header and body), unless the
// publish options set one, for Write and WriteBatch alike.
func TestWriterCarriesTraceContext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := servers.DB(t)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	d := descriptorFor("traced")
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	spanCtx := trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	const fromCtx = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const explicit = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := w.Write(spanCtx, tx, newEvent(d, "a", 0)); err != nil {
			return err
		}
		if _, err := w.WriteBatch(spanCtx, tx, []events.Event{newEvent(d, "a", 1)}); err != nil {
			return err
		}
		if _, err := w.Write(spanCtx, tx, newEvent(d, "a", 2), events.WithTraceParent(explicit)); err != nil {
			return err
		}
		_, err := w.Write(ctx, tx, newEvent(d, "a", 3))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT value, headers FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var value []byte
		var headers string
		if err := rows.Scan(&value, &headers); err != nil {
			t.Fatal(err)
		}
		hs, err := decodeHeaders(headers)
		if err != nil {
			t.Fatal(err)
		}
		env, err := envelope.Decode(kafka.Message{Value: value, Headers: hs})
		if err != nil {
			t.Fatal(err)
		}
		h, _ := envelope.Header(kafka.Message{Headers: hs}, envelope.HeaderTraceParent)
		if h != env.TraceParent {
			t.Errorf("traceparent header %q differs from the envelope's %q", h, env.TraceParent)
		}
		got = append(got, env.TraceParent)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{fromCtx, fromCtx, explicit, ""}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("trace parents %q, want %q", got, want)
	}
}
