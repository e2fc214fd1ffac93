package outbox

import (
	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/envelope"
)

// An envelope's first three headers — ce_specversion (always
// envelope.SpecVersion), ce_id and ce_type — repeat what the row holds
// anyway: a constant, and its event_id and event_type columns. For the
// envelope formats (JSON and Protobuf, whose value carries all the
// metadata) the row leaves them out, and the relay puts them back from the
// columns before it publishes: the record on Kafka is the same, the row a
// seventh smaller and cheaper to write (docs/design.md, "The producer's
// encoding"). The CloudEvents binary formats keep every header in the row:
// there the headers are the only metadata, and a relay of an earlier
// version, which sends the stored headers as they are, must not publish
// them without it.

// storedHeaders returns what the outbox row keeps of an event's headers,
// hs as envelope.Encode returns them in format f.
func storedHeaders(hs []kafka.Header, f envelope.Format) []kafka.Header {
	if f != envelope.FormatJSON && f != envelope.FormatProto {
		return hs
	}
	if len(hs) < 3 || hs[0].Key != envelope.HeaderSpecVersion || string(hs[0].Value) != envelope.SpecVersion ||
		hs[1].Key != envelope.HeaderID || hs[2].Key != envelope.HeaderType {
		return hs
	}
	return hs[3:]
}

// publishedHeaders returns the headers the relay sends for a row: hs, the
// stored ones, with ce_specversion, ce_id and ce_type put back in front
// when storedHeaders left them out. A row is completed only when its
// headers name an envelope format and hold no ce_id, and only with the
// ones it lacks: rows of earlier versions, of the CloudEvents formats and
// of hand-written SQL with a ce_id or another content type go out as they
// are.
func publishedHeaders(hs []kafka.Header, eventID, eventType string) []kafka.Header {
	envelopeFormat, hasVersion, hasType := false, false, false
	for _, h := range hs {
		switch h.Key {
		case envelope.HeaderID:
			return hs
		case envelope.HeaderSpecVersion:
			hasVersion = true
		case envelope.HeaderType:
			hasType = true
		case envelope.HeaderContentType:
			ct := string(h.Value)
			envelopeFormat = ct == envelope.ContentTypeJSON || ct == envelope.ContentTypeProto
		}
	}
	if !envelopeFormat {
		return hs
	}
	// One allocation for the values put back, one for the list.
	buf := make([]byte, 0, len(envelope.SpecVersion)+len(eventID)+len(eventType))
	value := func(s string) []byte {
		start := len(buf)
		buf = append(buf, s...)
		return buf[start:len(buf):len(buf)]
	}
	out := make([]kafka.Header, 0, len(hs)+3)
	if !hasVersion {
		out = append(out, kafka.Header{Key: envelope.HeaderSpecVersion, Value: value(envelope.SpecVersion)})
	}
	out = append(out, kafka.Header{Key: envelope.HeaderID, Value: value(eventID)})
	if !hasType {
		out = append(out, kafka.Header{Key: envelope.HeaderType, Value: value(eventType)})
	}
	return append(out, hs...)
}
