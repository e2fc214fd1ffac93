package compat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/protoevents/protoevents/runtime/eventsv1"
)

// LockFormat is the version of the lock file layout that Marshal writes and
// ParseLock accepts. It changes only when the layout does.
const LockFormat = 1

// Lock is the committed snapshot of every event's contract: its topic, key,
// version, dead-letter topic and supersedes, plus the schema of the event
// message and of every message and enum it references transitively. It is
// what a later schema is checked against, so it holds exactly what readers of
// the event depend on (names, numbers, JSON names, types, cardinality,
// presence, enum values, reservations) and nothing that may change freely
// (comments, source positions, field order in the file).
//
// Marshal writes it as indented JSON with every list sorted, so the same
// schemas always give the same bytes and a diff of events.lock in review shows
// exactly what changed.
type Lock struct {
	// Format is the lock layout version (LockFormat).
	Format int `json:"format"`
	// Events are the annotated messages, sorted by full name.
	Events []Event `json:"events"`
	// Messages are the event messages and every message they reference
	// transitively (map entries excluded: maps are described on the field),
	// sorted by full name.
	Messages []Message `json:"messages"`
	// Enums are the enums referenced transitively by events, sorted by full
	// name.
	Enums []Enum `json:"enums"`
}

// Event is one message annotated with (events.v1.event).
type Event struct {
	// Name is the full name of the event message, e.g. "orders.v1.OrderPlaced".
	Name string `json:"name"`
	// File is the .proto file that declares it (import path).
	File string `json:"file"`
	// Topic is the Kafka topic the event is published to.
	Topic string `json:"topic"`
	// Key is the dot-separated path of the key field.
	Key string `json:"key"`
	// Version is the event's major schema version.
	Version uint32 `json:"version"`
	// DLQTopic is the effective dead-letter topic ("<topic>.dlq" when the
	// option leaves it empty).
	DLQTopic string `json:"dlq_topic"`
	// Supersedes is the full name of the event this one replaces, if any.
	Supersedes string `json:"supersedes,omitempty"`
}

// Message is the recorded schema of one message type.
type Message struct {
	// Name is the message's full name.
	Name string `json:"name"`
	// File is the .proto file that declares it.
	File string `json:"file"`
	// Fields are the message's fields, sorted by number.
	Fields []Field `json:"fields"`
	// ReservedRanges are the reserved field numbers, "N" or "N-M"
	// (inclusive), sorted.
	ReservedRanges []string `json:"reserved_ranges,omitempty"`
	// ReservedNames are the reserved field names, sorted.
	ReservedNames []string `json:"reserved_names,omitempty"`
}

// Field is the recorded schema of one field.
type Field struct {
	// Name is the field's name in the .proto file.
	Name string `json:"name"`
	// Number is the field number.
	Number int32 `json:"number"`
	// JSONName is the effective JSON name (json_name option or the default
	// lowerCamelCase form).
	JSONName string `json:"json_name"`
	// Label is "singular", "repeated" or "map".
	Label string `json:"label"`
	// Type is the field's kind ("string", "int64", "message", "enum",
	// "group", …); for a map it is the value's kind.
	Type string `json:"type"`
	// TypeName is the full name of the message or enum type (the map value's
	// for a map), empty for scalars.
	TypeName string `json:"type_name,omitempty"`
	// MapKey is the kind of a map's key, empty for other fields.
	MapKey string `json:"map_key,omitempty"`
	// Presence is "implicit", "explicit" or "required" for singular fields,
	// empty for repeated and map fields.
	Presence string `json:"presence,omitempty"`
	// Oneof is the name of the (non-synthetic) oneof the field belongs to.
	Oneof string `json:"oneof,omitempty"`
	// Default is the field's effective default value wherever readers can
	// observe it, in descriptor text form: the explicit default
	// (proto2/editions), or, for a singular field of a closed enum with
	// explicit presence, the enum's first declared value when there is no
	// explicit default (reordering such an enum changes what an unset field
	// reads as). Empty when the default is the zero value of a scalar type
	// (0, false, empty), which needs no recording, and for open enums, whose
	// default is always the value numbered 0.
	Default string `json:"default,omitempty"`
}

// Enum is the recorded schema of one enum type.
type Enum struct {
	// Name is the enum's full name.
	Name string `json:"name"`
	// File is the .proto file that declares it.
	File string `json:"file"`
	// Values are the enum's values, sorted by number then name (aliases
	// share a number).
	Values []EnumValue `json:"values"`
	// ReservedRanges are the reserved value numbers, "N" or "N-M"
	// (inclusive), sorted.
	ReservedRanges []string `json:"reserved_ranges,omitempty"`
	// ReservedNames are the reserved value names, sorted.
	ReservedNames []string `json:"reserved_names,omitempty"`
}

