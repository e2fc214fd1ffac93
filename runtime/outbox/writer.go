package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/internal/jsonstr"
)

// Writer inserts event envelopes into the outbox table. It holds no
// connection: every write happens in the transaction the caller passes, so
// the event commits or rolls back with the business change. A Writer is
// safe for concurrent use.
//
// On its first write a Writer reads its table's shape (whether the table
// generates each row's lane, as tables of earlier versions do, or takes it
// from the Writer's INSERT, and with how many lanes) and keeps it. The
// tables one Writer writes to (through search_path, in several databases)
// must therefore agree in shape and lane count, and writers must be
// restarted after their table is dropped and created again with another
// lane count; a change of shape alone is noticed (the insert is refused
// once, and the Writer reads the table again).
type Writer struct {
	table    tableName
	env      envelope.Options
	maxBytes int
	// ins are the insert statements for the table's shape, learned from
	// the database on first use (learn); nil until then.
	ins atomic.Pointer[inserts]
	// generated are the statements of a table that generates its lanes
	// (the tables of earlier versions), used while the shape is unknown.
	generated inserts
	// learnErr is why the last attempt to learn the shape failed.
	learnErr atomic.Pointer[error]
	// walSlot is set by WithWALSource: emit logical decoding messages,
	// not rows, for the WAL relay reading this slot.
	walSlot string
	// walChecked is when the slot was last seen ready (unix nanoseconds).
	walChecked atomic.Int64
	// backlog applies WithBacklogPolicy (nil without it).
	backlog *backlogGuard
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
	if err := checkWALSlot(c.walSlot); err != nil {
		return nil, err
	}
	if c.walSlot != "" && c.backlog != nil {
		return nil, errors.New("outbox: WithBacklogPolicy counts the outbox table's pending rows, and a WithWALSource Writer writes none: " +
			"bound the WAL relay's slot instead (walrelay.WithMaxLagBytes for readiness, max_slot_wal_keep_size in Postgres; docs/runbook.md, \"WAL relay\")")
	}
	bg, err := newBacklogGuard(t, c.backlog)
	if err != nil {
		return nil, err
	}
	return &Writer{table: t, env: envelope.Options{Format: c.format, Producer: c.producer}, maxBytes: maxBytes,
		generated: newInserts(t.sanitized(), 0), walSlot: c.walSlot, backlog: bg}, nil
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
	fixed            bool   // the producer chose the ID (events.WithEventID)
	record           []byte // a WAL Writer's message: the Kafka record (walrecord)
}

// learn returns the statements for the Writer's table, reading its shape
// through q (the caller's transaction) the first time (one query in the Writer's life): tables created
// by this version take their lane from the Writer's statements, earlier
// ones generate it. It is best effort: when the table cannot be read (it
// does not exist yet, the connection is busy) it returns the statements of
// earlier tables this once and keeps the reason, and the insert reports
// what is wrong — a missing table as before, a table of this version with
// the reason (insertFailed).
func (w *Writer) learn(ctx context.Context, q querier) *inserts {
	if ins := w.ins.Load(); ins != nil {
		return ins
	}
	rt, err := lookUp(ctx, q, w.table, false)
	if err != nil {
		w.learnErr.Store(&err)
		return &w.generated
	}
	// The statements name the table as the Writer does, not as resolved:
	// an unqualified name keeps following the connection's search_path.
	ins := newInserts(w.table.sanitized(), rt.writerLanes())
	w.ins.Store(&ins)
	w.learnErr.Store(nil)
	return &ins
}

// insertFailed explains an insert's error. When the error shows that the
// table is not of the shape the Writer learned (a table dropped and
// created again by another version, or one Writer used on the tables of
// several schemas or databases), the Writer forgets the shape and learns
// it again on the next write.
func (w *Writer) insertFailed(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch {
	case pgErr.Code == sqlstateGeneratedAlways:
		w.ins.Store(nil)
		return err
	case pgErr.Code == sqlstateNotNull && pgErr.ColumnName == "lane":
		w.ins.Store(nil)
		why := "writers of earlier protoevents versions do not send it: upgrade every writer of the table"
		if p := w.learnErr.Load(); p != nil {
			why = fmt.Sprintf("the writer could not read the table to send it (%v)", *p)
		}
		return fmt.Errorf("%w (this outbox table takes each row's lane from the writer's INSERT, and %s)", err, why)
	}
	return missingTable(err)
}

// The errors of an insert into a table of the other shape: a value for a
// generated lane, or none for a plain one.
const (
	sqlstateGeneratedAlways = "428C9"
	sqlstateNotNull         = "23502"
)

