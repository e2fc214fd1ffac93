package testenv

import (
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/protoevents/protoevents/runtime/events"
)

// Event is a hand-written events.Event for the runtime's own tests, which
// cannot use generated code (the runtime must not depend on it). Its payload
// is a google.protobuf.Struct {"key": <key>, "seq": <n>}; Desc, usually from
// Descriptor, decides its topic.
type Event struct {
	*structpb.Struct
	Desc *events.Descriptor
}

// NewEvent returns the event numbered seq of key on d's topic.
func NewEvent(d *events.Descriptor, key string, seq int) Event {
	s, err := structpb.NewStruct(map[string]any{"key": key, "seq": seq})
	if err != nil {
		panic(err) // constant shapes: cannot happen
	}
	return Event{Struct: s, Desc: d}
}

// EventKey returns the "key" field.
func (e Event) EventKey() []byte { return []byte(e.Fields["key"].GetStringValue()) }

// EventDescriptor returns the event's descriptor.
func (e Event) EventDescriptor() *events.Descriptor { return e.Desc }

// Seq returns the "seq" field.
func (e Event) Seq() int { return int(e.Fields["seq"].GetNumberValue()) }

// Descriptor describes Event published on topic, with its DLQ on
// topic+".dlq" at version 1.
func Descriptor(topic string) *events.Descriptor {
	d := &events.Descriptor{Type: "google.protobuf.Struct", Topic: topic, DLQTopic: topic + ".dlq", Version: 1, Producer: "test", KeyPath: "key"}
	d.New = func() events.Event { return Event{Struct: &structpb.Struct{}, Desc: d} }
	return d
}
