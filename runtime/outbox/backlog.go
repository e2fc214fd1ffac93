package outbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Producer backpressure (WithBacklogPolicy): a Writer that sees the outbox
// backlog over a bound refuses new events, at once or after waiting, with
// a *BacklogError, instead of letting the table grow without limit while
// the relay cannot publish. The backlog is sampled through the caller's
// transaction at most once per sample interval and otherwise read from
// memory, so a write costs no extra round trip.

// BacklogBound bounds a backlog of pending (unpublished) outbox rows by
// how many there are and how old the oldest is; a zero field sets no
// bound of its kind.
type BacklogBound struct {
	// MaxPending is the most pending rows before writes are refused; it is
	// required, and it bounds a reading's cost: a reading reads at most
	// MaxPending+1 pending rows (then the bound is broken whatever their
	// age). It is a threshold, not an exact quota: writes admitted on the
	// same reading, and rows not yet committed, can pass it.
	MaxPending int64
	// MaxAge is the oldest a pending row may be (its created_at: the start
	// of the transaction that wrote it); 0 sets no bound on age.
	MaxAge time.Duration
}

func (b BacklogBound) zero() bool { return b.MaxPending == 0 && b.MaxAge == 0 }

func (b BacklogBound) check(what string) error {
	if b.MaxPending < 0 || b.MaxAge < 0 {
		return fmt.Errorf("outbox: backlog bound for %s: MaxPending %d and MaxAge %v must not be negative", what, b.MaxPending, b.MaxAge)
	}
	return nil
}

// checkWriter also requires MaxPending of a Writer's bound: it caps what a
// reading in the caller's transaction reads.
func (b BacklogBound) checkWriter(what string) error {
	if err := b.check(what); err != nil {
		return err
	}
	if !b.zero() && b.MaxPending == 0 {
		return fmt.Errorf("outbox: backlog bound for %s: MaxAge %v without MaxPending: set MaxPending too (a reading reads at most MaxPending+1 pending rows, in the caller's transaction)", what, b.MaxAge)
	}
	return nil
}

// over reports whether a sample breaks the bound (oldest is 0 when
// nothing is pending).
func (b BacklogBound) over(s backlogSample) bool {
	return (b.MaxPending > 0 && s.pending > b.MaxPending) || (b.MaxAge > 0 && s.oldest > b.MaxAge)
}

func (b BacklogBound) String() string {
	var parts []string
	if b.MaxPending > 0 {
		parts = append(parts, fmt.Sprintf("%d pending rows", b.MaxPending))
	}
	if b.MaxAge > 0 {
		parts = append(parts, fmt.Sprintf("oldest %s", b.MaxAge))
	}
	return strings.Join(parts, ", ")
}

// DefaultBacklogSample is how stale a Writer's backlog sample may be
// unless BacklogPolicy.Sample says otherwise.
const DefaultBacklogSample = time.Second

// BacklogPolicy is what a Writer does about the outbox's backlog (see
// WithBacklogPolicy).
type BacklogPolicy struct {
	// Table bounds the backlog of the whole table, every topic together.
	Table BacklogBound
	// Topics bounds the backlog of single topics: an event of a topic named
	// here is refused when that topic's pending rows break its bound (and
	// still when the whole table breaks Table's). A topic's sample reads
	// the table's pending rows until it has counted MaxPending+1 of the
	// topic's, so keep topic bounds for the topics where a backlog matters.
	Topics map[string]BacklogBound
	// Wait is how long a write over a bound waits for the backlog to fall
	// below it, sampling it again every Sample, before it fails; 0 fails at
	// once. The wait keeps the caller's transaction open: fail fast on
	// request paths, wait in batch jobs. Publish's context bounds the wait
	// too. Only a READ COMMITTED transaction waits (the default): under
	// REPEATABLE READ or SERIALIZABLE every reading sees the transaction's
	// snapshot, which no relay can drain, so such a write fails at once.
	Wait time.Duration
	// Sample is how stale the Writer's view of the backlog may be
	// (default DefaultBacklogSample): one write in each interval reads the
	// backlog through its transaction, the others use that reading.
	Sample time.Duration
}

// WithBacklogPolicy makes the Writer refuse events while the outbox's
// backlog is over a bound — the relay down or unable to reach Kafka for
// long enough — with a *BacklogError (errors.Is ErrBacklog), at once or
// after waiting up to the policy's Wait, rather than let the table grow
// without limit. Nothing is written when the error is returned; rows
// already written stay and are published once the relay catches up. The
// Writer of the WAL source has no rows to count and refuses the option.
func WithBacklogPolicy(p BacklogPolicy) WriterOption { return backlogOption{p} }

type backlogOption struct{ p BacklogPolicy }

func (o backlogOption) applyWriter(c *writerConfig) { c.backlog = &o.p }

// ErrBacklog matches (errors.Is) every *BacklogError.
var ErrBacklog = errors.New("outbox backlog over its bound")

