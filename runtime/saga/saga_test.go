package saga

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/protoevents/protoevents/runtime/events"
)

// TestFailureSemantics runs one saga per failure mode side by side, through
// the real outbox, relay, Kafka (kfake over TCP) and idempotent consumers,
// and checks where each ends, the effects the participants applied (each
// once, compensations in reverse order) and the path recorded.
func TestFailureSemantics(t *testing.T) {
	t.Parallel()
	wd := newWorld(t)
	var fixed atomic.Bool
	wd.setBehaviour(func(id, action string, n int) (ok, reply bool) {
		switch {
		case id == "fail-A" && action == "A", id == "fail-B" && action == "B":
			return false, true
		case (id == "fail-C" || id == "flaky" || id == "never") && action == "C":
			return false, true
		case id == "flaky" && action == "undo-B":
			return n > 0, true // fails once, then succeeds
		case id == "never" && action == "undo-B":
			return fixed.Load(), true
		case id == "timeout" && action == "B":
			return false, false // swallowed: the saga never hears back
		}
		return true, true
	})
	wd.runParticipants(t)
	main := wd.newSaga(t, "main", 0)
	timed := wd.newSaga(t, "timed", time.Second)
	wd.orchestrator(t, main)
	wd.orchestrator(t, timed)

	for _, id := range []string{"happy", "fail-A", "fail-B", "fail-C", "flaky", "never"} {
		wd.start(t, main, id, testData{})
	}
	wd.start(t, main, "fail-L", testData{FailLocal: true})
	wd.start(t, timed, "timeout", testData{})

	all := []string{"happy", "fail-A", "fail-L", "fail-B", "fail-C", "flaky", "never", "timeout"}
	final := wd.waitFinal(t, 60*time.Second, all...)
	want := map[string]struct {
		status  Status
		effects []string
	}{
		"happy":   {StatusCompleted, []string{"A", "L", "B", "C"}},
		"fail-A":  {StatusCompensated, nil},
		"fail-L":  {StatusCompensated, []string{"A", "undo-A"}},
		"fail-B":  {StatusCompensated, []string{"A", "L", "undo-L", "undo-A"}},
		"fail-C":  {StatusCompensated, []string{"A", "L", "B", "undo-B", "undo-L", "undo-A"}},
		"flaky":   {StatusCompensated, []string{"A", "L", "B", "undo-B", "undo-L", "undo-A"}},
		"never":   {StatusParked, []string{"A", "L", "B"}},
		"timeout": {StatusCompensated, []string{"A", "L", "undo-L", "undo-A"}},
	}
	for _, id := range all {
		if got := final[id].Status; got != want[id].status {
			t.Errorf("%s ended %s (%s), want %s; path %v", id, got, final[id].Failure, want[id].status, wd.transitions(t, id))
		}
		if got := wd.effects(t, id); !slices.Equal(got, want[id].effects) {
			t.Errorf("%s: effects %v, want %v (compensations in reverse order, each once); path %v", id, got, want[id].effects, wd.transitions(t, id))
		}
	}

	// The compensation that failed once was sent twice, as two commands.
	var tries int
	if err := wd.pool.QueryRow(context.Background(), `SELECT count(DISTINCT event_id) FROM tries WHERE saga_id = 'flaky' AND action = 'undo-B'`).Scan(&tries); err != nil {
		t.Fatal(err)
	}
	if tries != 2 {
		t.Errorf("flaky: undo-B tried %d times, want 2 (fail, retry after backoff, succeed)", tries)
	}
	if p := wd.transitions(t, "flaky"); !slices.Contains(p, "compensation-failed@B") {
		t.Errorf("flaky: path %v records no failed compensation", p)
	}
	// Parked after the budget of 3 tries; the operator retries once the
	// participant is fixed, and the saga compensates.
	if n := final["never"]; n.Attempt != 3 || !strings.Contains(n.Failure, "failed 3 times") {
		t.Errorf("never: parked at attempt %d, failure %q; want 3", n.Attempt, n.Failure)
	}
	if err := Retry(context.Background(), wd.pool, "happy"); err == nil {
		t.Error("Retry of a completed saga succeeded")
	}
	fixed.Store(true)
	if err := Retry(context.Background(), wd.pool, "never"); err != nil {
		t.Fatal(err)
	}
	if got := wd.waitFinal(t, 30*time.Second, "never")["never"].Status; got != StatusCompensated {
		t.Fatalf("never after operator retry: %s, want compensated; path %v", got, wd.transitions(t, "never"))
	}
	if got, want := wd.effects(t, "never"), []string{"A", "L", "B", "undo-B", "undo-L", "undo-A"}; !slices.Equal(got, want) {
		t.Errorf("never after retry: effects %v, want %v", got, want)
	}
	p := wd.transitions(t, "never")
	for _, w := range []string{"parked@B", "operator-retry@B", "compensated@A"} {
		if !slices.Contains(p, w) {
			t.Errorf("never: path %v lacks %s", p, w)
		}
	}

	// The timed-out step was compensated (a no-op at the participant, which
	// left a tombstone); now its reply arrives late: recorded, ignored.
	path, err := Path(context.Background(), wd.pool, "timeout")
	if err != nil {
		t.Fatal(err)
	}
	var sentB string
	for _, e := range path {
		if e.Transition == "sent" && e.StepName == "B" {
			sentB = e.CommandID
		}
	}
	if sentB == "" || !slices.Contains(wd.transitions(t, "timeout"), "timed-out@B") {
		t.Fatalf("timeout: path %v: want B sent and timed out", wd.transitions(t, "timeout"))
	}
	if err := pgx.BeginFunc(context.Background(), wd.pool, func(tx pgx.Tx) error {
		_, err := wd.w.Write(context.Background(), tx, wd.ds.event("reply-B", "timeout", true),
			events.WithCorrelationID("timeout"), events.WithCausationID(sentB))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "late reply recorded", func() bool {
		return slices.Contains(wd.transitions(t, "timeout"), "late-reply-ignored@A")
	})
	if info, err := Get(context.Background(), wd.pool, "timeout"); err != nil || info.Status != StatusCompensated {
		t.Errorf("timeout after the late reply: %v %v, want compensated", info.Status, err)
	}

	// No participant applied anything twice.
	var dup int
	if err := wd.pool.QueryRow(context.Background(), `SELECT count(*) FROM (SELECT 1 FROM effects GROUP BY saga_id, action HAVING count(*) > 1) d`).Scan(&dup); err != nil {
		t.Fatal(err)
	}
	if dup != 0 {
		t.Errorf("%d effects applied more than once", dup)
	}
	counts, err := Counts(context.Background(), wd.pool, "")
	if err != nil {
		t.Fatal(err)
	}
	if counts[StatusCompleted] != 1 || counts[StatusCompensated] != 7 {
		t.Errorf("counts %v, want 1 completed and 7 compensated", counts)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
