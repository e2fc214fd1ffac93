package outbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
)

// headerText renders headers as key=value lines, to compare and print.
func headerText(hs []kafka.Header) string {
	var b strings.Builder
	for _, h := range hs {
		fmt.Fprintf(&b, "%s=%s\n", h.Key, h.Value)
	}
	return b.String()
}

// TestStoredHeadersRoundTrip: for every format, with and without the
// optional headers, what the row keeps and the relay completes is exactly
// what envelope.Encode returned; the envelope formats leave ce_specversion,
// ce_id and ce_type out of the row, the CloudEvents formats keep them.
func TestStoredHeadersRoundTrip(t *testing.T) {
	d := descriptorFor("t")
	for _, f := range envelope.Formats {
		for _, optional := range []bool{false, true} {
			po := events.PublishOptions{}
			if optional {
				po.CorrelationID, po.CausationID, po.TraceParent = "corr", "cause", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
			}
			env, err := envelope.New(newEvent(d, "k", 1), po, envelope.Options{Format: f})
			if err != nil {
				t.Fatal(err)
			}
			_, hs, err := env.Encode()
			if err != nil {
				t.Fatal(err)
			}
			stored := storedHeaders(hs, f)
			slim := f == envelope.FormatJSON || f == envelope.FormatProto
			if got, want := len(stored), len(hs)-3; slim && got != want {
				t.Fatalf("%v: row keeps %d headers, want %d:\n%s", f, got, want, headerText(stored))
			}
			if !slim && len(stored) != len(hs) {
				t.Fatalf("%v: row keeps %d headers, want all %d", f, len(stored), len(hs))
			}
			// Through the column's text and back, as the relay reads it.
			text, err := encodeHeaders(stored)
			if err != nil {
				t.Fatal(err)
			}
			decoded, err := decodeHeaders(text)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := headerText(publishedHeaders(decoded, env.EventID.String(), env.Type)), headerText(hs); got != want {
				t.Fatalf("%v, optional %v: relay sends\n%s\nwant what Encode returned\n%s", f, optional, got, want)
			}
		}
	}
}

// TestPublishedHeadersLeaveOtherRowsAlone: rows of earlier versions (every
// header stored), rows without an envelope content type and hand-written
// rows without headers go out exactly as stored.
func TestPublishedHeadersLeaveOtherRowsAlone(t *testing.T) {
	full := []kafka.Header{
		{Key: envelope.HeaderSpecVersion, Value: []byte("1.0")}, {Key: envelope.HeaderID, Value: []byte("01JDQ2X7Y4Z8KQ3B6M9T5V0W1R")},
		{Key: envelope.HeaderType, Value: []byte("t")}, {Key: envelope.HeaderContentType, Value: []byte(envelope.ContentTypeJSON)},
	}
	for name, hs := range map[string][]kafka.Header{
		"earlier version":  full,
		"no headers":       {},
		"other content":    {{Key: envelope.HeaderContentType, Value: []byte("text/plain")}},
		"no content type":  {{Key: envelope.HeaderSource, Value: []byte("p")}},
		"cloudevents json": {{Key: envelope.HeaderContentType, Value: []byte(envelope.ContentTypePayloadJSON)}},
	} {
		if got := publishedHeaders(hs, "01JDQ2X7Y4Z8KQ3B6M9T5V0W1R", "t"); headerText(got) != headerText(hs) {
			t.Errorf("%s: relay sends\n%s\nwant the stored headers\n%s", name, headerText(got), headerText(hs))
		}
	}
	// A hand-written row of an envelope format without ce_id gets only
	// what it lacks, never a header twice.
	partial := []kafka.Header{{Key: envelope.HeaderType, Value: []byte("mine")}, {Key: envelope.HeaderContentType, Value: []byte(envelope.ContentTypeProto)}}
	got := publishedHeaders(partial, "id", "t")
	if want := "ce_specversion=1.0\nce_id=id\nce_type=mine\ncontent-type=" + envelope.ContentTypeProto + "\n"; headerText(got) != want {
		t.Fatalf("partial headers completed as\n%s\nwant\n%s", headerText(got), want)
	}
	// The values put back are capped: appending to one leaves the next.
	got = publishedHeaders(full[3:], "id", "type")
	_ = append(got[0].Value, "XX"...)
	_ = append(got[1].Value, "XX"...)
	if string(got[1].Value) != "id" || string(got[2].Value) != "type" {
		t.Fatalf("header values overlap: %s", headerText(got))
	}
}

