// Package catalog describes a set of event schemas for people and tools: an
// AsyncAPI 3.0 document (channels for the topics and their dead-letter
// topics, one message per event with its payload as JSON Schema, its key,
// version, producer and supersedes chain) and a Markdown catalog rendered from
// the same model. protoc-gen-events writes both when given catalog=<path>.
//
// Output is deterministic: events, channels and schemas are sorted by name,
// so the same schemas always give the same bytes and a diff shows what
// changed.
package catalog

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/protoevents/protoevents/runtime/eventsv1"
)

// Catalog is the model both renderings are built from.
type Catalog struct {
	// Events are the annotated messages, sorted by full name.
	Events []Event
	// Schemas are the JSON Schemas of every message and enum the events
	// reference (the events' own included), by full name.
	Schemas map[string]any
}

// Event is one message carrying (events.v1.event).
type Event struct {
	// Name is the message's full name, the envelope's event type.
	Name string
	// ShortName is the message's name without its package.
	ShortName string
	// File is the .proto file declaring it.
	File string
	// Description is the message's leading comment.
	Description string
	// Topic and DLQTopic are the Kafka topics it is published to and
	// dead-lettered to.
	Topic, DLQTopic string
	// Key is the key field's dot-separated path; KeyType its protobuf kind.
	Key, KeyType string
	// Version is the major schema version.
	Version uint32
	// Producer is the producer name in its envelopes.
	Producer string
	// Supersedes is the full name of the event it replaces, if any;
	// SupersededBy the events replacing it.
	Supersedes   string
	SupersededBy []string
	// Fields describe the payload's top-level fields, in declaration order.
	Fields []Field
}

// Field is one top-level payload field, for the Markdown catalog.
type Field struct {
	Name, Type, Description string
}

// Build reads the events declared in files (messages with the
// (events.v1.event) option, nested ones included) and the schemas of every
// type they reach.
func Build(files []protoreflect.FileDescriptor) (*Catalog, error) {
	c := &Catalog{Schemas: map[string]any{}}
	var errs []error
	for _, f := range files {
		fo, _, err := extension[*eventsv1.FileOptions](f.Options(), eventsv1.E_File)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.Path(), err))
			continue
		}
		producer := fo.GetProducer()
		if producer == "" {
			producer = string(f.Package())
		}
		walk(f.Messages(), func(md protoreflect.MessageDescriptor) {
			eo, ok, err := extension[*eventsv1.EventOptions](md.Options(), eventsv1.E_Event)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", md.FullName(), err))
				return
			}
			if !ok {
				return
			}
			ev := Event{
				Name: string(md.FullName()), ShortName: string(md.Name()), File: f.Path(),
				Description: comment(md), Topic: eo.GetTopic(), DLQTopic: eo.GetDlqTopic(),
				Key: eo.GetKey(), Version: eo.GetVersion(), Producer: producer, Supersedes: eo.GetSupersedes(),
			}
			if ev.DLQTopic == "" {
				ev.DLQTopic = ev.Topic + ".dlq"
			}
			ev.KeyType = keyType(md, ev.Key)
			fields := md.Fields()
			for i := 0; i < fields.Len(); i++ {
				fd := fields.Get(i)
				ev.Fields = append(ev.Fields, Field{Name: string(fd.Name()), Type: typeName(fd), Description: comment(fd)})
			}
			c.addSchema(md)
			c.Events = append(c.Events, ev)
		})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("catalog: %w", err)
	}
	sort.Slice(c.Events, func(i, j int) bool { return c.Events[i].Name < c.Events[j].Name })
	for i := range c.Events {
		for _, o := range c.Events {
			if o.Supersedes == c.Events[i].Name {
				c.Events[i].SupersededBy = append(c.Events[i].SupersededBy, o.Name)
			}
		}
	}
	return c, nil
}

