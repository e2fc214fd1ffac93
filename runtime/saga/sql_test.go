package saga

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/protoevents/protoevents/eventstest/servers"
)

// TestTableNames: names are validated, quoted, and the path table and
// indexes are derived from the state table's name.
func TestTableNames(t *testing.T) {
	for _, bad := range []string{"", "a.b.c", "bad-name", `x"; DROP TABLE y; --`, strings.Repeat("n", 50)} {
		if _, err := renderSQL(bad); err == nil {
			t.Errorf("table %q accepted", bad)
		}
	}
	s, err := renderSQL("app.my_sagas")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`CREATE TABLE IF NOT EXISTS "app"."my_sagas" (`, `CREATE TABLE IF NOT EXISTS "app"."my_sagas_history" (`, `"my_sagas_due_idx"`} {
		if !strings.Contains(s.migrate, want) {
			t.Errorf("migration lacks %s:\n%s", want, s.migrate)
		}
	}
}

// TestMigrateQualifiedTable creates the tables under another name in
// another schema, twice (idempotent), and reads them through the status
// functions with the same option.
func TestMigrateQualifiedTable(t *testing.T) {
	ctx := context.Background()
	pool, schema := servers.DB(t)
	opt := WithTable(schema + ".flows")
	for range 2 {
		if err := Migrate(ctx, pool, opt); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Get(ctx, pool, "x", opt); err == nil || !strings.Contains(err.Error(), "no such saga") {
		t.Fatalf("Get on an empty table: %v", err)
	}
	if err := Retry(ctx, pool, "x", opt); err == nil || !strings.Contains(err.Error(), "no such saga") {
		t.Fatalf("Retry of a missing saga: %v", err)
	}
	if list, err := List(ctx, pool, Filter{}, opt); err != nil || len(list) != 0 {
		t.Fatalf("List: %v %v", list, err)
	}
}

// TestBackoff doubles from the base up to the cap.
func TestBackoff(t *testing.T) {
	s, err := settingsFrom([]Option{WithCompensationRetries(9, 100*time.Millisecond, time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := s.backoffFor(i + 1); got != w*time.Millisecond {
			t.Errorf("after %d failures: %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
	if _, err := settingsFrom([]Option{WithCompensationRetries(0, time.Second, time.Second)}); err == nil {
		t.Error("0 attempts accepted")
	}
	if _, err := settingsFrom([]Option{WithPollInterval(0)}); err == nil {
		t.Error("poll interval 0 accepted")
	}
}
