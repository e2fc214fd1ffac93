package walrelay

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

func TestWatermarkNeverConfirmsPastUnackedWork(t *testing.T) {
	var w watermark
	w.start(100)
	if got := w.confirm(); got != 100 {
		t.Fatalf("start: confirm = %v, want 100", got)
	}
	// Idle at 150 with nothing handed over: safe.
	w.idle(150)
	if got := w.confirm(); got != 150 {
		t.Fatalf("idle: confirm = %v, want 150", got)
	}
	now := time.Now()
	t1 := &txn{end: 200, commit: now.Add(-3 * time.Second)}
	t2 := &txn{end: 300, commit: now.Add(-1 * time.Second)}
	t3 := &txn{end: 500, commit: now}
	w.hand(t1)
	w.hand(t2)
	w.idle(400) // a keepalive after both
	if got := w.confirm(); got != 150 {
		t.Fatalf("two in flight: confirm = %v, want 150 (nothing acknowledged)", got)
	}
	if d, n := w.behind(now); n != 2 || d < 3*time.Second {
		t.Fatalf("behind = %v, %d; want ≥ 3s, 2", d, n)
	}
	// Lanes acknowledge out of order: the second transaction first.
	w.ack(t2)
	if got := w.confirm(); got != 150 {
		t.Fatalf("second acked before the first: confirm = %v, want 150 (the watermark is contiguous)", got)
	}
	w.hand(t3) // handed after the keepalive
	w.ack(t1)
	if got := w.confirm(); got != 400 {
		t.Fatalf("first two acked: confirm = %v, want 400 (the idle position they preceded)", got)
	}
	if d, n := w.behind(now); n != 1 || d > time.Second {
		t.Fatalf("behind = %v, %d; want ≈ 0, 1", d, n)
	}
	w.idle(450) // older than the latest idle position: ignored
	w.ack(t3)
	if got := w.confirm(); got != 500 {
		t.Fatalf("all acked: confirm = %v, want 500", got)
	}
	if _, n := w.behind(now); n != 0 {
		t.Fatalf("behind: %d waiting, want 0", n)
	}
	// Never backwards.
	w.start(10)
	if got := w.confirm(); got != pglogrepl.LSN(500) {
		t.Fatalf("after a lower start: confirm = %v, want 500", got)
	}
}
