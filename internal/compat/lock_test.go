package compat

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// lockWith builds a lock with one event over message m (plus extra types).
func lockWith(m Message, enums ...Enum) *Lock {
	return &Lock{
		Format:   LockFormat,
		Events:   []Event{{Name: m.Name, File: m.File, Topic: "t.v1", Key: "id", Version: 1, DLQTopic: "t.v1.dlq"}},
		Messages: []Message{m},
		Enums:    enums,
	}
}

func str(name string, n int32) Field {
	return Field{Name: name, Number: n, JSONName: name, Label: "singular", Type: "string", Presence: "implicit"}
}

// TestCompareLocks covers rule logic that .proto pairs reach only awkwardly.
func TestCompareLocks(t *testing.T) {
	status := func(vals ...EnumValue) Enum { return Enum{Name: "p.S", File: "p.proto", Values: vals} }
	withEnum := func(e Enum) *Lock {
		f := Field{Name: "s", Number: 2, JSONName: "s", Label: "singular", Type: "enum", TypeName: "p.S", Presence: "implicit"}
		return lockWith(Message{Name: "p.E", File: "p.proto", Fields: []Field{str("id", 1), f}}, e)
	}
	withDefault := func(kind, typeName, def string) *Lock {
		f := Field{Name: "s", Number: 2, JSONName: "s", Label: "singular", Type: kind, TypeName: typeName, Presence: "explicit", Default: def}
		var enums []Enum
		if kind == "enum" {
			enums = append(enums, status(EnumValue{"S_A", 1}, EnumValue{"S_B", 2}))
		}
		return lockWith(Message{Name: "p.E", File: "p.proto", Fields: []Field{str("id", 1), f}}, enums...)
	}
	for _, tc := range []struct {
		name     string
		old, new *Lock
		want     []string
		contains string
	}{
		{
			name: "swapped numbers are two reuses",
			old:  lockWith(Message{Name: "p.E", File: "p.proto", Fields: []Field{str("a", 1), str("b", 2)}}),
			new:  lockWith(Message{Name: "p.E", File: "p.proto", Fields: []Field{str("b", 1), str("a", 2)}}),
			want: []string{RuleFieldNumberReused, RuleFieldNumberReused},
		},
		{
			name:     "shrunk reserved range",
			old:      lockWith(Message{Name: "p.E", File: "p.proto", Fields: []Field{str("id", 1)}, ReservedRanges: []string{"10-20"}}),
			new:      lockWith(Message{Name: "p.E", File: "p.proto", Fields: []Field{str("id", 1), str("x", 17)}, ReservedRanges: []string{"10-15"}}),
			want:     []string{RuleFieldNumberReused, RuleReservedRemoved},
			contains: "reserved number(s) 16, 18-20 no longer reserved",
		},
		{
			name: "reserved range split by new reservations stays covered",
			old:  lockWith(Message{Name: "p.E", File: "p.proto", Fields: []Field{str("id", 1)}, ReservedRanges: []string{"10-max"}}),
			new:  lockWith(Message{Name: "p.E", File: "p.proto", Fields: []Field{str("id", 1)}, ReservedRanges: []string{"10-100", "101-max"}}),
		},
		{
			name:     "enum alias dropped",
			old:      withEnum(status(EnumValue{"S_UNKNOWN", 0}, EnumValue{"S_A", 1}, EnumValue{"S_B", 1})),
			new:      withEnum(status(EnumValue{"S_UNKNOWN", 0}, EnumValue{"S_A", 1})),
			want:     []string{RuleEnumValueRenamed},
			contains: "S_B = 1 (event p.E, path s) is now named S_A",
		},
		{
			name: "enum alias added",
			old:  withEnum(status(EnumValue{"S_UNKNOWN", 0}, EnumValue{"S_A", 1})),
			new:  withEnum(status(EnumValue{"S_UNKNOWN", 0}, EnumValue{"S_A", 1}, EnumValue{"S_B", 1})),
		},
		{
			name:     "negative enum reserved range removed",
			old:      withEnum(Enum{Name: "p.S", File: "p.proto", Values: []EnumValue{{"S_UNKNOWN", 0}}, ReservedRanges: []string{"-5--2"}}),
			new:      withEnum(status(EnumValue{"S_UNKNOWN", 0})),
			want:     []string{RuleReservedRemoved},
			contains: "-5--2",
		},
		{
			name: "dlq topic and supersedes may change",
			old:  lockWith(Message{Name: "p.E", File: "p.proto", Fields: []Field{str("id", 1)}}),
			new: func() *Lock {
				l := lockWith(Message{Name: "p.E", File: "p.proto", Fields: []Field{str("id", 1)}})
				l.Events[0].DLQTopic = "x"
				return l
			}(),
		},
		{
			// Locks written before closed-enum defaults were recorded
			// leave them empty; upgrading must not report every such field.
			name: "closed enum default first recorded",
			old:  withDefault("enum", "p.S", ""),
			new:  withDefault("enum", "p.S", "S_A"),
		},
		{
			name:     "closed enum default changed",
			old:      withDefault("enum", "p.S", "S_A"),
			new:      withDefault("enum", "p.S", "S_B"),
			want:     []string{RuleFieldDefaultChanged},
			contains: `declare S_A first in p.S`,
		},
		{
			name:     "closed enum default dropped",
			old:      withDefault("enum", "p.S", "S_A"),
			new:      withDefault("enum", "p.S", ""),
			want:     []string{RuleFieldDefaultChanged},
			contains: `default changed from "S_A" to ""`,
		},
		{
			// Older locks recorded an explicit [default = 0] as "0".
			name: "explicit zero default recorded by an older lock",
			old:  withDefault("int32", "", "0"),
			new:  withDefault("int32", "", ""),
		},
		{
			name: "explicit false default recorded by an older lock",
			old:  withDefault("bool", "", "false"),
			new:  withDefault("bool", "", ""),
		},
		{
			name: "string default \"0\" is not the zero value",
			old:  withDefault("string", "", "0"),
			new:  withDefault("string", "", ""),
			want: []string{RuleFieldDefaultChanged},
		},
		{
			name: "float default -0 is not the zero value",
			old:  withDefault("float", "", ""),
			new:  withDefault("float", "", "-0"),
			want: []string{RuleFieldDefaultChanged},
		},
		{
			name:     "event file missing from the request",
			old:      lockWith(Message{Name: "p.E", File: "p.proto", Fields: []Field{str("id", 1)}}),
			new:      &Lock{Format: LockFormat},
			want:     []string{RuleEventRemoved},
			contains: "strategy: all",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// One unrelated file stands for "the compiled input" so that
			// the missing-file hint can be given.
			files := compileDir(t, filepath.Join(corpusDir, "proto2_default_changed", "after"))
			fs := Compare(tc.old, tc.new, files...)
			if got := slices.Sorted(slices.Values(ruleIDs(fs))); !slices.Equal(got, slices.Sorted(slices.Values(tc.want))) {
				t.Errorf("rules = %v, want %v\n%s", got, tc.want, lines(fs))
			}
			if tc.contains != "" && !strings.Contains(lines(fs), tc.contains) {
				t.Errorf("findings do not mention %q:\n%s", tc.contains, lines(fs))
			}
		})
	}
}