// EnumValue is one value of an enum.
type EnumValue struct {
	// Name is the value's name (what the JSON envelope carries).
	Name string `json:"name"`
	// Number is the value's number (what the binary form carries).
	Number int32 `json:"number"`
}

// Snapshot builds the lock for the events declared in files: every message
// carrying (events.v1.event), and every message and enum reachable from one
// through its fields. Referenced types may live in files not listed (they are
// reached through the descriptors); events are taken only from files.
func Snapshot(files []protoreflect.FileDescriptor) (*Lock, error) {
	l := &Lock{Format: LockFormat, Events: []Event{}, Messages: []Message{}, Enums: []Enum{}}
	var roots []protoreflect.MessageDescriptor
	for _, f := range files {
		var err error
		walkMessages(f.Messages(), func(md protoreflect.MessageDescriptor) {
			if err != nil {
				return
			}
			opts, ok, e := eventOptions(md)
			if e != nil {
				err = e
				return
			}
			if !ok {
				return
			}
			dlq := opts.GetDlqTopic()
			if dlq == "" {
				dlq = opts.GetTopic() + ".dlq"
			}
			l.Events = append(l.Events, Event{
				Name:       string(md.FullName()),
				File:       md.ParentFile().Path(),
				Topic:      opts.GetTopic(),
				Key:        opts.GetKey(),
				Version:    opts.GetVersion(),
				DLQTopic:   dlq,
				Supersedes: opts.GetSupersedes(),
			})
			roots = append(roots, md)
		})
		if err != nil {
			return nil, err
		}
	}
	seen := map[protoreflect.FullName]bool{}
	for _, md := range roots {
		l.addMessage(md, seen)
	}
	l.normalize()
	for i := 1; i < len(l.Events); i++ {
		if l.Events[i].Name == l.Events[i-1].Name {
			return nil, fmt.Errorf("compat: snapshot: event %s is declared twice (%s, %s)", l.Events[i].Name, l.Events[i-1].File, l.Events[i].File)
		}
	}
	return l, nil
}

// walkMessages calls fn for every message in ms and, depth first, for every
// message nested in them (map entries excluded).
func walkMessages(ms protoreflect.MessageDescriptors, fn func(protoreflect.MessageDescriptor)) {
	for i := 0; i < ms.Len(); i++ {
		md := ms.Get(i)
		if md.IsMapEntry() {
			continue
		}
		fn(md)
		walkMessages(md.Messages(), fn)
	}
}

// eventOptions returns the (events.v1.event) option of md. The options are
// re-decoded through the Go registry so that options built by any compiler
// (protoc, buf, protocompile's dynamic messages) read the same way.
func eventOptions(md protoreflect.MessageDescriptor) (*eventsv1.EventOptions, bool, error) {
	opts := md.Options()
	if opts == nil {
		return nil, false, nil
	}
	m, ok := opts.(proto.Message)
	if !ok || !m.ProtoReflect().IsValid() {
		return nil, false, nil
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, false, fmt.Errorf("compat: options of %s: marshal: %w", md.FullName(), err)
	}
	var mo descriptorpb.MessageOptions
	if err := (proto.UnmarshalOptions{Resolver: protoregistry.GlobalTypes}).Unmarshal(b, &mo); err != nil {
		return nil, false, fmt.Errorf("compat: options of %s: unmarshal: %w", md.FullName(), err)
	}
	if !proto.HasExtension(&mo, eventsv1.E_Event) {
		return nil, false, nil
	}
	ev, _ := proto.GetExtension(&mo, eventsv1.E_Event).(*eventsv1.EventOptions)
	if ev == nil {
		return nil, false, nil
	}
	return ev, true, nil
}

