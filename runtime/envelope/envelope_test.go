package envelope

import (
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/protoevents/protoevents/runtime/events"
)

// testEvent is a hand-written event over a well-known message type.
type testEvent struct{ *structpb.Struct }

var testDescriptor = &events.Descriptor{Type: "google.protobuf.Struct", Topic: "t", DLQTopic: "t.dlq", Version: 3, Producer: "default-producer"}

func (e testEvent) EventKey() []byte                    { return []byte(e.Fields["id"].GetStringValue()) }
func (e testEvent) EventDescriptor() *events.Descriptor { return testDescriptor }

func newTestEvent(t *testing.T, id string) testEvent {
	t.Helper()
	s, err := structpb.NewStruct(map[string]any{"id": id, "amount": 12.5})
	if err != nil {
		t.Fatal(err)
	}
	return testEvent{s}
}

func TestRoundTrip(t *testing.T) {
	at := time.Date(2026, 12, 2, 10, 0, 0, 123456789, time.FixedZone("x", 3600))
	for _, f := range []Format{FormatJSON, FormatProto} {
		t.Run(f.String(), func(t *testing.T) {
			ev := newTestEvent(t, "order-1")
			env, err := New(ev, events.ApplyPublishOptions([]events.PublishOption{
				events.WithOccurredAt(at), events.WithCorrelationID("corr"), events.WithCausationID("cause"),
				events.WithTraceParent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
			}), Options{Format: f})
			if err != nil {
				t.Fatal(err)
			}
			if env.Producer != "default-producer" || env.SchemaVersion != 3 || string(env.Key) != "order-1" {
				t.Fatalf("defaults not applied: %+v", env.Metadata)
			}
			value, headers, err := env.Encode()
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decode(kafka.Message{Key: env.Key, Value: value, Headers: headers})
			if err != nil {
				t.Fatal(err)
			}
			if got.EventID != env.EventID || got.Type != env.Type || got.SchemaVersion != 3 ||
				!got.OccurredAt.Equal(at) || got.Producer != env.Producer || got.CorrelationID != "corr" ||
				got.CausationID != "cause" || got.TraceParent != env.TraceParent || string(got.Key) != "order-1" || got.Format != f {
				t.Fatalf("metadata changed in transit:\n got %+v\nwant %+v", got.Metadata, env.Metadata)
			}
			var s structpb.Struct
			if err := got.UnmarshalPayload(&s); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(&s, ev.Struct) {
				t.Fatalf("payload changed: %v", &s)
			}
			if v, _ := Header(kafka.Message{Headers: headers}, HeaderID); v != env.EventID.String() {
				t.Fatalf("ce_id header = %q", v)
			}
			// Without the content-type header the format is sniffed.
			sniffed, err := Decode(kafka.Message{Value: value})
			if err != nil || sniffed.Format != f {
				t.Fatalf("sniffing: format %v, err %v", sniffed, err)
			}
		})
	}
}

func TestEventIDsIncrease(t *testing.T) {
	prev := NewEventID()
	for i := 0; i < 10000; i++ {
		id := NewEventID()
		if id.Compare(prev) <= 0 {
			t.Fatalf("event id %d (%s) not after %s", i, id, prev)
		}
		prev = id
	}
}

func TestDecodeRejectsMalformed(t *testing.T) {
	ct := func(v string) []kafka.Header { return []kafka.Header{{Key: HeaderContentType, Value: []byte(v)}} }
	cases := map[string]kafka.Message{
		"empty value":     {},
		"not json":        {Value: []byte("{nope"), Headers: ct(ContentTypeJSON)},
		"bad ulid":        {Value: []byte(`{"event_id":"xyz","event_type":"a.B","schema_version":1,"occurred_at":"2026-01-01T00:00:00Z","payload":{}}`)},
		"missing id":      {Value: []byte(`{"event_type":"a.B","schema_version":1,"occurred_at":"2026-01-01T00:00:00Z","payload":{}}`)},
		"missing type":    {Value: []byte(`{"event_id":"01JDQ2X7Y4Z8KQ3B6M9T5V0W1R","schema_version":1,"occurred_at":"2026-01-01T00:00:00Z","payload":{}}`)},
		"missing version": {Value: []byte(`{"event_id":"01JDQ2X7Y4Z8KQ3B6M9T5V0W1R","event_type":"a.B","occurred_at":"2026-01-01T00:00:00Z","payload":{}}`)},
		"missing time":    {Value: []byte(`{"event_id":"01JDQ2X7Y4Z8KQ3B6M9T5V0W1R","event_type":"a.B","schema_version":1,"payload":{}}`)},
		"missing payload": {Value: []byte(`{"event_id":"01JDQ2X7Y4Z8KQ3B6M9T5V0W1R","event_type":"a.B","schema_version":1,"occurred_at":"2026-01-01T00:00:00Z"}`)},
		"bad proto":       {Value: []byte{0xff, 0xff, 0xff}, Headers: ct(ContentTypeProto)},
		"unknown content": {Value: []byte("x"), Headers: ct("text/plain")},
	}
	for name, m := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(m)
			var de *DecodeError
			if !errors.As(err, &de) || !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode = %v, want a *DecodeError matching ErrMalformed", err)
			}
		})
	}
}

func TestPayloadMismatchIsMalformed(t *testing.T) {
	env := &Envelope{Format: FormatJSON, Payload: []byte(`[1, 2]`)}
	env.Type = "google.protobuf.Struct"
	err := env.UnmarshalPayload(&structpb.Struct{})
	if !errors.Is(err, ErrMalformed) {
		t.Fatalf("UnmarshalPayload = %v, want ErrMalformed", err)
	}
}
