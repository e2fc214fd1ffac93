package outbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/protoevents/protoevents/internal/testenv"
)

func TestParseTable(t *testing.T) {
	t.Parallel()
	good := map[string]string{
		"outbox":                `"outbox"`,
		"app.outbox":            `"app"."outbox"`,
		"_x9":                   `"_x9"`,
		strings.Repeat("a", 63): `"` + strings.Repeat("a", 63) + `"`,
	}
	for in, want := range good {
		tn, err := parseTable(in)
		if err != nil {
			t.Errorf("parseTable(%q): %v", in, err)
			continue
		}
		if got := tn.sanitized(); got != want {
			t.Errorf("parseTable(%q).sanitized() = %s, want %s", in, got, want)
		}
	}
	for _, in := range []string{"", "a.b.c", `out"box`, "outbox; DROP TABLE x", "9lives", "a-b", ".x", "x.", strings.Repeat("a", 64)} {
		if _, err := parseTable(in); err == nil {
			t.Errorf("parseTable(%q) accepted", in)
		}
	}
}

func TestDerivedNamesFit(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 63)
	other := strings.Repeat("a", 62) + "b"
	x, y := derivedName(long, "_published_idx"), derivedName(other, "_published_idx")
	if len(x) > maxIdentLen || len(y) > maxIdentLen || x == y {
		t.Fatalf("derived names %q and %q must be distinct and at most %d bytes", x, y, maxIdentLen)
	}
	if got := derivedName("outbox", "_notify"); got != "outbox_notify" {
		t.Fatalf("short names must stay readable, got %q", got)
	}
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testenv.DB(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- Migrate(ctx, pool)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}
	if err := Migrate(ctx, pool); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	st, err := Status(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if st.Table != schema+".outbox" || st.Lanes != DefaultLanes || st.Pending != 0 {
		t.Fatalf("status after migrate: %+v", st)
	}
	var indexes int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND tablename = 'outbox'`, schema).Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	if indexes != 4 { // pkey, event_id unique, pending, published
		t.Fatalf("%d indexes on outbox, want 4", indexes)
	}
	if err := Migrate(ctx, pool, WithLanes(8)); err == nil || !strings.Contains(err.Error(), "16 lanes") {
		t.Fatalf("changing the lane count must be refused, got %v", err)
	}
}

func TestMigrateQualifiedTableAndLanes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.DB(t)
	schema := strings.ReplaceAll(testenv.Topic(t, "ob"), "-", "_")
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+tableIdent(t, schema)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+tableIdent(t, schema)+" CASCADE") })
	tbl := schema + ".events_out"
	if err := Migrate(ctx, pool, WithTable(tbl), WithLanes(4)); err != nil {
		t.Fatal(err)
	}
	st, err := Status(ctx, pool, WithTable(tbl))
	if err != nil {
		t.Fatal(err)
	}
	if st.Table != tbl || st.Lanes != 4 {
		t.Fatalf("status: %+v", st)
	}
	// Re-running without WithLanes (every deploy) keeps the 4 lanes;
	// asking for another count is refused.
	if err := Migrate(ctx, pool, WithTable(tbl)); err != nil {
		t.Fatalf("migrate again without WithLanes: %v", err)
	}
	if st, err := Status(ctx, pool, WithTable(tbl)); err != nil || st.Lanes != 4 {
		t.Fatalf("lanes after a plain re-migrate: %+v, %v", st, err)
	}
	if err := Migrate(ctx, pool, WithTable(tbl), WithLanes(8)); err == nil || !strings.Contains(err.Error(), "table has 4 lanes, asked for 8") {
		t.Fatalf("a different lane count: %v", err)
	}
	if _, err := Status(ctx, pool); !errors.Is(err, ErrNoTable) {
		t.Fatalf("the default table was not created, want ErrNoTable, got %v", err)
	}
	// Lanes are a function of the key alone, within range.
	w, err := NewWriter(WithTable(tbl))
	if err != nil {
		t.Fatal(err)
	}
	d := descriptorFor("lanes")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	evs, _ := sequence(d, 200, 40)
	if _, err := w.WriteBatch(ctx, tx, evs); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var bad, perKey, used int
	err = pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE lane < 0 OR lane >= 4),
	  (SELECT max(c) FROM (SELECT count(DISTINCT lane) AS c FROM `+tableIdent(t, tbl)+` GROUP BY key) k),
	  count(DISTINCT lane) FROM `+tableIdent(t, tbl)).Scan(&bad, &perKey, &used)
	if err != nil {
		t.Fatal(err)
	}
	if bad != 0 || perKey != 1 || used != 4 {
		t.Fatalf("lanes: %d out of range, %d lanes per key (want 1), %d lanes used of 4", bad, perKey, used)
	}
}

func tableIdent(t *testing.T, s string) string {
	tn, err := parseTable(s)
	if err != nil {
		t.Fatal(err)
	}
	return tn.sanitized()
}

func TestMigrateRefusesForeignTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.DB(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE outbox (id int)`); err != nil {
		t.Fatal(err)
	}
	if err := Migrate(ctx, pool); err == nil || !strings.Contains(err.Error(), "not a protoevents outbox") {
		t.Fatalf("Migrate over an unrelated table: %v", err)
	}
	if err := Migrate(ctx, pool, WithTable("bad-name")); err == nil {
		t.Fatal("invalid table name accepted")
	}
	if err := Migrate(ctx, pool, WithLanes(0)); err == nil {
		t.Fatal("zero lanes accepted")
	}
}
