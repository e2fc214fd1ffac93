package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
)

// Headers the consumer adds to a message it dead-letters, beside the
// message's own key, value and headers. Times are RFC 3339 with
// nanoseconds, numbers decimal. Redrive strips every header starting with
// HeaderDLQPrefix and adds HeaderRedrivenFrom and HeaderRedriveFor.
const (
	// HeaderDLQPrefix starts every DLQ header.
	HeaderDLQPrefix = "dlq_"
	// HeaderDLQError is the last error, truncated (a panic includes its stack).
	HeaderDLQError = "dlq_error"
	// HeaderDLQAttempts is how often the message was tried.
	HeaderDLQAttempts = "dlq_attempts"
	// HeaderDLQOriginalTopic, -Partition and -Offset locate the original.
	HeaderDLQOriginalTopic     = "dlq_original_topic"
	HeaderDLQOriginalPartition = "dlq_original_partition"
	HeaderDLQOriginalOffset    = "dlq_original_offset"
	// HeaderDLQConsumer is the name of the consumer that gave up.
	HeaderDLQConsumer = "dlq_consumer"
	// HeaderDLQFirstFailure and HeaderDLQLastFailure bracket the failures.
	HeaderDLQFirstFailure = "dlq_first_failure"
	HeaderDLQLastFailure  = "dlq_last_failure"
	// HeaderDLQValueDropped, set to the original value's size in bytes,
	// marks an entry whose value was too large for the DLQ topic: it
	// carries the headers and key only, and the original stays at
	// dlq_original_topic/partition/offset for as long as that topic keeps
	// it. Redrive refuses such entries.
	HeaderDLQValueDropped = "dlq_value_dropped"
	// HeaderRedrivenFrom, on a redriven message, says where in the DLQ it
	// came from: "<dlq topic>/<partition>/<offset>".
	HeaderRedrivenFrom = "redriven_from"
	// HeaderRedriveFor, on a redriven message, names the consumer it is
	// meant for: the one that dead-lettered it. Other consumers of the topic
	// skip it, since they applied the event when it first came by and their
	// dedup rows may have been pruned since.
	HeaderRedriveFor = "redrive_for"
)

