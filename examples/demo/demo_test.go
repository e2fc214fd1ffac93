package demo

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/eventstest/pgcluster"
	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/examples/shipping"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/walrelay"
)

func TestMain(m *testing.M) { servers.Main(m) }

// TestDemoFlow runs what `make demo` runs, on a schema of its own, and
// holds it to the demo's own invariants plus the report's numbers.
func TestDemoFlow(t *testing.T) {
	pool, _ := servers.DB(t)
	demoFlow(t, pool, "table")
}

// TestDemoFlowOnTheWALRelay is the same on the WAL relay (make demo
// RELAY=wal), on a wal_level = logical cluster of its own.
func TestDemoFlowOnTheWALRelay(t *testing.T) {
	ctx := context.Background()
	_, pool := testenv.OwnCluster(t, ctx, pgcluster.WithSetting("wal_level", "logical"))
	if err := walrelay.Setup(ctx, pool); err != nil {
		t.Fatal(err)
	}
	demoFlow(t, pool, "wal")
}

func demoFlow(t *testing.T, pool *pgxpool.Pool, relay string) {
	ctx := context.Background()
	// The example's topics and consumer groups are fixed by its schemas, so
	// runs would see each other's messages on a shared cluster: a cluster of
	// the test's own (a real node in the real tier, else in-process).
	k := servers.OwnKafka(t)
	if err := Setup(ctx, pool, k.Brokers); err != nil {
		t.Fatal(err)
	}
	var progress strings.Builder
	cfg := Config{DB: pool, Brokers: k.Brokers, Orders: 120, Progress: &progress, Relay: relay}
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	rep.Print(&out)
	t.Log(out.String())
	if !rep.OK() {
		t.Fatalf("invariants violated: %v", rep.Violations)
	}
	if rep.OrdersCancelled != 1 || rep.CancelsApplied != 1 {
		t.Fatalf("cancellations: %d asked, %d applied by shipping; want 1 and 1", rep.OrdersCancelled, rep.CancelsApplied)
	}
	if rep.OrdersPlaced != 120 || rep.EventsWritten != 240 || rep.AppliedV2 != 120 {
		t.Errorf("placed %d orders, %d events, %d applied by the v2 consumer; want 120, 240 (v2 + v1 side by side) and 120", rep.OrdersPlaced, rep.EventsWritten, rep.AppliedV2)
	}
	if rep.Applied != 119 {
		t.Errorf("applied %d events, want 119 (all but the poison order)", rep.Applied)
	}
	if rep.RelayCrashes != 1 || rep.ConsumerCrashes != 1 {
		t.Errorf("crashes: relay %d, consumer %d; want 1 each", rep.RelayCrashes, rep.ConsumerCrashes)
	}
	if rep.DuplicatesAbsorbed == 0 {
		t.Error("no duplicates absorbed, though the relay re-sent a batch and the consumer crashed before an offset commit")
	}
	// One copy, or two when the poison was in the batch the relay re-sent
	// or the consumer crashed between the DLQ publish and its offset
	// commit (the DLQ is at-least-once; the hook fires once per commit, so
	// it may count one copy fewer).
	if n := len(rep.DLQEntries); rep.DeadLettered < 1 || rep.DeadLettered > int64(n) || n < 1 || n > 2 || string(rep.DLQEntries[0].Key) != rep.PoisonOrderID ||
		rep.DLQEntries[n-1].EventID != rep.DLQEntries[0].EventID {
		t.Fatalf("DLQ: %d dead-lettered, entries %+v; want the poison order %s once or twice", rep.DeadLettered, rep.DLQEntries, rep.PoisonOrderID)
	}
	if e := rep.DLQEntries[0]; e.Attempts != 4 || !strings.Contains(e.Error, `no carrier serves country "ZZ"`) {
		t.Errorf("DLQ entry: %d attempts, error %q", e.Attempts, e.Error)
	}

	// Fix shipping and redrive: applied once; a second redrive changes nothing.
	w, err := NewWriter(relay)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		n, err := Redrive(ctx, cfg, shipping.New(w), rep.PoisonOrderID)
		if err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("redrive %d: poison order applied %d times, want 1", i+1, n)
		}
	}
}
