package outbox

import (
	"testing"
)

// TestQuotasSplitTheBatchByDemand pins the claim's per-lane quotas: every
// lane is asked for the whole batch while no demand is known; afterwards
// the quotas add up to the batch, every lane keeps a row, and a lane that
// filled its quota gets the most; with more lanes than the batch holds,
// every lane still comes round while one lane is busy.
func TestQuotasSplitTheBatchByDemand(t *testing.T) {
	owned := []int{0, 1, 2, 3, 4, 5, 6, 7}
	l := &loop{s: &session{owned: owned}, limit: 64}

	lanes, quotas := l.quotas()
	if len(lanes) != len(owned) {
		t.Fatalf("no demand known: lanes %v, want all %v", lanes, owned)
	}
	for i, q := range quotas {
		if q != l.limit {
			t.Fatalf("no demand known: lane %d quota %d, want the batch size %d", lanes[i], q, l.limit)
		}
	}

	// Lane 3 gave its whole quota, lane 5 a few rows, the others none.
	l.demand = map[int]int{3: 2 * 64, 5: 3}
	lanes, quotas = l.quotas()
	sum, byLane := 0, map[int]int{}
	for i, q := range quotas {
		sum += q
		byLane[lanes[i]] = q
	}
	if sum != l.limit {
		t.Fatalf("quotas %v over lanes %v add up to %d, want the batch size %d", quotas, lanes, sum, l.limit)
	}
	for _, lane := range owned {
		if byLane[lane] < 1 {
			t.Fatalf("lane %d got no row: %v", lane, byLane)
		}
	}
	if byLane[3] <= byLane[5] || byLane[5] < byLane[0] {
		t.Fatalf("quotas do not follow the demand (lane 3 busy, lane 5 some, lane 0 none): %v", byLane)
	}

	// 100 lanes, a batch of 20, one busy lane: every lane is asked for a
	// row within a few claims.
	many := make([]int, 100)
	for i := range many {
		many[i] = i
	}
	l = &loop{s: &session{owned: many}, limit: 20, demand: map[int]int{42: 40}}
	seen := map[int]bool{}
	for range 20 {
		lanes, quotas := l.quotas()
		sum := 0
		for i, q := range quotas {
			sum += q
			if q > 0 {
				seen[lanes[i]] = true
			}
		}
		if sum != l.limit {
			t.Fatalf("quotas add up to %d, want %d", sum, l.limit)
		}
	}
	if len(seen) != len(many) {
		t.Fatalf("after 20 claims %d of %d lanes were asked for a row", len(seen), len(many))
	}
}
