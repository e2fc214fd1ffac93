package outbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/internal/sqlident"
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
	if len(x) > sqlident.MaxLen || len(y) > sqlident.MaxLen || x == y {
		t.Fatalf("derived names %q and %q must be distinct and at most %d bytes", x, y, sqlident.MaxLen)
	}
	if got := derivedName("outbox", "_notify"); got != "outbox_notify" {
		t.Fatalf("short names must stay readable, got %q", got)
	}
}

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := servers.DB(t)
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
	if indexes != 4 { // pkey, fixed event IDs (unique, partial), pending, published
		t.Fatalf("%d indexes on outbox, want 4", indexes)
	}
	if err := Migrate(ctx, pool, WithLanes(8)); err == nil || !strings.Contains(err.Error(), "16 lanes") {
		t.Fatalf("changing the lane count must be refused, got %v", err)
	}
}

func TestMigrateQualifiedTableAndLanes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := servers.DB(t)
	schema := strings.ReplaceAll(servers.Topic(t, "ob"), "-", "_")
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
	pool, _ := servers.DB(t)
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

// previousOutbox is the outbox table as versions before the partial
// unique index created it: every event_id unique.
const previousOutbox = `CREATE TABLE outbox (
    id bigserial PRIMARY KEY,
    event_id text NOT NULL UNIQUE,
    event_type text NOT NULL,
    topic text NOT NULL,
    key bytea NOT NULL,
    lane integer NOT NULL GENERATED ALWAYS AS ((hashtext(encode(key, 'hex')) & 2147483647) % 16) STORED,
    value bytea NOT NULL,
    headers jsonb NOT NULL DEFAULT '[]',
    created_at timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    attempts integer NOT NULL DEFAULT 0,
    last_error text);
COMMENT ON TABLE outbox IS '{"protoevents":"outbox","version":1,"lanes":16}';
INSERT INTO outbox (event_id, event_type, topic, key, value) VALUES ('01JOLDROW0000000000000000', 't', 'x', 'k', 'v');`

// TestMigrateUpgradesUniqueEventID: Migrate turns an earlier version's
// unique event_id into the partial index on fixed IDs, keeping its rows;
// afterwards a fixed ID is still refused twice, and fresh IDs are not
// indexed at all.
func TestMigrateUpgradesUniqueEventID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := servers.DB(t)
	if _, err := pool.Exec(ctx, previousOutbox); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	// The index definitions are read for this table's indexes only:
	// pg_indexes decodes every index of the database, and one that a
	// parallel test drops meanwhile fails the query.
	var uniques, rows, fixedIdx int
	if err := pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM pg_constraint WHERE conrelid = 'outbox'::regclass AND contype = 'u'),
		(SELECT count(*) FROM outbox WHERE NOT fixed_event_id),
		(SELECT count(*) FROM (SELECT indexrelid FROM pg_index WHERE indrelid = 'outbox'::regclass AND indisunique OFFSET 0) i
			WHERE pg_get_indexdef(i.indexrelid) LIKE '%(event_id) WHERE fixed_event_id')`).Scan(&uniques, &rows, &fixedIdx); err != nil {
		t.Fatal(err)
	}
	if uniques != 0 || rows != 1 || fixedIdx != 1 {
		t.Fatalf("after the upgrade: %d unique constraints (want 0), %d old rows (want 1), %d fixed-ID indexes (want 1)", uniques, rows, fixedIdx)
	}
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	d := descriptorFor("upgraded")
	id := envelope.NewEventID()
	write := func(opts ...events.PublishOption) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.Write(ctx, tx, newEvent(d, "a", 0), opts...)
			return err
		})
	}
	if err := write(events.WithEventID(id)); err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	if err := write(events.WithEventID(id)); !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("second write of a fixed ID: %v, want a unique violation", err)
	}
	if err := write(); err != nil {
		t.Fatal(err)
	}
	var fixed int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE fixed_event_id`).Scan(&fixed); err != nil || fixed != 1 {
		t.Fatalf("%d rows marked fixed (%v), want 1", fixed, err)
	}
}
