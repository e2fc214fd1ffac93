package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
)

// The recovery tests take a dependency away while the relay works, long
// enough for it to fail and back off, and bring it back: the relay must
// publish again soon after (resumeBound), although the backoff it is
// sleeping out is far longer (recoveryBackoff: its first delay alone is
// 20–40 s). Only the health check seeing the dependency back, and waking
// the relay, gets it there in time.
const (
	resumeBound     = 10 * time.Second
	outageAfterFail = 2 * time.Second // the outage goes on this long after the relay's first failure
)

func recoveryBackoff() RelayOption { return WithBackoff(40*time.Second, time.Minute) }

// waitFailures waits until the relay reported more than n failures.
func waitFailures(t *testing.T, rr *runningRelay, n int64) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for rr.failures.Load() <= n {
		if time.Now().After(deadline) {
			t.Fatalf("the relay reported no failure during the outage (%d)", rr.failures.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRelayResumesWhenKafkaReturns: the brokers go away while rows are
// pending; the relay fails, backs off (20 s or more) and, once the brokers
// answer again, publishes within resumeBound of their return, without
// having retried meanwhile.
func TestRelayResumesWhenKafkaReturns(t *testing.T) {
	t.Parallel()
	b := setup(t, true, 3)
	down := testenv.KafkaOutage(b.kafka.Fake)
	rr := b.startRelay(t, recoveryBackoff())
	evs, want := sequence(b.d, 60, 6)
	b.write(t, evs[:30])
	b.waitDrained(t, time.Minute)

	down.Store(true)
	failures := rr.failures.Load()
	b.write(t, evs[30:])
	waitFailures(t, rr, failures)
	time.Sleep(outageAfterFail)
	if n := rr.failures.Load() - failures; n > 2 {
		t.Fatalf("%d failures in the %v of the outage: the relay did not back off", n, outageAfterFail)
	}
	down.Store(false)
	back := time.Now()
	b.waitDrained(t, time.Minute)
	resumed := time.Since(back)
	t.Logf("relay published the rows pending across the outage %v after the brokers came back", resumed.Round(time.Millisecond))
	if resumed > resumeBound {
		t.Fatalf("relay resumed %v after the brokers came back, want within %v", resumed.Round(time.Millisecond), resumeBound)
	}
	checkDelivery(t, b.readAll(t), want)
}

// TestRelayResumesWhenPostgresReturns: the database goes down under an
// idle relay, which fails and backs off (20 s or more); rows written once
// it is back are published within resumeBound of its return.
func TestRelayResumesWhenPostgresReturns(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, b := bundleOnOwnCluster(t, ctx, servers.FakeKafka(t))
	rr := b.startRelay(t, recoveryBackoff())
	evs, want := sequence(b.d, 60, 6)
	b.write(t, evs[:30])
	b.waitDrained(t, time.Minute)

	failures := rr.failures.Load()
	if err := c.Down(ctx); err != nil {
		t.Fatal(err)
	}
	waitFailures(t, rr, failures)
	time.Sleep(outageAfterFail)
	if n := rr.failures.Load() - failures; n > 2 {
		t.Fatalf("%d failures in the %v of the outage: the relay did not back off", n, outageAfterFail)
	}
	if err := c.Up(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	// The pool's connections died with the server: the first writes may
	// fail until it has new ones.
	for {
		if err := tryWrite(ctx, b, evs[30:]); err == nil {
			break
		} else if time.Since(back) > time.Minute {
			t.Fatalf("writing after the database came back: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.waitDrained(t, time.Minute)
	resumed := time.Since(back)
	t.Logf("relay published rows written after the outage %v after the database came back", resumed.Round(time.Millisecond))
	if resumed > resumeBound {
		t.Fatalf("relay resumed %v after the database came back, want within %v", resumed.Round(time.Millisecond), resumeBound)
	}
	checkDelivery(t, b.readAll(t), want)
}

// tryWrite is bundle.write returning its error.
func tryWrite(ctx context.Context, b *bundle, evs []events.Event) error {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := b.writer.WriteBatch(ctx, tx, evs); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