// walk calls fn for every message, nested ones included, in declaration
// order; map entries are skipped.
func walk(msgs protoreflect.MessageDescriptors, fn func(protoreflect.MessageDescriptor)) {
	for i := 0; i < msgs.Len(); i++ {
		md := msgs.Get(i)
		if md.IsMapEntry() {
			continue
		}
		fn(md)
		walk(md.Messages(), fn)
	}
}

// comment returns the leading comment of d, trimmed, one paragraph per
// blank-line-separated block.
func comment(d protoreflect.Descriptor) string {
	loc := d.ParentFile().SourceLocations().ByDescriptor(d)
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(loc.LeadingComments), "\n") {
		lines = append(lines, strings.TrimSpace(l))
	}
	return strings.TrimSpace(strings.Join(lines, "\n"))
}

// keyType returns the kind of the field at the dot-separated path, or "" if
// it does not resolve (the generator has refused such schemas already).
func keyType(md protoreflect.MessageDescriptor, path string) string {
	var fd protoreflect.FieldDescriptor
	for _, name := range strings.Split(path, ".") {
		if md == nil {
			return ""
		}
		fd = md.Fields().ByName(protoreflect.Name(name))
		if fd == nil {
			return ""
		}
		md = fd.Message()
	}
	return fd.Kind().String()
}

// typeName is a field's type as a .proto author writes it.
func typeName(fd protoreflect.FieldDescriptor) string {
	base := func(fd protoreflect.FieldDescriptor) string {
		switch fd.Kind() {
		case protoreflect.MessageKind, protoreflect.GroupKind:
			return string(fd.Message().FullName())
		case protoreflect.EnumKind:
			return string(fd.Enum().FullName())
		}
		return fd.Kind().String()
	}
	switch {
	case fd.IsMap():
		return "map<" + base(fd.MapKey()) + ", " + base(fd.MapValue()) + ">"
	case fd.IsList():
		return "repeated " + base(fd)
	case fd.HasOptionalKeyword():
		return "optional " + base(fd)
	}
	return base(fd)
}

// extensionTypes resolve the events.v1 options when they arrive as unknown
// fields (descriptors built without eventsv1 linked in).
var extensionTypes = resolver{eventsv1.E_Event, eventsv1.E_File}

type resolver []protoreflect.ExtensionType

func (r resolver) FindExtensionByName(name protoreflect.FullName) (protoreflect.ExtensionType, error) {
	for _, x := range r {
		if x.TypeDescriptor().FullName() == name {
			return x, nil
		}
	}
	return nil, protoregistry.NotFound
}

func (r resolver) FindExtensionByNumber(message protoreflect.FullName, field protoreflect.FieldNumber) (protoreflect.ExtensionType, error) {
	for _, x := range r {
		if d := x.TypeDescriptor(); d.ContainingMessage().FullName() == message && d.Number() == field {
			return x, nil
		}
	}
	return nil, protoregistry.NotFound
}

// extension reads xt from opts. The options are re-encoded and decoded with
// a resolver that knows the events.v1 extensions, whatever form they came
// in: unknown fields (descriptors built without eventsv1 linked in) or
// dynamic messages (descriptors from a compiler such as protocompile).
func extension[T proto.Message](opts proto.Message, xt protoreflect.ExtensionType) (T, bool, error) {
	var zero T
	if opts == nil || !opts.ProtoReflect().IsValid() {
		return zero, false, nil
	}
	b, err := proto.Marshal(opts)
	if err != nil {
		return zero, false, fmt.Errorf("re-encode options: %w", err)
	}
	fresh := opts.ProtoReflect().Type().New().Interface()
	if err := (proto.UnmarshalOptions{Resolver: extensionTypes}).Unmarshal(b, fresh); err != nil {
		return zero, false, fmt.Errorf("decode options: %w", err)
	}
	if !proto.HasExtension(fresh, xt) {
		return zero, false, nil
	}
	v, ok := proto.GetExtension(fresh, xt).(T)
	return v, ok, nil
}
