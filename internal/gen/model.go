package gen

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"unicode"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/protoevents/protoevents/runtime/eventsv1"
)

// file is the model of one .proto file's events layer: what render turns
// into <file>.events.go.
type file struct {
	proto    *protogen.File
	registry string // name of the per-file registry variable
	events   []*event
}

// event is the model of one message carrying the (events.v1.event) option.
type event struct {
	msg      *protogen.Message
	file     *protogen.File // the file declaring msg
	opts     *eventsv1.EventOptions
	generate bool // declared in a file to generate (not only imported)

	// Filled in by validation.
	dlqTopic   string
	keyPath    []*protogen.Field // the fields of opts.Key, outermost first
	producer   string
	supersedes *event
	names      names
}

// names are the Go identifiers generated for one event.
type names struct {
	Topic, DLQTopic, EventType, SchemaVersion string
	Descriptor                                string
	Producer, NewProducer                     string
	Handler, Handle                           string
}

// namesFor derives the generated identifiers from the message's Go name.
func namesFor(m *protogen.Message) names {
	b := m.GoIdent.GoName
	return names{
		Topic:         b + "Topic",
		DLQTopic:      b + "DLQTopic",
		EventType:     b + "EventType",
		SchemaVersion: b + "SchemaVersion",
		Descriptor:    b + "Event",
		Producer:      b + "Producer",
		NewProducer:   "New" + b + "Producer",
		Handler:       b + "Handler",
		Handle:        "Handle" + b,
	}
}

// list returns the names in a fixed order.
func (n names) list() []string {
	return []string{n.Topic, n.DLQTopic, n.EventType, n.SchemaVersion, n.Descriptor,
		n.Producer, n.NewProducer, n.Handler, n.Handle}
}

// generatedMethods are the methods generated on every event message; a Go
// field of the same name would not compile.
var generatedMethods = []string{"EventKey", "EventDescriptor"}

// optionTypes resolves the events.v1 extensions when options arrive as
// unknown fields (a request decoded without eventsv1 linked in).
var optionTypes extensionResolver = []protoreflect.ExtensionType{eventsv1.E_Event, eventsv1.E_File}

// extensionResolver is a fixed protoregistry.ExtensionTypeResolver.
type extensionResolver []protoreflect.ExtensionType

// FindExtensionByName implements protoregistry.ExtensionTypeResolver.
func (r extensionResolver) FindExtensionByName(name protoreflect.FullName) (protoreflect.ExtensionType, error) {
	for _, x := range r {
		if x.TypeDescriptor().FullName() == name {
			return x, nil
		}
	}
	return nil, protoregistry.NotFound
}

// FindExtensionByNumber implements protoregistry.ExtensionTypeResolver.
func (r extensionResolver) FindExtensionByNumber(message protoreflect.FullName, field protoreflect.FieldNumber) (protoreflect.ExtensionType, error) {
	for _, x := range r {
		d := x.TypeDescriptor()
		if d.ContainingMessage().FullName() == message && d.Number() == field {
			return x, nil
		}
	}
	return nil, protoregistry.NotFound
}

// extension reads extension xt from opts, re-decoding the options with a
// resolver that knows the events.v1 extensions when they came in unknown.
func extension[T proto.Message](opts proto.Message, xt protoreflect.ExtensionType) (T, bool, error) {
	var zero T
	if opts == nil || !opts.ProtoReflect().IsValid() {
		return zero, false, nil
	}
	if !proto.HasExtension(opts, xt) && len(opts.ProtoReflect().GetUnknown()) > 0 {
		b, err := proto.Marshal(opts)
		if err != nil {
			return zero, false, fmt.Errorf("re-encode options: %w", err)
		}
		fresh := opts.ProtoReflect().New().Interface()
		if err := (proto.UnmarshalOptions{Resolver: optionTypes}).Unmarshal(b, fresh); err != nil {
			return zero, false, fmt.Errorf("decode options: %w", err)
		}
		opts = fresh
	}
	if !proto.HasExtension(opts, xt) {
		return zero, false, nil
	}
	v, ok := proto.GetExtension(opts, xt).(T)
	return v, ok, nil
}

