package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
)

// writeRuleCase is a business transaction that writes events among other
// statements. A case calls ev(key) to write one event (an outbox row keyed
// key) and biz(key) rows land in the business table; after the
// transaction, the keys of both tables must be exactly want, on a plain
// pgx transaction and on a CommitTx alike.
type writeRuleCase struct {
	name string
	run  func(ctx context.Context, tx pgx.Tx, ev func(pgx.Tx, string) error) error
	want []string // the keys in both tables once committed, sorted
}

// writeRuleCases are the statements the old write path guessed about by
// reading SQL text; here nothing is read and each must simply behave as on
// pgx.
var writeRuleCases = []writeRuleCase{
	{name: "event last", want: []string{"a"}, run: func(ctx context.Context, tx pgx.Tx, ev func(pgx.Tx, string) error) error {
		if _, err := tx.Exec(ctx, `INSERT INTO biz (k) VALUES ($1)`, "a"); err != nil {
			return err
		}
		return ev(tx, "a")
	}},
	{name: "CTE insert after the event", want: []string{"a", "b"}, run: func(ctx context.Context, tx pgx.Tx, ev func(pgx.Tx, string) error) error {
		if err := ev(tx, "a"); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, `WITH ins AS (INSERT INTO biz (k) VALUES ('a'), ($1) RETURNING k) SELECT count(*) FROM ins`, "b").Scan(&n); err != nil {
			return err
		}
		return ev(tx, "b")
	}},
	{name: "DO block", want: []string{"a", "b"}, run: func(ctx context.Context, tx pgx.Tx, ev func(pgx.Tx, string) error) error {
		if err := ev(tx, "a"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DO $$ BEGIN INSERT INTO biz (k) VALUES ('a'), ('b'); END $$`); err != nil {
			return err
		}
		return ev(tx, "b")
	}},
	{name: "leading comments and several statements", want: []string{"a", "b"}, run: func(ctx context.Context, tx pgx.Tx, ev func(pgx.Tx, string) error) error {
		if err := ev(tx, "a"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "/* a comment */ -- and another\nINSERT INTO biz (k) VALUES ('a'); INSERT INTO biz (k) VALUES ('b')")
		if err != nil {
			return err
		}
		return ev(tx, "b")
	}},
	{name: "prepared statement by name", want: []string{"a"}, run: func(ctx context.Context, tx pgx.Tx, ev func(pgx.Tx, string) error) error {
		if err := ev(tx, "a"); err != nil {
			return err
		}
		if _, err := tx.Prepare(ctx, "ins_biz", `INSERT INTO biz (k) VALUES ($1)`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "ins_biz", "a")
		return err
	}},
	{name: "the outbox row is visible to the next statement", want: []string{"a"}, run: func(ctx context.Context, tx pgx.Tx, ev func(pgx.Tx, string) error) error {
		if err := ev(tx, "a"); err != nil {
			return err
		}
		// A trigger-like business rule: copy what the outbox holds.
		_, err := tx.Exec(ctx, `INSERT INTO biz (k) SELECT convert_from(key, 'UTF8') FROM outbox`)
		return err
	}},
	{name: "savepoint through Begin, rolled back", want: []string{"a"}, run: func(ctx context.Context, tx pgx.Tx, ev func(pgx.Tx, string) error) error {
		if _, err := tx.Exec(ctx, `INSERT INTO biz (k) VALUES ('a')`); err != nil {
			return err
		}
		if err := ev(tx, "a"); err != nil {
			return err
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, `INSERT INTO biz (k) VALUES ('b')`); err != nil {
			return err
		}
		if err := ev(sp, "b"); err != nil {
			return err
		}
		return sp.Rollback(ctx)
	}},
	{name: "savepoint through Begin, released", want: []string{"a", "b"}, run: func(ctx context.Context, tx pgx.Tx, ev func(pgx.Tx, string) error) error {
		return pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
			if _, err := sp.Exec(ctx, `INSERT INTO biz (k) VALUES ('a'), ('b')`); err != nil {
				return err
			}
			if err := ev(sp, "a"); err != nil {
				return err
			}
			return ev(sp, "b")
		})
	}},
	{name: "nested savepoints, the inner rolled back", want: []string{"a", "b"}, run: func(ctx context.Context, tx pgx.Tx, ev func(pgx.Tx, string) error) error {
		outer, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := outer.Exec(ctx, `INSERT INTO biz (k) VALUES ('a')`); err != nil {
			return err
		}
		if err := ev(outer, "a"); err != nil {
			return err
		}
		inner, err := outer.Begin(ctx)
		if err != nil {
			return err
		}
		if err := ev(inner, "c"); err != nil {
			return err
		}
		if err := inner.Rollback(ctx); err != nil {
			return err
		}
		if err := ev(outer, "b"); err != nil {
			return err
		}
		if _, err := outer.Exec(ctx, `INSERT INTO biz (k) VALUES ('b')`); err != nil {
			return err
		}
		return outer.Commit(ctx)
	}},
	{name: "savepoint as SQL text, rolled back to", want: []string{"a"}, run: func(ctx context.Context, tx pgx.Tx, ev func(pgx.Tx, string) error) error {
		if err := ev(tx, "a"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO biz (k) VALUES ('a'); SAVEPOINT before_b`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO biz (k) VALUES ('b')`); err != nil {
			return err
		}
		if err := ev(tx, "b"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT before_b`)
		return err
	}},
	{name: "savepoint as SQL text, released", want: []string{"a", "b"}, run: func(ctx context.Context, tx pgx.Tx, ev func(pgx.Tx, string) error) error {
		if _, err := tx.Exec(ctx, `SAVEPOINT s`); err != nil {
			return err
		}
		if err := ev(tx, "a"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO biz (k) VALUES ('a'), ('b')`); err != nil {
			return err
		}
		if err := ev(tx, "b"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `RELEASE SAVEPOINT s`)
		return err
	}},
	{name: "batch and copy after the event", want: []string{"a", "b", "c"}, run: func(ctx context.Context, tx pgx.Tx, ev func(pgx.Tx, string) error) error {
		if err := ev(tx, "a"); err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO biz (k) VALUES ($1)`, "a")
		b.Queue(`INSERT INTO biz (k) VALUES ($1)`, "b")
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if err := ev(tx, "b"); err != nil {
			return err
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"biz"}, []string{"k"}, pgx.CopyFromRows([][]any{{"c"}})); err != nil {
			return err
		}
		return ev(tx, "c")
	}},
}

