package outbox

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/runtime/events"
)

// TestWriterInDatabaseSQLTransaction: through SQLTx, Write and WriteBatch
// write in a database/sql transaction (pgx stdlib driver): rows roll back
// and commit with it, in call order.
func TestWriterInDatabaseSQLTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := servers.DB(t)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	d := descriptorFor("orders")

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, SQLTx(tx), newEvent(d, "a", 0)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows (%v) after rollback, want 0", n, err)
	}

	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	first, err := w.Write(ctx, SQLTx(tx), newEvent(d, "a", 0), events.WithCorrelationID("c-1"))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := w.WriteBatch(ctx, SQLTx(tx), []events.Event{newEvent(d, "a", 1), newEvent(d, "b", 0)})
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	rows, err := db.QueryContext(ctx, `SELECT event_id, key, headers::text FROM outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids, keys []string
	for rows.Next() {
		var id, key, headers string
		if err := rows.Scan(&id, &key, &headers); err != nil {
			t.Fatal(err)
		}
		ids, keys = append(ids, id), append(keys, key)
	}
	want := []string{first.String(), batch[0].String(), batch[1].String()}
	if len(ids) != 3 || ids[0] != want[0] || ids[1] != want[1] || ids[2] != want[2] || keys[2] != "b" {
		t.Fatalf("rows %v keys %v, want %v keyed a, a, b", ids, keys, want)
	}
}
