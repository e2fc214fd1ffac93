package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/internal/health"
)

// Health is a relay's liveness and readiness, as Relay.Health reports it.
type Health struct {
	// Live is false when Run is not running, or its loop has not come
	// round for longer than any of its waits may take (a hung relay):
	// restart the process.
	Live bool
	// Ready is true when the relay runs, can reach the database and the
	// Kafka brokers, and makes progress: it is false while either is
	// unreachable, and while rows of its lanes have been pending longer
	// than the stall timeout (WithStallTimeout) without any row being
	// published meanwhile. Problems says why.
	Ready bool
	// Problems are the reasons for not being live or ready, for people.
	Problems []string
	// Database and Kafka are the last known state of the dependencies.
	Database, Kafka Dependency
	// Lanes is the number of lanes the relay owns.
	Lanes int
	// OldestPending is the age of the oldest pending row of the relay's
	// lanes at the last check (0: none).
	OldestPending time.Duration
	// Pending is how many rows of the relay's lanes were pending at the
	// last check, counted up to the WithReadyBacklog bound + 1; -1 when no
	// such bound is set (nothing is counted).
	Pending int64
	// Backlog is the WithReadyBacklog bound (zero: none); Ready is false
	// while Pending or OldestPending breaks it.
	Backlog BacklogBound
	// LastProgress is when the relay last marked rows published (or
	// started, if it has not yet).
	LastProgress time.Time
}

// Dependency is the reachability of the database or the brokers.
type Dependency struct {
	// Reachable is the outcome of the last check or operation.
	Reachable bool
	// Checked is when that was (zero: not checked yet).
	Checked time.Time
	// Since is when the state last changed.
	Since time.Time
	// Error is the last failure while unreachable.
	Error string
}

func (d Dependency) describe(name string, now time.Time) string {
	switch {
	case d.Checked.IsZero():
		return name + ": not checked yet"
	case d.Reachable:
		return fmt.Sprintf("%s: reachable (checked %s ago)", name, roundAge(now.Sub(d.Checked)))
	default:
		return fmt.Sprintf("%s: unreachable for %s: %s", name, roundAge(now.Sub(d.Since)), d.Error)
	}
}

func roundAge(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}

// String renders the health as the lines /livez and /readyz serve.
func (h Health) String() string {
	var b strings.Builder
	now := time.Now()
	switch {
	case !h.Live:
		b.WriteString("not live\n")
	case h.Ready:
		b.WriteString("ready\n")
	default:
		b.WriteString("live, not ready\n")
	}
	for _, p := range h.Problems {
		fmt.Fprintf(&b, "problem: %s\n", p)
	}
	fmt.Fprintln(&b, h.Database.describe("database", now))
	fmt.Fprintln(&b, h.Kafka.describe("kafka", now))
	fmt.Fprintf(&b, "lanes: %d owned\n", h.Lanes)
	fmt.Fprintf(&b, "oldest pending row: %s; last progress %s ago\n", roundAge(h.OldestPending), roundAge(now.Sub(h.LastProgress)))
	if h.Pending >= 0 {
		pending := fmt.Sprint(h.Pending)
		if h.Backlog.MaxPending > 0 && h.Pending > h.Backlog.MaxPending {
			pending = fmt.Sprintf("more than %d", h.Backlog.MaxPending)
		}
		fmt.Fprintf(&b, "pending rows: %s (bound: %s)\n", pending, h.Backlog)
	}
	return b.String()
}

// Health reports the relay's liveness and readiness. It is cheap (no I/O):
// Run checks the database and the brokers every health interval
// (WithHealthInterval) and records the outcome of its own work.
func (r *Relay) Health() Health { return r.health.snapshot(r.cfg) }

// LiveHandler serves the relay's liveness: 200 and the health text when
// live, 503 otherwise. Mount it at /livez.
func (r *Relay) LiveHandler() http.Handler { return health.Live(r.healthCheck) }

// ReadyHandler serves the relay's readiness: 200 and the health text when
// ready, 503 otherwise. Mount it at /readyz.
func (r *Relay) ReadyHandler() http.Handler { return health.Ready(r.healthCheck) }

// healthCheck is the relay's health in the handlers' shape.
func (r *Relay) healthCheck() (text string, live, ready bool) {
	h := r.Health()
	return h.String(), h.Live, h.Ready
}

// Names of the dependencies, in logs and health.
const (
	depDatabase = "database"
	depKafka    = "kafka"
	// depPublish folds per-row publish failures (a missing topic, a
	// refused key), which the brokers answering does not end.
	depPublish = "publish"
)

// healthState is what Health reads; the Run goroutines write it.
type healthState struct {
	mu           sync.Mutex
	running      bool
	beat         time.Time
	db, kafka    Dependency
	lanes        int
	owned        []int         // every worker's lanes, sorted
	byWorker     map[int][]int // each worker's lanes
	table        *resolvedTable
	oldest       time.Duration
	pending      int64 // -1: not counted
	lastProgress time.Time
}

