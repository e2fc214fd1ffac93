package sqltmpl

import (
	"strings"
	"testing"
	"testing/fstest"
)

func TestRender(t *testing.T) {
	s := Must(fstest.MapFS{
		"a.sql": {Data: []byte(`CREATE TABLE {{.Table}} ();{{define "a_get"}}SELECT 1 FROM {{.Table}}{{end}}`)},
	}, "*.sql")
	if got, err := s.Render("a.sql", struct{ Table string }{`"t"`}); err != nil || got != `CREATE TABLE "t" ();` {
		t.Fatalf("Render(a.sql) = %q, %v", got, err)
	}
	if got, err := s.Render("a_get", struct{ Table string }{`"t"`}); err != nil || got != `SELECT 1 FROM "t"` {
		t.Fatalf("Render(a_get) = %q, %v", got, err)
	}
	if _, err := s.Render("a.sql", struct{}{}); err == nil {
		t.Fatal("a missing field rendered")
	}
	if _, err := s.Render("b.sql", nil); err == nil || !strings.Contains(err.Error(), "b.sql") {
		t.Fatalf("an unknown template: %v", err)
	}
}