// addMessage records md and, transitively, the types its fields reference.
func (l *Lock) addMessage(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) {
	if seen[md.FullName()] {
		return
	}
	seen[md.FullName()] = true
	m := Message{Name: string(md.FullName()), File: md.ParentFile().Path(), Fields: []Field{}}
	rr := md.ReservedRanges()
	for i := 0; i < rr.Len(); i++ {
		r := rr.Get(i) // [start, end)
		m.ReservedRanges = append(m.ReservedRanges, formatRange(int32(r[0]), int32(r[1])-1))
	}
	rn := md.ReservedNames()
	for i := 0; i < rn.Len(); i++ {
		m.ReservedNames = append(m.ReservedNames, string(rn.Get(i)))
	}
	var refs []protoreflect.Descriptor
	fs := md.Fields()
	for i := 0; i < fs.Len(); i++ {
		fd := fs.Get(i)
		f := Field{Name: string(fd.Name()), Number: int32(fd.Number()), JSONName: fd.JSONName()}
		vd := fd
		switch {
		case fd.IsMap():
			f.Label = "map"
			f.MapKey = fd.MapKey().Kind().String()
			vd = fd.MapValue()
		case fd.Cardinality() == protoreflect.Repeated:
			f.Label = "repeated"
		default:
			f.Label = "singular"
			switch {
			case fd.Cardinality() == protoreflect.Required:
				f.Presence = "required"
			case fd.HasPresence():
				f.Presence = "explicit"
			default:
				f.Presence = "implicit"
			}
		}
		f.Type = vd.Kind().String()
		switch vd.Kind() {
		case protoreflect.MessageKind, protoreflect.GroupKind:
			f.TypeName = string(vd.Message().FullName())
			refs = append(refs, vd.Message())
		case protoreflect.EnumKind:
			f.TypeName = string(vd.Enum().FullName())
			refs = append(refs, vd.Enum())
		}
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() {
			f.Oneof = string(od.Name())
		}
		f.Default = effectiveDefault(fd)
		m.Fields = append(m.Fields, f)
	}
	l.Messages = append(l.Messages, m)
	for _, d := range refs {
		switch d := d.(type) {
		case protoreflect.MessageDescriptor:
			l.addMessage(d, seen)
		case protoreflect.EnumDescriptor:
			l.addEnum(d, seen)
		}
	}
}

// effectiveDefault is the default value of fd that the lock records (see
// Field.Default).
func effectiveDefault(fd protoreflect.FieldDescriptor) string {
	if fd.Cardinality() == protoreflect.Repeated {
		return ""
	}
	if fd.Kind() == protoreflect.EnumKind {
		if !fd.HasDefault() && (!fd.HasPresence() || !fd.Enum().IsClosed()) {
			return ""
		}
		// Some descriptor implementations (protocompile's) give no
		// DefaultEnumValue for an implicit default; Default's number then
		// names the first declared value.
		v := fd.DefaultEnumValue()
		if v == nil {
			v = fd.Enum().Values().ByNumber(fd.Default().Enum())
		}
		if v == nil {
			return ""
		}
		return string(v.Name())
	}
	if !fd.HasDefault() {
		return ""
	}
	return normalizeDefault(fd.Kind().String(), protodesc.ToFieldDescriptorProto(fd).GetDefaultValue())
}

// normalizeDefault maps a recorded default of a field of the given kind to
// "" when it is the kind's zero value, which is what a field without an
// explicit default has: `[default = 0]` and no default read the same.
func normalizeDefault(kind, v string) string {
	switch kind {
	case "string", "bytes", "enum", "message", "group":
		return v
	case "bool":
		if v == "false" {
			return ""
		}
	default: // numeric kinds; "-0" is a distinct float default and stays
		if v == "0" {
			return ""
		}
	}
	return v
}

// addEnum records ed once.
func (l *Lock) addEnum(ed protoreflect.EnumDescriptor, seen map[protoreflect.FullName]bool) {
	if seen[ed.FullName()] {
		return
	}
	seen[ed.FullName()] = true
	e := Enum{Name: string(ed.FullName()), File: ed.ParentFile().Path(), Values: []EnumValue{}}
	vs := ed.Values()
	for i := 0; i < vs.Len(); i++ {
		e.Values = append(e.Values, EnumValue{Name: string(vs.Get(i).Name()), Number: int32(vs.Get(i).Number())})
	}
	rr := ed.ReservedRanges()
	for i := 0; i < rr.Len(); i++ {
		r := rr.Get(i) // [start, end], inclusive
		e.ReservedRanges = append(e.ReservedRanges, formatRange(int32(r[0]), int32(r[1])))
	}
	rn := ed.ReservedNames()
	for i := 0; i < rn.Len(); i++ {
		e.ReservedNames = append(e.ReservedNames, string(rn.Get(i)))
	}
	l.Enums = append(l.Enums, e)
}