// BacklogError is returned by Write and WriteBatch when the outbox's
// backlog is over a bound of the Writer's BacklogPolicy; nothing is
// written.
type BacklogError struct {
	// Table is the outbox table, as the Writer names it.
	Table string
	// Topic is the topic whose bound was broken, "" for the whole table.
	Topic string
	// Pending is how many rows were pending at the last sample (at most
	// the bound + 1: a sample stops counting there).
	Pending int64
	// OldestPending is the age of the oldest pending row.
	OldestPending time.Duration
	// Bound is the bound that was broken.
	Bound BacklogBound
	// Waited is how long the write waited for the backlog to fall.
	Waited time.Duration
}

func (e *BacklogError) Error() string {
	scope := "table " + e.Table
	if e.Topic != "" {
		scope += fmt.Sprintf(" (topic %q)", e.Topic)
	}
	pending := fmt.Sprintf("%d", e.Pending)
	if e.Bound.MaxPending > 0 && e.Pending > e.Bound.MaxPending {
		pending = fmt.Sprintf("more than %d", e.Bound.MaxPending)
	}
	waited := ""
	if e.Waited > 0 {
		waited = fmt.Sprintf(" after waiting %s", e.Waited.Round(time.Millisecond))
	}
	return fmt.Sprintf("outbox: %v: %s has %s pending rows, the oldest %s old, over the bound (%s)%s; nothing was written: "+
		"the relay is not keeping up or cannot reach Kafka (eventsctl outbox status, the relay's /readyz); retry later, or raise the bound (outbox.WithBacklogPolicy)",
		ErrBacklog, scope, pending, roundAge(e.OldestPending), e.Bound, waited)
}

// Is makes errors.Is(err, ErrBacklog) hold.
func (e *BacklogError) Is(target error) bool { return target == ErrBacklog }

// backlogSample is one reading of a backlog.
type backlogSample struct {
	at      time.Time
	pending int64
	oldest  time.Duration // at the time of the reading
	// readCommitted: the transaction that took the reading reads at READ
	// COMMITTED (a later reading in it sees newer commits). It describes
	// that transaction only: admit asks its caller's own before waiting.
	readCommitted bool
}

// aged is the sample with its oldest row aged to now: the age grows while
// nothing drains (at most one sample interval, after which a write reads
// the backlog again).
func (s backlogSample) aged(now time.Time) backlogSample {
	if s.pending > 0 {
		s.oldest += now.Sub(s.at)
	}
	return s
}

// backlogGauge is the sampled backlog of the table or of one topic.
type backlogGauge struct {
	topic string // "" for the table
	bound BacklogBound
	last  atomic.Pointer[backlogSample]
	// reading is held (a one-slot semaphore) by the one write reading
	// the backlog; a write waiting for it gives up when its context ends.
	reading chan struct{}
}

func newGauge(topic string, b BacklogBound) *backlogGauge {
	return &backlogGauge{topic: topic, bound: b, reading: make(chan struct{}, 1)}
}

// backlogGuard applies a Writer's BacklogPolicy.
type backlogGuard struct {
	table    string // as the Writer names it, for errors
	tableSQL string // counts the table's pending rows ($1: LIMIT)
	topicSQL string // counts one topic's ($1: LIMIT, $2: topic)
	wait     time.Duration
	sample   time.Duration
	all      *backlogGauge            // nil without a table bound
	topics   map[string]*backlogGauge // per topic bounds
}

func newBacklogGuard(t tableName, p *BacklogPolicy) (*backlogGuard, error) {
	if p == nil {
		return nil, nil
	}
	if p.Wait < 0 || p.Sample < 0 {
		return nil, fmt.Errorf("outbox: WithBacklogPolicy: Wait %v and Sample %v must not be negative", p.Wait, p.Sample)
	}
	if err := p.Table.checkWriter("the table"); err != nil {
		return nil, err
	}
	g := &backlogGuard{table: t.String(), wait: p.Wait, sample: p.Sample, topics: map[string]*backlogGauge{}}
	if g.sample == 0 {
		g.sample = DefaultBacklogSample
	}
	g.tableSQL, g.topicSQL = backlogQueries(t.sanitized())
	if !p.Table.zero() {
		g.all = newGauge("", p.Table)
	}
	for _, topic := range slices.Sorted(maps.Keys(p.Topics)) {
		b := p.Topics[topic]
		if topic == "" {
			return nil, errors.New("outbox: WithBacklogPolicy: empty topic name in Topics (bound the whole table with Table)")
		}
		if err := b.checkWriter(fmt.Sprintf("topic %q", topic)); err != nil {
			return nil, err
		}
		if !b.zero() {
			g.topics[topic] = newGauge(topic, b)
		}
	}
	if g.all == nil && len(g.topics) == 0 {
		return nil, errors.New("outbox: WithBacklogPolicy: no bound set: give Table or Topics a MaxPending (and, if you like, a MaxAge)")
	}
	return g, nil
}