// one is the statement and arguments that insert r alone: a fixed ID goes
// through insertFixed, which the partial unique index checks.
func (ins *inserts) one(r row) (string, []any) {
	q := ins.insert
	if r.fixed {
		q = ins.insertFixed
	}
	return q, []any{r.id.String(), r.eventType, r.topic, r.key, r.value, r.headers}
}

// run is the statement and arguments that insert rows, all of one kind
// (fixed IDs or not): one row alone, or many through insertBatch (a fixed
// ID is never shared by more than one row).
func (ins *inserts) run(rows []row) (string, []any) {
	if len(rows) == 1 || rows[0].fixed {
		return ins.one(rows[0])
	}
	a := newRowArrays(len(rows))
	for _, r := range rows {
		a.add(r)
	}
	return ins.insertBatch, a.args()
}

// rowArrays are the columns of several rows, the parameters of insertBatch.
type rowArrays struct {
	eids, types, topics, hdrs []string
	keys, values              [][]byte
}

func newRowArrays(n int) *rowArrays {
	return &rowArrays{
		eids: make([]string, 0, n), types: make([]string, 0, n), topics: make([]string, 0, n), hdrs: make([]string, 0, n),
		keys: make([][]byte, 0, n), values: make([][]byte, 0, n),
	}
}

func (a *rowArrays) add(r row) {
	a.eids, a.types, a.topics = append(a.eids, r.id.String()), append(a.types, r.eventType), append(a.topics, r.topic)
	a.keys, a.values, a.hdrs = append(a.keys, r.key), append(a.values, r.value), append(a.hdrs, r.headers)
}

// args are insertBatch's parameters, in order.
func (a *rowArrays) args() []any {
	return []any{a.eids, a.types, a.topics, a.keys, a.values, a.hdrs}
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
	r := row{id: env.EventID, eventType: env.Type, topic: d.Topic, key: key, value: value}
	if w.walSource() {
		// No table, no unique index: a fixed ID is an ID like any other.
		r.record = walRecord(d.Topic, key, headers, value)
		return r, nil
	}
	if r.headers, err = encodeHeaders(storedHeaders(headers, w.env.Format)); err != nil {
		return row{}, fmt.Errorf("outbox: write %s %s: %w", d.Type, env.EventID, err)
	}
	r.fixed = po.EventID != (events.EventID{})
	return r, nil
}

// admit checks, before rows are written through tx, that their reader is
// ready (walReady) and that the backlog allows them (WithBacklogPolicy).
func (w *Writer) admit(ctx context.Context, tx Tx, rows []row) error {
	if err := w.walReady(ctx, tx); err != nil {
		return err
	}
	return w.backlog.admit(ctx, tx, rows)
}

// statement is the statement and arguments that write rows, all of one
// kind (fixed IDs or not), through q: the INSERT for the table's shape, or
// a WAL Writer's messages.
func (w *Writer) statement(ctx context.Context, q querier, rows []row) (string, []any) {
	if w.walSource() {
		return walStatement(rows)
	}
	return w.learn(ctx, q).run(rows)
}

// failed explains why a write's statement failed (a message has nothing
// to explain that walReady did not check first).
func (w *Writer) failed(err error) error {
	if w.walSource() {
		return err
	}
	return w.insertFailed(err)
}

// verb and target say what the Writer does and where, for errors.
func (w *Writer) verb() string {
	if w.walSource() {
		return "emit"
	}
	return "insert"
}

func (w *Writer) target() string {
	if w.walSource() {
		return "the write-ahead log"
	}
	return w.table.String()
}

// Write inserts one event into the outbox within tx (a pgx.Tx, or a
// database/sql transaction through SQLTx) and returns its ID. On a
// *CommitTx the row is held instead and sent with the transaction's next
// statement or its COMMIT (see CommitTx); on any other Tx it is inserted
// now. An event over the Writer's size limit is refused with an
// *EventTooLargeError, a nil tx with ErrNilTx; nothing is written then.
func (w *Writer) Write(ctx context.Context, tx Tx, ev events.Event, opts ...events.PublishOption) (events.EventID, error) {
	if err := checkTx(tx); err != nil {
		return events.EventID{}, err
	}
	po := publishOptions(ctx, opts)
	r, err := w.encode(ev, po)
	if err != nil {
		return events.EventID{}, err
	}
	if err := w.admit(ctx, tx, []row{r}); err != nil {
		return events.EventID{}, err
	}
	if c, ok := tx.(*CommitTx); ok {
		if err := c.hold(ctx, w, []row{r}); err != nil {
			return events.EventID{}, fmt.Errorf("outbox: write %s %s: %w", r.eventType, r.id, err)
		}
		return r.id, nil
	}
	q, args := w.statement(ctx, tx, []row{r})
	if _, err := tx.Exec(ctx, q, args...); err != nil {
		return events.EventID{}, fmt.Errorf("outbox: %s %s %s into %s: %w", w.verb(), r.eventType, r.id, w.target(), w.failed(err))
	}
	// Relays of this process poll quickly from now on and find the row
	// once the caller commits (see Notify).
	w.wake()
	return r.id, nil
}

