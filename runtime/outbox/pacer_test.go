package outbox

import (
	"testing"
	"time"
)

// The pacer alone, without a database: what the relay's claims, byte caps,
// idle waits and wake-ups do to the batch size and the poll delay. Time is
// passed in, so the tests set the clock: t0 is an arbitrary start.

var t0 = time.Unix(1_000_000, 0)

func TestPacerStartsSmall(t *testing.T) {
	p := newPacer(500, 100*time.Millisecond)
	if p.batch() != minBatch || p.delay() != pollMin {
		t.Fatalf("new pacer: batch %d, delay %v; want %d and %v", p.batch(), p.delay(), minBatch, pollMin)
	}
	// A maximum below minBatch is also the floor and the start.
	p = newPacer(10, 100*time.Millisecond)
	if p.batch() != 10 {
		t.Fatalf("new pacer with maximum 10: batch %d", p.batch())
	}
}

func TestPacerGrowsWhileClaimsComeBackFull(t *testing.T) {
	p := newPacer(500, 100*time.Millisecond)
	want := []int{128, 256, 500, 500}
	for i, w := range want {
		if take := p.observe(p.batch(), true, t0); take > p.ceiling {
			t.Fatalf("claim %d: takes %d rows, above the maximum", i, take)
		}
		if p.batch() != w {
			t.Fatalf("after full claim %d: batch %d, want %d", i, p.batch(), w)
		}
	}
}

func TestPacerJumpsToABacklog(t *testing.T) {
	p := newPacer(500, 100*time.Millisecond)
	// Every lane was asked for more than its share and together they gave
	// 300 rows: the batch takes them all at once, not 64 of them.
	if take := p.observe(300, false, t0); take != 300 || p.batch() != 300 {
		t.Fatalf("claim of 300 at batch 64: takes %d, batch %d; want 300 and 300", take, p.batch())
	}
	// More than the maximum: the batch takes the maximum, and stays there.
	p = newPacer(500, 100*time.Millisecond)
	if take := p.observe(900, false, t0); take != 500 || p.batch() != 500 {
		t.Fatalf("claim of 900, maximum 500: takes %d, batch %d; want 500 and 500", take, p.batch())
	}
	// With a lane still full it doubles on top, up to the maximum.
	p = newPacer(1000, 100*time.Millisecond)
	if take := p.observe(300, true, t0); take != 300 || p.batch() != 600 {
		t.Fatalf("full claim of 300 at batch 64: takes %d, batch %d; want 300 and 600", take, p.batch())
	}
}

func TestPacerShrinksWhenClaimsComeBackMostlyEmpty(t *testing.T) {
	p := newPacer(500, 100*time.Millisecond)
	p.observe(500, false, t0)
	if p.batch() != 500 {
		t.Fatalf("setup: batch %d", p.batch())
	}
	// A quarter full or more keeps the size.
	if take := p.observe(125, false, t0); take != 125 || p.batch() != 500 {
		t.Fatalf("claim of 125 at 500: takes %d, batch %d; want 125 and 500", take, p.batch())
	}
	// Less than a quarter halves it, down to the floor and no further.
	for _, w := range []int{250, 125, minBatch, minBatch} {
		p.observe(1, false, t0)
		if p.batch() != w {
			t.Fatalf("after a near-empty claim: batch %d, want %d", p.batch(), w)
		}
	}
	p.observe(0, false, t0)
	if p.batch() != minBatch {
		t.Fatalf("after an empty claim: batch %d, want the floor %d", p.batch(), minBatch)
	}
}

func TestPacerByteCap(t *testing.T) {
	p := newPacer(500, 100*time.Millisecond)
	p.observe(500, false, t0)
	p.capped(120)
	if p.batch() != 120 {
		t.Fatalf("after a cut at 120 rows: batch %d", p.batch())
	}
	// A cut below the floor (huge rows) still asks for the floor.
	p.capped(3)
	if p.batch() != minBatch {
		t.Fatalf("after a cut at 3 rows: batch %d, want the floor %d", p.batch(), minBatch)
	}
}

