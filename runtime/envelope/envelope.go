// Package envelope is the wire form of an event on Kafka: the metadata
// (ULID event ID, type, schema version, time, producer, correlation and
// causation IDs) wrapped around the payload, encoded as JSON (the default,
// payload via protojson) or binary Protobuf, with the metadata mirrored in
// CloudEvents Kafka-binding headers (ce_*).
//
// The CloudEvents formats (FormatCloudEventsJSON, FormatCloudEventsProto)
// drop the wrapper: the value is the payload alone and the metadata travels
// only in the headers, which is CloudEvents' binary content mode. Decode
// reads all four, so producers can switch format while consumers run.
package envelope

import (
	"errors"
	"fmt"
	"time"

	"github.com/oklog/ulid/v2"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/payloadjson"
)

// Format selects the wire form of envelopes.
type Format int

const (
	// FormatJSON encodes the envelope as JSON with the payload as protojson:
	// readable by any consumer, tolerant of added fields. The default.
	FormatJSON Format = iota
	// FormatProto encodes the envelope as binary Protobuf (events.v1.Envelope).
	FormatProto
	// FormatCloudEventsJSON is CloudEvents' binary content mode with a JSON
	// payload: the value is the payload alone (protojson), the metadata is
	// in the ce_* headers only, content-type application/json. Smaller
	// records; any CloudEvents Kafka consumer reads them.
	FormatCloudEventsJSON
	// FormatCloudEventsProto is CloudEvents' binary content mode with a
	// binary Protobuf payload (content-type application/protobuf).
	FormatCloudEventsProto
)

// Formats lists every wire format, in the order of their values.
var Formats = []Format{FormatJSON, FormatProto, FormatCloudEventsJSON, FormatCloudEventsProto}

// Valid tells whether f is one of the formats above.
func (f Format) Valid() bool { return f >= FormatJSON && f <= FormatCloudEventsProto }

// payloadIsJSON tells whether the payload is protojson (else binary
// Protobuf).
func (f Format) payloadIsJSON() bool { return f == FormatJSON || f == FormatCloudEventsJSON }

// cloudEventsBinary tells whether the value is the payload alone, the
// metadata living in the headers.
func (f Format) cloudEventsBinary() bool {
	return f == FormatCloudEventsJSON || f == FormatCloudEventsProto
}

// String returns the format's name as used in flags and configuration.
func (f Format) String() string {
	switch f {
	case FormatJSON:
		return "json"
	case FormatProto:
		return "proto"
	case FormatCloudEventsJSON:
		return "ce-json"
	case FormatCloudEventsProto:
		return "ce-proto"
	default:
		return fmt.Sprintf("Format(%d)", int(f))
	}
}

// ParseFormat parses "json", "proto", "ce-json" or "ce-proto".
func ParseFormat(s string) (Format, error) {
	switch s {
	case "json", "":
		return FormatJSON, nil
	case "proto", "protobuf":
		return FormatProto, nil
	case "ce-json":
		return FormatCloudEventsJSON, nil
	case "ce-proto", "ce-protobuf":
		return FormatCloudEventsProto, nil
	}
	return 0, fmt.Errorf("envelope: unknown format %q (want json, proto, ce-json or ce-proto)", s)
}

// ContentType returns the media type recorded in the content-type header.
func (f Format) ContentType() string {
	switch f {
	case FormatProto:
		return ContentTypeProto
	case FormatCloudEventsJSON:
		return ContentTypePayloadJSON
	case FormatCloudEventsProto:
		return ContentTypePayloadProto
	}
	return ContentTypeJSON
}

// Media types of the wire forms: the two envelopes, and the payloads alone
// (CloudEvents binary content mode, where content-type is the data's type).
const (
	ContentTypeJSON         = "application/vnd.protoevents.envelope+json"
	ContentTypeProto        = "application/vnd.protoevents.envelope+protobuf"
	ContentTypePayloadJSON  = "application/json"
	ContentTypePayloadProto = "application/protobuf"
)