// WriteBatch inserts many events into the outbox within tx in one round
// trip (on a *CommitTx: held, as Write) and returns their IDs in order. The publish options apply to every
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
	rows := make([]row, len(evs))
	for i, ev := range evs {
		r, err := w.encode(ev, po)
		if err != nil {
			return nil, fmt.Errorf("outbox: write batch: event %d: %w", i, err)
		}
		ids[i], rows[i] = r.id, r
	}
	if err := w.admit(ctx, tx, rows); err != nil {
		return nil, err
	}
	if c, ok := tx.(*CommitTx); ok {
		if err := c.hold(ctx, w, rows); err != nil {
			return nil, fmt.Errorf("outbox: write batch: %w", err)
		}
		return ids, nil
	}
	q, args := w.statement(ctx, tx, rows)
	if _, err := tx.Exec(ctx, q, args...); err != nil {
		return nil, fmt.Errorf("outbox: %s %d events into %s: %w", w.verb(), len(evs), w.target(), w.failed(err))
	}
	w.wake()
	return ids, nil
}

// wake tells this process's relays of the Writer's table that rows are
// coming (uncommitted); a WAL Writer has no table and wakes nobody.
func (w *Writer) wake() {
	if !w.walSource() {
		wakeTable(w.table, false)
	}
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
	n := 2
	for _, h := range hs {
		if !utf8.ValidString(h.Key) || !utf8.Valid(h.Value) {
			return "", fmt.Errorf("header %q is not valid UTF-8", h.Key)
		}
		n += len(h.Key) + len(h.Value) + 8
	}
	b := make([]byte, 0, n)
	b = append(b, '[')
	for i, h := range hs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		b, _ = jsonstr.Append(b, h.Key, jsonstr.Mode{}) // valid UTF-8, checked above
		b = append(b, ',')
		b, _ = jsonstr.Append(b, string(h.Value), jsonstr.Mode{})
		b = append(b, ']')
	}
	return string(append(b, ']')), nil
}

// decodeHeaders is the inverse of encodeHeaders. The relay calls it for
// every row it sends, so the common case — pairs of strings without
// escapes, as Postgres prints a jsonb value — is parsed by hand; anything
// else goes through encoding/json.
func decodeHeaders(s string) ([]kafka.Header, error) {
	if hs, ok := scanHeaders(s); ok {
		return hs, nil
	}
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

// scanHeaders parses `[["k", "v"], ...]` whose strings hold no escapes
// (ok false for anything else, which decodeHeaders hands to
// encoding/json).
func scanHeaders(s string) (hs []kafka.Header, ok bool) {
	p := headerScanner{s: s}
	if !p.eat('[') {
		return nil, false
	}
	if p.eat(']') {
		return []kafka.Header{}, p.end()
	}
	hs = make([]kafka.Header, 0, 8)
	// The values share one copy of the text (kafka-go only reads them):
	// one allocation a row rather than one a header.
	b := []byte(s)
	for {
		if !p.eat('[') {
			return nil, false
		}
		k, _, ok1 := p.str()
		if !ok1 || !p.eat(',') {
			return nil, false
		}
		v, at, ok2 := p.str()
		if !ok2 || !p.eat(']') {
			return nil, false
		}
		end := at + len(v)
		hs = append(hs, kafka.Header{Key: k, Value: b[at:end:end]})
		if p.eat(']') {
			return hs, p.end()
		}
		if !p.eat(',') {
			return nil, false
		}
	}
}

// headerScanner walks a headers JSON text for scanHeaders.
type headerScanner struct {
	s string
	i int
}

func (p *headerScanner) space() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\n' || p.s[p.i] == '\t' || p.s[p.i] == '\r') {
		p.i++
	}
}

// eat skips white space and then c, reporting whether c was there.
func (p *headerScanner) eat(c byte) bool {
	p.space()
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

// str reads a string without escapes or control characters, and returns
// it with its offset in the text.
func (p *headerScanner) str() (string, int, bool) {
	if !p.eat('"') {
		return "", 0, false
	}
	start := p.i
	for p.i < len(p.s) {
		switch c := p.s[p.i]; {
		case c == '"':
			p.i++
			return p.s[start : p.i-1], start, true
		case c == '\\' || c < 0x20:
			return "", 0, false
		}
		p.i++
	}
	return "", 0, false
}

// end reports whether only white space is left.
func (p *headerScanner) end() bool {
	p.space()
	return p.i == len(p.s)
}
