package envelope

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/protoevents/protoevents/runtime/internal/jsonstr"
)

// The JSON envelope is written by hand rather than by encoding/json: the
// producer encodes one per event inside the caller's business transaction,
// and reflection, the re-validation of the payload and the copies cost
// more than everything else in the encoding but protojson itself
// (docs/design.md, "The producer's encoding"). The bytes are exactly
// those json.Marshal gives for jsonEnvelope: TestJSONEnvelopeMatchesMarshal
// holds the two side by side.

// appendJSONEnvelope appends the JSON wire form of e, with id and at its
// event ID and time already formatted (the headers carry them too) and
// payload its payload as compact JSON.
func (e *Envelope) appendJSONEnvelope(b []byte, id string, at, payload []byte) []byte {
	b = append(b, `{"event_id":`...)
	b = appendJSONString(b, id)
	b = append(b, `,"event_type":`...)
	b = appendJSONString(b, e.Type)
	b = append(b, `,"schema_version":`...)
	b = strconv.AppendUint(b, uint64(e.SchemaVersion), 10)
	b = append(b, `,"occurred_at":"`...)
	b = append(b, at...)
	b = append(b, `","producer":`...)
	b = appendJSONString(b, e.Producer)
	if e.CorrelationID != "" {
		b = append(b, `,"correlation_id":`...)
		b = appendJSONString(b, e.CorrelationID)
	}
	if e.CausationID != "" {
		b = append(b, `,"causation_id":`...)
		b = appendJSONString(b, e.CausationID)
	}
	if e.TraceParent != "" {
		b = append(b, `,"trace_parent":`...)
		b = appendJSONString(b, e.TraceParent)
	}
	b = append(b, `,"payload":`...)
	if len(payload) == 0 {
		b = append(b, "null"...) // what json.Marshal writes for an empty RawMessage
	} else {
		b = appendHTMLEscaped(b, payload)
	}
	return append(b, '}')
}

// encodeJSON returns the JSON wire form of e, with id and at its event ID
// and time (RFC 3339, nanoseconds) already formatted. Like json.Marshal it
// refuses a time whose year RFC 3339 cannot write, and a payload that is
// not JSON; a payload New encoded is known to be compact JSON and is not
// read twice.
func (e *Envelope) encodeJSON(id string, at []byte) ([]byte, error) {
	if y := e.OccurredAt.UTC().Year(); y < 0 || y > 9999 {
		return nil, fmt.Errorf("occurred_at %v: year outside of range [0,9999]", e.OccurredAt)
	}
	payload := e.Payload
	if vouched := e.compact; len(payload) > 0 && (len(vouched) != len(payload) || &vouched[0] != &payload[0]) {
		var b bytes.Buffer
		if err := json.Compact(&b, payload); err != nil {
			return nil, fmt.Errorf("payload is not JSON: %w", err)
		}
		payload = b.Bytes()
	}
	n := 128 + len(id) + len(e.Type) + len(at) + len(e.Producer) + len(e.CorrelationID) + len(e.CausationID) + len(e.TraceParent) + len(payload)
	return e.appendJSONEnvelope(make([]byte, 0, n), id, at, payload), nil
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string the way encoding/json does
// (HTML-safe, invalid UTF-8 replaced by \ufffd).
func appendJSONString(b []byte, s string) []byte {
	b, _ = jsonstr.Append(b, s, jsonstr.Mode{HTML: true, Replace: true})
	return b
}

// appendHTMLEscaped appends src, compact JSON, with <, >, &, U+2028 and
// U+2029 escaped as json.Marshal escapes them in a json.RawMessage. They
// can only occur inside strings, where the escapes mean the same text.
func appendHTMLEscaped(b, src []byte) []byte {
	start := 0
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch {
		case c == '<' || c == '>' || c == '&':
			b = append(b, src[start:i]...)
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			start = i + 1
		case c == 0xE2 && i+2 < len(src) && src[i+1] == 0x80 && src[i+2]&^1 == 0xA8:
			b = append(b, src[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[src[i+2]&0xF])
			start = i + 3
			i += 2
		}
	}
	return append(b, src[start:]...)
}