// admit returns nil when rows of these topics may be written now, or a
// *BacklogError once a bound is still broken after the policy's wait.
func (g *backlogGuard) admit(ctx context.Context, q querier, rows []row) error {
	if g == nil {
		return nil
	}
	gauges := g.gaugesFor(rows)
	if len(gauges) == 0 {
		return nil
	}
	start := time.Now()
	refuse := func(gg *backlogGauge, s backlogSample) error {
		e := &BacklogError{Table: g.table, Topic: gg.topic, Pending: s.pending, OldestPending: s.oldest, Bound: gg.bound}
		if g.wait > 0 {
			e.Waited = time.Since(start)
		}
		return e
	}
	since := start.Add(-g.sample) // a reading newer than this will do
	var waitedOn *backlogGauge    // the bound broken before the last sleep
	var waitedS backlogSample
	// Whether the caller's transaction reads at READ COMMITTED, learnt by a
	// reading of its own before the first wait.
	var isolationKnown, readCommitted bool
	for {
		var broken *backlogGauge
		var s backlogSample
		for _, gg := range gauges {
			var err error
			if s, err = g.read(ctx, q, gg, since); err != nil {
				if waitedOn != nil && ctx.Err() != nil {
					return refuse(waitedOn, waitedS) // the wait ended during a reading
				}
				return err
			}
			if gg.bound.over(s) {
				broken = gg
				break
			}
		}
		if broken == nil {
			return nil
		}
		left := g.wait - time.Since(start)
		if dl, ok := ctx.Deadline(); ok {
			left = min(left, time.Until(dl))
		}
		if left <= 0 {
			return refuse(broken, s)
		}
		if !isolationKnown {
			// Under REPEATABLE READ or SERIALIZABLE every reading sees the
			// transaction's snapshot: waiting could not see the backlog
			// fall. A reading of this transaction's own says which.
			own, err := g.sampleNow(ctx, q, broken)
			if err != nil {
				return err
			}
			isolationKnown, readCommitted = true, own.readCommitted
			if !broken.bound.over(own) {
				continue
			}
			s = own
		}
		if !readCommitted {
			return refuse(broken, s)
		}
		// The next round wants a reading taken after this sleep began,
		// by this write or by any other.
		since, waitedOn, waitedS = time.Now(), broken, s
		if sleep(ctx, min(left, g.sample)); ctx.Err() != nil {
			return refuse(broken, s)
		}
	}
}

// gaugesFor returns the gauges that apply to rows: the table's, then each
// of their topics' once.
func (g *backlogGuard) gaugesFor(rows []row) []*backlogGauge {
	var gs []*backlogGauge
	if g.all != nil {
		gs = append(gs, g.all)
	}
	if len(g.topics) == 0 {
		return gs
	}
	for _, r := range rows {
		if gg, ok := g.topics[r.topic]; ok && !slices.Contains(gs, gg) {
			gs = append(gs, gg)
		}
	}
	return gs
}

// read returns the gauge's latest reading if it was taken after since,
// and otherwise reads the backlog through q — unless another write is
// reading it, whose reading it then waits for (or, when the latest reading
// is still within the sample interval, uses that one).
func (g *backlogGuard) read(ctx context.Context, q querier, gg *backlogGauge, since time.Time) (backlogSample, error) {
	for {
		now := time.Now()
		last := gg.last.Load()
		if last != nil && last.at.After(since) {
			return last.aged(now), nil
		}
		select {
		case gg.reading <- struct{}{}:
		default:
			if last != nil && now.Sub(last.at) < g.sample {
				return last.aged(now), nil // another write is reading it
			}
			select {
			case gg.reading <- struct{}{}:
			case <-ctx.Done():
				return backlogSample{}, fmt.Errorf("outbox: read the backlog of %s: %w", g.table, ctx.Err())
			}
		}
		if l := gg.last.Load(); l != last {
			<-gg.reading
			continue // read by another write meanwhile: look again
		}
		s, err := g.sampleNow(ctx, q, gg)
		<-gg.reading
		return s, err
	}
}

// sampleNow reads the gauge's backlog through q and, when q reads at READ
// COMMITTED, keeps the reading for the other writes: a transaction above
// it reads its own snapshot, which may be older than the reading's time.
func (g *backlogGuard) sampleNow(ctx context.Context, q querier, gg *backlogGauge) (backlogSample, error) {
	s, err := g.query(ctx, q, gg)
	if err == nil && s.readCommitted {
		gg.last.Store(&s)
	}
	return s, err
}

// query reads a gauge's backlog, counting at most its bound + 1 rows.
func (g *backlogGuard) query(ctx context.Context, q querier, gg *backlogGauge) (backlogSample, error) {
	limit := min(gg.bound.MaxPending, math.MaxInt64-1) + 1
	var s backlogSample
	var oldest float64
	var err error
	if gg.topic == "" {
		err = q.QueryRow(ctx, g.tableSQL, limit).Scan(&s.pending, &oldest, &s.readCommitted)
	} else {
		err = q.QueryRow(ctx, g.topicSQL, limit, gg.topic).Scan(&s.pending, &oldest, &s.readCommitted)
	}
	if err != nil {
		what := g.table
		if gg.topic != "" {
			what += fmt.Sprintf(" (topic %q)", gg.topic)
		}
		return s, fmt.Errorf("outbox: read the backlog of %s: %w", what, missingTable(err))
	}
	s.at = time.Now()
	s.oldest = time.Duration(oldest * float64(time.Second))
	return s, nil
}
