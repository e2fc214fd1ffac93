package walrelay

import (
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
)

// watermark decides how far the slot may be confirmed: never past a
// transaction whose records Kafka has not all acknowledged. The stream
// hands transactions over in commit order (hand) and reports the idle
// positions it sees at a transaction boundary (idle: a keepalive, a
// heartbeat, a transaction without records); the lanes acknowledge
// transactions in any order (ack), as each lane publishes its share. The
// watermark is contiguous: the end of the last transaction of the longest
// acknowledged prefix, or an idle position once everything handed over
// before it is acknowledged.
//
// Every transaction committing before an idle position was handed over
// before it (the server decodes the WAL in order and sends in order), so
// confirming that position re-sends nothing unacknowledged and skips
// nothing: a restart streams from the confirmed position on.
type watermark struct {
	mu        sync.Mutex
	queue     []*txn // handed, not yet in the acknowledged prefix, in commit order
	handed    uint64 // transactions handed over
	acks      uint64 // of those, in the acknowledged prefix
	ackedEnd  pglogrepl.LSN
	idlePos   pglogrepl.LSN // latest idle position
	idleAfter uint64        // handed when idlePos was seen
	confirmed pglogrepl.LSN
}

// hand records a transaction given to the lanes, in commit order.
func (w *watermark) hand(t *txn) {
	w.mu.Lock()
	w.handed++
	w.queue = append(w.queue, t)
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

// ack records that every record of t was acknowledged.
func (w *watermark) ack(t *txn) {
	w.mu.Lock()
	t.acked = true
	n := 0
	for n < len(w.queue) && w.queue[n].acked {
		w.ackedEnd = max(w.ackedEnd, w.queue[n].end)
		w.queue[n] = nil
		n++
	}
	w.queue = w.queue[n:]
	w.acks += uint64(n)
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

// behind is how long the oldest transaction not in the acknowledged
// prefix has been committed (0 when there is none), and how many
// transactions wait.
func (w *watermark) behind(now time.Time) (time.Duration, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.queue) == 0 {
		return 0, 0
	}
	return max(0, now.Sub(w.queue[0].commit)), len(w.queue)
}
