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
	"reflect"
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
	table    tableName
	q        queries
	env      envelope.Options
	maxBytes int
}

// NewWriter returns a Writer for the outbox table (default "outbox").
func NewWriter(opts ...WriterOption) (*Writer, error) {
	c := writerConfig{table: DefaultTable, format: envelope.FormatJSON}
	maxBytes := DefaultMaxEventBytes
	for _, o := range opts {
		if o == nil {
			continue
		}
		if m, ok := o.(maxEventBytesOption); ok {
			// Read here rather than through writerConfig: the limit is a
			// property of the Writer alone.
			if m < 1 || m > maxEventBytesCeiling {
				return nil, fmt.Errorf("outbox: max event bytes %d out of range 1..%d", int(m), maxEventBytesCeiling)
			}
			maxBytes = int(m)
			continue
		}
		o.applyWriter(&c)
	}
	t, err := parseTable(c.table)
	if err != nil {
		return nil, err
	}
	if !c.format.Valid() {
		return nil, fmt.Errorf("outbox: unknown envelope format %v", c.format)
	}
	return &Writer{table: t, q: newQueries(t.sanitized()), env: envelope.Options{Format: c.format, Producer: c.producer}, maxBytes: maxBytes}, nil
}

// DefaultMaxEventBytes is the largest Kafka record (key + value + headers)
// a Writer accepts unless WithMaxEventBytes says otherwise: below Kafka's
// default max.message.bytes (1,048,588), with room for the record batch's
// own overhead, so an accepted event is one the broker accepts too.
const DefaultMaxEventBytes = 1_000_000

// maxEventBytesCeiling bounds WithMaxEventBytes: a bytea value in Postgres
// cannot exceed 1 GiB.
const maxEventBytesCeiling = 1 << 30

// WithMaxEventBytes sets the largest encoded event, key + value + headers as
// the relay will send it to Kafka, that Write and WriteBatch accept (default
// DefaultMaxEventBytes). A larger event is refused at Publish with an
// *EventTooLargeError instead of being committed and then refused by the
// broker forever, blocking its key. Raise it only together with the topic's
// max.message.bytes (and the brokers' replica.fetch.max.bytes and the
// consumers' fetch sizes).
func WithMaxEventBytes(n int) WriterOption { return maxEventBytesOption(n) }

type maxEventBytesOption int

// applyWriter does nothing: NewWriter reads the limit itself.
func (maxEventBytesOption) applyWriter(*writerConfig) {}

// ErrEventTooLarge matches (errors.Is) every *EventTooLargeError.
var ErrEventTooLarge = errors.New("event too large")

// EventTooLargeError is returned by Write and WriteBatch for an event whose
// encoded Kafka record is over the Writer's limit; nothing is written.
type EventTooLargeError struct {
	Type    string         // the event's type, e.g. "shop.orders.v1.OrderPlaced"
	Topic   string         // the topic it was meant for
	EventID events.EventID // the ID it would have had
	Size    int            // key + value + headers, in bytes
	Limit   int            // the Writer's limit (WithMaxEventBytes)
}

func (e *EventTooLargeError) Error() string {
	return fmt.Sprintf("outbox: event %s %s for topic %q is %d bytes as a Kafka record (key + value + headers), over the limit of %d bytes: "+
		"slim the event (send a reference to large data rather than the data), or raise the topic's max.message.bytes and outbox.WithMaxEventBytes together",
		e.Type, e.EventID, e.Topic, e.Size, e.Limit)
}

// Is makes errors.Is(err, ErrEventTooLarge) hold.
func (e *EventTooLargeError) Is(target error) bool { return target == ErrEventTooLarge }

// ErrNilTx is returned by Write and WriteBatch when no transaction is given.
var ErrNilTx = errors.New("nil transaction")

// checkTx refuses a nil transaction, an interface holding a nil pointer
// included, before anything calls it.
func checkTx(tx Tx) error {
	nilTx := tx == nil
	if s, ok := tx.(sqlTx); ok {
		nilTx = s.tx == nil
	} else if !nilTx {
		v := reflect.ValueOf(tx)
		nilTx = (v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface) && v.IsNil()
	}
	if nilTx {
		return fmt.Errorf("outbox: write: %w: pass the open transaction of the business change (a pgx.Tx, or outbox.SQLTx(tx) for database/sql)", ErrNilTx)
	}
	return nil
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
	// The relay sends exactly these bytes (the headers as decoded from the
	// stored JSON), so this is the record the broker will weigh.
	size := len(key) + len(value)
	for _, h := range headers {
		size += len(h.Key) + len(h.Value)
	}
	if size > w.maxBytes {
		return row{}, &EventTooLargeError{Type: d.Type, Topic: d.Topic, EventID: env.EventID, Size: size, Limit: w.maxBytes}
	}
	return row{id: env.EventID, eventType: env.Type, topic: d.Topic, key: key, value: value, headers: h}, nil
}

// Write inserts one event into the outbox within tx (a pgx.Tx, or a
// database/sql transaction through SQLTx) and returns its ID. An event
// over the Writer's size limit is refused with an *EventTooLargeError, a nil
// tx with ErrNilTx; nothing is written then.
func (w *Writer) Write(ctx context.Context, tx Tx, ev events.Event, opts ...events.PublishOption) (events.EventID, error) {
	if err := checkTx(tx); err != nil {
		return events.EventID{}, err
	}
	r, err := w.encode(ev, publishOptions(ctx, opts))
	if err != nil {
		return events.EventID{}, err
	}
	if _, err := tx.Exec(ctx, w.q.insert, r.id.String(), r.eventType, r.topic, r.key, r.value, r.headers); err != nil {
		return events.EventID{}, fmt.Errorf("outbox: insert %s %s into %s: %w", r.eventType, r.id, w.table, missingTable(err))
	}
	// Relays of this process poll quickly from now on and find the row
	// once the caller commits (see Notify).
	wakeTable(w.table)
	return r.id, nil
}

// WriteBatch inserts many events into the outbox within tx in one round
// trip and returns their IDs in order. The publish options apply to every
// event; a fixed event ID (events.WithEventID) is refused for more than one
// event. One event over the size limit refuses the whole batch.
func (w *Writer) WriteBatch(ctx context.Context, tx Tx, evs []events.Event, opts ...events.PublishOption) ([]events.EventID, error) {
	if err := checkTx(tx); err != nil {
		return nil, err
	}
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
	wakeTable(w.table)
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
