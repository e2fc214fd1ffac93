package health

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestWatchSignalsReturnsOnly: Back's channel closes on a success after a
// failure, and on nothing else: not on successes while up, not on repeated
// failures (no wake-ups, so no retries, while the dependency is down).
func TestWatchSignalsReturnsOnly(t *testing.T) {
	var w Watch
	back := w.Back()
	if w.Checked(nil) || closed(back) {
		t.Fatal("a success while up signalled a return")
	}
	down := errors.New("down")
	for range 3 {
		if w.Checked(down) || closed(back) {
			t.Fatal("a failure signalled a return")
		}
	}
	if !w.Down() {
		t.Fatal("not down after failed checks")
	}
	if !w.Checked(nil) || !closed(back) {
		t.Fatal("a success after failures did not signal the return")
	}
	next := w.Back()
	if closed(next) || w.Down() {
		t.Fatal("the signal after a return is not armed again")
	}
	if w.Checked(nil) || closed(next) {
		t.Fatal("a second success signalled a second return")
	}
}

// TestWatchRunFollowsTheDependency: with no interval, Run checks only when
// asked (Suspect), then every RecheckInterval while the dependency is
// down, and its return ends a Sleep of an hour.
func TestWatchRunFollowsTheDependency(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var w Watch
	var up atomic.Bool
	var checks atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx, 0, func(context.Context) error {
			checks.Add(1)
			if up.Load() {
				return nil
			}
			return errors.New("down")
		})
	}()
	defer func() {
		cancel()
		<-done
	}()
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s (%d checks)", what, checks.Load())
			}
			time.Sleep(time.Millisecond)
		}
	}

	back := w.Back()
	w.Suspect()
	waitUntil("the check asked for", func() bool { return w.Down() })
	n := checks.Load()
	waitUntil("checks again while down", func() bool { return checks.Load() >= n+2 })
	if closed(back) {
		t.Fatal("signalled a return while down")
	}

	woke := make(chan error, 1)
	go func() { woke <- Sleep(ctx, time.Hour, back) }()
	up.Store(true)
	select {
	case err := <-woke:
		if err != nil {
			t.Fatalf("Sleep: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the return did not end the sleep")
	}
	if w.Down() {
		t.Fatal("still down after the return")
	}
}

// TestSleep: Sleep ends after its duration, on the signal, or with its
// context (returning the context's error).
func TestSleep(t *testing.T) {
	if err := Sleep(context.Background(), time.Millisecond, nil); err != nil {
		t.Fatalf("Sleep: %v", err)
	}
	back := make(chan struct{})
	close(back)
	bounded, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	if err := Sleep(bounded, time.Hour, back); err != nil {
		t.Fatalf("Sleep on a closed signal did not end at once: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, time.Hour, make(chan struct{})); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sleep with a canceled context: %v", err)
	}
}
