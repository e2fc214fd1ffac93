package sqlident

import (
	"strings"
	"testing"
)

func TestParseTable(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{in: "outbox", want: `"outbox"`},
		{in: "app.outbox", want: `"app"."outbox"`},
		{in: "_x9", want: `"_x9"`},
		{in: "a.b.c", err: "want table or schema.table"},
		{in: "9lives", err: `"9lives" is not a plain identifier`},
		{in: `out"box`, err: "not a plain identifier"},
		{in: "app.", err: `"" is not a plain identifier`},
		{in: strings.Repeat("x", MaxLen+1), err: "at most 63 bytes"},
	} {
		got, err := ParseTable(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseTable(%q) = %v, %v; want an error saying %q", tc.in, got, err, tc.err)
		case tc.err == "" && (err != nil || got.Sanitize() != tc.want || got.String() != tc.in):
			t.Errorf("ParseTable(%q) = %s (%s), %v; want %s", tc.in, got.Sanitize(), got, err, tc.want)
		}
	}
}

func TestDerivedAndSibling(t *testing.T) {
	long := strings.Repeat("t", MaxLen)
	if d := Derived(long, "_idx"); len(d) > MaxLen || !strings.HasSuffix(d, "_idx") || d == Derived(long[:MaxLen-1]+"u", "_idx") {
		t.Fatalf("Derived of a long name: %q", d)
	}
	if d := Derived("outbox", "_idx"); d != "outbox_idx" {
		t.Fatalf("Derived = %q", d)
	}
	tbl := Table{Schema: "app", Name: "sagas"}
	if h, err := tbl.Sibling("_history"); err != nil || h.String() != "app.sagas_history" {
		t.Fatalf("Sibling = %v, %v", h, err)
	}
	if _, err := (Table{Name: long}).Sibling("_history"); err == nil {
		t.Fatal("a sibling over MaxLen was accepted")
	}
	if l := Literal("it's"); l != "'it''s'" {
		t.Fatalf("Literal = %s", l)
	}
}

func TestCheckSlotAndName(t *testing.T) {
	for _, ok := range []string{"protoevents", "relay_1", "0abc"} {
		if err := CheckSlot(ok); err != nil {
			t.Errorf("CheckSlot(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Upper", "has-dash", "a b", strings.Repeat("a", MaxLen+1)} {
		if err := CheckSlot(bad); err == nil {
			t.Errorf("CheckSlot(%q) accepted", bad)
		}
	}
	if err := CheckName("publication", "Pub_1"); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"", "1pub", `x"y`, strings.Repeat("a", MaxLen+1)} {
		if err := CheckName("publication", bad); err == nil || !strings.Contains(err.Error(), "publication") {
			t.Errorf("CheckName(%q) = %v, want an error naming the kind", bad, err)
		}
	}
}