// deadLetter publishes m to the DLQ topic, retrying until it succeeds or
// ctx ends (a message is never dropped), then commits its offset and fires
// the DeadLettered hook.
func (p *partition) deadLetter(ctx context.Context, m kafka.Message, env *envelope.Envelope, d events.Delivery, cause error, first, last time.Time) error {
	c := p.c
	dlq := p.r.dlq
	msg := kafka.Message{
		Topic: dlq,
		Key:   m.Key,
		Value: m.Value,
		Headers: append(originalHeaders(m.Headers),
			kafka.Header{Key: HeaderDLQError, Value: []byte(truncate(cause.Error(), c.s.maxErrorBytes))},
			kafka.Header{Key: HeaderDLQAttempts, Value: []byte(strconv.Itoa(d.Attempt))},
			kafka.Header{Key: HeaderDLQOriginalTopic, Value: []byte(m.Topic)},
			kafka.Header{Key: HeaderDLQOriginalPartition, Value: []byte(strconv.Itoa(m.Partition))},
			kafka.Header{Key: HeaderDLQOriginalOffset, Value: []byte(strconv.FormatInt(m.Offset, 10))},
			kafka.Header{Key: HeaderDLQConsumer, Value: []byte(c.name)},
			kafka.Header{Key: HeaderDLQFirstFailure, Value: []byte(first.UTC().Format(time.RFC3339Nano))},
			kafka.Header{Key: HeaderDLQLastFailure, Value: []byte(last.UTC().Format(time.RFC3339Nano))},
		),
	}
	for try := 1; ; try++ {
		err := c.writer.WriteMessages(ctx, msg)
		if err == nil {
			break
		}
		if tooLarge(err) && msg.Value != nil {
			// The DLQ topic refuses the message (the dlq_* headers made it
			// larger, or the topic's limit is lower than the original's):
			// dead-letter its headers and key, and point at the original.
			p.log.Error("consumer: message too large for the DLQ, dead-lettering it without its value", "dlq", dlq, "offset", m.Offset, "bytes", len(m.Value))
			msg.Headers = append(msg.Headers, kafka.Header{Key: HeaderDLQValueDropped, Value: []byte(strconv.Itoa(len(m.Value)))})
			msg.Value = nil
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if p.soft.Err() != nil {
			return p.soft.Err() // shutting down: redelivered later
		}
		wait := c.backoff(try)
		p.log.Error("consumer: publish to DLQ failed, retrying; the offset stays uncommitted", "dlq", dlq, "offset", m.Offset, "err", err, "backoff", wait)
		if err := sleep(p.soft, wait); err != nil {
			return err
		}
	}
	if err := p.done(m); err != nil {
		return err
	}
	if err := p.flush(); err != nil {
		return err
	}
	dl := DeadLetter{Consumer: c.name, Original: d, Err: cause, FirstFailure: first, LastFailure: last, DLQTopic: dlq}
	if env != nil {
		dl.EventID, dl.EventType = env.EventID.String(), env.Type
	}
	p.log.Warn("consumer: message dead-lettered", "offset", m.Offset, "event_id", dl.EventID, "attempts", d.Attempt, "dlq", dlq, "err", cause)
	if c.s.hooks.DeadLettered != nil {
		c.s.hooks.DeadLettered(dl)
	}
	return nil
}

// originalHeaders returns a copy of hs without DLQ and redrive headers.
func originalHeaders(hs []kafka.Header) []kafka.Header {
	out := make([]kafka.Header, 0, len(hs)+9)
	for _, h := range hs {
		if strings.HasPrefix(h.Key, HeaderDLQPrefix) || h.Key == HeaderRedrivenFrom || h.Key == HeaderRedriveFor {
			continue
		}
		out = append(out, h)
	}
	return out
}

// DLQEntry is one message in a DLQ topic, as ListDLQ reads it.
type DLQEntry struct {
	// Partition and Offset locate the entry in the DLQ topic.
	Partition int
	Offset    int64
	// Time is when the entry was written to the DLQ.
	Time time.Time
	// EventID and EventType come from the envelope (or, when it does not
	// decode, from the ce_id and ce_type headers); empty if neither exists.
	EventID   string
	EventType string
	// Key is the message key.
	Key []byte
	// Error, Attempts, Consumer, FirstFailure and LastFailure come from the
	// dlq_* headers.
	Error        string
	Attempts     int
	Consumer     string
	FirstFailure time.Time
	LastFailure  time.Time
	// OriginalTopic, OriginalPartition and OriginalOffset locate the
	// message the consumer gave up on; Redrive publishes to OriginalTopic.
	OriginalTopic     string
	OriginalPartition int
	OriginalOffset    int64
	// RedrivenFrom is set when the failed message had itself been redriven.
	RedrivenFrom string
	// ValueDropped is the size of the original value when it was too large
	// for the DLQ and left out (HeaderDLQValueDropped); 0 otherwise.
	ValueDropped int
	// Message is the DLQ message as read.
	Message kafka.Message
}

// DLQOption changes how ListDLQ and Redrive reach Kafka.
type DLQOption func(*dlqSettings)

type dlqSettings struct {
	dialer  *kafka.Dialer
	maxWait time.Duration
}

// WithDLQDialer sets the dialer (TLS, SASL, timeouts) ListDLQ and Redrive
// use; default kafka.DefaultDialer.
func WithDLQDialer(d *kafka.Dialer) DLQOption {
	return func(s *dlqSettings) {
		if d != nil {
			s.dialer = d
		}
	}
}

func dlqSettingsFrom(opts []DLQOption) dlqSettings {
	s := dlqSettings{dialer: kafka.DefaultDialer, maxWait: 100 * time.Millisecond}
	for _, o := range opts {
		if o != nil {
			o(&s)
		}
	}
	return s
}

// ListDLQ reads every message of a DLQ topic, from the start of each
// partition up to its high watermark as of the call, without a consumer
// group (it commits nothing and moves no one's offsets). Entries come
// ordered by partition, then offset.
func ListDLQ(ctx context.Context, brokers []string, dlqTopic string, opts ...DLQOption) ([]DLQEntry, error) {
	s := dlqSettingsFrom(opts)
	if len(brokers) == 0 {
		return nil, errors.New("consumer: list DLQ: no brokers")
	}
	parts, err := partitionsOf(ctx, s, brokers, dlqTopic)
	if err != nil {
		return nil, fmt.Errorf("consumer: list DLQ %s: %w", dlqTopic, err)
	}
	slices.SortFunc(parts, func(a, b kafka.Partition) int { return a.ID - b.ID })
	var out []DLQEntry
	for _, part := range parts {
		first, last, err := partitionBounds(ctx, s.dialer, brokers[0], dlqTopic, part.ID)
		if err != nil {
			return nil, err
		}
		if first >= last {
			continue
		}
		got, err := readRange(ctx, s, brokers, dlqTopic, part.ID, first, last)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

// ErrNoTopic reports a topic the cluster does not have.
var ErrNoTopic = errors.New("no such topic")

// partitionsOf returns the partitions of topic without ever creating it
// (a metadata request that does not allow auto-creation), so a mistyped DLQ
// name is an error rather than a new, empty topic.
func partitionsOf(ctx context.Context, s dlqSettings, brokers []string, topic string) ([]kafka.Partition, error) {
	transport := transportFor(s.dialer)
	defer transport.CloseIdleConnections()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: transport, Timeout: 30 * time.Second}
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	for _, t := range md.Topics {
		if t.Name != topic {
			continue
		}
		if errors.Is(t.Error, kafka.UnknownTopicOrPartition) {
			return nil, ErrNoTopic
		}
		if t.Error != nil {
			return nil, fmt.Errorf("metadata: %w", t.Error)
		}
		return t.Partitions, nil
	}
	return nil, ErrNoTopic
}

// partitionBounds returns the first and the high-watermark offset.
func partitionBounds(ctx context.Context, dialer *kafka.Dialer, broker, topic string, partition int) (first, last int64, err error) {
	conn, err := dialer.DialLeader(ctx, "tcp", broker, topic, partition)
	if err != nil {
		return 0, 0, fmt.Errorf("consumer: DLQ %s/%d: dial leader: %w", topic, partition, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	first, last, err = conn.ReadOffsets()
	if err != nil {
		return 0, 0, fmt.Errorf("consumer: DLQ %s/%d: read offsets: %w", topic, partition, err)
	}
	return first, last, nil
}

// readRange reads offsets [first, last) of one partition.
func readRange(ctx context.Context, s dlqSettings, brokers []string, topic string, partition int, first, last int64) ([]DLQEntry, error) {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: partition, Dialer: s.dialer, MinBytes: 1, MaxBytes: 10 << 20, MaxWait: s.maxWait})
	defer r.Close()
	if err := r.SetOffset(first); err != nil {
		return nil, fmt.Errorf("consumer: DLQ %s/%d: %w", topic, partition, err)
	}
	var out []DLQEntry
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return nil, fmt.Errorf("consumer: DLQ %s/%d: read at %d: %w", topic, partition, first, err)
		}
		out = append(out, parseEntry(m))
		if m.Offset >= last-1 {
			return out, nil
		}
	}
}

