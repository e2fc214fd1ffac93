package gen

import (
	"fmt"
	"slices"

	"github.com/dave/jennifer/jen"
	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/gofeaturespb"
)

// payloadJSONPkg is the runtime package the generated JSON encoders call.
const payloadJSONPkg = "github.com/protoevents/protoevents/runtime/payloadjson"

// appendMethod is the JSON encoder generated on the messages of a file
// with events (payloadjson.Appender).
const appendMethod = "AppendPayloadJSON"

// jsonMessages returns the messages of f, nested ones included, in
// declaration order, that get a generated JSON encoder: every message
// whose JSON form the encoder writes exactly as protojson does. Left out,
// so that protojson keeps encoding them: map entries, messages of the
// hybrid and opaque Go APIs (their fields are not the open struct fields
// the encoder reads), messages with extension ranges (protojson writes
// the extensions set at run time), and messages with groups or required
// fields (protojson names groups differently and checks required fields),
// or with a field or oneof that the method's name would clash with; and
// the well-known types, which protojson writes in forms of their own.
func jsonMessages(f *protogen.File) []*protogen.Message {
	var out []*protogen.Message
	var walk func([]*protogen.Message)
	walk = func(ms []*protogen.Message) {
		for _, m := range ms {
			if jsonSupported(m) {
				out = append(out, m)
			}
			walk(m.Messages)
		}
	}
	walk(f.Messages)
	return out
}

func jsonSupported(m *protogen.Message) bool {
	d := m.Desc
	if d.IsMapEntry() || m.APILevel != gofeaturespb.GoFeatures_API_OPEN || d.ExtensionRanges().Len() > 0 ||
		d.ParentFile().Package() == "google.protobuf" {
		return false
	}
	for _, fd := range m.Fields {
		if fd.Desc.Kind() == protoreflect.GroupKind || fd.Desc.Cardinality() == protoreflect.Required || fd.GoName == appendMethod {
			return false
		}
	}
	for _, o := range m.Oneofs {
		if o.GoName == appendMethod {
			return false
		}
	}
	return true
}

// jsonEncoder renders the JSON encoders of one file.
type jsonEncoder struct {
	f         *jen.File
	generated []*protogen.Message // the messages with an encoder
}

func renderJSON(f *jen.File, pf *protogen.File) {
	e := &jsonEncoder{f: f, generated: jsonMessages(pf)}
	for _, m := range e.generated {
		e.message(m)
	}
}

// message renders AppendPayloadJSON on m: an object with m's populated
// fields in declaration order, named by their proto names, as protojson
// writes them (UseProtoNames) once compacted.
func (e *jsonEncoder) message(m *protogen.Message) {
	e.f.Add(doc(
		fmt.Sprintf("%s appends x to b as the JSON payload of an event envelope:", appendMethod),
		"the bytes protojson writes with proto field names, compacted, without its reflection.",
		"A nil x is an empty object. A string that is not valid UTF-8 is an error, as in protojson.",
	))
	recv := jen.Id("x").Op("*").Id(m.GoIdent.GoName)
	sig := func(s *jen.Statement) *jen.Statement {
		return s.Params(jen.Id("b").Index().Byte()).Params(jen.Index().Byte(), jen.Error())
	}
	empty := jen.Return(jen.Append(jen.Id("b"), jen.Lit("{}").Op("...")), jen.Nil())
	if len(m.Fields) == 0 {
		e.f.Func().Params(recv).Add(sig(jen.Id(appendMethod))).Block(empty)
		return
	}
	var body []jen.Code
	body = append(body, jen.If(jen.Id("x").Op("==").Nil()).Block(empty))
	hasErr := slices.ContainsFunc(m.Fields, fieldCanFail)
	if hasErr {
		body = append(body, jen.Var().Id("err").Error())
	}
	body = append(body,
		jen.Id("b").Op("=").Append(jen.Id("b"), jen.LitRune('{')),
		jen.Id("start").Op(":=").Len(jen.Id("b")),
	)
	for _, fd := range m.Fields {
		body = append(body, e.field(fd)...)
	}
	body = append(body, jen.Return(jen.Append(jen.Id("b"), jen.LitRune('}')), jen.Nil()))
	e.f.Func().Params(recv).Add(sig(jen.Id(appendMethod))).Block(body...)
}

// fieldCanFail reports whether encoding fd can return an error: strings
// (invalid UTF-8) and messages (a nested encoder, or protojson).
func fieldCanFail(fd *protogen.Field) bool {
	switch {
	case fd.Desc.IsMap():
		return fieldCanFail(fd.Message.Fields[0]) || fieldCanFail(fd.Message.Fields[1])
	default:
		k := fd.Desc.Kind()
		return k == protoreflect.StringKind || k == protoreflect.MessageKind
	}
}