// Envelope is one event occurrence as it travels: metadata plus payload.
type Envelope struct {
	events.Metadata
	// Format is the wire form the envelope was (or will be) encoded in.
	Format Format
	// Payload holds the encoded event message: protojson text for
	// FormatJSON, binary Protobuf for FormatProto.
	Payload []byte
	// compact is the payload New encoded as compact JSON: while Payload is
	// still that slice, Encode copies it without reading it again.
	compact []byte
}

// NewEventID returns a fresh ULID. IDs are strictly increasing within a
// process, even within one millisecond.
func NewEventID() events.EventID { return ulid.Make() }

// Options set how New fills in defaults.
type Options struct {
	// Format is the wire form of the payload.
	Format Format
	// Producer is the producer name used when the publish options name none
	// and the event descriptor has no default.
	Producer string
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

// New wraps ev in an envelope, applying the publish options and filling in
// a fresh event ID, the current time and the producer where they are unset.
func New(ev events.Event, po events.PublishOptions, o Options) (*Envelope, error) {
	d := ev.EventDescriptor()
	if d == nil {
		return nil, errors.New("envelope: event has no descriptor")
	}
	env := &Envelope{Format: o.Format}
	env.Metadata = events.Metadata{
		EventID:       po.EventID,
		Type:          d.Type,
		SchemaVersion: d.Version,
		OccurredAt:    po.OccurredAt,
		Producer:      po.Producer,
		Key:           ev.EventKey(),
		CorrelationID: po.CorrelationID,
		CausationID:   po.CausationID,
		TraceParent:   po.TraceParent,
	}
	if env.EventID == (events.EventID{}) {
		env.EventID = NewEventID()
	}
	if env.OccurredAt.IsZero() {
		now := time.Now
		if o.Now != nil {
			now = o.Now
		}
		env.OccurredAt = now()
	}
	env.OccurredAt = env.OccurredAt.UTC()
	if env.Producer == "" {
		env.Producer = o.Producer
	}
	if env.Producer == "" {
		env.Producer = d.Producer
	}
	var err error
	switch {
	case !o.Format.Valid():
		err = fmt.Errorf("unknown format %v", o.Format)
	case o.Format.payloadIsJSON():
		env.Payload, err = marshalJSON(ev)
		env.compact = env.Payload
	default:
		env.Payload, err = payloadProto.Marshal(ev)
	}
	if err != nil {
		return nil, fmt.Errorf("envelope: encode %s payload: %w", d.Type, err)
	}
	return env, nil
}

// Payload codecs: deterministic, so one event always encodes to the same
// bytes; JSON (payloadjson) uses the proto field names the compat rules
// protect and tolerates fields it does not know on the way in.
var (
	payloadProto    = proto.MarshalOptions{Deterministic: true}
	payloadJSONRead = protojson.UnmarshalOptions{DiscardUnknown: true}
)

// marshalJSON encodes the payload as compact protojson: through the
// encoder protoc-gen-events generated on the message when it has one,
// protojson itself otherwise (payloadjson.Append); the bytes are the same.
func marshalJSON(m proto.Message) ([]byte, error) {
	return payloadjson.Append(make([]byte, 0, payloadBuffer), m)
}

// payloadBuffer is the room marshalJSON starts with: most payloads fit, so
// the encoder appends without growing the buffer.
const payloadBuffer = 256

// UnmarshalPayload decodes the payload into dst, a message of the
// envelope's event type. Unknown fields (added by a newer producer) are
// ignored in JSON and kept in Protobuf.
func (e *Envelope) UnmarshalPayload(dst proto.Message) error {
	var err error
	switch {
	case !e.Format.Valid():
		err = fmt.Errorf("unknown format %v", e.Format)
	case e.Format.payloadIsJSON():
		err = payloadJSONRead.Unmarshal(e.Payload, dst)
	default:
		err = proto.Unmarshal(e.Payload, dst)
	}
	if err != nil {
		return &DecodeError{Reason: "payload of " + e.Type + " does not decode", Err: err}
	}
	return nil
}
