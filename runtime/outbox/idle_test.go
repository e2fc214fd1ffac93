package outbox

import (
	"context"
	"testing"
	"time"
)

// TestIdleWaitsItsPollDelay pins the idle wait between looks: a worker that
// owns no lanes (more relay sessions than lanes) still waits its poll
// delay between pumps instead of spinning, and a wake-up ends the wait at
// once. The delays asserted are lower bounds (timers never fire early),
// which a loaded machine only lengthens.
func TestIdleWaitsItsPollDelay(t *testing.T) {
	t.Parallel()
	const poll = 50 * time.Millisecond
	wake, unregister := registerWake("idle_test", "idle_test_outbox")
	defer unregister()
	l := &loop{
		r:    &Relay{cfg: relayConfig{pollInterval: poll}},
		s:    &session{}, // no lanes owned
		wake: wake,
		pace: pacer{poll: poll, maxPoll: poll},
		// No periodic task due while the test runs.
		nextRebalance: farFuture, nextCleanup: farFuture,
	}
	ctx := context.Background()
	for i := range 3 {
		start := time.Now()
		if n, err := l.pump(ctx); n != 0 || err != nil {
			t.Fatalf("pump without lanes: %d rows, %v", n, err)
		}
		l.idle(ctx)
		if waited := time.Since(start); waited < poll {
			t.Fatalf("idle %d without lanes returned after %v, before its poll delay %v: the worker would spin", i, waited, poll)
		}
	}

	l.pace.poll = time.Hour
	if _, err := l.pump(ctx); err != nil {
		t.Fatal(err)
	}
	woken := make(chan struct{})
	go func() {
		defer close(woken)
		l.idle(ctx)
	}()
	wakeTable(tableName{schema: "idle_test", name: "idle_test_outbox"}, true)
	select {
	case <-woken:
	case <-time.After(time.Minute):
		t.Fatal("a wake-up did not end the idle wait")
	}
	if l.pace.poll != pollMin || l.pace.fast != 0 {
		t.Fatalf("after a wake-up for committed rows: poll %v, quick polls %d; want %v and none", l.pace.poll, l.pace.fast, pollMin)
	}
}
