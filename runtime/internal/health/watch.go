package health

import (
	"context"
	"sync"
	"time"
)

// RecheckInterval is how often a Watch checks a dependency it saw down, so
// the work waiting for it resumes within about this long of its return.
// One check per interval per process is no load on a dependency that is
// down; the work's own retries keep their growing backoff.
const RecheckInterval = 500 * time.Millisecond

// Watch is one dependency's reachability (the database, the Kafka
// brokers) as its checker sees it, and the signal that wakes the work
// waiting for it: work that failed against the dependency sleeps out its
// backoff with Sleep on the channel of Back, and the check that sees the
// dependency answer again, after it saw it fail, closes that channel. So
// the work resumes as soon as the dependency is back, instead of at the
// end of a backoff grown during the outage, and still does not retry
// while it is down.
//
// Only the checker's own verdicts move the state: a failure of the work
// asks for a check (Suspect) but does not mark the dependency down, so an
// error only the work meets (a bad statement, a refused record) never
// cuts its backoff short. The zero Watch is ready to use; one goroutine
// runs Run, any number call the other methods.
type Watch struct {
	mu   sync.Mutex
	down bool          // the last check failed
	back chan struct{} // closed, and replaced, when a check succeeds after one that failed
	look chan struct{} // a pending request for a check (Suspect); one is enough
}

// init makes the channels of a zero Watch; w.mu is held.
func (w *Watch) init() {
	if w.back == nil {
		w.back = make(chan struct{})
		w.look = make(chan struct{}, 1)
	}
}

// Back returns the channel that the next return of the dependency closes:
// the next check to succeed after one that failed. Take it before the
// attempt whose failure will sleep on it, so that a return during the
// attempt is not missed: the sleep then ends at once.
func (w *Watch) Back() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.init()
	return w.back
}

// Down reports whether the last check failed.
func (w *Watch) Down() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.down
}

// Suspect asks the checker to check now: the work failed against the
// dependency. It never blocks; requests made before the check runs count
// as one.
func (w *Watch) Suspect() {
	w.mu.Lock()
	w.init()
	look := w.look
	w.mu.Unlock()
	select {
	case look <- struct{}{}:
	default:
	}
}

// Checked records a check's outcome. A success after a failure is the
// dependency's return: it wakes every Sleep on the channel of Back and
// reports true.
func (w *Watch) Checked(err error) (back bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.init()
	if err != nil {
		w.down = true
		return false
	}
	if !w.down {
		return false
	}
	w.down = false
	close(w.back)
	w.back = make(chan struct{})
	return true
}

// Run checks the dependency with check until ctx ends, recording each
// outcome (Checked): at once and then every interval when every > 0; at
// once when the work suspects it (Suspect); every RecheckInterval while
// the last check failed. With every = 0 it checks only on suspicion and
// while the dependency is down, for a process that has no periodic health
// check of its own. check must return when its context ends.
func (w *Watch) Run(ctx context.Context, every time.Duration, check func(context.Context) error) {
	w.mu.Lock()
	w.init()
	look := w.look
	w.mu.Unlock()
	due := every > 0
	for {
		if due {
			err := check(ctx)
			if ctx.Err() != nil {
				return
			}
			w.Checked(err)
		}
		wait := every
		if w.Down() && (wait <= 0 || wait > RecheckInterval) {
			wait = RecheckInterval
		}
		if !w.wait(ctx, wait, look) {
			return
		}
		due = true
	}
}

// wait waits d (d <= 0: for ever), or for a request for a check, or until
// ctx ends; it reports whether ctx is still going.
func (w *Watch) wait(ctx context.Context, d time.Duration, look <-chan struct{}) bool {
	var tick <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		tick = t.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-look:
	case <-tick:
	}
	return true
}

// Sleep waits d, or until back is closed (the dependency the caller
// failed against is back: see Watch) or ctx ends; it returns ctx's error
// if ctx ended, nil otherwise. A nil back waits d or ctx.
func Sleep(ctx context.Context, d time.Duration, back <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-back:
	case <-t.C:
	}
	return ctx.Err()
}
