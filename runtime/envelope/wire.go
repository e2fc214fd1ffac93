package envelope

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"
	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/protoevents/protoevents/runtime/eventsv1"
)

// Kafka header names. They follow the CloudEvents Kafka protocol binding
// (ce_ prefix, lower-case attribute names) so CloudEvents-aware tools can
// read our events without knowing protoevents.
const (
	HeaderSpecVersion   = "ce_specversion"
	HeaderID            = "ce_id"
	HeaderType          = "ce_type"
	HeaderSource        = "ce_source"
	HeaderTime          = "ce_time"
	HeaderSchemaVersion = "ce_schemaversion"
	HeaderCorrelationID = "ce_correlationid"
	HeaderCausationID   = "ce_causationid"
	HeaderTraceParent   = "traceparent"
	HeaderContentType   = "content-type"
)

// SpecVersion is the CloudEvents version every envelope declares in its
// ce_specversion header.
const SpecVersion = "1.0"

// jsonEnvelope is the JSON wire form.
type jsonEnvelope struct {
	EventID       string          `json:"event_id"`
	EventType     string          `json:"event_type"`
	SchemaVersion uint32          `json:"schema_version"`
	OccurredAt    time.Time       `json:"occurred_at"`
	Producer      string          `json:"producer"`
	CorrelationID string          `json:"correlation_id,omitempty"`
	CausationID   string          `json:"causation_id,omitempty"`
	TraceParent   string          `json:"trace_parent,omitempty"`
	Payload       json.RawMessage `json:"payload"`
}

// Encode returns the Kafka message value and headers of the envelope. The
// key is not part of the value: it travels as the Kafka message key.
func (e *Envelope) Encode() ([]byte, []kafka.Header, error) {
	// The event ID and the time go in both the value and the headers:
	// format each once.
	id, at := e.stamp()
	var value []byte
	var err error
	switch e.Format {
	case FormatJSON:
		value, err = e.encodeJSON(id, at)
	case FormatProto:
		value, err = payloadProto.Marshal(&eventsv1.Envelope{
			EventId:       id,
			EventType:     e.Type,
			SchemaVersion: e.SchemaVersion,
			OccurredAt:    timestamppb.New(e.OccurredAt),
			Producer:      e.Producer,
			CorrelationId: e.CorrelationID,
			CausationId:   e.CausationID,
			TraceParent:   e.TraceParent,
			Payload:       e.Payload,
		})
	case FormatCloudEventsJSON, FormatCloudEventsProto:
		// Binary content mode: the headers carry the metadata.
		value = e.Payload
	default:
		err = fmt.Errorf("unknown format %v", e.Format)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("envelope: encode %s %s: %w", e.Type, id, err)
	}
	return value, e.headers(id, at), nil
}

// Headers returns the metadata as Kafka headers.
func (e *Envelope) Headers() []kafka.Header {
	return e.headers(e.stamp())
}

// stamp returns the event ID and the time (UTC, RFC 3339 with
// nanoseconds) as the value and the headers write them.
func (e *Envelope) stamp() (id string, at []byte) {
	return e.EventID.String(), e.OccurredAt.UTC().AppendFormat(make([]byte, 0, len(time.RFC3339Nano)), time.RFC3339Nano)
}

