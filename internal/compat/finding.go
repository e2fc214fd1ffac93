package compat

import (
	"fmt"
	"sort"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/protoevents/protoevents/runtime/eventsv1"
)

// Finding is one breaking change: which rule it breaks, where in the new
// schema it is, what changed and how to make the change safely.
type Finding struct {
	// Rule is the rule's ID, e.g. FIELD_TYPE_CHANGED (see the Rule*
	// constants).
	Rule string
	// File is the .proto file (import path) the change is in.
	File string
	// Line and Col are the 1-based position of the changed element in the
	// new schema; 1:1 when the new schema carries no source positions or
	// the element is gone with its file.
	Line, Col int
	// Message names the file's message/field/enum value and the change.
	Message string
	// Fix is the remedy.
	Fix string
}

// String formats f as "file:line:col: RULE_ID: message (fix: …)", the form
// editors and CI annotators recognise.
func (f Finding) String() string {
	return fmt.Sprintf("%s:%d:%d: %s: %s (fix: %s)", f.File, f.Line, f.Col, f.Rule, f.Message, f.Fix)
}

// sortFindings orders findings by position, then rule, then message, so
// output is stable across runs.
func sortFindings(fs []Finding) {
	sort.SliceStable(fs, func(i, j int) bool {
		a, b := fs[i], fs[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		if a.Col != b.Col {
			return a.Col < b.Col
		}
		if a.Rule != b.Rule {
			return a.Rule < b.Rule
		}
		return a.Message < b.Message
	})
}

// positions finds source positions of named elements in the new schema's
// files.
type positions struct {
	files map[string]protoreflect.FileDescriptor
	decls map[protoreflect.FullName]protoreflect.Descriptor
}

// newPositions indexes the messages and enums of files by full name.
func newPositions(files []protoreflect.FileDescriptor) *positions {
	p := &positions{files: map[string]protoreflect.FileDescriptor{}, decls: map[protoreflect.FullName]protoreflect.Descriptor{}}
	var addEnums func(es protoreflect.EnumDescriptors)
	addEnums = func(es protoreflect.EnumDescriptors) {
		for i := 0; i < es.Len(); i++ {
			p.decls[es.Get(i).FullName()] = es.Get(i)
		}
	}
	var addMessages func(ms protoreflect.MessageDescriptors)
	addMessages = func(ms protoreflect.MessageDescriptors) {
		for i := 0; i < ms.Len(); i++ {
			md := ms.Get(i)
			p.decls[md.FullName()] = md
			addEnums(md.Enums())
			addMessages(md.Messages())
		}
	}
	for _, f := range files {
		p.files[f.Path()] = f
		addEnums(f.Enums())
		addMessages(f.Messages())
	}
	return p
}

// at returns the file and 1-based position of d.
func at(d protoreflect.Descriptor) (string, int, int) {
	f := d.ParentFile()
	loc := f.SourceLocations().ByDescriptor(d)
	if len(loc.Path) == 0 {
		return f.Path(), 1, 1
	}
	return f.Path(), loc.StartLine + 1, loc.StartColumn + 1
}

// message locates a message by full name; fallback is the file to name when
// it is not in the new schema.
func (p *positions) message(name, fallback string) (string, int, int) {
	if md, ok := p.decls[protoreflect.FullName(name)].(protoreflect.MessageDescriptor); ok {
		return at(md)
	}
	return p.file(fallback)
}

// eventOption locates the (events.v1.event) option of a message, or the
// message itself.
func (p *positions) eventOption(name, fallback string) (string, int, int) {
	md, ok := p.decls[protoreflect.FullName(name)].(protoreflect.MessageDescriptor)
	if !ok {
		return p.file(fallback)
	}
	f := md.ParentFile()
	msgLoc := f.SourceLocations().ByDescriptor(md)
	if len(msgLoc.Path) > 0 {
		// DescriptorProto.options = 7, then the extension's field number.
		path := append(append(protoreflect.SourcePath(nil), msgLoc.Path...), 7)
		path = append(path, int32(eventsv1.E_Event.TypeDescriptor().Number()))
		if loc := f.SourceLocations().ByPath(path); len(loc.Path) > 0 {
			return f.Path(), loc.StartLine + 1, loc.StartColumn + 1
		}
	}
	return at(md)
}

// field locates field number n of a message, or the message itself.
func (p *positions) field(msg string, n int32, fallback string) (string, int, int) {
	if md, ok := p.decls[protoreflect.FullName(msg)].(protoreflect.MessageDescriptor); ok {
		if fd := md.Fields().ByNumber(protoreflect.FieldNumber(n)); fd != nil {
			return at(fd)
		}
		return at(md)
	}
	return p.file(fallback)
}

// enumValue locates a value of an enum by name, or the enum itself.
func (p *positions) enumValue(enum, value, fallback string) (string, int, int) {
	if ed, ok := p.decls[protoreflect.FullName(enum)].(protoreflect.EnumDescriptor); ok {
		if vd := ed.Values().ByName(protoreflect.Name(value)); vd != nil && value != "" {
			return at(vd)
		}
		return at(ed)
	}
	return p.file(fallback)
}

// file locates a file's package statement, or 1:1 when the file is gone or
// has no positions.
func (p *positions) file(path string) (string, int, int) {
	f, ok := p.files[path]
	if !ok {
		return path, 1, 1
	}
	loc := f.SourceLocations().ByPath(protoreflect.SourcePath{2}) // package
	if len(loc.Path) == 0 {
		return path, 1, 1
	}
	return path, loc.StartLine + 1, loc.StartColumn + 1
}

// hasFile reports whether path is part of the new schema's files.
func (p *positions) hasFile(path string) bool {
	_, ok := p.files[path]
	return ok
}