// parseEntry reads a DLQ message's headers and envelope.
func parseEntry(m kafka.Message) DLQEntry {
	e := DLQEntry{Partition: m.Partition, Offset: m.Offset, Time: m.Time, Key: m.Key, Message: m}
	if env, err := envelope.Decode(m); err == nil {
		e.EventID, e.EventType = env.EventID.String(), env.Type
	} else {
		e.EventID, _ = envelope.Header(m, envelope.HeaderID)
		e.EventType, _ = envelope.Header(m, envelope.HeaderType)
	}
	hdr := func(k string) string { v, _ := envelope.Header(m, k); return v }
	e.Error = hdr(HeaderDLQError)
	e.Attempts, _ = strconv.Atoi(hdr(HeaderDLQAttempts))
	e.Consumer = hdr(HeaderDLQConsumer)
	e.FirstFailure, _ = time.Parse(time.RFC3339Nano, hdr(HeaderDLQFirstFailure))
	e.LastFailure, _ = time.Parse(time.RFC3339Nano, hdr(HeaderDLQLastFailure))
	e.OriginalTopic = hdr(HeaderDLQOriginalTopic)
	e.OriginalPartition, _ = strconv.Atoi(hdr(HeaderDLQOriginalPartition))
	e.OriginalOffset, _ = strconv.ParseInt(hdr(HeaderDLQOriginalOffset), 10, 64)
	e.RedrivenFrom = hdr(HeaderRedrivenFrom)
	e.ValueDropped, _ = strconv.Atoi(hdr(HeaderDLQValueDropped))
	return e
}

// Selector picks the DLQ entries Redrive republishes.
type Selector func(DLQEntry) bool

// SelectAll selects every entry.
func SelectAll() Selector { return func(DLQEntry) bool { return true } }

// SelectOffsets selects the entries at the given offsets of one DLQ
// partition (a DLQ with one partition: partition 0).
func SelectOffsets(partition int, offsets ...int64) Selector {
	return func(e DLQEntry) bool { return e.Partition == partition && slices.Contains(offsets, e.Offset) }
}