// TestParseLockRefuses: locks that are not exactly what Marshal writes fail
// loudly.
func TestParseLockRefuses(t *testing.T) {
	for _, tc := range []struct{ data, want string }{
		{`{"format":1,"events":[],"messages":[],"enums":[],"extra":1}`, "unknown field"},
		{`{"format":2,"events":[],"messages":[],"enums":[]}`, "format 2"},
		{`{"format":1,"events":[],"messages":[],"enums":[]} {}`, "trailing data"},
		{`{"format":1,"events":[],"messages":[{"name":"a.B","file":"a.proto","fields":[],"reserved_ranges":["9-3"]}],"enums":[]}`, "bad reserved range"},
		{`[]`, "parse lock"},
	} {
		if _, err := ParseLock([]byte(tc.data)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseLock(%s) = %v, want error containing %q", tc.data, err, tc.want)
		}
	}
}

// TestFindingString pins the output format.
func TestFindingString(t *testing.T) {
	f := Finding{Rule: RuleFieldTypeChanged, File: "a/b.proto", Line: 3, Col: 5, Message: "field a.B.c: type changed", Fix: "restore it"}
	if got, want := f.String(), "a/b.proto:3:5: FIELD_TYPE_CHANGED: field a.B.c: type changed (fix: restore it)"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

// TestMarshalSortsWithoutMutating: Marshal writes sorted output for a lock
// built out of order, leaves the lock as it was, and ParseLock reads it back.
func TestMarshalSortsWithoutMutating(t *testing.T) {
	l := &Lock{
		Format:   LockFormat,
		Events:   []Event{{Name: "p.Z"}, {Name: "p.A"}},
		Messages: []Message{{Name: "p.Z", Fields: []Field{str("b", 2), str("a", 1)}, ReservedRanges: []string{"20", "5-7"}, ReservedNames: []string{"y", "x"}}},
		Enums:    []Enum{{Name: "p.E", Values: []EnumValue{{"E_B", 1}, {"E_A", 1}, {"E_Z", 0}}}},
	}
	data, err := l.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if l.Events[0].Name != "p.Z" || l.Messages[0].Fields[0].Name != "b" || l.Enums[0].Values[0].Name != "E_B" {
		t.Error("Marshal reordered the lock it was given")
	}
	s := string(data)
	for _, order := range [][2]string{{`"p.A"`, `"p.Z"`}, {`"name": "a"`, `"name": "b"`}, {`"5-7"`, `"20"`}, {`"x"`, `"y"`}, {`"E_Z"`, `"E_A"`}, {`"E_A"`, `"E_B"`}} {
		if i, j := strings.Index(s, order[0]), strings.Index(s, order[1]); i < 0 || j < 0 || i > j {
			t.Errorf("%s not before %s in:\n%s", order[0], order[1], s)
		}
	}
	back, err := ParseLock(data)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := back.Marshal()
	if string(again) != s {
		t.Error("parse/marshal round trip changed the lock")
	}
}
