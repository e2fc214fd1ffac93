package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/runtime/events"
)

// planNode is the part of EXPLAIN (ANALYZE, FORMAT JSON) the test reads.
type planNode struct {
	NodeType     string     `json:"Node Type"`
	RelationName string     `json:"Relation Name"`
	ActualRows   float64    `json:"Actual Rows"`
	ActualLoops  float64    `json:"Actual Loops"`
	Filtered     float64    `json:"Rows Removed by Filter"`
	Rechecked    float64    `json:"Rows Removed by Index Recheck"`
	Plans        []planNode `json:"Plans"`
}

// rowsFrom sums the rows every scan node on table read: those it produced
// and those its filters threw away.
func (p planNode) rowsFrom(table string) float64 {
	n := 0.0
	if p.RelationName == table && p.NodeType != "ModifyTable" {
		n += (p.ActualRows + p.Filtered + p.Rechecked) * p.ActualLoops
	}
	for _, c := range p.Plans {
		n += c.rowsFrom(table)
	}
	return n
}

// TestClaimReadsLaneHeadsNotBacklog: a claim reads the first rows of each
// of its lanes, as many as the lane's quota, and a mark reads its
// batch, however large the backlog and whatever the planner's statistics
// say: taken when the table was empty (a backlog that grew since the last
// ANALYZE, the case of a relay catching up after an outage), taken with the
// backlog (autovacuum caught up with it), or taken before it drained. The
// plans are those of the relay's session (sqlSessionSettings). Earlier
// versions filtered the other lanes' rows from an id-ordered scan and
// sorted the whole backlog for each batch; later ones, with fresh
// statistics, read a lane's every pending row by bitmap for each claim,
// and marked through the whole pending index with stale ones. (The claim
// with parked keys may also read, and skip, the parked key's rows at the
// head of its lane: one in 200 here.)
func TestClaimReadsLaneHeadsNotBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := servers.DB(t)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// Statistics stay as they were when the table was empty.
	if _, err := pool.Exec(ctx, `ANALYZE outbox; ALTER TABLE outbox SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, sqlSessionSettings); err != nil {
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
	var lastIDs []int64
	if err := pool.QueryRow(ctx, `SELECT array_agg(id) FROM (SELECT id FROM outbox WHERE published_at IS NULL ORDER BY id DESC LIMIT $1) l`, limit).Scan(&lastIDs); err != nil {
		t.Fatal(err)
	}
	// The quotas of a batch of limit rows over 4 lanes (loop.quotas): a
	// claim reads its batch and no more.
	quotas := []int32{limit / 4, limit / 4, limit / 4, limit / 4}
	plans := []claimQuery{
		{"claim", q.claim, []any{lanes, quotas, []int64{}}, limit},
		{"claim with parked keys", q.claimUnparked, []any{lanes, quotas, []int64{}, []string{"backlog"}, [][]byte{[]byte("key-007")}, []string{}}, limit + backlog/200},
		{"mark", q.markPublished, []any{lastIDs}, limit},
	}
	checkPlans(t, conn, "empty-table statistics", plans, backlog)
	// Statistics taken with the backlog, which then drains by half: the
	// lanes hold about a batch each, behind the index entries of the rows
	// marked since.
	if _, err := pool.Exec(ctx, `ANALYZE outbox; UPDATE outbox SET published_at = now() WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT 4000)`); err != nil {
		t.Fatal(err)
	}
	checkPlans(t, conn, "backlog statistics, half drained", plans, backlog)
	// Statistics taken during the backlog, then the backlog drained but
	// for a few rows: the relay is back to trickle claims, and the
	// published rows must not be walked through.
	if _, err := pool.Exec(ctx, `ANALYZE outbox; UPDATE outbox SET published_at = now() WHERE id NOT IN (SELECT id FROM outbox ORDER BY id DESC LIMIT 10)`); err != nil {
		t.Fatal(err)
	}
	plans[2].args = []any{lastIDs[:10]}
	checkPlans(t, conn, "backlog statistics after the drain", plans, backlog)
	var age float64
	if err := conn.QueryRow(ctx, q.oldestOwned, lanes).Scan(&age); err != nil || age < 0 {
		t.Fatalf("oldest owned row: %v, %v", age, err)
	}
}

// claimQuery is one of the relay's statements with its arguments and the
// most rows it may read.
type claimQuery struct {
	name string
	sql  string
	args []any
	max  int
}

// checkPlans explains each statement, in a transaction rolled back, and
// fails if one read more rows than it may.
func checkPlans(t *testing.T, conn *pgx.Conn, stats string, plans []claimQuery, backlog int) {
	t.Helper()
	ctx := context.Background()
	for _, c := range plans {
		var out []byte
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+c.sql, c.args...).Scan(&out); err != nil {
				return err
			}
			return errRollback
		})
		if !errors.Is(err, errRollback) {
			t.Fatalf("%s: %v", c.name, err)
		}
		var parsed []struct {
			Plan planNode `json:"Plan"`
		}
		if err := json.Unmarshal(out, &parsed); err != nil || len(parsed) != 1 {
			t.Fatalf("%s: plan %s: %v", c.name, out, err)
		}
		if read := parsed[0].Plan.rowsFrom("outbox"); read > float64(c.max) {
			t.Errorf("%s, %s: read %.0f rows of a %d-row table, want at most %d\n%s", c.name, stats, read, backlog, c.max, out)
		}
	}
}

// errRollback ends a transaction that must leave nothing behind.
var errRollback = errors.New("rolled back on purpose")