// TestWriteRules: every case leaves the same rows on a plain pgx
// transaction and on a CommitTx, and exactly the rows it means to.
func TestWriteRules(t *testing.T) {
	t.Parallel()
	for _, tc := range writeRuleCases {
		for _, kind := range []string{"pgx.Tx", "CommitTx"} {
			t.Run(tc.name+"/"+kind, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				pool, w := ruleFixture(t)
				err := beginKind(ctx, pool, kind, func(tx pgx.Tx) error {
					return tc.run(ctx, tx, func(tx pgx.Tx, key string) error {
						_, err := w.Write(ctx, tx, newEvent(descriptorFor("rules"), key, 0))
						return err
					})
				})
				if err != nil {
					t.Fatal(err)
				}
				if got := keysIn(t, pool, `SELECT convert_from(key, 'UTF8') FROM outbox ORDER BY id`); !slices.Equal(got, tc.want) {
					t.Fatalf("outbox keys %v, want %v", got, tc.want)
				}
				if got := keysIn(t, pool, `SELECT DISTINCT k FROM biz ORDER BY k`); !slices.Equal(got, tc.want) {
					t.Fatalf("business keys %v, want %v", got, tc.want)
				}
			})
		}
	}
}

// TestWriteRulesRollBack: rolled back, no case leaves a row in either table.
func TestWriteRulesRollBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := ruleFixture(t)
	errRollBack := errors.New("roll back")
	for _, tc := range writeRuleCases {
		err := BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := tc.run(ctx, tx, func(tx pgx.Tx, key string) error {
				_, err := w.Write(ctx, tx, newEvent(descriptorFor("rules"), key, 0))
				return err
			}); err != nil {
				return err
			}
			return errRollBack
		})
		if !errors.Is(err, errRollBack) {
			t.Fatalf("%s: %v", tc.name, err)
		}
	}
	if n := count(t, pool, `SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM biz)`); n != 0 {
		t.Fatalf("%d rows after every transaction rolled back, want none", n)
	}
	if s := pool.Stat(); s.AcquiredConns() != 0 {
		t.Fatalf("%d connections still acquired after BeginFunc", s.AcquiredConns())
	}
}

