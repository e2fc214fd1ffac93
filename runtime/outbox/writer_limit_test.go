package outbox

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/runtime/events"
)

// recordSize is the Kafka record the relay will send for a stored row: key,
// value and every header's key and value, the headers as the relay
// completes them (publishedHeaders).
func recordSize(t *testing.T, eventID, eventType string, key, value []byte, headers string) int {
	t.Helper()
	hs, err := decodeHeaders(headers)
	if err != nil {
		t.Fatal(err)
	}
	hs = publishedHeaders(hs, eventID, eventType)
	n := len(key) + len(value)
	for _, h := range hs {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

func countRows(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestWriterSizeLimitIsExact writes one event, measures the record it
// stored, and checks that a limit of exactly that size accepts the same
// event while one byte less refuses it with an *EventTooLargeError, for
// Write and WriteBatch, leaving nothing behind after commit.
func TestWriterSizeLimitIsExact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := servers.DB(t)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	d := descriptorFor("sized")
	// A fixed event ID and time keep the encoded size the same on every
	// write of the event.
	id := events.EventID{1, 2, 3}
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	ev := newEvent(d, "k", 7)
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	var (
		key, value                  []byte
		eventID, eventType, headers string
	)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := w.Write(ctx, tx, ev, events.WithEventID(id), events.WithOccurredAt(at)); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT event_id, event_type, key, value, headers::text FROM outbox`).Scan(&eventID, &eventType, &key, &value, &headers); err != nil {
			return err
		}
		return errors.New("roll back")
	})
	if err == nil || err.Error() != "roll back" {
		t.Fatal(err)
	}
	size := recordSize(t, eventID, eventType, key, value, headers)

	exact, err := NewWriter(WithMaxEventBytes(size))
	if err != nil {
		t.Fatal(err)
	}
	under, err := NewWriter(WithMaxEventBytes(size - 1))
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := under.Write(ctx, tx, ev, events.WithEventID(id), events.WithOccurredAt(at))
		var tooLarge *EventTooLargeError
		if !errors.As(err, &tooLarge) || !errors.Is(err, ErrEventTooLarge) {
			t.Fatalf("event of %d bytes under a limit of %d: %v, want an *EventTooLargeError", size, size-1, err)
		}
		if tooLarge.Size != size || tooLarge.Limit != size-1 || tooLarge.Type != d.Type || tooLarge.Topic != "sized" || tooLarge.EventID != id {
			t.Fatalf("error fields %+v, want size %d, limit %d, type %s, topic sized, id %s", tooLarge, size, size-1, d.Type, id)
		}
		_, err = under.WriteBatch(ctx, tx, []events.Event{ev}, events.WithEventID(id), events.WithOccurredAt(at))
		if !errors.As(err, &tooLarge) || !strings.Contains(err.Error(), "event 0") {
			t.Fatalf("batch with an oversized event: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, pool); n != 0 {
		t.Fatalf("%d rows after refused writes, want 0", n)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := exact.Write(ctx, tx, ev, events.WithEventID(id), events.WithOccurredAt(at))
		return err
	})
	if err != nil {
		t.Fatalf("event of exactly the limit (%d bytes) refused: %v", size, err)
	}
	if n := countRows(t, pool); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
}

// TestWriterRefusesNilTxAndBadLimits checks the clear errors for a missing
// transaction (no panic, whatever shape the nil takes) and an invalid limit.
func TestWriterRefusesNilTxAndBadLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	ev := newEvent(descriptorFor("x"), "k", 0)
	var nilPgx *pgxpoolTx
	for name, tx := range map[string]Tx{"nil": nil, "nil *sql.Tx": SQLTx((*sql.Tx)(nil)), "nil pointer": nilPgx} {
		if _, err := w.Write(ctx, tx, ev); !errors.Is(err, ErrNilTx) || !strings.Contains(err.Error(), "pass the open transaction") {
			t.Errorf("Write with %s tx: %v, want ErrNilTx", name, err)
		}
		if _, err := w.WriteBatch(ctx, tx, []events.Event{ev}); !errors.Is(err, ErrNilTx) {
			t.Errorf("WriteBatch with %s tx: %v, want ErrNilTx", name, err)
		}
	}
	for _, n := range []int{0, -1, maxEventBytesCeiling + 1} {
		if _, err := NewWriter(WithMaxEventBytes(n)); err == nil || !strings.Contains(err.Error(), "max event bytes") {
			t.Errorf("WithMaxEventBytes(%d): %v, want a range error", n, err)
		}
	}
}

// pgxpoolTx stands for a concrete transaction type passed as a nil pointer.
type pgxpoolTx struct{ pgx.Tx }