// SelectEventIDs selects the entries whose event ID is one of ids.
func SelectEventIDs(ids ...string) Selector {
	return func(e DLQEntry) bool { return e.EventID != "" && slices.Contains(ids, e.EventID) }
}

// Redrive republishes the selected entries of a DLQ topic to their original
// topics: the original key, value and headers (dlq_* headers stripped) plus
// a redriven_from header and a redrive_for header naming the consumer that
// dead-lettered the entry, to the original partition when it still exists.
// Only that consumer handles the message; the topic's other consumers skip
// it. The event ID is unchanged, so if that consumer did apply the event in
// the meantime it skips it too. The DLQ itself is left as it is (it is a log); redriving an entry
// twice is harmless for the same reason. It returns the entries redriven.
func Redrive(ctx context.Context, brokers []string, dlqTopic string, sel Selector, opts ...DLQOption) ([]DLQEntry, error) {
	if sel == nil {
		return nil, errors.New("consumer: redrive: nil selector (use SelectAll to redrive everything)")
	}
	s := dlqSettingsFrom(opts)
	entries, err := ListDLQ(ctx, brokers, dlqTopic, opts...)
	if err != nil {
		return nil, err
	}
	var picked []DLQEntry
	var msgs []kafka.Message
	for _, e := range entries {
		if !sel(e) {
			continue
		}
		if e.OriginalTopic == "" {
			return nil, fmt.Errorf("consumer: redrive: %s/%d/%d has no %s header", dlqTopic, e.Partition, e.Offset, HeaderDLQOriginalTopic)
		}
		if e.ValueDropped > 0 {
			return nil, fmt.Errorf("consumer: redrive: %s/%d/%d lost its %d-byte value (too large for the DLQ); the original is at %s/%d/%d: republish it from there",
				dlqTopic, e.Partition, e.Offset, e.ValueDropped, e.OriginalTopic, e.OriginalPartition, e.OriginalOffset)
		}
		picked = append(picked, e)
		msgs = append(msgs, kafka.Message{
			Topic:     e.OriginalTopic,
			Partition: e.OriginalPartition,
			Key:       e.Message.Key,
			Value:     e.Message.Value,
			Headers:   append(originalHeaders(e.Message.Headers), redriveHeaders(dlqTopic, e)...),
		})
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	transport := transportFor(s.dialer)
	defer transport.CloseIdleConnections()
	w := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Balancer:     originalPartition{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond,
		Transport:    transport,
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("consumer: redrive from %s: %w", dlqTopic, err)
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("consumer: redrive from %s: close writer: %w", dlqTopic, err)
	}
	return picked, nil
}

// redriveHeaders are the headers Redrive adds: where the message comes
// from and, when the DLQ entry names it, the consumer it is meant for.
func redriveHeaders(dlqTopic string, e DLQEntry) []kafka.Header {
	h := []kafka.Header{{Key: HeaderRedrivenFrom, Value: fmt.Appendf(nil, "%s/%d/%d", dlqTopic, e.Partition, e.Offset)}}
	if e.Consumer != "" {
		h = append(h, kafka.Header{Key: HeaderRedriveFor, Value: []byte(e.Consumer)})
	}
	return h
}

// tooLarge reports whether a produce failed because the message exceeds a
// size limit, the client's or the broker's.
func tooLarge(err error) bool {
	var we kafka.WriteErrors
	if errors.As(err, &we) {
		for _, e := range we {
			if e != nil && tooLarge(e) {
				return true
			}
		}
		return false
	}
	var mtl kafka.MessageTooLargeError
	return errors.Is(err, kafka.MessageSizeTooLarge) || errors.As(err, &mtl)
}

// originalPartition sends a redriven message back to its original
// partition, which keeps it with the other events of its key; should the
// topic have shrunk, it falls back to hashing the key.
type originalPartition struct{}

func (originalPartition) Balance(m kafka.Message, partitions ...int) int {
	if slices.Contains(partitions, m.Partition) {
		return m.Partition
	}
	return (&kafka.Hash{}).Balance(m, partitions...)
}

// transportFor gives a Writer the connection settings of a Dialer.
func transportFor(d *kafka.Dialer) *kafka.Transport {
	return &kafka.Transport{Dial: d.DialFunc, SASL: d.SASLMechanism, TLS: d.TLS, ClientID: d.ClientID}
}
