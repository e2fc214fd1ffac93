package outbox

import (
	"context"
	"testing"
	"time"
)

// TestRelayWorkersSplitLanesAndKeepOrder: a relay with several workers
// runs one session per worker, the lanes split between them, and every
// key stays in order, also when one worker's session is killed mid-stream
// and its lanes move to the others.
func TestRelayWorkersSplitLanesAndKeepOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, false, 6)
	rr := b.startRelay(t, WithWorkers(4), WithBatchSize(100), WithRebalanceInterval(50*time.Millisecond))

	// The lane owners of this table: one session per worker, all 16 lanes.
	owners := func() (sessions, lanes int) {
		t.Helper()
		if err := b.pool.QueryRow(ctx, `SELECT count(DISTINCT pid), count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND objid <> $1
			  AND classid = to_regclass('outbox')::oid`, uint32(presenceLane)).Scan(&sessions, &lanes); err != nil {
			t.Fatal(err)
		}
		return sessions, lanes
	}
	deadline := time.Now().Add(time.Minute)
	for {
		s, l := owners()
		if s == 4 && l == DefaultLanes && rr.lanes.Load() == int64(DefaultLanes) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lanes not split over the 4 workers: %d sessions own %d lanes; metric says %d", s, l, rr.lanes.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	st, err := Status(ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if st.Relays != 4 {
		t.Fatalf("status counts %d relay sessions, want one per worker (4)", st.Relays)
	}

	evs, want := sequence(b.d, 4000, 40)
	for i := 0; i < len(evs); i += 200 {
		b.write(t, evs[i:i+200])
		if i == 2000 {
			// One worker's session dies; its lanes go to the other workers
			// (or to it, reconnected), which start at their first pending row.
			if _, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
				WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND objid = $1
				  AND classid = to_regclass('outbox')::oid LIMIT 1`, uint32(presenceLane)); err != nil {
				t.Fatal(err)
			}
		}
	}
	b.waitDrained(t, time.Minute)
	dups := checkDelivery(t, b.readAll(t), want)
	t.Logf("%d duplicates after killing one worker's session", dups)
}
