package consumer

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/runtime/events"
)

// TestMigrateConcurrentAndIdempotent runs Migrate from several goroutines
// at once, then again: no error, one table with its index.
func TestMigrateConcurrentAndIdempotent(t *testing.T) {
	t.Parallel()
	pool, schema := servers.DB(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 4 {
		wg.Go(func() { errs <- Migrate(ctx, pool, WithTable("dedup_a")) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := Migrate(ctx, pool, WithTable("dedup_a")); err != nil {
		t.Fatalf("second migrate: %v", err)
	}
	if n := query(t, pool, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND tablename = 'dedup_a'`, schema); n != 2 {
		t.Fatalf("%d indexes on dedup_a, want the primary key and the pruning index", n)
	}
	// A schema-qualified name lands in that schema.
	if err := Migrate(ctx, pool, WithTable(schema+".dedup_b")); err != nil {
		t.Fatal(err)
	}
	if n := query(t, pool, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'dedup_b'`, schema); n != 1 {
		t.Fatal("schema-qualified table not created")
	}
}

func TestTableNamesValidated(t *testing.T) {
	for _, bad := range []string{"", "a;drop table x", "a.b.c", "x-y", `"q"`, "1abc", ".t", strings.Repeat("t", 64), strings.Repeat("t", 60)} {
		if _, err := renderSQL(bad); err == nil {
			t.Errorf("table %q accepted", bad)
		}
		if _, err := settingsFrom([]Option{WithTable(bad)}); err == nil && bad != strings.Repeat("t", 60) {
			t.Errorf("WithTable(%q) accepted", bad)
		}
	}
	s, err := renderSQL("app.Consumed_1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(s.dedup, `INSERT INTO "app"."Consumed_1"`) || !strings.Contains(s.migrate, `"Consumed_1_consumed_at_idx" ON "app"."Consumed_1"`) {
		t.Fatalf("identifiers not quoted:\n%s\n%s", s.dedup, s.migrate)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	d := descriptorFor("t")
	noop := func(context.Context, pgx.Tx, events.Meta, testEvent) error { return nil }
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none") // connects lazily: never here
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	brokers := []string{"127.0.0.1:1"}
	// build is New and Handle, as a program calls them.
	build := func(pool *pgxpool.Pool, brokers []string, name string, d *events.Descriptor, fn func(context.Context, pgx.Tx, events.Meta, testEvent) error, opts ...Option) (*Consumer, error) {
		c, err := New(pool, brokers, name, opts...)
		if err != nil {
			return nil, err
		}
		return c, Handle(c, d, fn)
	}
	if c, err := build(pool, brokers, "n", d, noop); err != nil || c.GroupID() != "n" || c.Name() != "n" {
		t.Fatalf("valid config refused: %v, %v", c, err)
	}
	if c, err := build(pool, brokers, "n", d, noop, WithGroupID("g")); err != nil || c.GroupID() != "g" || c.Name() != "n" {
		t.Fatalf("WithGroupID: %v, %v", c, err)
	}
	noDLQ := *d
	noDLQ.DLQTopic = ""
	if c, err := build(pool, brokers, "n", &noDLQ, noop); err != nil || c.DLQTopic("t") != "t.dlq" || c.DLQTopic("other") != "" {
		t.Fatalf("default DLQ topic: %v, %v", c, err)
	}
	noNew := *d
	noNew.New = nil
	for name, tc := range map[string]struct {
		pool    *pgxpool.Pool
		brokers []string
		name    string
		d       *events.Descriptor
		fn      func(context.Context, pgx.Tx, events.Meta, testEvent) error
		opts    []Option
	}{
		"no name":         {pool, brokers, "", d, noop, nil},
		"no brokers":      {pool, nil, "n", d, noop, nil},
		"empty broker":    {pool, []string{""}, "n", d, noop, nil},
		"no db":           {nil, brokers, "n", d, noop, nil},
		"no handler":      {pool, brokers, "n", d, nil, nil},
		"no descriptor":   {pool, brokers, "n", nil, noop, nil},
		"no New":          {pool, brokers, "n", &noNew, noop, nil},
		"empty group":     {pool, brokers, "n", d, noop, []Option{WithGroupID("")}},
		"bad table":       {pool, brokers, "n", d, noop, []Option{WithTable("x;y")}},
		"bad attempts":    {pool, brokers, "n", d, noop, []Option{WithMaxAttempts(0)}},
		"bad backoff":     {pool, brokers, "n", d, noop, []Option{WithBackoff(time.Second, time.Millisecond)}},
		"prune too short": {pool, brokers, "n", d, noop, []Option{WithPruning(time.Hour, time.Hour)}},
	} {
		_, err := build(tc.pool, tc.brokers, tc.name, tc.d, tc.fn, tc.opts...)
		if err == nil {
			t.Errorf("%s: New accepted it", name)
		} else if !strings.HasPrefix(err.Error(), "consumer: ") {
			t.Errorf("%s: error %q lacks the consumer: prefix", name, err)
		}
	}
}

// TestPrune deletes rows older than the retention in batches, keeps newer
// ones, and refuses a retention below the floor.
func TestPrune(t *testing.T) {
	t.Parallel()
	pool, _ := servers.DB(t)
	ctx := context.Background()
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO consumed_events (consumer, event_id, consumed_at)
		SELECT 'c', gen_random_uuid(), now() - make_interval(days => d)
		FROM (SELECT CASE WHEN i <= 70 THEN 10 WHEN i <= 80 THEN 1 ELSE 0 END AS d FROM generate_series(1, 85) i) x`); err != nil {
		t.Fatal(err)
	}
	if _, err := Prune(ctx, pool, time.Hour); err == nil || !strings.Contains(err.Error(), "floor") {
		t.Fatalf("Prune below the floor: err = %v", err)
	}
	if n := query(t, pool, `SELECT count(*) FROM consumed_events`); n != 85 {
		t.Fatalf("refused prune deleted rows: %d left", n)
	}
	n, err := Prune(ctx, pool, DefaultRetentionFloor, WithPruneBatch(30))
	if err != nil || n != 70 {
		t.Fatalf("Prune 7d = %d, %v; want 70", n, err)
	}
	if left := query(t, pool, `SELECT count(*) FROM consumed_events`); left != 15 {
		t.Fatalf("%d rows left, want 15", left)
	}
	n, err = Prune(ctx, pool, 12*time.Hour, WithRetentionFloor(time.Hour))
	if err != nil || n != 10 {
		t.Fatalf("Prune 12h (floor lowered) = %d, %v; want 10", n, err)
	}
	if left := query(t, pool, `SELECT count(*) FROM consumed_events WHERE consumed_at > now() - interval '1 hour'`); left != 5 {
		t.Fatalf("%d recent rows left, want 5", left)
	}
}

func TestBackoff(t *testing.T) {
	c := &Consumer{s: defaultSettings()}
	c.s.baseBackoff, c.s.maxBackoff = 100*time.Millisecond, time.Second
	for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 60: time.Second} {
		for range 50 {
			if got := c.backoff(n); got < want/2 || got > want {
				t.Fatalf("backoff(%d) = %v, want in [%v, %v]", n, got, want/2, want)
			}
		}
	}
}

func TestTruncate(t *testing.T) {
	if got := truncate("short", 10); got != "short" {
		t.Fatal(got)
	}
	got := truncate(strings.Repeat("é", 100), 50)
	if len(got) > 50 || !strings.HasSuffix(got, "…[truncated]") || !strings.HasPrefix(got, "é") {
		t.Fatalf("truncate = %q (%d bytes)", got, len(got))
	}
	for _, r := range strings.TrimSuffix(got, "…[truncated]") {
		if r == '\uFFFD' {
			t.Fatal("cut inside a UTF-8 sequence")
		}
	}
}