func (h *healthState) start() {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	h.running, h.beat, h.lastProgress = true, now, now
	h.db, h.kafka, h.lanes, h.owned, h.table, h.oldest, h.pending = Dependency{}, Dependency{}, 0, nil, nil, 0, -1
	h.byWorker = map[int][]int{}
}

func (h *healthState) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.running = false
}

// alive records that the loop came round.
func (h *healthState) alive() {
	h.mu.Lock()
	h.beat = time.Now()
	h.mu.Unlock()
}

func (h *healthState) setTable(t resolvedTable) {
	h.mu.Lock()
	h.table = &t
	h.mu.Unlock()
}

// setLanes records the lanes one worker owns and returns how many the
// relay owns in all.
func (h *healthState) setLanes(worker int, owned []int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.byWorker[worker] = slices.Clone(owned)
	h.owned = h.owned[:0]
	for _, o := range h.byWorker {
		h.owned = append(h.owned, o...)
	}
	slices.Sort(h.owned)
	h.lanes = len(h.owned)
	return h.lanes
}

func (h *healthState) progress() {
	h.mu.Lock()
	h.lastProgress = time.Now()
	h.mu.Unlock()
}

// set records a dependency's state and returns how long it had been
// unreachable when it is reachable again (0 otherwise), and whether it just
// went from reachable to unreachable.
func (h *healthState) set(dep string, err error) (recoveredAfter time.Duration, wentDown bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	d := &h.db
	if dep == depKafka {
		d = &h.kafka
	}
	now := time.Now()
	ok := err == nil
	if d.Checked.IsZero() || d.Reachable != ok {
		if ok && !d.Checked.IsZero() {
			recoveredAfter = now.Sub(d.Since)
		}
		wentDown = !ok && d.Reachable
		d.Since = now
	}
	d.Checked, d.Reachable = now, ok
	d.Error = ""
	if err != nil {
		d.Error = err.Error()
	}
	return recoveredAfter, wentDown
}

func (h *healthState) snapshot(cfg relayConfig) Health {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	out := Health{Database: h.db, Kafka: h.kafka, Lanes: h.lanes, OldestPending: h.oldest, LastProgress: h.lastProgress,
		Pending: h.pending, Backlog: cfg.readyBacklog}
	if !h.running {
		out.Problems = append(out.Problems, "relay not running")
		return out
	}
	out.Live = true
	if stale := now.Sub(h.beat); stale > cfg.liveTimeout() {
		out.Live = false
		out.Problems = append(out.Problems, fmt.Sprintf("relay loop stuck for %s", roundAge(stale)))
	}
	out.Ready = out.Live
	for _, dep := range []struct {
		name string
		d    Dependency
	}{{depDatabase, h.db}, {depKafka, h.kafka}} {
		if !dep.d.Reachable {
			out.Ready = false
			out.Problems = append(out.Problems, dep.d.describe(dep.name, now))
		}
	}
	if h.table == nil && h.db.Reachable {
		out.Ready = false
		out.Problems = append(out.Problems, "outbox table not found yet")
	}
	if idle := now.Sub(h.lastProgress); h.oldest > cfg.stallTimeout && idle > cfg.stallTimeout {
		out.Ready = false
		out.Problems = append(out.Problems, fmt.Sprintf("no progress for %s with rows pending for %s (see `eventsctl outbox status` and `outbox list --stuck`)", roundAge(idle), roundAge(h.oldest)))
	}
	if cfg.readyBacklog.over(backlogSample{pending: h.pending, oldest: h.oldest}) {
		out.Ready = false
		out.Problems = append(out.Problems, fmt.Sprintf("backlog over the bound (%s): producers with the same WithBacklogPolicy are refused; is the relay publishing? (see `eventsctl outbox status`)", cfg.readyBacklog))
	}
	return out
}

// liveTimeout is how long the loop may go without coming round before the
// relay counts as hung: longer than its longest wait (a backoff, an idle
// wait until the next periodic task, a produce with its retries, a database
// call until keepalives give up).
func (c relayConfig) liveTimeout() time.Duration {
	idle := max(c.pollInterval, c.rebalanceInterval, c.cleanupInterval)
	return 2*c.backoffMax + idle + 2*time.Minute
}

// probeTimeout bounds one health check.
const probeTimeout = 5 * time.Second