// field renders one field: the member (comma, name, value) when the field
// is populated as protojson sees it.
func (e *jsonEncoder) field(fd *protogen.Field) []jen.Code {
	d := fd.Desc
	name := jen.Id("b").Op("=").Append(
		jen.Qual(payloadJSONPkg, "Sep").Call(jen.Id("b"), jen.Id("start")),
		// A raw string literal: field names are identifiers.
		jen.Op("`\""+d.TextName()+"\":`").Op("..."),
	)
	x := jen.Id("x").Dot(fd.GoName)
	switch {
	case fd.Oneof != nil && !d.ContainingOneof().IsSynthetic():
		// A oneof member is written whenever it is the one set, even
		// with its zero value (a nil wrapper sets none).
		v := jen.Id("v").Dot(fd.GoName)
		return []jen.Code{
			jen.If(jen.List(jen.Id("v"), jen.Id("ok")).Op(":=").Id("x").Dot(fd.Oneof.GoName).Assert(jen.Op("*").Id(fd.GoIdent.GoName)), jen.Id("ok").Op("&&").Id("v").Op("!=").Nil()).Block(
				append([]jen.Code{name}, e.value(fd, v)...)...,
			),
		}
	case d.IsList():
		return []jen.Code{
			jen.If(jen.Len(x.Clone()).Op(">").Lit(0)).Block(
				name,
				jen.Id("b").Op("=").Append(jen.Id("b"), jen.LitRune('[')),
				jen.For(jen.List(jen.Id("i"), jen.Id("v")).Op(":=").Range().Add(x.Clone())).Block(
					append([]jen.Code{
						jen.If(jen.Id("i").Op(">").Lit(0)).Block(jen.Id("b").Op("=").Append(jen.Id("b"), jen.LitRune(','))),
					}, e.value(fd, jen.Id("v"))...)...,
				),
				jen.Id("b").Op("=").Append(jen.Id("b"), jen.LitRune(']')),
			),
		}
	case d.IsMap():
		return []jen.Code{jen.If(jen.Len(x.Clone()).Op(">").Lit(0)).Block(append([]jen.Code{name}, e.mapBody(fd, x)...)...)}
	case d.Kind() == protoreflect.MessageKind:
		return []jen.Code{jen.If(x.Clone().Op("!=").Nil()).Block(append([]jen.Code{name}, e.value(fd, x)...)...)}
	case d.HasPresence() && d.Kind() == protoreflect.BytesKind:
		return []jen.Code{jen.If(x.Clone().Op("!=").Nil()).Block(append([]jen.Code{name}, e.value(fd, x)...)...)}
	case d.HasPresence():
		return []jen.Code{jen.If(x.Clone().Op("!=").Nil()).Block(append([]jen.Code{name}, e.value(fd, jen.Op("*").Add(x))...)...)}
	default:
		return []jen.Code{jen.If(populated(fd, x)).Block(append([]jen.Code{name}, e.value(fd, x)...)...)}
	}
}

// populated is the condition under which protojson writes a field without
// presence: its value is not the zero value. Floats compare their bits,
// so -0 is written, as protojson writes it.
func populated(fd *protogen.Field, x *jen.Statement) jen.Code {
	switch fd.Desc.Kind() {
	case protoreflect.BoolKind:
		return x.Clone()
	case protoreflect.StringKind:
		return x.Clone().Op("!=").Lit("")
	case protoreflect.BytesKind:
		return jen.Len(x.Clone()).Op(">").Lit(0)
	case protoreflect.FloatKind:
		return jen.Qual("math", "Float32bits").Call(x.Clone()).Op("!=").Lit(0)
	case protoreflect.DoubleKind:
		return jen.Qual("math", "Float64bits").Call(x.Clone()).Op("!=").Lit(0)
	default:
		return x.Clone().Op("!=").Lit(0)
	}
}

