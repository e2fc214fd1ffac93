package events

import (
	"fmt"
	"sort"
	"sync"
)

// registry holds every event type linked into the program, keyed by type.
var registry = struct {
	sync.RWMutex
	byType map[string]*Descriptor
}{byType: map[string]*Descriptor{}}

// Register records event descriptors in the process-wide registry, which the
// relay, topic provisioning and operator tools read. Generated code calls it
// from init. Registering two different descriptors for one type, two types
// on one topic, or a type whose topic is another type's dead-letter topic
// (DLQTopic, or "<topic>.dlq" when empty) is an error: consumers of that topic
// would decode dead letters as events of the other type. Several types may
// share one dead-letter topic.
//
// Each descriptor is checked against those registered before it, so on error
// the descriptors before the failing one stay registered.
func Register(ds ...*Descriptor) error {
	registry.Lock()
	defer registry.Unlock()
	for _, d := range ds {
		if d == nil || d.Type == "" {
			return fmt.Errorf("events: register: descriptor without a type")
		}
		if old, ok := registry.byType[d.Type]; ok && old != d {
			return fmt.Errorf("events: register: event type %q registered twice (from %s and %s)", d.Type, old.File, d.File)
		}
		if dlq := effectiveDLQ(d); dlq == d.Topic {
			return fmt.Errorf("events: register: dead-letter topic %q of %s is its own topic", dlq, d.Type)
		}
		for _, old := range registry.byType {
			if old == d {
				continue
			}
			if old.Topic == d.Topic {
				return fmt.Errorf("events: register: topic %q used by both %s and %s", d.Topic, old.Type, d.Type)
			}
			if dlq := effectiveDLQ(d); dlq == old.Topic {
				return fmt.Errorf("events: register: dead-letter topic %q of %s is the topic of %s", dlq, d.Type, old.Type)
			}
			if dlq := effectiveDLQ(old); dlq == d.Topic {
				return fmt.Errorf("events: register: topic %q of %s is the dead-letter topic of %s", d.Topic, d.Type, old.Type)
			}
		}
		registry.byType[d.Type] = d
	}
	return nil
}

// effectiveDLQ is the dead-letter topic consumers of d use: DLQTopic, or
// "<topic>.dlq" when it is empty.
func effectiveDLQ(d *Descriptor) string {
	if d.DLQTopic != "" {
		return d.DLQTopic
	}
	return d.Topic + ".dlq"
}

// Lookup returns the registered descriptor of an event type.
func Lookup(eventType string) (*Descriptor, bool) {
	registry.RLock()
	defer registry.RUnlock()
	d, ok := registry.byType[eventType]
	return d, ok
}

// Registered returns every registered descriptor, sorted by type.
func Registered() []*Descriptor {
	registry.RLock()
	defer registry.RUnlock()
	out := make([]*Descriptor, 0, len(registry.byType))
	for _, d := range registry.byType {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Type < out[j].Type })
	return out
}