// checkDatabase is the database's health check: a query on the pending
// index once the table is known (a ping before), its outcome recorded for
// Health and returned to the Watch that runs it.
func (r *Relay) checkDatabase(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, min(probeTimeout, r.cfg.healthInterval*2))
	defer cancel()
	r.health.mu.Lock()
	t, owned := r.health.table, append([]int(nil), r.health.owned...)
	r.health.mu.Unlock()
	var err error
	var oldest float64
	pending := int64(-1)
	if t == nil {
		err = r.pool.Ping(cctx)
	} else {
		qs := newQueries(t.qualified())
		err = r.pool.QueryRow(cctx, qs.oldestOwned, owned).Scan(&oldest)
		if bound := r.cfg.readyBacklog.MaxPending; err == nil && bound > 0 {
			err = r.pool.QueryRow(cctx, qs.pendingOwned, owned, bound+1).Scan(&pending)
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err == nil {
		r.health.mu.Lock()
		r.health.oldest = time.Duration(oldest * float64(time.Second))
		r.health.pending = pending
		r.health.mu.Unlock()
	}
	err = wrapProbe(depDatabase, err)
	r.dep(depDatabase, err)
	return err
}

// checkKafka is the brokers' health check (pingKafka), its outcome
// recorded for Health and returned to the Watch that runs it.
func (r *Relay) checkKafka(ctx context.Context, kc *kafka.Client) error {
	err := r.pingKafka(ctx, kc)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	r.dep(depKafka, err)
	return err
}

// pingKafka asks the brokers for their API versions: a real request and
// response, so a broker that accepts connections but hangs counts as down.
func (r *Relay) pingKafka(ctx context.Context, kc *kafka.Client) error {
	cctx, cancel := context.WithTimeout(ctx, min(probeTimeout, r.cfg.healthInterval*2))
	defer cancel()
	resp, err := kc.ApiVersions(cctx, &kafka.ApiVersionsRequest{})
	if err == nil && resp.Error != nil {
		err = resp.Error
	}
	return wrapProbe(depKafka, err)
}

func wrapProbe(dep string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s check: %w", dep, err)
}

// dep records a dependency's state; a recovery is logged with how long the
// outage lasted.
func (r *Relay) dep(dep string, err error) {
	after, wentDown := r.health.set(dep, err)
	if err != nil {
		if wentDown {
			// The first failure after a reachable spell; the retries that
			// follow are logged (folded) by whoever retries.
			r.log.Warn("outbox relay: "+dep+" unreachable", "err", err)
		}
		return
	}
	if after > 0 {
		r.log.Info(fmt.Sprintf("outbox relay: %s reachable again after %s", dep, roundAge(after)), "dep", dep, "outage", after.Round(time.Millisecond))
	}
	r.folds.recovered(dep)
}

// localAddr matches the local end of a connection in a network error
// ("read tcp 127.0.0.1:38284->10.0.0.7:9092: i/o timeout"): a new port per
// attempt must not make repeats of one error look different.
var localAddr = regexp.MustCompile(`[0-9A-Fa-f.:\[\]]+:\d+->`)

// folder logs repeated identical errors once, then a summary with the count
// every interval while they go on, so an outage does not flood the log.
type folder struct {
	log   *slog.Logger
	every time.Duration
	mu    sync.Mutex
	seen  map[string]*folded
}

type folded struct {
	dep        string
	msg        string
	first      time.Time
	lastLogged time.Time
	suppressed int
}

// warn logs msg with err unless the same error was logged less than
// every ago; then it counts it, and logs a summary once every has passed.
func (f *folder) warn(dep, msg string, err error, attrs ...any) {
	key := dep + "\x00" + msg + "\x00" + localAddr.ReplaceAllString(err.Error(), "")
	now := time.Now()
	f.mu.Lock()
	if f.seen == nil || len(f.seen) > 1000 {
		f.seen = map[string]*folded{}
	}
	e := f.seen[key]
	if e == nil {
		e = &folded{dep: dep, msg: msg, first: now, lastLogged: now}
		f.seen[key] = e
		f.mu.Unlock()
		f.log.Warn(msg, append([]any{"err", err}, attrs...)...)
		return
	}
	e.suppressed++
	if now.Sub(e.lastLogged) < f.every {
		f.mu.Unlock()
		return
	}
	n := e.suppressed
	e.suppressed, e.lastLogged = 0, now
	since := now.Sub(e.first)
	f.mu.Unlock()
	f.log.Warn(fmt.Sprintf("%s (repeated %d times in the last %s; failing for %s)", msg, n, roundAge(f.every), roundAge(since)), append([]any{"err", err, "repeated", n}, attrs...)...)
}

// recovered forgets dep's errors, first logging how many repeats of each
// went unlogged.
func (f *folder) recovered(dep string) {
	f.mu.Lock()
	var left []*folded
	for k, e := range f.seen {
		if e.dep == dep {
			if e.suppressed > 0 {
				left = append(left, e)
			}
			delete(f.seen, k)
		}
	}
	f.mu.Unlock()
	for _, e := range left {
		f.log.Info(fmt.Sprintf("%s: %d more times until it recovered", e.msg, e.suppressed), "dep", dep)
	}
}

// depError marks an error with the dependency it came from, so the loop
// can record it in the health.
type depError struct {
	dep string
	err error
}

func (e *depError) Error() string { return e.err.Error() }
func (e *depError) Unwrap() error { return e.err }

func dbErr(err error) error {
	if err == nil {
		return nil
	}
	return &depError{dep: depDatabase, err: err}
}

// depOf returns the dependency err came from ("" if unknown).
func depOf(err error) string {
	var d *depError
	if errors.As(err, &d) {
		return d.dep
	}
	return ""
}
