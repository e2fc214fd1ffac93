package outbox

import "time"

// Defaults of the adaptive batch size: it starts at minBatch (or the
// configured maximum, if smaller) and grows up to the maximum.
const (
	defaultBatchSize = 500
	minBatch         = 64
)

// pacer owns a lane worker's pace: the adaptive batch size (how many rows
// a claim asks for) and the idle poll delay (how long after its last look
// an idle worker looks again). Only its methods change them, from what the
// worker observes: a claim's yield (observe), a batch cut at the byte cap
// (capped), an idle wait (idled) and a wake-up (woken). A failed pump
// changes neither: the worker's backoff paces its retries, and the claim
// after it starts at the pace it left off.
//
// The batch size starts at the floor (minBatch, or the maximum if smaller),
// doubles while claims come back full, jumps to what one claim found when
// that is more, halves when claims come back less than a quarter full, and
// stays within [floor, maximum]. The poll delay is pollMin right after
// work or a wake-up and doubles on every idle wait up to the poll interval,
// except for the quick polls (wakeFastPolls) a wake-up sent before the
// writer's commit keeps at its delay, and while rows are arriving at a
// steady rate (the hot window): when claims have found rows less than
// hotGap apart, on average, the delay stays at pollMin until twice that
// gap has passed with nothing found. A relay in a process of its own, with
// no wake-ups from the writers, then finds a row about pollMin/2 after its
// commit under a steady flow, instead of after a delay that doubled in the
// gap between two rows; an idle relay backs off as before.
type pacer struct {
	// ceiling and floor bound the batch size (WithBatchSize, and minBatch
	// or the ceiling if smaller); maxPoll bounds the poll delay
	// (WithPollInterval).
	ceiling, floor int
	maxPoll        time.Duration

	size int           // the batch size
	poll time.Duration // the idle poll delay
	// fast counts the idle waits left at the current poll delay after a
	// wake-up for uncommitted rows, before the delay doubles again.
	fast int
	// found is when a claim last found rows, and gap the running mean of
	// the time between such claims (zero until two have): the hot window.
	found time.Time
	gap   time.Duration
}

// hotGap bounds the hot window: rows found on average less than hotGap
// apart keep the poll delay at pollMin (about hotGap/pollMin polls per
// row at most); rarer rows let it back off. 20 ms is a flow of 50 rows a
// second per worker.
const hotGap = 20 * time.Millisecond

// newPacer returns the pace of a worker that has not looked yet: the
// smallest batch, and the shortest poll delay.
func newPacer(maxBatch int, maxPoll time.Duration) pacer {
	floor := min(minBatch, maxBatch)
	return pacer{ceiling: maxBatch, floor: floor, maxPoll: maxPoll, size: floor, poll: pollMin}
}

// batch is how many rows the next claim asks for.
func (p *pacer) batch() int { return p.size }

// delay is the idle poll delay: the next look comes this long after the
// last one.
func (p *pacer) delay() time.Duration { return p.poll }

// observe adapts the pace to a claim, ended at now, that returned got rows
// (asked for batch() rows, split by lane quotas); full says some lane gave
// its whole quota, so rows may wait behind the batch. It returns how many
// of the got rows (in id order) the batch takes.
//
// Rows found reset the poll delay. More rows than asked for (every lane
// was asked for more than its even share) mean a backlog: the batch grows
// at once to what it may hold, rather than doubling claim by claim. A full
// claim doubles the batch size; one less than a quarter full halves it.
func (p *pacer) observe(got int, full bool, now time.Time) (take int) {
	if got > 0 {
		p.poll = pollMin // work resets the poll delay
		switch since := now.Sub(p.found); {
		case p.found.IsZero():
			// the first find: no gap yet
		case p.gap == 0:
			p.gap = since
		default:
			p.gap = (p.gap + since) / 2
		}
		p.found = now
	}
	take = got
	if got > p.size {
		p.size = min(got, p.ceiling)
		take = p.size
	}
	switch {
	case full:
		p.size = min(2*p.size, p.ceiling)
	case take < p.size/4:
		p.size = max(p.floor, p.size/2)
	}
	return take
}

// capped records a batch cut at the byte cap after fit rows: the next
// claims ask for no more than fit (and at least the floor), since the rest
// would be read again and again only to be dropped.
func (p *pacer) capped(fit int) { p.size = max(p.floor, fit) }

// idled records an idle wait at now (after its delay was read): the next
// one waits twice as long, up to the poll interval, unless quick polls are
// left after a wake-up or the flow of rows is hot.
func (p *pacer) idled(now time.Time) {
	if p.fast > 0 {
		p.fast-- // just woken: the rows come with the writer's commit, any moment now
		return
	}
	if p.gap > 0 && p.gap < hotGap && now.Sub(p.found) < 2*p.gap {
		return // rows come every gap or so: the next one is due any moment
	}
	p.poll = min(2*p.poll, p.maxPoll)
}

// woken records a wake-up: the poll delay is back to pollMin. A wake-up
// sent before the writer's commit (uncommitted) also keeps the next
// wakeFastPolls idle waits at that delay, since the rows come with that
// commit, any moment now.
func (p *pacer) woken(uncommitted bool) {
	p.poll = pollMin
	if uncommitted {
		p.fast = wakeFastPolls
	}
}