// eventOptions returns the (events.v1.event) option of m, if present.
func eventOptions(m *protogen.Message) (*eventsv1.EventOptions, bool, error) {
	opts, _ := m.Desc.Options().(*descriptorpb.MessageOptions)
	return extension[*eventsv1.EventOptions](opts, eventsv1.E_Event)
}

// fileOptions returns the (events.v1.file) option of f, or an empty one.
func fileOptions(f *protogen.File) (*eventsv1.FileOptions, error) {
	opts, _ := f.Desc.Options().(*descriptorpb.FileOptions)
	v, ok, err := extension[*eventsv1.FileOptions](opts, eventsv1.E_File)
	if err != nil || !ok {
		return &eventsv1.FileOptions{}, err
	}
	return v, nil
}

// walkMessages calls fn for every message of f, nested ones included, in
// declaration order. Map entries are skipped: they are not Go types.
func walkMessages(msgs []*protogen.Message, fn func(*protogen.Message)) {
	for _, m := range msgs {
		if m.Desc.IsMapEntry() {
			continue
		}
		fn(m)
		walkMessages(m.Messages, fn)
	}
}

// registryName derives the per-file registry variable from the file's base
// name: orders.proto → OrdersEvents, order_events.proto → OrderEventsEvents.
func registryName(protoPath string) string {
	base := strings.TrimSuffix(path.Base(protoPath), ".proto")
	var b strings.Builder
	for _, part := range strings.FieldsFunc(base, func(r rune) bool {
		return !(r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r)))
	}) {
		b.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	name := b.String()
	if name == "" || unicode.IsDigit(rune(name[0])) {
		name = "File" + name
	}
	return name + "Events"
}

// packageIdents lists the package-level Go identifiers protoc-gen-go
// declares for the files of one Go package, with what declares each, so
// generated names can be checked against them.
func packageIdents(files []*protogen.File) map[string]string {
	idents := map[string]string{}
	addEnum := func(e *protogen.Enum) {
		what := "enum " + string(e.Desc.FullName())
		idents[e.GoIdent.GoName] = what
		idents[e.GoIdent.GoName+"_name"] = what
		idents[e.GoIdent.GoName+"_value"] = what
		for _, v := range e.Values {
			idents[v.GoIdent.GoName] = "enum value " + string(v.Desc.FullName())
		}
	}
	addExt := func(x *protogen.Extension) {
		idents["E_"+x.GoIdent.GoName] = "extension " + string(x.Desc.FullName())
	}
	for _, f := range files {
		idents[f.GoDescriptorIdent.GoName] = "the file descriptor of " + f.Desc.Path()
		for _, e := range f.Enums {
			addEnum(e)
		}
		for _, x := range f.Extensions {
			addExt(x)
		}
		walkMessages(f.Messages, func(m *protogen.Message) {
			idents[m.GoIdent.GoName] = "message " + string(m.Desc.FullName())
			for _, fld := range m.Fields {
				if fld.Oneof != nil && !fld.Oneof.Desc.IsSynthetic() {
					idents[fld.GoIdent.GoName] = "the oneof wrapper of field " + string(fld.Desc.FullName())
				}
			}
			for _, e := range m.Enums {
				addEnum(e)
			}
			for _, x := range m.Extensions {
				addExt(x)
			}
		})
	}
	return idents
}

// goFieldNames returns the Go struct field names protoc-gen-go declares on
// m: one per field outside a oneof, one per real oneof.
func goFieldNames(m *protogen.Message) map[string]string {
	out := map[string]string{}
	for _, fld := range m.Fields {
		if fld.Oneof != nil && !fld.Oneof.Desc.IsSynthetic() {
			continue
		}
		out[fld.GoName] = "field " + string(fld.Desc.Name())
	}
	for _, o := range m.Oneofs {
		if !o.Desc.IsSynthetic() {
			out[o.GoName] = "oneof " + string(o.Desc.Name())
		}
	}
	return out
}

// sortedKeys returns the keys of m in order, for deterministic messages.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
