package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
)

// planNode is the part of EXPLAIN (ANALYZE, FORMAT JSON) the test reads.
type planNode struct {
	NodeType     string     `json:"Node Type"`
	RelationName string     `json:"Relation Name"`
	ActualRows   float64    `json:"Actual Rows"`
	ActualLoops  float64    `json:"Actual Loops"`
	Plans        []planNode `json:"Plans"`
}

// rowsFrom sums the rows every scan node on table produced.
func (p planNode) rowsFrom(table string) float64 {
	n := 0.0
	if p.RelationName == table {
		n += p.ActualRows * p.ActualLoops
	}
	for _, c := range p.Plans {
		n += c.rowsFrom(table)
	}
	return n
}

// TestClaimReadsLaneHeadsNotBacklog: a claim reads at most its batch
// size of ids from each of its lanes, and then its batch, however large the backlog and however
// stale the planner's statistics (a backlog that grew since the last
// ANALYZE, the case of a relay catching up after an outage). Earlier
// versions filtered the other lanes' rows from an id-ordered scan, and the
// planner read and sorted the whole backlog for each batch.
func TestClaimReadsLaneHeadsNotBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.DB(t)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// Statistics stay as they were when the table was empty.
	if _, err := pool.Exec(ctx, `ANALYZE outbox; ALTER TABLE outbox SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	d := descriptorFor("backlog")
	const backlog, limit = 8000, 100
	for i := 0; i < backlog; i += 1000 {
		evs := make([]events.Event, 1000)
		for j := range evs {
			evs[j] = newEvent(d, fmt.Sprintf("key-%03d", (i+j)%200), i+j)
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.WriteBatch(ctx, tx, evs)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	q := newQueries(`"outbox"`)
	lanes := []int32{0, 1, 2, 3}
	claims := []claimQuery{
		{"claim", q.claim, []any{lanes, limit, []int64{}}},
		{"trickle claim", q.claimTrickle, []any{lanes, limit, []int64{}}},
		{"claim with parked keys", q.claimUnparked, []any{lanes, limit, []int64{}, []string{"backlog"}, [][]byte{[]byte("key-007")}, []string{}}},
	}
	checkClaims(t, pool, "empty-table statistics", claims, len(lanes), limit, backlog)
	// Statistics taken during the backlog, then the backlog drained but
	// for a few rows: the relay is back to trickle claims, and the
	// published rows must not be walked through.
	if _, err := pool.Exec(ctx, `ANALYZE outbox; UPDATE outbox SET published_at = now() WHERE id NOT IN (SELECT id FROM outbox ORDER BY id DESC LIMIT 10)`); err != nil {
		t.Fatal(err)
	}
	checkClaims(t, pool, "backlog statistics after the drain", claims, len(lanes), limit, backlog)
	var age float64
	if err := pool.QueryRow(ctx, q.oldestOwned, lanes).Scan(&age); err != nil || age < 0 {
		t.Fatalf("oldest owned row: %v, %v", age, err)
	}
}

// claimQuery is one form of the relay's claim with its arguments.
type claimQuery struct {
	name string
	sql  string
	args []any
}

// checkClaims explains each claim and fails if one read more than its
// lanes' heads and its batch.
func checkClaims(t *testing.T, pool *pgxpool.Pool, stats string, claims []claimQuery, lanes, limit, backlog int) {
	t.Helper()
	ctx := context.Background()
	for _, c := range claims {
		var out []byte
		if err := pool.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+c.sql, c.args...).Scan(&out); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var plans []struct {
			Plan planNode `json:"Plan"`
		}
		if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
			t.Fatalf("%s: plan %s: %v", c.name, out, err)
		}
		// The ids of at most limit rows per lane, then the limit rows
		// themselves.
		read := plans[0].Plan.rowsFrom("outbox")
		if max := float64((lanes + 1) * limit); read > max {
			t.Errorf("%s, %s: read %.0f rows of a %d-row table, want at most %.0f (%d per lane and the batch)\n%s", c.name, stats, read, backlog, max, limit, out)
		}
	}
}
