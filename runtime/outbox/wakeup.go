package outbox

import (
	"sync"
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
// interval (WithPollInterval).
const (
	pollMin             = time.Millisecond
	defaultPollInterval = 100 * time.Millisecond
	// wakeFastPolls is how many polls a wake-up keeps at pollMin before
	// backing off: a Writer wakes the relays before its caller commits,
	// and a commit under load takes a few milliseconds.
	wakeFastPolls = 8
)

// wakeRegistry holds the wake-up channels of the relays running in this
// process, by outbox table name.
var wakeRegistry struct {
	sync.Mutex
	relays map[*wakeEntry]struct{}
}

type wakeEntry struct {
	schema, name string
	ch           chan struct{}
}

// registerWake makes ch receive the wake-ups for the table; the returned
// function unregisters it.
func registerWake(schema, name string, ch chan struct{}) func() {
	e := &wakeEntry{schema: schema, name: name, ch: ch}
	wakeRegistry.Lock()
	if wakeRegistry.relays == nil {
		wakeRegistry.relays = map[*wakeEntry]struct{}{}
	}
	wakeRegistry.relays[e] = struct{}{}
	wakeRegistry.Unlock()
	return func() {
		wakeRegistry.Lock()
		delete(wakeRegistry.relays, e)
		wakeRegistry.Unlock()
	}
}

// wakeTable wakes the relays of this process whose table matches t: by
// name, and by schema too when t names one (an unqualified name may resolve
// to any schema; a needless wake-up costs one poll).
func wakeTable(t tableName) {
	wakeRegistry.Lock()
	defer wakeRegistry.Unlock()
	for e := range wakeRegistry.relays {
		if e.name == t.name && (t.schema == "" || t.schema == e.schema) {
			signal(e.ch)
		}
	}
}

// Notify wakes the relays running in this process on the Writer's table:
// they poll at once and then every millisecond or so, backing off, instead
// of waiting out their idle poll interval. Write and WriteBatch call it
// after their insert (before the caller commits: the quick polls that
// follow find the rows once the commit lands); call it again right after
// committing when a transaction stays open long after its writes. It
// never blocks and costs nothing when no relay runs in the process; relays
// in other processes find the rows by polling (WithPollInterval).
func (w *Writer) Notify() { wakeTable(w.table) }

// signal wakes a loop without blocking; one pending wake-up is enough.
func signal(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}
