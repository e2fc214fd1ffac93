package outbox

import (
	"sync"
	"sync/atomic"
	"time"
)

// Waking the relay: the relays find new rows by polling the pending index,
// adaptively (see Relay), and relays in the same process as a Writer can be
// woken directly. There is no database-side notification: NOTIFY takes a
// database-wide lock from the writer's pre-commit through its commit flush,
// which serialises the commits of every outbox writer (docs/design.md,
// "Waking the relay").

// Default bounds of the relay's adaptive idle poll: right after work it
// polls every pollMin, doubling the delay on every empty poll up to the poll
// interval (WithPollInterval), but for the hot window (see pacer).
const (
	pollMin             = time.Millisecond
	defaultPollInterval = 100 * time.Millisecond
	// wakeFastPolls is how many polls a wake-up keeps at pollMin before
	// backing off: a Writer wakes the relays before its caller commits,
	// and a commit under load takes a few milliseconds.
	wakeFastPolls = 8
)

// wakeRegistry holds the wake-ups of the relays running in this process.
var wakeRegistry struct {
	sync.Mutex
	relays map[*waker]struct{}
}

// waker is one relay loop's wake-up: a signal, and whether the rows it
// announces may still be on their way (written, not yet committed).
type waker struct {
	schema, name string
	ch           chan struct{}
	// uncommitted is set by a wake-up sent before the writer's commit:
	// the loop then keeps polling quickly for a while (wakeFastPolls).
	uncommitted atomic.Bool
}

// registerWake returns the wake-up of a loop on the table, registered until
// the returned function is called.
func registerWake(schema, name string) (*waker, func()) {
	e := &waker{schema: schema, name: name, ch: make(chan struct{}, 1)}
	wakeRegistry.Lock()
	if wakeRegistry.relays == nil {
		wakeRegistry.relays = map[*waker]struct{}{}
	}
	wakeRegistry.relays[e] = struct{}{}
	wakeRegistry.Unlock()
	return e, func() {
		wakeRegistry.Lock()
		delete(wakeRegistry.relays, e)
		wakeRegistry.Unlock()
	}
}

// wakeTable wakes the relays of this process whose table matches t: by
// name, and by schema too when t names one (an unqualified name may resolve
// to any schema; a needless wake-up costs one poll). committed says the
// rows are visible now (a CommitTx wakes after its COMMIT): one poll
// finds them. Otherwise they land when the caller commits, and the relays
// poll quickly for a while.
func wakeTable(t tableName, committed bool) {
	wakeRegistry.Lock()
	defer wakeRegistry.Unlock()
	for e := range wakeRegistry.relays {
		if e.name == t.name && (t.schema == "" || t.schema == e.schema) {
			if !committed {
				e.uncommitted.Store(true)
			}
			select {
			case e.ch <- struct{}{}:
			default: // one pending wake-up is enough
			}
		}
	}
}

// Notify wakes the relays running in this process on the Writer's table:
// they poll at once and then every millisecond or so, backing off, instead
// of waiting out their idle poll interval. Write and WriteBatch on a
// transaction other than a CommitTx call it after their insert (before
// the caller commits: the quick polls that follow find the rows once the
// commit lands), as does a CommitTx that sends its held rows before its
// COMMIT; a CommitTx whose rows go with the COMMIT wakes the relays right
// after it, when one poll finds the rows. Call it again right after committing when
// a transaction stays open long after its writes. It never blocks and
// costs nothing when no relay runs in the process; relays in other
// processes find the rows by polling (WithPollInterval).
func (w *Writer) Notify() { wakeTable(w.table, false) }
