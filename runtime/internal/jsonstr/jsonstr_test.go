package jsonstr

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

var tricky = []string{"", "plain", `"quoted"`, `back\slash`, "\x00\x01\x1f\x7f", "\b\f\n\r\t", "<a href='x'>&</a>",
	"\u2028\u2029", "é😀", "bad \xff byte", "cut \xc3", "surrogate \xed\xa0\x80"}

// FuzzAppend: in HTML mode with replacement Append writes what json.Marshal
// writes; in the plain mode it writes JSON that decodes back to s, and
// reports invalid UTF-8 instead of writing it.
func FuzzAppend(f *testing.F) {
	for _, s := range tricky {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := Append(nil, s, Mode{HTML: true, Replace: true}); string(got) != string(want) {
			t.Fatalf("HTML mode: Append(%q) = %s, json.Marshal %s", s, got, want)
		}
		got, valid := Append([]byte("x"), s, Mode{})
		if valid != utf8.ValidString(s) {
			t.Fatalf("plain mode: Append(%q) valid %v", s, valid)
		}
		if !valid {
			return
		}
		if strings.ContainsAny(string(got), "<>&") != strings.ContainsAny(s, "<>&") {
			t.Fatalf("plain mode: Append(%q) = %s escaped <, > or &", s, got)
		}
		var back string
		if err := json.Unmarshal(got[1:], &back); err != nil || back != s {
			t.Fatalf("plain mode: Append(%q) = %s decodes to %q, %v", s, got, back, err)
		}
	})
}
