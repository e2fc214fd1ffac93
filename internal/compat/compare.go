package compat

import (
	"fmt"
	"sort"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// Rule IDs. Every finding carries one; docs/compat.md explains each with an
// example and its remedy.
const (
	// RuleEventRemoved: an event of the lock is gone, or its message no
	// longer carries (events.v1.event). Never allowed: consumers still read
	// it and its topic still holds its history.
	RuleEventRemoved = "EVENT_REMOVED"
	// RuleEventTopicChanged: an event is published to another topic;
	// consumers of the old topic would silently stop receiving it.
	RuleEventTopicChanged = "EVENT_TOPIC_CHANGED"
	// RuleEventKeyChanged: an event is keyed by another field, which moves
	// keys to other partitions and breaks per-key order across the change.
	RuleEventKeyChanged = "EVENT_KEY_CHANGED"
	// RuleEventVersionChanged: an event's version changed on the same topic;
	// a new major version must be a new message on a new topic.
	RuleEventVersionChanged = "EVENT_VERSION_CHANGED"
	// RuleFieldRemoved: a field is gone without both its number and its name
	// reserved.
	RuleFieldRemoved = "FIELD_REMOVED"
	// RuleFieldRenumbered: a field keeps its name but has a new number.
	RuleFieldRenumbered = "FIELD_RENUMBERED"
	// RuleFieldNumberReused: a different field now has an old field's number
	// (or a number the old schema reserved).
	RuleFieldNumberReused = "FIELD_NUMBER_REUSED"
	// RuleFieldRenamed: a field keeps its number and type but has a new
	// name; the JSON envelope's payload carries proto field names
	// (protojson UseProtoNames), so consumers reading JSON break.
	RuleFieldRenamed = "FIELD_RENAMED"
	// RuleFieldJSONNameChanged: a field's json_name changed.
	RuleFieldJSONNameChanged = "FIELD_JSON_NAME_CHANGED"
	// RuleFieldTypeChanged: a field's type changed, including wire-compatible
	// changes such as int32 to int64 (which changes the JSON form) and a
	// different message or enum type.
	RuleFieldTypeChanged = "FIELD_TYPE_CHANGED"
	// RuleFieldCardinalityChanged: a field moved between singular, repeated
	// and map, or into, out of or between oneofs.
	RuleFieldCardinalityChanged = "FIELD_CARDINALITY_CHANGED"
	// RuleFieldPresenceChanged: a singular field's presence changed between
	// implicit, explicit (proto3 optional) and required.
	RuleFieldPresenceChanged = "FIELD_PRESENCE_CHANGED"
	// RuleFieldDefaultChanged: a field's explicit default value changed.
	RuleFieldDefaultChanged = "FIELD_DEFAULT_CHANGED"
	// RuleFieldRequiredAdded: a new field is required (proto2 required or
	// editions LEGACY_REQUIRED); events written before it lack it.
	RuleFieldRequiredAdded = "FIELD_REQUIRED_ADDED"
	// RuleReservedRemoved: a reserved number or name of a message or enum
	// is no longer reserved.
	RuleReservedRemoved = "RESERVED_REMOVED"
	// RuleEnumValueRemoved: an enum value is gone without both its number
	// and name reserved.
	RuleEnumValueRemoved = "ENUM_VALUE_REMOVED"
	// RuleEnumValueRenumbered: an enum value keeps its name but has a new
	// number.
	RuleEnumValueRenumbered = "ENUM_VALUE_RENUMBERED"
	// RuleEnumValueRenamed: an enum number is no longer reachable by an old
	// name (renamed, or an alias dropped).
	RuleEnumValueRenamed = "ENUM_VALUE_RENAMED"
)

// Rules lists every rule ID, in documentation order.
var Rules = []string{
	RuleEventRemoved, RuleEventTopicChanged, RuleEventKeyChanged, RuleEventVersionChanged,
	RuleFieldRemoved, RuleFieldRenumbered, RuleFieldNumberReused, RuleFieldRenamed,
	RuleFieldJSONNameChanged, RuleFieldTypeChanged, RuleFieldCardinalityChanged,
	RuleFieldPresenceChanged, RuleFieldDefaultChanged, RuleFieldRequiredAdded,
	RuleReservedRemoved, RuleEnumValueRemoved, RuleEnumValueRenumbered, RuleEnumValueRenamed,
}

// Compare checks the new lock against the old one and returns every breaking
// change, sorted by position then rule. newFiles, when given, are the
// descriptors the new lock was built from; they supply the source positions
// of findings (without them, or without source info, positions are 1:1).
//
// Both locks are expected to cover every event (buf generate with
// strategy: all): an event of the old lock missing from the new one is
// reported as removed.
func Compare(old, new *Lock, newFiles ...protoreflect.FileDescriptor) []Finding {
	c := &comparer{
		old: index(old), new: index(new), pos: newPositions(newFiles),
		visited: map[string]bool{},
	}
	for _, oe := range old.Events {
		c.event(oe)
	}
	sortFindings(c.findings)
	return c.findings
}

// lockIndex gives name lookups into a lock.
type lockIndex struct {
	events   map[string]Event
	messages map[string]Message
	enums    map[string]Enum
	// users maps a type name to the events that reach it, sorted.
	users map[string][]string
}

func index(l *Lock) *lockIndex {
	x := &lockIndex{events: map[string]Event{}, messages: map[string]Message{}, enums: map[string]Enum{}, users: map[string][]string{}}
	if l == nil {
		return x
	}
	for _, e := range l.Events {
		x.events[e.Name] = e
	}
	for _, m := range l.Messages {
		x.messages[m.Name] = m
	}
	for _, e := range l.Enums {
		x.enums[e.Name] = e
	}
	for _, e := range l.Events {
		seen := map[string]bool{}
		var walk func(string)
		walk = func(t string) {
			if seen[t] {
				return
			}
			seen[t] = true
			x.users[t] = append(x.users[t], e.Name)
			for _, f := range x.messages[t].Fields {
				if f.TypeName != "" {
					walk(f.TypeName)
				}
			}
		}
		walk(e.Name)
	}
	for _, u := range x.users {
		sort.Strings(u)
	}
	return x
}

// comparer accumulates findings for one Compare call.
type comparer struct {
	old, new *lockIndex
	pos      *positions
	// visited holds the types already compared: a type shared by several
	// events (or reached twice) is reported once, on the first path.
	visited  map[string]bool
	findings []Finding
}

// add appends a finding at file:line:col.
func (c *comparer) add(rule, file string, line, col int, msg, fix string) {
	c.findings = append(c.findings, Finding{Rule: rule, File: file, Line: line, Col: col, Message: msg, Fix: fix})
}

// newVersionFix is the standard remedy for a change no reader can absorb.
func newVersionFix(event string) string {
	return fmt.Sprintf("keep %s as it was; publish the change as a new message with a new major version on a new topic, with supersedes: %q, and publish both until every consumer has migrated", event, event)
}

func (c *comparer) event(oe Event) {
	ne, ok := c.new.events[oe.Name]
	if !ok {
		file, line, col := c.pos.message(oe.Name, oe.File)
		why := "is gone"
		if _, still := c.new.messages[oe.Name]; still || c.pos.decls[protoreflect.FullName(oe.Name)] != nil {
			why = "no longer carries the (events.v1.event) option"
		} else if !c.pos.hasFile(oe.File) && len(c.pos.files) > 0 {
			why = fmt.Sprintf("is gone: its file %s is not in the compiled input (deleted? buf generate must run protoc-gen-events with strategy: all)", oe.File)
		}
		if by := c.topicUsedBy(oe.Topic); by != "" {
			why += fmt.Sprintf("; its topic is now used by %s (a renamed or moved message is a new event_type to consumers)", by)
		}
		if by := c.supersededBy(oe.Name); by != "" {
			why += "; it is superseded by " + by + ", which needs it published side by side"
		}
		c.add(RuleEventRemoved, file, line, col,
			fmt.Sprintf("event %s (topic %q) %s", oe.Name, oe.Topic, why),
			fmt.Sprintf("restore %s and its (events.v1.event) option; an event is kept until every consumer has migrated off it", oe.Name))
		return
	}
	file, line, col := c.pos.eventOption(ne.Name, ne.File)
	if ne.Topic != oe.Topic {
		c.add(RuleEventTopicChanged, file, line, col,
			fmt.Sprintf("event %s: topic changed from %q to %q; consumers of %q would stop receiving it", oe.Name, oe.Topic, ne.Topic, oe.Topic),
			fmt.Sprintf("restore topic %q; to publish on %q add a new message with a new major version and supersedes: %q, and keep the old event", oe.Topic, ne.Topic, oe.Name))
	} else if ne.Version != oe.Version {
		c.add(RuleEventVersionChanged, file, line, col,
			fmt.Sprintf("event %s: version changed from %d to %d on the same topic %q", oe.Name, oe.Version, ne.Version, oe.Topic),
			fmt.Sprintf("restore version %d; a new major version is a new message on a new topic with supersedes: %q, published beside the old one", oe.Version, oe.Name))
	}
	if ne.Key != oe.Key {
		c.add(RuleEventKeyChanged, file, line, col,
			fmt.Sprintf("event %s: key changed from %q to %q; events of one key would land on other partitions and lose their order", oe.Name, oe.Key, ne.Key),
			fmt.Sprintf("restore key %q; a new key needs a new message on a new topic with supersedes: %q", oe.Key, oe.Name))
	}
	c.message(oe.Name, oe.Name, nil)
}

// topicUsedBy names the new events published on topic, if any.
func (c *comparer) topicUsedBy(topic string) string {
	var by []string
	for _, e := range c.new.events {
		if e.Topic == topic {
			by = append(by, e.Name)
		}
	}
	sort.Strings(by)
	return strings.Join(by, ", ")
}

// supersededBy names the new events that supersede name, if any.
func (c *comparer) supersededBy(name string) string {
	var by []string
	for _, e := range c.new.events {
		if e.Supersedes == name {
			by = append(by, e.Name)
		}
	}
	sort.Strings(by)
	return strings.Join(by, ", ")
}

// context describes where a type sits: the event it is reached from (and how
// many others reach it) and the field path from that event.
func (c *comparer) context(typeName, event string, path []string, field string) string {
	desc := "event " + event
	if n := len(c.old.users[typeName]); n > 1 {
		desc += fmt.Sprintf(" (and %d more)", n-1)
	}
	if len(path) > 0 {
		p := append([]string(nil), path...)
		if field != "" {
			p = append(p, field)
		}
		desc += ", path " + strings.Join(p, ".")
	}
	return desc
}

// message compares the old and new schema of message name, reached from an
// event through path (field names).
func (c *comparer) message(name, event string, path []string) {
	if c.visited[name] {
		return
	}
	c.visited[name] = true
	om, ok1 := c.old.messages[name]
	nm, ok2 := c.new.messages[name]
	if !ok1 || !ok2 {
		return
	}
	oldByNum, newByNum := map[int32]Field{}, map[int32]Field{}
	newByName := map[string]Field{}
	for _, f := range om.Fields {
		oldByNum[f.Number] = f
	}
	for _, f := range nm.Fields {
		newByNum[f.Number] = f
		newByName[f.Name] = f
	}
	oldReserved := parseRanges(om.ReservedRanges)
	newReserved := parseRanges(nm.ReservedRanges)
	type child struct {
		typeName, field string
		enum            bool
	}
	var children []child
	for _, of := range om.Fields {
		fq := name + "." + of.Name
		ctx, ev := c.context(name, event, path, of.Name), event
		nf, ok := newByNum[of.Number]
		if !ok {
			if moved, ok := newByName[of.Name]; ok {
				file, line, col := c.pos.field(name, moved.Number, nm.File)
				c.add(RuleFieldRenumbered, file, line, col,
					fmt.Sprintf("field %s (%s): number changed from %d to %d", fq, ctx, of.Number, moved.Number),
					fmt.Sprintf("restore %s = %d; %s", of.Name, of.Number, newVersionFix(ev)))
				continue
			}
			numRes, nameRes := inRanges(newReserved, of.Number), contains(nm.ReservedNames, of.Name)
			if numRes && nameRes {
				continue
			}
			var missing []string
			if !numRes {
				missing = append(missing, fmt.Sprintf("reserved %d;", of.Number))
			}
			if !nameRes {
				missing = append(missing, fmt.Sprintf("reserved %q;", of.Name))
			}
			file, line, col := c.pos.message(name, nm.File)
			c.add(RuleFieldRemoved, file, line, col,
				fmt.Sprintf("field %s = %d (%s) removed without reserving its number and name", fq, of.Number, ctx),
				fmt.Sprintf("restore the field, or add %s to %s so neither is reused", strings.Join(missing, " "), name))
			continue
		}
		file, line, col := c.pos.field(name, nf.Number, nm.File)
		if nf.Name != of.Name {
			if _, moved := newByName[of.Name]; moved || !sameShape(of, nf) {
				c.add(RuleFieldNumberReused, file, line, col,
					fmt.Sprintf("field %s.%s = %d (%s) reuses the number of old field %s (%s)", name, nf.Name, nf.Number, ctx, of.Name, describe(of)),
					fmt.Sprintf("give %s a new number and add reserved %d; reserved %q; for the old field", nf.Name, of.Number, of.Name))
				continue
			}
			c.add(RuleFieldRenamed, file, line, col,
				fmt.Sprintf("field %s = %d (%s) renamed to %q, was %q (the JSON envelope's payload carries proto field names)", fq, of.Number, ctx, nf.Name, of.Name),
				fmt.Sprintf("restore the name %s; %s", of.Name, newVersionFix(ev)))
		} else if nf.JSONName != of.JSONName {
			c.add(RuleFieldJSONNameChanged, file, line, col,
				fmt.Sprintf("field %s (%s): json_name changed from %q to %q", fq, ctx, of.JSONName, nf.JSONName),
				fmt.Sprintf("restore json_name %q; %s", of.JSONName, newVersionFix(ev)))
		}
		typeSame := of.Type == nf.Type && of.TypeName == nf.TypeName && (of.Label != "map" || nf.Label != "map" || of.MapKey == nf.MapKey)
		if !typeSame {
			c.add(RuleFieldTypeChanged, file, line, col,
				fmt.Sprintf("field %s (%s): type changed from %s to %s", fq, ctx, typeOf(of), typeOf(nf)),
				fmt.Sprintf("restore type %s; %s", typeOf(of), newVersionFix(ev)))
		}
		switch {
		case of.Label != nf.Label || of.Oneof != nf.Oneof:
			c.add(RuleFieldCardinalityChanged, file, line, col,
				fmt.Sprintf("field %s (%s): cardinality changed from %s to %s", fq, ctx, cardinality(of), cardinality(nf)),
				fmt.Sprintf("restore it as %s; %s", cardinality(of), newVersionFix(ev)))
		case of.Presence != nf.Presence:
			c.add(RuleFieldPresenceChanged, file, line, col,
				fmt.Sprintf("field %s (%s): presence changed from %s to %s", fq, ctx, of.Presence, nf.Presence),
				fmt.Sprintf("restore %s presence; %s", of.Presence, newVersionFix(ev)))
		}
		if defaultChanged(of, nf) {
			restore := fmt.Sprintf("restore default %q", of.Default)
			if of.Type == "enum" && nf.Type == "enum" && of.Default != "" {
				restore = fmt.Sprintf("restore default %q (set [default = %s] on the field, or declare %s first in %s again)",
					of.Default, of.Default, of.Default, nf.TypeName)
			}
			c.add(RuleFieldDefaultChanged, file, line, col,
				fmt.Sprintf("field %s (%s): default changed from %q to %q", fq, ctx, of.Default, nf.Default),
				fmt.Sprintf("%s; %s", restore, newVersionFix(ev)))
		}
		if typeSame && of.TypeName != "" {
			children = append(children, child{of.TypeName, of.Name, of.Type == "enum"})
		}
	}
	for _, nf := range nm.Fields {
		if _, existed := oldByNum[nf.Number]; existed {
			continue
		}
		file, line, col := c.pos.field(name, nf.Number, nm.File)
		ctx := c.context(name, event, path, nf.Name)
		if inRanges(oldReserved, nf.Number) {
			c.add(RuleFieldNumberReused, file, line, col,
				fmt.Sprintf("field %s.%s = %d (%s) uses a number the old schema reserved", name, nf.Name, nf.Number, ctx),
				fmt.Sprintf("give %s an unused number and restore reserved %d", nf.Name, nf.Number))
		} else if nf.Presence == "required" {
			c.add(RuleFieldRequiredAdded, file, line, col,
				fmt.Sprintf("new field %s.%s = %d (%s) is required; events written before it lack it", name, nf.Name, nf.Number, ctx),
				"make the field optional: required fields can never be added to an event")
		}
	}
	c.reserved(name, om.ReservedRanges, nm.ReservedRanges, om.ReservedNames, nm.ReservedNames, newByNum, newByName, func() (string, int, int) {
		return c.pos.message(name, nm.File)
	}, event, path)
	for _, ch := range children {
		p := append(append([]string(nil), path...), ch.field)
		if ch.enum {
			c.enum(ch.typeName, event, p)
		} else {
			c.message(ch.typeName, event, p)
		}
	}
}

// reserved reports reserved numbers and names of the old schema that the new
// one no longer reserves (numbers now used by a field are reported as
// FIELD_NUMBER_REUSED by the field rules instead).
func (c *comparer) reserved(typeName string, oldRanges, newRanges, oldNames, newNames []string,
	usedNum map[int32]Field, usedName map[string]Field, where func() (string, int, int), event string, path []string) {
	nr := parseRanges(newRanges)
	ctx := c.context(typeName, event, path, "")
	for _, s := range oldRanges {
		a, b, _ := parseRange(s)
		gaps := uncovered(a, b, nr, usedNum)
		if len(gaps) > 0 {
			f, l, col := where()
			c.add(RuleReservedRemoved, f, l, col,
				fmt.Sprintf("%s (%s): reserved number(s) %s no longer reserved", typeName, ctx, strings.Join(gaps, ", ")),
				fmt.Sprintf("restore reserved %s in %s", s, typeName))
		}
	}
	for _, n := range oldNames {
		if contains(newNames, n) {
			continue
		}
		f, l, col := where()
		msg := fmt.Sprintf("%s (%s): reserved name %q is no longer reserved", typeName, ctx, n)
		if _, used := usedName[n]; used {
			msg += " and is used again"
		}
		c.add(RuleReservedRemoved, f, l, col, msg,
			fmt.Sprintf("restore reserved %q in %s and name the new element differently", n, typeName))
	}
}

// enum compares the old and new schema of enum name.
func (c *comparer) enum(name, event string, path []string) {
	if c.visited[name] {
		return
	}
	c.visited[name] = true
	oe, ok1 := c.old.enums[name]
	ne, ok2 := c.new.enums[name]
	if !ok1 || !ok2 {
		return
	}
	newByName := map[string]EnumValue{}
	newByNum := map[int32][]string{}
	for _, v := range ne.Values {
		newByName[v.Name] = v
		newByNum[v.Number] = append(newByNum[v.Number], v.Name)
	}
	newReserved := parseRanges(ne.ReservedRanges)
	ctx, ev := c.context(name, event, path, ""), event
	for _, ov := range oe.Values {
		if nv, ok := newByName[ov.Name]; ok {
			if nv.Number != ov.Number {
				file, line, col := c.pos.enumValue(name, nv.Name, ne.File)
				c.add(RuleEnumValueRenumbered, file, line, col,
					fmt.Sprintf("enum value %s.%s (%s): number changed from %d to %d", name, ov.Name, ctx, ov.Number, nv.Number),
					fmt.Sprintf("restore %s = %d; %s", ov.Name, ov.Number, newVersionFix(ev)))
			}
			continue
		}
		if names := newByNum[ov.Number]; len(names) > 0 {
			file, line, col := c.pos.enumValue(name, names[0], ne.File)
			c.add(RuleEnumValueRenamed, file, line, col,
				fmt.Sprintf("enum value %s.%s = %d (%s) is now named %s; the JSON envelope carries the name", name, ov.Name, ov.Number, ctx, strings.Join(names, ", ")),
				fmt.Sprintf("restore the name %s; if the new name must stay, keep %s beside it as an alias (option allow_alias = true)", ov.Name, ov.Name))
			continue
		}
		numRes, nameRes := inRanges(newReserved, ov.Number), contains(ne.ReservedNames, ov.Name)
		if numRes && nameRes {
			continue
		}
		var missing []string
		if !numRes {
			missing = append(missing, fmt.Sprintf("reserved %d;", ov.Number))
		}
		if !nameRes {
			missing = append(missing, fmt.Sprintf("reserved %q;", ov.Name))
		}
		file, line, col := c.pos.enumValue(name, "", ne.File)
		c.add(RuleEnumValueRemoved, file, line, col,
			fmt.Sprintf("enum value %s.%s = %d (%s) removed without reserving its number and name", name, ov.Name, ov.Number, ctx),
			fmt.Sprintf("restore the value, or add %s to %s so neither is reused", strings.Join(missing, " "), name))
	}
	usedNum := map[int32]Field{}
	usedName := map[string]Field{}
	for _, v := range ne.Values {
		usedName[v.Name] = Field{}
	}
	// Enum values may reuse reserved numbers only by dropping the
	// reservation, which is what RESERVED_REMOVED reports: pass no used
	// numbers so that reuse counts as removal.
	c.reserved(name, oe.ReservedRanges, ne.ReservedRanges, oe.ReservedNames, ne.ReservedNames, usedNum, usedName, func() (string, int, int) {
		return c.pos.enumValue(name, "", ne.File)
	}, event, path)
}

// sameShape reports whether two fields differ at most in name: same type,
// cardinality and presence. A renumbered-in-place field of the same shape is
// a rename; anything else is a different field reusing the number.
func sameShape(a, b Field) bool {
	return a.Type == b.Type && a.TypeName == b.TypeName && a.MapKey == b.MapKey &&
		a.Label == b.Label && a.Presence == b.Presence && a.Oneof == b.Oneof
}

// typeOf renders a field's type as in .proto source.
func typeOf(f Field) string {
	t := f.Type
	switch {
	case f.Type == "group":
		t = "group " + f.TypeName // editions DELIMITED or proto2 group
	case f.TypeName != "":
		t = f.TypeName
	}
	if f.Label == "map" {
		return fmt.Sprintf("map<%s, %s>", f.MapKey, t)
	}
	return t
}

// cardinality renders a field's label and oneof membership.
func cardinality(f Field) string {
	s := f.Label
	if f.Oneof != "" {
		s += " in oneof " + f.Oneof
	}
	return s
}

// describe renders a field for messages about another field.
func describe(f Field) string {
	return strings.TrimSpace(fmt.Sprintf("%s %s", cardinality(f), typeOf(f)))
}

// numRange is an inclusive range of numbers.
type numRange struct{ start, end int32 }

func parseRanges(rs []string) []numRange {
	out := make([]numRange, 0, len(rs))
	for _, s := range rs {
		if a, b, err := parseRange(s); err == nil {
			out = append(out, numRange{a, b})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start < out[j].start })
	return out
}

func inRanges(rs []numRange, n int32) bool {
	for _, r := range rs {
		if n >= r.start && n <= r.end {
			return true
		}
	}
	return false
}

// uncovered returns the parts of [a, b] that are neither in rs nor used
// numbers, formatted as ranges. Used numbers are skipped: their reuse is
// reported by the field rules.
func uncovered(a, b int32, rs []numRange, used map[int32]Field) []string {
	type span struct{ start, end int64 }
	var gaps []span
	cur := int64(a)
	for _, r := range rs {
		if int64(r.end) < cur || r.start > b {
			continue
		}
		if int64(r.start) > cur {
			gaps = append(gaps, span{cur, int64(r.start) - 1})
		}
		if int64(r.end)+1 > cur {
			cur = int64(r.end) + 1
		}
	}
	if cur <= int64(b) {
		gaps = append(gaps, span{cur, int64(b)})
	}
	nums := make([]int64, 0, len(used))
	for n := range used {
		nums = append(nums, int64(n))
	}
	sort.Slice(nums, func(i, j int) bool { return nums[i] < nums[j] })
	var out []string
	for _, g := range gaps {
		from := g.start
		for _, n := range nums {
			if n < from || n > g.end {
				continue
			}
			if n > from {
				out = append(out, formatRange(int32(from), int32(n-1)))
			}
			from = n + 1
		}
		if from <= g.end {
			out = append(out, formatRange(int32(from), int32(g.end)))
		}
	}
	return out
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// defaultChanged reports whether the effective default of a field differs
// between the old and the new lock. Scalar defaults are compared with zero
// values folded to "" (locks written before that normalisation may record
// `[default = 0]` as "0"). An enum field with no default in the old lock but
// one in the new is not reported: locks written before closed-enum defaults
// were recorded left them empty, and a lock written since leaves a field's
// enum default empty only when the enum is open, whose default (the value
// numbered 0) cannot change by reordering.
func defaultChanged(of, nf Field) bool {
	od, nd := normalizeDefault(of.Type, of.Default), normalizeDefault(nf.Type, nf.Default)
	if od == nd {
		return false
	}
	if of.Type == "enum" && nf.Type == "enum" && od == "" {
		return false
	}
	return true
}
