package catalog

import (
	"google.golang.org/protobuf/reflect/protoreflect"
)

// This file maps Protobuf types to JSON Schema as the JSON envelope carries
// payloads: protojson with the proto field names (envelope.New), so 64-bit
// integers are strings, enums their value names, bytes base64 and the
// well-known types their special JSON forms.

// schemaRef is the JSON pointer of a component schema.
func schemaRef(name string) map[string]any {
	return map[string]any{"$ref": "#/components/schemas/" + name}
}

// addSchema records the schema of md and of every message and enum it
// reaches.
func (c *Catalog) addSchema(md protoreflect.MessageDescriptor) {
	name := string(md.FullName())
	if _, ok := c.Schemas[name]; ok {
		return
	}
	if wk := wellKnown(md); wk != nil {
		c.Schemas[name] = wk
		return
	}
	s := map[string]any{"type": "object", "title": string(md.Name())}
	c.Schemas[name] = s // before recursing: messages may refer to themselves
	if d := comment(md); d != "" {
		s["description"] = d
	}
	props := map[string]any{}
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		fs := c.fieldSchema(fd)
		if d := comment(fd); d != "" {
			fs = map[string]any{"allOf": []any{fs}, "description": d}
		}
		props[string(fd.Name())] = fs
	}
	s["properties"] = props
}

// fieldSchema is the schema of one field's JSON value.
func (c *Catalog) fieldSchema(fd protoreflect.FieldDescriptor) map[string]any {
	switch {
	case fd.IsMap():
		return map[string]any{"type": "object", "additionalProperties": c.valueSchema(fd.MapValue())}
	case fd.IsList():
		return map[string]any{"type": "array", "items": c.valueSchema(fd)}
	}
	return c.valueSchema(fd)
}

// valueSchema is the schema of one singular value of fd's type.
func (c *Catalog) valueSchema(fd protoreflect.FieldDescriptor) map[string]any {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return map[string]any{"type": "string"}
	case protoreflect.BytesKind:
		return map[string]any{"type": "string", "contentEncoding": "base64"}
	case protoreflect.BoolKind:
		return map[string]any{"type": "boolean"}
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return map[string]any{"type": "integer", "format": "int32"}
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return map[string]any{"type": "integer", "format": "int32", "minimum": 0}
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return map[string]any{"type": "string", "format": "int64", "pattern": "^-?[0-9]+$"}
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return map[string]any{"type": "string", "format": "uint64", "pattern": "^[0-9]+$"}
	case protoreflect.FloatKind:
		return map[string]any{"type": "number", "format": "float"}
	case protoreflect.DoubleKind:
		return map[string]any{"type": "number", "format": "double"}
	case protoreflect.EnumKind:
		ed := fd.Enum()
		name := string(ed.FullName())
		if _, ok := c.Schemas[name]; !ok {
			var values []any
			for i := 0; i < ed.Values().Len(); i++ {
				values = append(values, string(ed.Values().Get(i).Name()))
			}
			s := map[string]any{"type": "string", "title": string(ed.Name()), "enum": values}
			if d := comment(ed); d != "" {
				s["description"] = d
			}
			c.Schemas[name] = s
		}
		return schemaRef(name)
	case protoreflect.MessageKind, protoreflect.GroupKind:
		c.addSchema(fd.Message())
		return schemaRef(string(fd.Message().FullName()))
	}
	return map[string]any{}
}

// wellKnown returns the JSON form of a google.protobuf type with a special
// protojson mapping, or nil.
func wellKnown(md protoreflect.MessageDescriptor) map[string]any {
	switch md.FullName() {
	case "google.protobuf.Timestamp":
		return map[string]any{"type": "string", "format": "date-time"}
	case "google.protobuf.Duration":
		return map[string]any{"type": "string", "pattern": "^-?[0-9]+(\\.[0-9]+)?s$"}
	case "google.protobuf.FieldMask":
		return map[string]any{"type": "string"}
	case "google.protobuf.Struct":
		return map[string]any{"type": "object"}
	case "google.protobuf.ListValue":
		return map[string]any{"type": "array"}
	case "google.protobuf.Value", "google.protobuf.Any":
		return map[string]any{}
	case "google.protobuf.Empty":
		return map[string]any{"type": "object", "maxProperties": 0}
	case "google.protobuf.StringValue":
		return map[string]any{"type": "string"}
	case "google.protobuf.BytesValue":
		return map[string]any{"type": "string", "contentEncoding": "base64"}
	case "google.protobuf.BoolValue":
		return map[string]any{"type": "boolean"}
	case "google.protobuf.Int32Value", "google.protobuf.UInt32Value":
		return map[string]any{"type": "integer"}
	case "google.protobuf.Int64Value", "google.protobuf.UInt64Value":
		return map[string]any{"type": "string", "pattern": "^-?[0-9]+$"}
	case "google.protobuf.FloatValue", "google.protobuf.DoubleValue":
		return map[string]any{"type": "number"}
	}
	return nil
}