// TestCommitTxSendsTheRowsWithTheCommit: an event written last costs no
// round trip of its own: the INSERT goes in the COMMIT's batch; an event
// followed by a statement goes in a batch of its own just before it.
func TestCommitTxSendsTheRowsWithTheCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base, _ := ruleFixture(t)
	pool, sent := testenv.TracedPool(t, base)
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	d := descriptorFor("rules")
	// Learn the table's shape first, so the trace shows only the writes.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := w.Write(ctx, tx, newEvent(d, "warm", 0)); return err }); err != nil {
		t.Fatal(err)
	}
	sent.Take()
	err = BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := w.Write(ctx, tx, newEvent(d, "x", 0)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO biz (k) VALUES ($1)`, "x"); err != nil {
			return err
		}
		if _, err := w.Write(ctx, tx, newEvent(d, "y", 0)); err != nil {
			return err
		}
		_, err := w.Write(ctx, tx, newEvent(d, "z", 0))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	queries, batches := sent.Take()
	if len(batches) != 2 {
		t.Fatalf("batches sent %q, want two: the first row before the business insert, the last two with the COMMIT", batches)
	}
	if b := batches[0]; len(b) != 1 || !strings.HasPrefix(b[0], `INSERT INTO "outbox"`) {
		t.Fatalf("first batch %q, want the held row alone", b)
	}
	if b := batches[1]; len(b) != 2 || !strings.HasPrefix(b[0], `INSERT INTO "outbox"`) || b[1] != sqlCommit {
		t.Fatalf("last batch %q, want one INSERT of both rows, then the COMMIT", b)
	}
	for _, q := range queries {
		if strings.EqualFold(q, "commit") {
			t.Fatalf("queries %q: a COMMIT went alone", queries)
		}
	}
	if got := keysIn(t, base, `SELECT convert_from(key, 'UTF8') FROM outbox WHERE convert_from(key, 'UTF8') <> 'warm' ORDER BY id`); !slices.Equal(got, []string{"x", "y", "z"}) {
		t.Fatalf("outbox keys %v, want x y z in the order written", got)
	}
}

// TestCommitTxRefusesToCommitWithoutItsRows: rows the database refuses
// fail the statement that sends them (which does not run) and then the
// Commit, which rolls everything back; rolling back a savepoint opened
// before the failure discards the failed rows and the transaction goes on.
func TestCommitTxRefusesToCommitWithoutItsRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := ruleFixture(t)
	missing, err := NewWriter(WithTable("no_such_outbox"))
	if err != nil {
		t.Fatal(err)
	}
	d := descriptorFor("rules")
	tx, err := Begin(ctx, pool, pgx.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO biz (k) VALUES ('kept?')`); err != nil {
		t.Fatal(err)
	}
	if _, err := missing.Write(ctx, tx, newEvent(d, "k", 0)); err != nil {
		t.Fatalf("Write holds the row, the database is not asked yet: %v", err)
	}
	var n int
	err = tx.QueryRow(ctx, `SELECT count(*) FROM biz`).Scan(&n)
	if err == nil || !strings.Contains(err.Error(), "no_such_outbox") {
		t.Fatalf("the statement after a refused row: %v, want the refusal naming the table", err)
	}
	rows, err := tx.Query(ctx, `SELECT k FROM biz`)
	if err == nil {
		t.Fatal("Query ran after the held rows failed")
	}
	if _, cerr := pgx.CollectRows(rows, pgx.RowTo[string]); cerr == nil {
		t.Fatal("the rows of a statement that did not run report no error")
	}
	if err := tx.Commit(ctx); err == nil || !strings.Contains(err.Error(), "rolled back") {
		t.Fatalf("Commit after the held rows failed: %v, want a refusal saying the transaction was rolled back", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM biz`); n != 0 {
		t.Fatalf("%d business rows committed without their event", n)
	}
	if err := tx.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Rollback after Commit: %v, want pgx.ErrTxClosed", err)
	}

	// In a savepoint: rolled back to, the failure goes with it.
	err = BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO biz (k) VALUES ('kept')`); err != nil {
			return err
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := missing.Write(ctx, sp, newEvent(d, "k", 0)); err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, `SELECT 1`); err == nil {
			return errors.New("the refused row went unnoticed")
		}
		return sp.Rollback(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := keysIn(t, pool, `SELECT k FROM biz`); !slices.Equal(got, []string{"kept"}) {
		t.Fatalf("business rows %v after the savepoint was rolled back, want the one outside it", got)
	}
	if s := pool.Stat(); s.AcquiredConns() != 0 {
		t.Fatalf("%d connections still acquired", s.AcquiredConns())
	}
}

// TestCommitTxFixedEventID: a fixed event ID is sent at once, so a
// duplicate is refused by the Write itself, as on pgx.
func TestCommitTxFixedEventID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, w := ruleFixture(t)
	d := descriptorFor("rules")
	id := events.EventID{1, 2, 3}
	for i, want := range []bool{true, false} {
		err := BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.Write(ctx, tx, newEvent(d, "k", i), events.WithEventID(id))
			return err
		})
		if (err == nil) != want {
			t.Fatalf("write %d of the same fixed ID: %v", i+1, err)
		}
	}
}

