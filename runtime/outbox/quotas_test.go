package outbox

import (
	"testing"
)

// simulateClaims runs claims of loop l's quotas against per-lane backlogs
// (pending, by lane), adding arrive[lane] rows after each claim, and
// returns the rows each lane gave in every claim.
func simulateClaims(l *loop, pending, arrive map[int]int, claims int) []map[int]int {
	var out []map[int]int
	for range claims {
		lanes, quotas := l.quotas()
		sum := 0
		var batch []claimed
		gave := map[int]int{}
		for i, lane := range lanes {
			sum += quotas[i]
			n := min(pending[lane], quotas[i])
			pending[lane] -= n
			gave[lane] = n
			for range n {
				batch = append(batch, claimed{rowMeta: rowMeta{Lane: lane}})
			}
		}
		l.noteDemand(batch, lanes, quotas)
		for lane, n := range arrive {
			pending[lane] += n
		}
		out = append(out, gave)
	}
	return out
}

// TestQuotasFollowTheDemand pins the claim's per-lane quotas against
// simulated backlogs: they add up to the batch once demand is known; one
// hot lane fills the batch but for a row per other lane; a lane that turns
// busy beside a hot one gets an even share at once and keeps up with its
// arrivals; and with more lanes than the batch holds, every lane comes
// round while one lane is busy.
func TestQuotasFollowTheDemand(t *testing.T) {
	lanes16 := make([]int, 16)
	for i := range lanes16 {
		lanes16[i] = i
	}

	// No demand known: every lane gets twice its share, at least
	// minLaneQuota.
	l := &loop{s: &session{owned: lanes16}, pace: pacer{size: 64}}
	if _, quotas := l.quotas(); quotas[0] != minLaneQuota {
		t.Fatalf("no demand known: quota %d, want %d", quotas[0], minLaneQuota)
	}

	// One hot lane: after a few claims it gets the batch but one row per
	// other lane, and the quotas add up to the batch.
	l = &loop{s: &session{owned: lanes16}, pace: pacer{size: 500}}
	pending := map[int]int{0: 1 << 30}
	gave := simulateClaims(l, pending, nil, 5)
	if got, want := gave[4][0], 500-15; got != want {
		t.Fatalf("hot lane gave %d rows in the 5th claim, want %d: %v", got, want, gave)
	}

	// Lane 1 turns busy beside it (50 rows a claim, 2,000 waiting): its
	// backlog must drain within a few claims, not crawl.
	pending[1] = 2000
	gave = simulateClaims(l, pending, map[int]int{1: 50}, 20)
	if pending[1] > 50 {
		t.Fatalf("lane 1 still holds %d rows after 20 claims beside a hot lane: %v", pending[1], gave)
	}
	if gave[19][0] < 200 {
		t.Fatalf("the hot lane fell to %d rows a claim: %v", gave[19][0], gave[19])
	}

	// Trickle: a few rows here and there never fill a quota, so the
	// quotas stay spread over every lane.
	l = &loop{s: &session{owned: lanes16}, pace: pacer{size: 64}}
	simulateClaims(l, map[int]int{3: 2, 9: 1}, map[int]int{3: 2, 9: 1}, 5)
	for lane, d := range l.demand {
		if d.full {
			t.Fatalf("trickle: lane %d filled its quota (%+v)", lane, l.demand)
		}
	}

	// More lanes than the batch holds, one busy lane: every lane is asked
	// for a row within a few claims, whatever the lane count.
	for _, n := range []int{30, 100, 128} {
		many := make([]int, n)
		for i := range many {
			many[i] = i
		}
		l := &loop{s: &session{owned: many}, pace: pacer{size: 20}}
		seen := map[int]bool{}
		p := map[int]int{0: 1 << 30}
		for _, g := range simulateClaims(l, p, nil, 2*n) {
			for lane := range g {
				seen[lane] = true
			}
		}
		if len(seen) != n {
			t.Fatalf("%d lanes, batch 20: %d lanes asked for a row in %d claims", n, len(seen), 2*n)
		}
	}
}
