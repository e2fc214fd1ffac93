package outbox

import (
	"testing"
	"time"
)

// The pacer alone, without a database: what the relay's claims, byte caps,
// idle waits and wake-ups do to the batch size and the poll delay.

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
		if take := p.observe(p.batch(), true); take > p.ceiling {
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
	if take := p.observe(300, false); take != 300 || p.batch() != 300 {
		t.Fatalf("claim of 300 at batch 64: takes %d, batch %d; want 300 and 300", take, p.batch())
	}
	// More than the maximum: the batch takes the maximum, and stays there.
	p = newPacer(500, 100*time.Millisecond)
	if take := p.observe(900, false); take != 500 || p.batch() != 500 {
		t.Fatalf("claim of 900, maximum 500: takes %d, batch %d; want 500 and 500", take, p.batch())
	}
	// With a lane still full it doubles on top, up to the maximum.
	p = newPacer(1000, 100*time.Millisecond)
	if take := p.observe(300, true); take != 300 || p.batch() != 600 {
		t.Fatalf("full claim of 300 at batch 64: takes %d, batch %d; want 300 and 600", take, p.batch())
	}
}

func TestPacerShrinksWhenClaimsComeBackMostlyEmpty(t *testing.T) {
	p := newPacer(500, 100*time.Millisecond)
	p.observe(500, false)
	if p.batch() != 500 {
		t.Fatalf("setup: batch %d", p.batch())
	}
	// A quarter full or more keeps the size.
	if take := p.observe(125, false); take != 125 || p.batch() != 500 {
		t.Fatalf("claim of 125 at 500: takes %d, batch %d; want 125 and 500", take, p.batch())
	}
	// Less than a quarter halves it, down to the floor and no further.
	for _, w := range []int{250, 125, minBatch, minBatch} {
		p.observe(1, false)
		if p.batch() != w {
			t.Fatalf("after a near-empty claim: batch %d, want %d", p.batch(), w)
		}
	}
	p.observe(0, false)
	if p.batch() != minBatch {
		t.Fatalf("after an empty claim: batch %d, want the floor %d", p.batch(), minBatch)
	}
}

func TestPacerByteCap(t *testing.T) {
	p := newPacer(500, 100*time.Millisecond)
	p.observe(500, false)
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
		p.idled()
	}
	// An empty claim leaves the delay alone; rows found reset it.
	p.observe(0, false)
	if p.delay() != ceiling {
		t.Fatalf("after an empty claim: delay %v, want %v", p.delay(), ceiling)
	}
	p.observe(1, false)
	if p.delay() != pollMin {
		t.Fatalf("after a claim with rows: delay %v, want %v", p.delay(), pollMin)
	}
	// The batch size and the delay are independent.
	p.idled()
	p.capped(200)
	if p.delay() != 2*pollMin || p.batch() != 200 {
		t.Fatalf("delay %v, batch %d; want %v and 200", p.delay(), p.batch(), 2*pollMin)
	}
}

func TestPacerWakeUps(t *testing.T) {
	const ceiling = 100 * time.Millisecond
	p := newPacer(500, ceiling)
	for range 10 {
		p.idled()
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
	p.idled()
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
		p.idled()
	}
	if p.delay() != pollMin {
		t.Fatalf("after the quick polls: delay %v, want %v", p.delay(), pollMin)
	}
	p.idled()
	if p.delay() != 2*pollMin {
		t.Fatalf("after the quick polls and an idle wait: delay %v, want %v", p.delay(), 2*pollMin)
	}
	// Wake-ups change nothing of the batch size.
	if p.batch() != minBatch {
		t.Fatalf("batch %d after wake-ups, want %d", p.batch(), minBatch)
	}
}