// TestCommitTxOptions: a CommitQuery is refused, with why; the BeginQuery
// and isolation level are pgx's.
func TestCommitTxOptions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := ruleFixture(t)
	if _, err := Begin(ctx, pool, pgx.TxOptions{CommitQuery: "COMMIT AND CHAIN"}); err == nil || !strings.Contains(err.Error(), "CommitQuery") {
		t.Fatalf("Begin with a CommitQuery: %v, want it refused", err)
	}
	tx, err := Begin(ctx, pool, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var level string
	if err := tx.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&level); err != nil || level != "serializable" {
		t.Fatalf("isolation %q, %v; want serializable", level, err)
	}
}

// ruleFixture is a schema with the outbox and a business table.
func ruleFixture(t *testing.T) (*pgxpool.Pool, *Writer) {
	t.Helper()
	ctx := context.Background()
	pool, _ := servers.DB(t)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE biz (id bigserial PRIMARY KEY, k text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	return pool, w
}

// beginKind runs fn in a transaction of the named kind and commits it.
func beginKind(ctx context.Context, pool *pgxpool.Pool, kind string, fn func(pgx.Tx) error) error {
	if kind == "CommitTx" {
		return BeginFunc(ctx, pool, fn)
	}
	return pgx.BeginFunc(ctx, pool, fn)
}

func keysIn(t *testing.T, pool *pgxpool.Pool, query string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), query)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func count(t *testing.T, pool *pgxpool.Pool, query string) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), query).Scan(&n); err != nil {
		t.Fatal(fmt.Errorf("%s: %w", query, err))
	}
	return n
}
