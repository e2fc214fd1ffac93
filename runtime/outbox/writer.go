// Package outbox writes events into a Postgres outbox table inside the
// caller's own transaction and relays them to Kafka.
//
// The writer and the relay give at-least-once delivery with per-key order:
// an event is a row in the same transaction as the business change (no
// phantom events, no lost ones), and the relay marks a row published only
// after the broker acknowledged it (acks=all), so a crash re-sends rather
// than loses. Rows are spread over key-hash lanes; each lane is owned by one
// relay at a time and sent strictly in id order, so several relay instances
// can run without re-ordering any key. See Relay for the details.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
)

// Writer inserts event envelopes into the outbox table. It holds no
// connection: every write happens in the transaction the caller passes, so
// the event commits or rolls back with the business change. A Writer is
// safe for concurrent use.
type Writer struct {
	table tableName
	q     queries
	env   envelope.Options
}

// NewWriter returns a Writer for the outbox table (default "outbox").
func NewWriter(opts ...WriterOption) (*Writer, error) {
	c := writerConfig{table: DefaultTable, format: envelope.FormatJSON}
	for _, o := range opts {
		if o != nil {
			o.applyWriter(&c)
		}
	}
	t, err := parseTable(c.table)
	if err != nil {
		return nil, err
	}
	if !c.format.Valid() {
		return nil, fmt.Errorf("outbox: unknown envelope format %v", c.format)
	}
	return &Writer{table: t, q: newQueries(t.sanitized()), env: envelope.Options{Format: c.format, Producer: c.producer}}, nil
}

// row is one encoded event, ready to insert.
// ErrEmptyKey is returned for an event whose key field is unset or empty:
// every event needs its key, which decides its partition and so its order.
var ErrEmptyKey = errors.New("empty event key")

type row struct {
	id               events.EventID
	eventType, topic string
	key, value       []byte
	headers          string
}

func (w *Writer) encode(ev events.Event, po events.PublishOptions) (row, error) {
	if ev == nil {
		return row{}, fmt.Errorf("outbox: write: nil event")
	}
	d := ev.EventDescriptor()
	if d == nil || d.Topic == "" {
		return row{}, fmt.Errorf("outbox: write %T: descriptor names no topic", ev)
	}
	env, err := envelope.New(ev, po, w.env)
	if err != nil {
		return row{}, fmt.Errorf("outbox: write %s: %w", d.Type, err)
	}
	value, headers, err := env.Encode()
	if err != nil {
		return row{}, fmt.Errorf("outbox: write %s: %w", d.Type, err)
	}
	h, err := encodeHeaders(headers)
	if err != nil {
		return row{}, fmt.Errorf("outbox: write %s %s: %w", d.Type, env.EventID, err)
	}
	key := env.Key
	if len(key) == 0 {
		// The key orders the event among its kind on Kafka; without one every
		// such event would share a partition and no order would mean much.
		return row{}, fmt.Errorf("outbox: write %s: %w (key field %q is unset or empty)", d.Type, ErrEmptyKey, d.KeyPath)
	}
	return row{id: env.EventID, eventType: env.Type, topic: d.Topic, key: key, value: value, headers: h}, nil
}

// Write inserts one event into the outbox within tx (a pgx.Tx, or a
// database/sql transaction through SQLTx) and returns its ID.
func (w *Writer) Write(ctx context.Context, tx Tx, ev events.Event, opts ...events.PublishOption) (events.EventID, error) {
	r, err := w.encode(ev, publishOptions(ctx, opts))
	if err != nil {
		return events.EventID{}, err
	}
	if _, err := tx.Exec(ctx, w.q.insert, r.id.String(), r.eventType, r.topic, r.key, r.value, r.headers); err != nil {
		return events.EventID{}, fmt.Errorf("outbox: insert %s %s into %s: %w", r.eventType, r.id, w.table, missingTable(err))
	}
	return r.id, nil
}

// WriteBatch inserts many events into the outbox within tx in one round
// trip and returns their IDs in order. The publish options apply to every
// event; a fixed event ID (events.WithEventID) is refused for more than one
// event.
func (w *Writer) WriteBatch(ctx context.Context, tx Tx, evs []events.Event, opts ...events.PublishOption) ([]events.EventID, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	po := publishOptions(ctx, opts)
	if po.EventID != (events.EventID{}) && len(evs) > 1 {
		return nil, fmt.Errorf("outbox: write batch: a fixed event ID cannot be shared by %d events", len(evs))
	}
	ids := make([]events.EventID, len(evs))
	var (
		eids, types, topics, hdrs = make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs))
		keys, values              = make([][]byte, len(evs)), make([][]byte, len(evs))
	)
	for i, ev := range evs {
		r, err := w.encode(ev, po)
		if err != nil {
			return nil, fmt.Errorf("outbox: write batch: event %d: %w", i, err)
		}
		ids[i] = r.id
		eids[i], types[i], topics[i], keys[i], values[i], hdrs[i] = r.id.String(), r.eventType, r.topic, r.key, r.value, r.headers
	}
	if _, err := tx.Exec(ctx, w.q.insertBatch, eids, types, topics, keys, values, hdrs); err != nil {
		return nil, fmt.Errorf("outbox: insert %d events into %s: %w", len(evs), w.table, missingTable(err))
	}
	return ids, nil
}

// publishOptions applies opts and, unless they set a trace parent, takes
// the one of the span in ctx, so consumers join the producer's trace.
func publishOptions(ctx context.Context, opts []events.PublishOption) events.PublishOptions {
	po := events.ApplyPublishOptions(opts)
	if po.TraceParent == "" {
		po.TraceParent = events.TraceParentFromContext(ctx)
	}
	return po
}

// encodeHeaders stores Kafka headers as a JSON array of [key, value] pairs:
// readable in psql, ordered, duplicates kept. Envelope headers are text;
// anything else is refused rather than mangled.
func encodeHeaders(hs []kafka.Header) (string, error) {
	pairs := make([][2]string, len(hs))
	for i, h := range hs {
		if !utf8.ValidString(h.Key) || !utf8.Valid(h.Value) {
			return "", fmt.Errorf("header %q is not valid UTF-8", h.Key)
		}
		pairs[i] = [2]string{h.Key, string(h.Value)}
	}
	b, err := json.Marshal(pairs)
	if err != nil {
		return "", fmt.Errorf("encode headers: %w", err)
	}
	return string(b), nil
}

// decodeHeaders is the inverse of encodeHeaders.
func decodeHeaders(s string) ([]kafka.Header, error) {
	var pairs [][2]string
	if err := json.Unmarshal([]byte(s), &pairs); err != nil {
		return nil, fmt.Errorf("decode headers: %w", err)
	}
	hs := make([]kafka.Header, len(pairs))
	for i, p := range pairs {
		hs[i] = kafka.Header{Key: p[0], Value: []byte(p[1])}
	}
	return hs, nil
}
