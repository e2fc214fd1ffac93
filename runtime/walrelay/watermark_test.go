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
	w.hand(now.Add(-3 * time.Second)) // tx ending at 200
	w.hand(now.Add(-1 * time.Second)) // tx ending at 300
	w.idle(400)                       // keepalive after both
	if got := w.confirm(); got != 150 {
		t.Fatalf("two in flight: confirm = %v, want 150 (nothing acknowledged)", got)
	}
	if d, n := w.behind(now); n != 2 || d < 3*time.Second {
		t.Fatalf("behind = %v, %d; want ≥ 3s, 2", d, n)
	}
	w.acked(1, 200)
	if got := w.confirm(); got != 200 {
		t.Fatalf("first acked: confirm = %v, want 200 (the keepalive at 400 came after the second)", got)
	}
	if d, n := w.behind(now); n != 1 || d < time.Second || d >= 3*time.Second {
		t.Fatalf("behind = %v, %d; want ≈ 1s, 1", d, n)
	}
	w.hand(now) // tx ending at 500, handed after the keepalive
	w.acked(1, 300)
	if got := w.confirm(); got != 400 {
		t.Fatalf("both acked: confirm = %v, want 400 (the idle position they preceded)", got)
	}
	w.idle(450) // older than the latest idle position: ignored
	w.acked(1, 500)
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
