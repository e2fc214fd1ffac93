package envelope

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/protoevents/protoevents/runtime/events"
)

// trickyStrings are texts every JSON escape rule applies to.
var trickyStrings = []string{
	"", "plain", `quote " and backslash \`, "<script>&amp;</script>", "tab\tnewline\nreturn\rbell\afeed\fback\b",
	"\x00\x01\x1f\x7f", "line\u2028para\u2029end", "é ü 日本 🚀", "bad \xff utf8 \xc3", "\xe2\x80", "\xe2\x80\xa8",
	"ends with \\", "\u2027\u202a",
}

// randomString returns a short string of bytes drawn to hit the escapes:
// ASCII, control bytes, HTML characters, multi-byte runes and invalid bytes.
func randomString(r *rand.Rand) string {
	pieces := []string{"a", "Z", "0", " ", `"`, `\`, "<", ">", "&", "\n", "\x00", "\x1f", "\x7f", "é", "\u2028", "\u2029", "🚀", "\xff", "\xe2", "\x80", "\xa8"}
	var b strings.Builder
	for range r.IntN(12) {
		b.WriteString(pieces[r.IntN(len(pieces))])
	}
	return b.String()
}

// validString is randomString made valid UTF-8, as a Protobuf string must
// be.
func validString(r *rand.Rand) string { return strings.ToValidUTF8(randomString(r), "\uFFFD") }

func marshalString(t testing.TB, s string) string {
	t.Helper()
	want, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(want)
}

func TestJSONStringMatchesMarshal(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	inputs := append([]string(nil), trickyStrings...)
	for range 5000 {
		inputs = append(inputs, randomString(r))
	}
	for _, s := range inputs {
		if got, want := string(appendJSONString(nil, s)), marshalString(t, s); got != want {
			t.Fatalf("appendJSONString(%q) = %s, json.Marshal = %s", s, got, want)
		}
	}
}

func FuzzJSONString(f *testing.F) {
	for _, s := range trickyStrings {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := string(appendJSONString(nil, s)), marshalString(t, s); got != want {
			t.Fatalf("appendJSONString(%q) = %s, json.Marshal = %s", s, got, want)
		}
	})
}

// TestJSONEnvelopeMatchesMarshal holds the hand-written JSON envelope to
// what json.Marshal writes for the same jsonEnvelope, byte for byte, over
// payloads with every escape and metadata with and without the optional
// fields.
func TestJSONEnvelopeMatchesMarshal(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	at := time.Date(2026, 12, 3, 19, 0, 0, 120000000, time.UTC)
	check := func(t *testing.T, e *Envelope) {
		t.Helper()
		value, _, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(jsonEnvelope{
			EventID: e.EventID.String(), EventType: e.Type, SchemaVersion: e.SchemaVersion,
			OccurredAt: e.OccurredAt.UTC(), Producer: e.Producer, CorrelationID: e.CorrelationID,
			CausationID: e.CausationID, TraceParent: e.TraceParent, Payload: json.RawMessage(e.Payload),
		})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(value, want) {
			t.Fatalf("hand-written envelope differs from json.Marshal:\n got %s\nwant %s", value, want)
		}
	}
	for i := range 2000 {
		s, err := structpb.NewStruct(map[string]any{"text": validString(r), "n": float64(i), "list": []any{validString(r), true, nil}})
		if err != nil {
			t.Fatal(err)
		}
		ev := testEvent{s}
		po := events.PublishOptions{OccurredAt: at.Add(time.Duration(r.Int64N(int64(time.Hour))))}
		if i%2 == 0 {
			po.CorrelationID, po.CausationID, po.TraceParent = randomString(r), randomString(r), randomString(r)
		}
		if i%3 == 0 {
			po.Producer = randomString(r)
		}
		e, err := New(ev, po, Options{Format: FormatJSON})
		if err != nil {
			t.Fatal(err)
		}
		check(t, e)
	}
	t.Run("whole seconds and the first and last years", func(t *testing.T) {
		for _, at := range []time.Time{at.Truncate(time.Second), time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)} {
			check(t, &Envelope{Metadata: events.Metadata{EventID: NewEventID(), Type: "t", SchemaVersion: 1, OccurredAt: at}, Payload: []byte(`{}`)})
		}
	})
	t.Run("empty payload", func(t *testing.T) {
		check(t, &Envelope{Metadata: events.Metadata{EventID: NewEventID(), Type: "t", SchemaVersion: 1, OccurredAt: at}})
	})
}

