package walrelay

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
)

// The recovery tests take a dependency away while the relay works, long
// enough for it to fail and back off, and bring it back: the relay must
// publish again soon after (resumeBound), although the backoff it is
// sleeping out is far longer (slowRetries: 40 s from the first failure).
// Only the check seeing the dependency back, and waking the relay, gets it
// there in time.
const (
	resumeBound     = 10 * time.Second
	outageAfterFail = 2 * time.Second // the outage goes on this long after the relay's first failure
)

// slowRetries sets both of the relay's backoffs to 40 s, doubling up to a
// minute.
func slowRetries() Option {
	return func(c *config) {
		c.sessionRetryMin, c.sessionRetryMax = 40*time.Second, time.Minute
		c.publishRetryMin, c.publishRetryMax = 40*time.Second, time.Minute
	}
}

// recoverySetup is setup on an in-process Kafka cluster, whose outages
// the test controls.
func recoverySetup(t *testing.T) *bundle {
	t.Helper()
	return setupOn(t, 3, servers.FakeKafka(t))
}

// TestWALRelayResumesWhenKafkaReturns: the brokers go away while events
// are written; the relay's publish fails and backs off (40 s) and, once
// the brokers answer again, the events are published and confirmed within
// resumeBound of their return.
func TestWALRelayResumesWhenKafkaReturns(t *testing.T) {
	t.Parallel()
	b := recoverySetup(t)
	down := testenv.KafkaOutage(b.kafka.Fake)
	rr := b.startRelay(t, slowRetries())
	evs, want := sequence(b.d, 60, 6)
	b.write(t, evs[:30], 5)
	b.waitConfirmed(t)

	down.Store(true)
	failures := rr.failures.Load()
	b.write(t, evs[30:], 5)
	waitFor(t, "a publish to fail", func() bool { return rr.failures.Load() > failures })
	time.Sleep(outageAfterFail)
	if n := rr.failures.Load() - failures; n > 4 { // two per lane at most
		t.Fatalf("%d failures in the %v of the outage: the relay did not back off", n, outageAfterFail)
	}
	down.Store(false)
	back := time.Now()
	b.waitConfirmed(t)
	resumed := time.Since(back)
	t.Logf("relay published and confirmed the events of the outage %v after the brokers came back", resumed.Round(time.Millisecond))
	if resumed > resumeBound {
		t.Fatalf("relay resumed %v after the brokers came back, want within %v", resumed.Round(time.Millisecond), resumeBound)
	}
	testenv.CheckDelivery(t, b.readAll(t), want)
}

// TestWALRelayResumesWhenPostgresReturns: the database goes down under a
// streaming relay, whose session ends; it backs off (40 s) and, once the
// database is back, events written then are published and confirmed
// within resumeBound of its return.
func TestWALRelayResumesWhenPostgresReturns(t *testing.T) {
	t.Parallel()
	b := recoverySetup(t)
	if b.cluster == nil {
		t.Skipf("needs a cluster of its own to stop (unset %s)", EnvLogicalDatabaseURL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rr := b.startRelay(t, slowRetries())
	evs, want := sequence(b.d, 60, 6)
	b.write(t, evs[:30], 5)
	b.waitConfirmed(t)

	if err := b.cluster.Down(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the session to end", func() bool {
		st := rr.r.Status()
		return !st.Active && st.LastError != nil
	})
	time.Sleep(outageAfterFail)
	if err := b.cluster.Up(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	// The pool's connections died with the server: the first writes may
	// fail until it has new ones.
	for {
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := b.writer.WriteBatch(ctx, tx, evs[30:])
			return err
		})
		if err == nil {
			break
		}
		if time.Since(back) > time.Minute {
			t.Fatalf("writing after the database came back: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.waitConfirmed(t)
	resumed := time.Since(back)
	t.Logf("relay published and confirmed events written after the outage %v after the database came back", resumed.Round(time.Millisecond))
	if resumed > resumeBound {
		t.Fatalf("relay resumed %v after the database came back, want within %v", resumed.Round(time.Millisecond), resumeBound)
	}
	testenv.CheckDelivery(t, b.readAll(t), want)
}