// headers returns the metadata as Kafka headers, given the event ID and
// time already formatted. The values share one allocation; each is capped
// at its own length, so appending to one cannot overwrite the next.
func (e *Envelope) headers(id string, at []byte) []kafka.Header {
	contentType := e.Format.ContentType()
	n := len(SpecVersion) + len(id) + len(e.Type) + len(e.Producer) + len(at) + 10 + len(contentType) +
		len(e.CorrelationID) + len(e.CausationID) + len(e.TraceParent)
	buf := make([]byte, 0, n)
	str := func(v string) []byte { return appendCapped(&buf, v) }
	h := make([]kafka.Header, 7, 10)
	h[0] = kafka.Header{Key: HeaderSpecVersion, Value: str(SpecVersion)}
	h[1] = kafka.Header{Key: HeaderID, Value: str(id)}
	h[2] = kafka.Header{Key: HeaderType, Value: str(e.Type)}
	h[3] = kafka.Header{Key: HeaderSource, Value: str(e.Producer)}
	h[4] = kafka.Header{Key: HeaderTime, Value: appendCapped(&buf, at)}
	var version [10]byte
	h[5] = kafka.Header{Key: HeaderSchemaVersion, Value: appendCapped(&buf, strconv.AppendUint(version[:0], uint64(e.SchemaVersion), 10))}
	h[6] = kafka.Header{Key: HeaderContentType, Value: str(contentType)}
	if e.CorrelationID != "" {
		h = append(h, kafka.Header{Key: HeaderCorrelationID, Value: str(e.CorrelationID)})
	}
	if e.CausationID != "" {
		h = append(h, kafka.Header{Key: HeaderCausationID, Value: str(e.CausationID)})
	}
	if e.TraceParent != "" {
		h = append(h, kafka.Header{Key: HeaderTraceParent, Value: str(e.TraceParent)})
	}
	return h
}

// appendCapped appends v to *buf and returns the appended bytes, capped at
// their length.
func appendCapped[T string | []byte](buf *[]byte, v T) []byte {
	start := len(*buf)
	*buf = append(*buf, v...)
	return (*buf)[start:len(*buf):len(*buf)]
}

// Decode parses a Kafka message into an envelope. The wire form is taken
// from the content-type header, or sniffed when it is absent. A message
// that is not a valid envelope yields a *DecodeError (errors.Is
// ErrMalformed): retrying it cannot help.
func Decode(m kafka.Message) (*Envelope, error) {
	format, err := formatOf(m)
	if err != nil {
		return nil, err
	}
	env := &Envelope{Format: format}
	env.Key = m.Key
	switch format {
	case FormatCloudEventsJSON, FormatCloudEventsProto:
		if err := env.readHeaders(m); err != nil {
			return nil, err
		}
		env.Payload = m.Value
	case FormatJSON:
		var j jsonEnvelope
		dec := json.NewDecoder(bytes.NewReader(m.Value))
		if err := dec.Decode(&j); err != nil {
			return nil, &DecodeError{Reason: "value is not a JSON envelope", Err: err}
		}
		if len(j.Payload) == 0 || string(j.Payload) == "null" {
			return nil, &DecodeError{Reason: "payload is missing"}
		}
		env.Type, env.SchemaVersion, env.OccurredAt = j.EventType, j.SchemaVersion, j.OccurredAt
		env.Producer, env.CorrelationID, env.CausationID, env.TraceParent = j.Producer, j.CorrelationID, j.CausationID, j.TraceParent
		env.Payload = []byte(j.Payload)
		if env.EventID, err = parseID(j.EventID); err != nil {
			return nil, err
		}
	case FormatProto:
		var p eventsv1.Envelope
		if err := proto.Unmarshal(m.Value, &p); err != nil {
			return nil, &DecodeError{Reason: notProtoReason(m), Err: err}
		}
		if _, typed := Header(m, HeaderContentType); !typed && p.GetEventType() == "" && utf8.Valid(m.Value) {
			// Text that happens to parse as Protobuf unknown fields.
			return nil, &DecodeError{Reason: notProtoReason(m)}
		}
		env.Type, env.SchemaVersion = p.GetEventType(), p.GetSchemaVersion()
		if p.OccurredAt != nil {
			if err := p.OccurredAt.CheckValid(); err != nil {
				return nil, &DecodeError{Reason: "occurred_at is invalid", Err: err}
			}
			env.OccurredAt = p.OccurredAt.AsTime()
		}
		env.Producer, env.CorrelationID, env.CausationID, env.TraceParent = p.GetProducer(), p.GetCorrelationId(), p.GetCausationId(), p.GetTraceParent()
		env.Payload = p.GetPayload()
		if env.EventID, err = parseID(p.GetEventId()); err != nil {
			return nil, err
		}
	}
	switch {
	case env.Type == "":
		return nil, &DecodeError{Reason: "event_type is missing"}
	case env.SchemaVersion == 0:
		return nil, &DecodeError{Reason: "schema_version is missing"}
	case env.OccurredAt.IsZero():
		return nil, &DecodeError{Reason: "occurred_at is missing"}
	}
	env.OccurredAt = env.OccurredAt.UTC()
	return env, nil
}

