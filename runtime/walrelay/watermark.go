package walrelay

import (
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
)

// watermark decides how far the slot may be confirmed: never past a
// transaction whose records Kafka has not all acknowledged. The stream
// reports what it hands over (handed) and the idle positions it sees at a
// transaction boundary (idle: a keepalive, a heartbeat, a transaction
// without records); the publisher reports acknowledgements in the order it
// was handed the transactions (acked). confirm is the furthest position
// that is safe: the end of the last acknowledged transaction, or an idle
// position once everything handed over before it was acknowledged.
//
// Every transaction committing before an idle position was handed over
// before it (the server decodes the WAL in order and sends in order), so
// confirming that position re-sends nothing unacknowledged and skips
// nothing: a restart streams from the confirmed position on.
type watermark struct {
	mu        sync.Mutex
	handed    uint64 // transactions handed to the publisher
	acks      uint64 // of those, acknowledged
	ackedEnd  pglogrepl.LSN
	idlePos   pglogrepl.LSN // latest idle position
	idleAfter uint64        // handed when idlePos was seen
	confirmed pglogrepl.LSN
	// commits are the commit times of the handed, unacknowledged
	// transactions, oldest first: how far behind the relay is.
	commits []time.Time
}

// handed records a transaction given to the publisher.
func (w *watermark) hand(commit time.Time) {
	w.mu.Lock()
	w.handed++
	w.commits = append(w.commits, commit)
	w.mu.Unlock()
}

// idle records a position at a transaction boundary.
func (w *watermark) idle(pos pglogrepl.LSN) {
	w.mu.Lock()
	if pos > w.idlePos {
		w.idlePos, w.idleAfter = pos, w.handed
	}
	w.mu.Unlock()
}

// acked records that the next n handed transactions were acknowledged,
// the last of them ending at end.
func (w *watermark) acked(n int, end pglogrepl.LSN) {
	w.mu.Lock()
	w.acks += uint64(n)
	if end > w.ackedEnd {
		w.ackedEnd = end
	}
	w.commits = w.commits[min(n, len(w.commits)):]
	w.mu.Unlock()
}

// confirm returns the position to confirm now; it never goes back.
func (w *watermark) confirm() pglogrepl.LSN {
	w.mu.Lock()
	defer w.mu.Unlock()
	pos := w.ackedEnd
	if w.acks >= w.idleAfter && w.idlePos > pos {
		pos = w.idlePos
	}
	if pos > w.confirmed {
		w.confirmed = pos
	}
	return w.confirmed
}

// start sets the position a session starts from (the slot's confirmed
// position), so that confirm never reports less.
func (w *watermark) start(pos pglogrepl.LSN) {
	w.mu.Lock()
	if pos > w.confirmed {
		w.confirmed = pos
	}
	w.mu.Unlock()
}

// behind is how long the oldest unacknowledged transaction has been
// committed (0 when nothing is waiting), and how many are waiting.
func (w *watermark) behind(now time.Time) (time.Duration, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.commits) == 0 {
		return 0, 0
	}
	return max(0, now.Sub(w.commits[0])), len(w.commits)
}