// mapBody renders a map field's object: its entries by key in the order
// protojson sorts them (false before true, numbers ascending, strings by
// code point).
func (e *jsonEncoder) mapBody(fd *protogen.Field, x *jen.Statement) []jen.Code {
	key, val := fd.Message.Fields[0], fd.Message.Fields[1]
	entry := func(k, v jen.Code) []jen.Code {
		return append([]jen.Code{
			jen.Id("b").Op("=").Qual(payloadJSONPkg, "Sep").Call(jen.Id("b"), jen.Id("open")),
			e.mapKey(fd, key, k),
		}, e.value(val, v)...)
	}
	code := []jen.Code{
		jen.Id("b").Op("=").Append(jen.Id("b"), jen.LitRune('{')),
		jen.Id("open").Op(":=").Len(jen.Id("b")),
	}
	if key.Desc.Kind() == protoreflect.BoolKind {
		code = append(code, jen.For(jen.List(jen.Id("_"), jen.Id("k")).Op(":=").Range().Index(jen.Lit(2)).Bool().Values(jen.False(), jen.True())).Block(
			append([]jen.Code{
				jen.List(jen.Id("v"), jen.Id("ok")).Op(":=").Add(x.Clone().Index(jen.Id("k"))),
				jen.If(jen.Op("!").Id("ok")).Block(jen.Continue()),
			}, entry(jen.Id("k"), jen.Id("v"))...)...,
		))
	} else {
		code = append(code, jen.For(jen.List(jen.Id("_"), jen.Id("k")).Op(":=").Range().Qual("slices", "Sorted").Call(jen.Qual("maps", "Keys").Call(x.Clone()))).Block(
			entry(jen.Id("k"), x.Clone().Index(jen.Id("k")))...,
		))
	}
	return append(code, jen.Id("b").Op("=").Append(jen.Id("b"), jen.LitRune('}')))
}

// mapKey renders a map key as the member's name: strings escaped, numbers
// and booleans in quotes.
func (e *jsonEncoder) mapKey(fd, key *protogen.Field, k jen.Code) jen.Code {
	switch key.Desc.Kind() {
	case protoreflect.StringKind:
		return jen.If(jen.List(jen.Id("b"), jen.Id("err")).Op("=").Qual(payloadJSONPkg, "AppendName").Call(jen.Id("b"), k, jen.Lit(string(fd.Desc.FullName()))), jen.Id("err").Op("!=").Nil()).Block(jen.Return(jen.Id("b"), jen.Id("err")))
	case protoreflect.BoolKind:
		return jen.Id("b").Op("=").Qual(payloadJSONPkg, "AppendBoolName").Call(jen.Id("b"), k)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return jen.Id("b").Op("=").Qual(payloadJSONPkg, "AppendUintName").Call(jen.Id("b"), jen.Uint64().Call(k))
	default:
		return jen.Id("b").Op("=").Qual(payloadJSONPkg, "AppendIntName").Call(jen.Id("b"), jen.Int64().Call(k))
	}
}

// value renders the statements appending the value v of field fd (an
// element, for repeated fields and map values) as protojson writes it.
func (e *jsonEncoder) value(fd *protogen.Field, v jen.Code) []jen.Code {
	set := func(call jen.Code) []jen.Code { return []jen.Code{jen.Id("b").Op("=").Add(call)} }
	check := func(call jen.Code) []jen.Code {
		return []jen.Code{jen.If(jen.List(jen.Id("b"), jen.Id("err")).Op("=").Add(call), jen.Id("err").Op("!=").Nil()).Block(jen.Return(jen.Id("b"), jen.Id("err")))}
	}
	b := jen.Id("b")
	switch fd.Desc.Kind() {
	case protoreflect.BoolKind:
		return set(jen.Qual(payloadJSONPkg, "AppendBool").Call(b, v))
	case protoreflect.StringKind:
		return check(jen.Qual(payloadJSONPkg, "AppendString").Call(b, v, jen.Lit(string(fd.Desc.FullName()))))
	case protoreflect.BytesKind:
		return set(jen.Qual(payloadJSONPkg, "AppendBytes").Call(b, v))
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return set(jen.Qual("strconv", "AppendInt").Call(b, jen.Int64().Call(v), jen.Lit(10)))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return set(jen.Qual("strconv", "AppendUint").Call(b, jen.Uint64().Call(v), jen.Lit(10)))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return set(jen.Qual(payloadJSONPkg, "AppendInt64").Call(b, v))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return set(jen.Qual(payloadJSONPkg, "AppendUint64").Call(b, v))
	case protoreflect.FloatKind:
		return set(jen.Qual(payloadJSONPkg, "AppendFloat").Call(b, jen.Float64().Call(v), jen.Lit(32)))
	case protoreflect.DoubleKind:
		return set(jen.Qual(payloadJSONPkg, "AppendFloat").Call(b, v, jen.Lit(64)))
	case protoreflect.EnumKind:
		return set(jen.Qual(payloadJSONPkg, "AppendEnum").Call(b, v))
	default: // messages
		if slices.Contains(e.generated, fd.Message) {
			return check(jen.Add(v).Dot(appendMethod).Call(b))
		}
		// Well-known types, messages of other files, and messages
		// without an encoder: through their own encoder if they have
		// one, protojson otherwise.
		return check(jen.Qual(payloadJSONPkg, "Append").Call(b, v))
	}
}