func parseID(s string) (ulid.ULID, error) {
	if s == "" {
		return ulid.ULID{}, &DecodeError{Reason: "event_id is missing"}
	}
	id, err := ulid.ParseStrict(s)
	if err != nil {
		return ulid.ULID{}, &DecodeError{Reason: fmt.Sprintf("event_id %q is not a ULID", s), Err: err}
	}
	return id, nil
}

// readHeaders fills the metadata from the ce_* headers of a message in
// CloudEvents binary content mode.
func (e *Envelope) readHeaders(m kafka.Message) error {
	var err error
	id, _ := Header(m, HeaderID)
	if e.EventID, err = parseID(id); err != nil {
		return err
	}
	e.Type, _ = Header(m, HeaderType)
	if v, ok := Header(m, HeaderSchemaVersion); ok {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return &DecodeError{Reason: fmt.Sprintf("header %s %q is not a version number", HeaderSchemaVersion, v), Err: err}
		}
		e.SchemaVersion = uint32(n)
	}
	if v, ok := Header(m, HeaderTime); ok {
		if e.OccurredAt, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return &DecodeError{Reason: fmt.Sprintf("header %s %q is not an RFC 3339 time", HeaderTime, v), Err: err}
		}
	}
	e.Producer, _ = Header(m, HeaderSource)
	e.CorrelationID, _ = Header(m, HeaderCorrelationID)
	e.CausationID, _ = Header(m, HeaderCausationID)
	e.TraceParent, _ = Header(m, HeaderTraceParent)
	return nil
}

// formatOf reads the content-type header, or sniffs the value: a JSON
// envelope is an object, a Protobuf one never starts with '{' (0x7b would be
// field 15, wire type 3, which events.v1.Envelope does not have). A message
// with a ce_specversion header and a content-type that is not an envelope's
// is in CloudEvents binary content mode: its value is the payload alone.
func formatOf(m kafka.Message) (Format, error) {
	_, ceBinary := Header(m, HeaderSpecVersion)
	for _, h := range m.Headers {
		if h.Key != HeaderContentType {
			continue
		}
		switch ct := string(h.Value); {
		case ct == ContentTypeJSON, ct == "application/cloudevents+json", ct == ContentTypePayloadJSON && !ceBinary:
			return FormatJSON, nil
		case ct == ContentTypeProto, (ct == ContentTypePayloadProto || ct == "application/x-protobuf") && !ceBinary:
			return FormatProto, nil
		case ct == ContentTypePayloadJSON:
			return FormatCloudEventsJSON, nil
		case ct == ContentTypePayloadProto, ct == "application/x-protobuf":
			return FormatCloudEventsProto, nil
		default:
			return 0, &DecodeError{Reason: fmt.Sprintf("unsupported content-type %q", h.Value)}
		}
	}
	if len(m.Value) == 0 {
		return 0, &DecodeError{Reason: "value is empty"}
	}
	if bytes.HasPrefix(bytes.TrimLeft(m.Value, " \t\r\n"), []byte("{")) {
		return FormatJSON, nil
	}
	return FormatProto, nil
}

// Header returns the value of the named header of m, and whether it exists.
func Header(m kafka.Message, key string) (string, bool) {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// notProtoReason explains a value that failed to parse as a Protobuf
// envelope. Without a content-type header the format was only sniffed, so
// a value that is not a JSON object either (plain text, a JSON array or
// string) is reported as such rather than as bad Protobuf.
func notProtoReason(m kafka.Message) string {
	if _, ok := Header(m, HeaderContentType); ok {
		return "value is not a Protobuf envelope (content-type " + ContentTypeProto + ")"
	}
	head := m.Value
	if len(head) > 32 {
		head = head[:32]
	}
	if utf8.Valid(head) {
		return fmt.Sprintf("value is not an envelope: it has no content-type header and is neither a JSON object nor Protobuf (it starts %q)", head)
	}
	return "value is not an envelope: it has no content-type header, is not a JSON object and does not parse as a Protobuf envelope"
}
