package walrelay

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// state is what the health handlers and Status report.
type state struct {
	mu        sync.Mutex
	run       bool
	isActive  bool
	isStandby bool
	why       string // the standby's reason
	lastErr   error
	errAt     time.Time
	pubAt     time.Time
	records   int64
	lagBytes  int64
	walStatus string
	behind    time.Duration
	waiting   int
	stall     time.Duration
}

func (s *state) running(on bool) {
	s.mu.Lock()
	s.run = on
	s.mu.Unlock()
}

func (s *state) active(on bool) {
	s.mu.Lock()
	s.isActive, s.isStandby = on, false
	if on {
		s.lastErr = nil
	}
	s.mu.Unlock()
}

func (s *state) standby(err error) {
	s.mu.Lock()
	s.isStandby, s.why = true, err.Error()
	s.mu.Unlock()
}

func (s *state) failed(err error) {
	s.mu.Lock()
	s.lastErr, s.errAt = err, time.Now()
	s.isStandby = false
	s.mu.Unlock()
}

func (s *state) published(n int) {
	s.mu.Lock()
	s.pubAt = time.Now()
	s.records += int64(n)
	s.mu.Unlock()
}

func (s *state) lag(bytes int64, walStatus string, behind time.Duration, waiting int) {
	s.mu.Lock()
	s.lagBytes, s.walStatus, s.behind, s.waiting = bytes, walStatus, behind, waiting
	s.mu.Unlock()
}

// Status is a snapshot of the relay, for health checks and operators.
type Status struct {
	Running bool
	// Active: this relay streams from the slot; Standby: another relay
	// does and this one waits to take over.
	Active, Standby bool
	// Published is the records this relay published since it started.
	Published int64
	// LagBytes is the WAL the slot retains (read every status interval
	// by the active relay); Behind is how long the oldest event read and
	// not yet acknowledged has been committed, Waiting how many
	// transactions are in that state.
	LagBytes int64
	// WALStatus is the slot's wal_status ("unreserved": at risk of
	// invalidation).
	WALStatus string
	Behind    time.Duration
	Waiting   int
	// LastError is the latest failure (a publish, a lost connection), nil
	// once the relay streams again.
	LastError error
}

// Status returns the relay's state now.
func (r *Relay) Status() Status {
	s := &r.state
	s.mu.Lock()
	defer s.mu.Unlock()
	return Status{Running: s.run, Active: s.isActive, Standby: s.isStandby, Published: s.records,
		LagBytes: s.lagBytes, WALStatus: s.walStatus, Behind: s.behind, Waiting: s.waiting, LastError: s.lastErr}
}

// check is the health handlers' verdict.
func (r *Relay) check() (string, bool, bool) {
	st := r.Status()
	var b strings.Builder
	ready := false
	switch {
	case !st.Running:
		b.WriteString("walrelay: not running\n")
	case st.Standby:
		ready = true
		fmt.Fprintf(&b, "walrelay: standby for slot %q: %s\n", r.cfg.slot, r.state.why)
	case st.Active && st.Behind > r.cfg.stallTimeout:
		fmt.Fprintf(&b, "walrelay: active, but the oldest unpublished event was committed %v ago (stall timeout %v)\n", st.Behind.Round(time.Millisecond), r.cfg.stallTimeout)
	case st.Active && st.WALStatus == "unreserved":
		fmt.Fprintf(&b, "walrelay: active, but slot %q is past max_wal_size and will be invalidated at max_slot_wal_keep_size\n", r.cfg.slot)
	case st.Active && r.cfg.maxLagBytes > 0 && st.LagBytes > r.cfg.maxLagBytes:
		fmt.Fprintf(&b, "walrelay: active, but slot %q retains %d bytes of WAL, over the bound of %d\n", r.cfg.slot, st.LagBytes, r.cfg.maxLagBytes)
	case st.Active:
		ready = true
		b.WriteString("walrelay: active\n")
	default:
		b.WriteString("walrelay: connecting\n")
	}
	fmt.Fprintf(&b, "slot %s: %d bytes of WAL retained; %d transactions waiting, oldest %v; %d records published\n",
		r.cfg.slot, st.LagBytes, st.Waiting, st.Behind.Round(time.Millisecond), st.Published)
	if st.LastError != nil {
		fmt.Fprintf(&b, "last error: %v\n", st.LastError)
	}
	return b.String(), st.Running, ready
}

// watchLag reads the slot's retained WAL and the watermark's age every
// status interval while the session streams.
func (r *Relay) watchLag(ctx context.Context, wm *watermark) {
	t := time.NewTicker(r.cfg.statusInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, err := readSlot(ctx, r.pool, r.cfg.slot)
		if err != nil {
			continue
		}
		behind, waiting := wm.behind(time.Now())
		r.state.lag(st.LagBytes, st.WALStatus, behind, waiting)
		if f := r.cfg.hooks.Lag; f != nil {
			f(st.LagBytes, behind)
		}
	}
}

// checkTimeout bounds one check of a dependency (Relay.dbWatch,
// Relay.kafkaWatch).
const checkTimeout = 5 * time.Second

// pingDatabase is the database's check: a ping on the pool.
func (r *Relay) pingDatabase(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	if err := r.pool.Ping(cctx); err != nil {
		return fmt.Errorf("walrelay: database check: %w", err)
	}
	return nil
}

// pingKafka is the brokers' check: an ApiVersions request and its answer,
// so a broker that accepts connections but hangs counts as down.
func pingKafka(ctx context.Context, kc *kafka.Client) error {
	cctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	resp, err := kc.ApiVersions(cctx, &kafka.ApiVersionsRequest{})
	if err == nil && resp.Error != nil {
		err = resp.Error
	}
	if err != nil {
		return fmt.Errorf("walrelay: kafka check: %w", err)
	}
	return nil
}
