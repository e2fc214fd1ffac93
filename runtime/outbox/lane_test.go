package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/runtime/events"
)

// laneGenerated tells whether the outbox table generates its lane column.
func laneGenerated(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	var generated bool
	if err := pool.QueryRow(context.Background(), `SELECT attgenerated <> '' FROM pg_attribute WHERE attrelid = 'outbox'::regclass AND attname = 'lane'`).Scan(&generated); err != nil {
		t.Fatal(err)
	}
	return generated
}

// checkLanes fails unless every row of the outbox is in the lane the
// generated column of earlier tables computes for its key, and returns how
// many rows there are.
func checkLanes(t *testing.T, pool *pgxpool.Pool, lanes int) int {
	t.Helper()
	var n, wrong int
	q := fmt.Sprintf(`SELECT count(*), count(*) FILTER (WHERE lane <> (hashtext(encode(key, 'hex')) & 2147483647) %% %d) FROM outbox`, lanes)
	if err := pool.QueryRow(context.Background(), q).Scan(&n, &wrong); err != nil {
		t.Fatal(err)
	}
	if wrong != 0 {
		t.Fatalf("%d of %d rows are not in their key's lane", wrong, n)
	}
	return n
}

// writeEveryWay writes keys through every path a Writer has: Write and
// WriteBatch on a pgx transaction, on a CommitTx (held for the COMMIT,
// and a fixed ID sent at once), and on database/sql through SQLTx — each
// with a Writer of its own, so that each path learns the table's shape.
func writeEveryWay(t *testing.T, pool *pgxpool.Pool, keys int) {
	t.Helper()
	ctx := context.Background()
	newWriter := func() *Writer {
		w, err := NewWriter()
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	w := newWriter()
	d := descriptorFor("lanes")
	evs := func(prefix string) []events.Event {
		out := make([]events.Event, keys)
		for i := range out {
			out[i] = newEvent(d, fmt.Sprintf("%s-%d", prefix, i), i)
		}
		return out
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := w.Write(ctx, tx, newEvent(d, "one", 0)); err != nil {
			return err
		}
		_, err := w.WriteBatch(ctx, tx, evs("pgx"))
		return err
	})
	if err != nil {
		t.Fatalf("pgx transaction: %v", err)
	}
	w = newWriter()
	err = BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := w.WriteBatch(ctx, tx, evs("pipe")); err != nil {
			return err
		}
		_, err := w.Write(ctx, tx, newEvent(d, "fixed", 0), events.WithEventID(events.EventID{7, byte(keys)}))
		return err
	})
	if err != nil {
		t.Fatalf("CommitTx: %v", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stx.Rollback() }()
	w = newWriter()
	if _, err := w.WriteBatch(ctx, SQLTx(stx), evs("sql")); err != nil {
		t.Fatalf("SQLTx: %v", err)
	}
	if err := stx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// laneFixture returns a pool on a migrated outbox — one created by an
// earlier version (previousOutbox) when earlier is set — and a new Writer.
func laneFixture(t *testing.T, earlier bool, opts ...Option) (*pgxpool.Pool, *Writer) {
	t.Helper()
	ctx := context.Background()
	pool, _ := servers.DB(t)
	if earlier {
		if _, err := pool.Exec(ctx, previousOutbox); err != nil {
			t.Fatal(err)
		}
	}
	if err := Migrate(ctx, pool, opts...); err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	return pool, w
}

// TestWriterFillsInTheLane: a table of this version has a plain lane
// column, and every way of writing puts each row in the lane the generated
// column of earlier tables gives its key, with 16 lanes and with 32.
func TestWriterFillsInTheLane(t *testing.T) {
	t.Parallel()
	for _, lanes := range []int{16, 32} {
		t.Run(fmt.Sprint(lanes), func(t *testing.T) {
			t.Parallel()
			pool, _ := laneFixture(t, false, WithLanes(lanes))
			if laneGenerated(t, pool) {
				t.Fatal("Migrate created a generated lane column")
			}
			writeEveryWay(t, pool, 50)
			if n := checkLanes(t, pool, lanes); n != 1+3*50+1 {
				t.Fatalf("%d rows, want %d", n, 1+3*50+1)
			}
		})
	}
}

// TestWriterOnTableOfEarlierVersion: on a table that generates its lanes
// (as earlier versions created it, and as Migrate leaves it) every way of
// writing still works, and the lanes are the same as in a new table.
func TestWriterOnTableOfEarlierVersion(t *testing.T) {
	t.Parallel()
	pool, _ := laneFixture(t, true)
	if !laneGenerated(t, pool) {
		t.Fatal("Migrate changed the lane column of an existing table")
	}
	writeEveryWay(t, pool, 50)
	if n := checkLanes(t, pool, 16); n != 1+1+3*50+1 {
		t.Fatalf("%d rows, want %d", n, 1+1+3*50+1)
	}
}

// TestWriterRelearnsTheTable: a Writer that learned one shape of table and
// meets the other (the table dropped and created again by another
// version) fails that write with the database's error, learns again, and
// writes the next one.
func TestWriterRelearnsTheTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := laneFixture(t, false)
	write := func() error {
		return BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.Write(ctx, tx, newEvent(descriptorFor("relearn"), "k", 0))
			return err
		})
	}
	if err := write(); err != nil {
		t.Fatal(err)
	}
	recreate := func(ddl string) {
		t.Helper()
		if _, err := pool.Exec(ctx, `DROP TABLE outbox CASCADE`); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, ddl); err != nil {
			t.Fatal(err)
		}
		if err := Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	recreate(previousOutbox) // now the table generates its lanes
	var pgErr *pgconn.PgError
	if err := write(); !errors.As(err, &pgErr) || pgErr.Code != sqlstateGeneratedAlways {
		t.Fatalf("first write after the table changed: %v, want the database's refusal of a lane value", err)
	}
	if err := write(); err != nil {
		t.Fatalf("second write after the table changed: %v", err)
	}
	recreate(`SELECT 1`) // and back: Migrate creates this version's table
	err := write()
	if !errors.As(err, &pgErr) || pgErr.Code != sqlstateNotNull || !strings.Contains(err.Error(), "upgrade every writer") {
		t.Fatalf("first write after the table changed back: %v, want the missing lane explained", err)
	}
	if err := write(); err != nil {
		t.Fatalf("second write after the table changed back: %v", err)
	}
	checkLanes(t, pool, 16)
}