// normalize sorts every list so that equal locks have equal bytes.
func (l *Lock) normalize() {
	if l.Events == nil {
		l.Events = []Event{}
	}
	if l.Messages == nil {
		l.Messages = []Message{}
	}
	if l.Enums == nil {
		l.Enums = []Enum{}
	}
	sort.Slice(l.Events, func(i, j int) bool { return l.Events[i].Name < l.Events[j].Name })
	sort.Slice(l.Messages, func(i, j int) bool { return l.Messages[i].Name < l.Messages[j].Name })
	sort.Slice(l.Enums, func(i, j int) bool { return l.Enums[i].Name < l.Enums[j].Name })
	for i := range l.Messages {
		m := &l.Messages[i]
		if m.Fields == nil {
			m.Fields = []Field{}
		}
		sort.Slice(m.Fields, func(a, b int) bool { return m.Fields[a].Number < m.Fields[b].Number })
		sortRanges(m.ReservedRanges)
		sort.Strings(m.ReservedNames)
	}
	for i := range l.Enums {
		e := &l.Enums[i]
		if e.Values == nil {
			e.Values = []EnumValue{}
		}
		sort.Slice(e.Values, func(a, b int) bool {
			if e.Values[a].Number != e.Values[b].Number {
				return e.Values[a].Number < e.Values[b].Number
			}
			return e.Values[a].Name < e.Values[b].Name
		})
		sortRanges(e.ReservedRanges)
		sort.Strings(e.ReservedNames)
	}
}

// clone copies l deeply enough for normalize to sort it without touching l.
func (l *Lock) clone() *Lock {
	c := &Lock{Format: l.Format, Events: slices.Clone(l.Events)}
	for _, m := range l.Messages {
		m.Fields = slices.Clone(m.Fields)
		m.ReservedRanges = slices.Clone(m.ReservedRanges)
		m.ReservedNames = slices.Clone(m.ReservedNames)
		c.Messages = append(c.Messages, m)
	}
	for _, e := range l.Enums {
		e.Values = slices.Clone(e.Values)
		e.ReservedRanges = slices.Clone(e.ReservedRanges)
		e.ReservedNames = slices.Clone(e.ReservedNames)
		c.Enums = append(c.Enums, e)
	}
	return c
}

// Marshal returns the lock as deterministic, indented JSON ending in a
// newline.
func (l *Lock) Marshal() ([]byte, error) {
	c := l.clone()
	c.normalize()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("compat: marshal lock: %w", err)
	}
	return buf.Bytes(), nil
}

// ParseLock reads a lock written by Marshal. Unknown keys and other formats
// are refused so that a lock written by a newer protoc-gen-events is not
// silently misread.
func ParseLock(data []byte) (*Lock, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var l Lock
	if err := dec.Decode(&l); err != nil {
		return nil, fmt.Errorf("compat: parse lock: %w", err)
	}
	if dec.More() {
		return nil, errors.New("compat: parse lock: trailing data after the JSON object")
	}
	if l.Format != LockFormat {
		return nil, fmt.Errorf("compat: parse lock: format %d, this protoc-gen-events reads format %d", l.Format, LockFormat)
	}
	for _, m := range l.Messages {
		for _, r := range m.ReservedRanges {
			if _, _, err := parseRange(r); err != nil {
				return nil, fmt.Errorf("compat: parse lock: message %s: %w", m.Name, err)
			}
		}
	}
	for _, e := range l.Enums {
		for _, r := range e.ReservedRanges {
			if _, _, err := parseRange(r); err != nil {
				return nil, fmt.Errorf("compat: parse lock: enum %s: %w", e.Name, err)
			}
		}
	}
	l.normalize()
	return &l, nil
}

// formatRange writes an inclusive number range as "N", "N-M" or "N-max".
func formatRange(start, end int32) string {
	switch {
	case start == end:
		return strconv.Itoa(int(start))
	case end == math.MaxInt32 || end == int32(protowireMaxField):
		return fmt.Sprintf("%d-max", start)
	default:
		return fmt.Sprintf("%d-%d", start, end)
	}
}

// protowireMaxField is the largest field number (2^29-1); "max" in a
// message's reserved range means it, in an enum's it means MaxInt32.
const protowireMaxField = 1<<29 - 1

// parseRange reads formatRange's output. "max" parses as MaxInt32, which is
// at least as large as any real bound.
func parseRange(s string) (int32, int32, error) {
	a, b, ok := strings.Cut(s, "-")
	if strings.HasPrefix(s, "-") { // negative enum numbers: "-5" or "-5--1"
		a2, b2, ok2 := strings.Cut(s[1:], "-")
		a, b, ok = "-"+a2, b2, ok2
	}
	start, err := strconv.ParseInt(a, 10, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("bad reserved range %q", s)
	}
	if !ok {
		return int32(start), int32(start), nil
	}
	if b == "max" {
		return int32(start), math.MaxInt32, nil
	}
	end, err := strconv.ParseInt(b, 10, 32)
	if err != nil || end < start {
		return 0, 0, fmt.Errorf("bad reserved range %q", s)
	}
	return int32(start), int32(end), nil
}

// sortRanges sorts ranges by their start number.
func sortRanges(rs []string) {
	sort.SliceStable(rs, func(i, j int) bool {
		a, _, _ := parseRange(rs[i])
		b, _, _ := parseRange(rs[j])
		return a < b
	})
}