// TestEncodeRefusesYearsRFC3339CannotWrite: as with json.Marshal, the JSON
// envelope refuses a year RFC 3339 cannot write; the other formats, which
// never went through json.Marshal, encode it as before.
func TestEncodeRefusesYearsRFC3339CannotWrite(t *testing.T) {
	for _, f := range Formats {
		e := &Envelope{Format: f, Metadata: events.Metadata{EventID: NewEventID(), Type: "t", SchemaVersion: 1, OccurredAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, Payload: []byte(`{}`)}
		_, _, err := e.Encode()
		if refused := err != nil && strings.Contains(err.Error(), "year outside of range [0,9999]"); refused != (f == FormatJSON) {
			t.Errorf("%v: Encode of year 10000 = %v, want it refused only by the JSON envelope", f, err)
		}
	}
}

// TestJSONEnvelopeOfPayloadsNewDidNotMake: an envelope built by hand or
// decoded, whose payload may be spaced or not JSON at all, encodes as
// json.Marshal encodes it: spaced JSON compacted, anything else refused;
// and a payload replaced after New is read again.
func TestJSONEnvelopeOfPayloadsNewDidNotMake(t *testing.T) {
	at := time.Date(2026, 12, 3, 19, 0, 0, 0, time.UTC)
	for _, payload := range []string{"{\n  \"a\": \"<b> & c\",\n  \"n\": [1, 2]\n}", ` {"x" : 1} `, `{"a":`, `not json`} {
		e := &Envelope{Metadata: events.Metadata{EventID: NewEventID(), Type: "t", SchemaVersion: 1, OccurredAt: at}, Payload: []byte(payload)}
		value, _, err := e.Encode()
		want, werr := json.Marshal(jsonEnvelope{EventID: e.EventID.String(), EventType: "t", SchemaVersion: 1, OccurredAt: at, Payload: json.RawMessage(payload)})
		if (err != nil) != (werr != nil) || !bytes.Equal(value, want) {
			t.Fatalf("payload %q: Encode = %s, %v; json.Marshal = %s, %v", payload, value, err, want, werr)
		}
	}
	s, err := structpb.NewStruct(map[string]any{"a": "b"})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(testEvent{s}, events.PublishOptions{OccurredAt: at}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	e.Payload = []byte(`{"a": "replaced"}`)
	value, _, err := e.Encode()
	if err != nil || !bytes.Contains(value, []byte(`"payload":{"a":"replaced"}`)) {
		t.Fatalf("replaced payload: %s, %v", value, err)
	}
}

// TestHeaderValuesDoNotOverlap appends to each header value, which must
// not change the next one: the values share one allocation.
func TestHeaderValuesDoNotOverlap(t *testing.T) {
	e := &Envelope{Metadata: events.Metadata{EventID: NewEventID(), Type: "t", SchemaVersion: 12, OccurredAt: time.Now(), Producer: "p",
		CorrelationID: "c", CausationID: "k", TraceParent: "tp"}}
	hs := e.Headers()
	want := make([]string, len(hs))
	for i, h := range hs {
		want[i] = string(h.Value)
	}
	for i := range hs {
		_ = append(hs[i].Value, "XXXX"...)
	}
	for i, h := range hs {
		if string(h.Value) != want[i] {
			t.Fatalf("header %s became %q after appending to another, want %q", h.Key, h.Value, want[i])
		}
	}
	if got := headerValue(hs, HeaderSchemaVersion); got != "12" {
		t.Fatalf("ce_schemaversion = %q, want 12", got)
	}
}

func headerValue(hs []kafka.Header, key string) string {
	for _, h := range hs {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func BenchmarkEncodeJSON(b *testing.B) {
	s, err := structpb.NewStruct(map[string]any{"id": "order-1", "customer_id": "customer-1", "total_cents": "1251", "currency": "EUR", "country": "DE"})
	if err != nil {
		b.Fatal(err)
	}
	ev := testEvent{s}
	b.ReportAllocs()
	for b.Loop() {
		e, err := New(ev, events.PublishOptions{}, Options{})
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := e.Encode(); err != nil {
			b.Fatal(err)
		}
	}
}