// TestWriterFollowsSearchPath: a Writer of an unqualified table keeps
// writing where each transaction's search_path finds the table, after it
// learned the table's shape in another schema.
func TestWriterFollowsSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := servers.DB(t)
	other := schema + "_other"
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{other}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{other}.Sanitize()+` CASCADE`)
	})
	for _, table := range []string{"outbox", other + ".outbox"} {
		if err := Migrate(ctx, pool, WithTable(table)); err != nil {
			t.Fatal(err)
		}
	}
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	for i, path := range []string{schema, other, other, schema} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, pgx.Identifier{path}.Sanitize()); err != nil {
				return err
			}
			_, err := w.Write(ctx, tx, newEvent(descriptorFor("paths"), path, i))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []string{schema, other} {
		var n int
		q := fmt.Sprintf(`SELECT count(*) FROM %s WHERE key = $1`, pgx.Identifier{s, "outbox"}.Sanitize())
		if err := pool.QueryRow(ctx, q, []byte(s)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 2 {
			t.Fatalf("schema %s holds %d of its 2 events", s, n)
		}
	}
}

// TestSwitchingAnEarlierTable: the switch docs/runbook.md ("Upgrades") gives
// for a table of an earlier version, once every writer is upgraded — DROP
// EXPRESSION — keeps every row's lane, and a running Writer fails one
// write, learns, and fills in the lane from then on.
func TestSwitchingAnEarlierTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := laneFixture(t, true)
	write := func(key string) error {
		return BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.Write(ctx, tx, newEvent(descriptorFor("switch"), key, 0))
			return err
		})
	}
	if err := write("before"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE outbox ALTER COLUMN lane DROP EXPRESSION`); err != nil {
		t.Fatal(err)
	}
	if laneGenerated(t, pool) {
		t.Fatal("lane still generated")
	}
	if err := write("refused"); err == nil {
		t.Fatal("the first write after the switch went through without a lane")
	}
	for i := range 20 {
		if err := write(fmt.Sprint("after-", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := checkLanes(t, pool, 16); n != 1+1+20 {
		t.Fatalf("%d rows, want %d", n, 1+1+20)
	}
}
