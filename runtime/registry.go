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
// from init. Registering two different descriptors for one type, or two
// types on one topic, is an error.
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
		for _, old := range registry.byType {
			if old != d && old.Topic == d.Topic {
				return fmt.Errorf("events: register: topic %q used by both %s and %s", d.Topic, old.Type, d.Type)
			}
		}
		registry.byType[d.Type] = d
	}
	return nil
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