func TestPacerIdleDelay(t *testing.T) {
	const ceiling = 10 * time.Millisecond
	p := newPacer(500, ceiling)
	// Every idle wait doubles the delay, up to the poll interval.
	want := []time.Duration{pollMin, 2 * pollMin, 4 * pollMin, 8 * pollMin, ceiling, ceiling}
	for i, w := range want {
		if p.delay() != w {
			t.Fatalf("idle wait %d: delay %v, want %v", i, p.delay(), w)
		}
		p.idled(t0)
	}
	// An empty claim leaves the delay alone; rows found reset it.
	p.observe(0, false, t0)
	if p.delay() != ceiling {
		t.Fatalf("after an empty claim: delay %v, want %v", p.delay(), ceiling)
	}
	p.observe(1, false, t0)
	if p.delay() != pollMin {
		t.Fatalf("after a claim with rows: delay %v, want %v", p.delay(), pollMin)
	}
	// The batch size and the delay are independent.
	p.idled(t0)
	p.capped(200)
	if p.delay() != 2*pollMin || p.batch() != 200 {
		t.Fatalf("delay %v, batch %d; want %v and 200", p.delay(), p.batch(), 2*pollMin)
	}
}

func TestPacerWakeUps(t *testing.T) {
	const ceiling = 100 * time.Millisecond
	p := newPacer(500, ceiling)
	for range 10 {
		p.idled(t0)
	}
	if p.delay() != ceiling {
		t.Fatalf("setup: delay %v", p.delay())
	}
	// A wake-up for committed rows resets the delay; the next idle wait
	// doubles it again.
	p.woken(false)
	if p.delay() != pollMin || p.fast != 0 {
		t.Fatalf("after a committed wake-up: delay %v, quick polls %d; want %v and none", p.delay(), p.fast, pollMin)
	}
	p.idled(t0)
	if p.delay() != 2*pollMin {
		t.Fatalf("after a committed wake-up and an idle wait: delay %v, want %v", p.delay(), 2*pollMin)
	}
	// One for rows not yet committed keeps wakeFastPolls idle waits at
	// pollMin (the commit lands any moment), then backs off again.
	p.woken(true)
	for i := range wakeFastPolls {
		if p.delay() != pollMin {
			t.Fatalf("quick poll %d after an uncommitted wake-up: delay %v, want %v", i, p.delay(), pollMin)
		}
		p.idled(t0)
	}
	if p.delay() != pollMin {
		t.Fatalf("after the quick polls: delay %v, want %v", p.delay(), pollMin)
	}
	p.idled(t0)
	if p.delay() != 2*pollMin {
		t.Fatalf("after the quick polls and an idle wait: delay %v, want %v", p.delay(), 2*pollMin)
	}
	// Wake-ups change nothing of the batch size.
	if p.batch() != minBatch {
		t.Fatalf("batch %d after wake-ups, want %d", p.batch(), minBatch)
	}
}

func TestPacerHotWindow(t *testing.T) {
	const ceiling = 100 * time.Millisecond
	p := newPacer(500, ceiling)
	now := t0
	// Rows found every 5 ms (a steady flow, well under hotGap): from the
	// second on, the idle waits in between stay at pollMin.
	const every = 5 * time.Millisecond
	for i := range 10 {
		p.observe(1, false, now)
		for tick := pollMin; i > 0 && tick < every; tick += pollMin {
			p.idled(now.Add(tick))
			if p.delay() != pollMin {
				t.Fatalf("row %d, %v after it: delay %v, want %v (hot)", i, tick, p.delay(), pollMin)
			}
		}
		now = now.Add(every)
	}
	// The flow stops: once twice the gap has passed with nothing found,
	// the delay doubles again, up to the poll interval.
	last := now.Add(-every)
	p.idled(last.Add(2*every + pollMin))
	if p.delay() != 2*pollMin {
		t.Fatalf("2 gaps after the last row: delay %v, want %v", p.delay(), 2*pollMin)
	}
	for range 20 {
		p.idled(last.Add(time.Second))
	}
	if p.delay() != ceiling {
		t.Fatalf("a second after the last row: delay %v, want %v", p.delay(), ceiling)
	}

	// Sparse rows (every 50 ms, above hotGap) never make the window hot:
	// idle waits double between them as before.
	p = newPacer(500, ceiling)
	now = t0
	for range 5 {
		p.observe(1, false, now)
		now = now.Add(50 * time.Millisecond)
	}
	p.observe(1, false, now)
	p.idled(now.Add(pollMin))
	if p.delay() != 2*pollMin {
		t.Fatalf("rows 50 ms apart, an idle wait after one: delay %v, want %v", p.delay(), 2*pollMin)
	}

	// One find alone is no flow: the first idle wait after it doubles.
	p = newPacer(500, ceiling)
	p.observe(3, false, t0)
	p.idled(t0.Add(pollMin))
	if p.delay() != 2*pollMin {
		t.Fatalf("after a single find: delay %v, want %v", p.delay(), 2*pollMin)
	}
}