// TestRelaySendsEveryHeader writes an event in every format through the
// Writer, and a row of an earlier version (all headers stored), and reads
// the records the relay published: each carries exactly the headers
// envelope.Encode gives for its envelope, though the rows of the envelope
// formats store three fewer.
func TestRelaySendsEveryHeader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, true, 1)
	at := time.Date(2026, 12, 3, 20, 0, 0, 5, time.UTC)
	want := map[string]string{} // event ID → the headers Encode gave
	for i, f := range envelope.Formats {
		w, err := NewWriter(WithFormat(f), WithProducer("p"))
		if err != nil {
			t.Fatal(err)
		}
		id := events.EventID{byte(i + 1)}
		po := []events.PublishOption{events.WithEventID(id), events.WithOccurredAt(at), events.WithCorrelationID("c")}
		ev := newEvent(b.d, "k", i)
		env, err := envelope.New(ev, events.ApplyPublishOptions(po), envelope.Options{Format: f, Producer: "p"})
		if err != nil {
			t.Fatal(err)
		}
		_, hs, err := env.Encode()
		if err != nil {
			t.Fatal(err)
		}
		want[id.String()] = headerText(hs)
		var stored string
		err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := w.Write(ctx, tx, ev, po...); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT headers::text FROM outbox WHERE event_id = $1`, id.String()).Scan(&stored)
		})
		if err != nil {
			t.Fatal(err)
		}
		slim := f == envelope.FormatJSON || f == envelope.FormatProto
		if got := strings.Contains(stored, envelope.HeaderID); got == slim {
			t.Fatalf("%v: stored headers %s: ce_id stored %v, want %v", f, stored, got, !slim)
		}
	}
	// A row as earlier versions wrote it: every header in the column.
	old := events.EventID{9}
	oldEvent := newEvent(b.d, "k", 9)
	oldOpts := []events.PublishOption{events.WithEventID(old), events.WithOccurredAt(at)}
	env, err := envelope.New(oldEvent, events.ApplyPublishOptions(oldOpts), envelope.Options{Producer: "p"})
	if err != nil {
		t.Fatal(err)
	}
	_, hs, err := env.Encode()
	if err != nil {
		t.Fatal(err)
	}
	text, err := encodeHeaders(hs)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter(WithProducer("p"))
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := w.Write(ctx, tx, oldEvent, oldOpts...); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE outbox SET headers = $1::jsonb WHERE event_id = $2`, text, old.String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want[old.String()] = headerText(hs)

	b.startRelay(t)
	b.waitDrained(t, time.Minute)
	cl := &kafka.Client{Addr: kafka.TCP(b.brokers...), Timeout: time.Minute}
	msgs, err := testenv.FetchPartition(ctx, cl, b.topic, 0, int64(len(want)))
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != len(want) {
		t.Fatalf("%d records, want %d", len(msgs), len(want))
	}
	for _, m := range msgs {
		i := slices.IndexFunc(m.Headers, func(h kafka.Header) bool { return h.Key == envelope.HeaderID })
		if i < 0 {
			t.Fatalf("record at offset %d has no ce_id:\n%s", m.Offset, headerText(m.Headers))
		}
		id := string(m.Headers[i].Value)
		if got := headerText(m.Headers); got != want[id] {
			t.Fatalf("record of %s has headers\n%s\nwant\n%s", id, got, want[id])
		}
		if _, err := envelope.Decode(m); err != nil {
			t.Fatalf("record of %s: %v", id, err)
		}
	}
}
