package outbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
)

// oldNotifyTrigger is the wake-up trigger of earlier versions, installed by
// hand to show what it did and that Migrate removes it.
const oldNotifyTrigger = `
CREATE OR REPLACE FUNCTION public.protoevents_outbox_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER outbox_notify AFTER INSERT ON public.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION public.protoevents_outbox_notify('protoevents_outbox_test');`

// TestOutboxWritersDoNotWaitOnEachOthersCommits: a writer whose commit is
// held up (waiting for a synchronous standby that never answers, on a
// throwaway cluster) must not hold up another writer's commit. With the
// NOTIFY trigger of earlier versions it does: the second commit waits for
// the database-wide notify lock (seen in pg_locks) until the first one is
// through. Migrate drops that trigger from an existing install, after which
// the second writer commits while the first is still stuck in its commit.
func TestOutboxWritersDoNotWaitOnEachOthersCommits(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, pool := testenv.OwnCluster(t, ctx)
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, oldNotifyTrigger); err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("old trigger serialises commits", func(t *testing.T) {
		blocked, _ := commitBehindStuckCommit(ctx, t, pool, w)
		if !blocked {
			t.Fatal("with the NOTIFY trigger the second commit went through: the test no longer sees the notify lock")
		}
	})

	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	var triggers, funcs int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.outbox'::regclass AND NOT tgisinternal),
		(SELECT count(*) FROM pg_proc WHERE proname = 'protoevents_outbox_notify')`).Scan(&triggers, &funcs); err != nil {
		t.Fatal(err)
	}
	if triggers != 0 || funcs != 0 {
		t.Fatalf("after Migrate: %d triggers on the outbox, %d notify functions; want none", triggers, funcs)
	}

	t.Run("no trigger, no wait", func(t *testing.T) {
		blocked, waits := commitBehindStuckCommit(ctx, t, pool, w)
		if blocked {
			t.Fatalf("the second writer's commit waits behind the first one's: %s", waits)
		}
	})
}

// commitBehindStuckCommit holds writer A's commit in a synchronous-standby
// wait, then commits writer B and reports whether B got stuck behind A on a
// lock (and the lock waits seen), or committed.
func commitBehindStuckCommit(ctx context.Context, t *testing.T, pool *pgxpool.Pool, w *Writer) (blocked bool, waits string) {
	t.Helper()
	setStandby := func(name string) {
		if _, err := pool.Exec(ctx, fmt.Sprintf(`ALTER SYSTEM SET synchronous_standby_names = '%s'`, name)); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
			t.Fatal(err)
		}
	}
	setStandby("nobody")
	released := false
	release := func() {
		if !released {
			released = true
			setStandby("")
		}
	}
	defer release()

	d := descriptorFor("writes")
	commit := func(name, syncCommit string) (pid int, done chan error) {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		// The reload reaches each backend a moment later: wait for it.
		deadline := time.Now().Add(2 * time.Minute)
		for {
			var standby string
			if err := conn.QueryRow(ctx, `SHOW synchronous_standby_names`).Scan(&standby); err != nil {
				t.Fatal(err)
			}
			if standby == "nobody" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the backend did not pick up synchronous_standby_names")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if _, err := conn.Exec(ctx, `SET synchronous_commit = `+syncCommit); err != nil {
			t.Fatal(err)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(ctx, tx, newEvent(d, name, 0)); err != nil {
			t.Fatal(err)
		}
		done = make(chan error, 1)
		go func() {
			defer conn.Release()
			done <- tx.Commit(ctx)
		}()
		return pid, done
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	activity := func(pid int) (state, waitType, waitEvent string) {
		_ = pool.QueryRow(ctx, `SELECT state, COALESCE(wait_event_type, ''), COALESCE(wait_event, '')
			FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&state, &waitType, &waitEvent)
		return
	}

	// Writer A: its commit waits for a standby that does not exist. The
	// checkpointer publishes the new standby setting to the backends a
	// moment after the reload; a commit before that does not wait, so
	// writer A tries again until one does.
	var pidA int
	var doneA chan error
	for attempt := 0; doneA == nil; attempt++ {
		pid, done := commit(fmt.Sprintf("a%d", attempt), "on")
		waitFor("writer A to wait for the standby or commit", func() bool {
			if _, _, ev := activity(pid); ev == "SyncRep" {
				pidA, doneA = pid, done
				return true
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("writer A: %v", err)
				}
				return true // committed without waiting: the setting was not live yet
			default:
				return false
			}
		})
	}
	// Writer B: a local commit, which needs nothing from A.
	pidB, doneB := commit("b", "local")
	lockWait := func() string {
		var s string
		_ = pool.QueryRow(ctx, `SELECT COALESCE(string_agg(l.locktype || ' ' || COALESCE(l.classid::regclass::text, '') || ' ' || l.mode, ', '), '')
			FROM pg_locks l WHERE l.pid = $1 AND NOT l.granted`, pidB).Scan(&s)
		return s
	}
	var result error
	waitFor("writer B to commit or to wait on a lock", func() bool {
		select {
		case result = <-doneB:
			return true
		default:
		}
		if waits = lockWait(); waits != "" {
			_, typ, ev := activity(pidB)
			waits += fmt.Sprintf(" (wait_event %s/%s)", typ, ev)
			blocked = true
			return true
		}
		return false
	})
	if !blocked && result != nil {
		t.Fatalf("writer B: %v", result)
	}
	if blocked && waits != "" {
		t.Logf("writer B waits: %s", waits)
	}
	// Writer A is still stuck in its commit either way.
	if _, _, ev := activity(pidA); ev != "SyncRep" {
		t.Fatalf("writer A no longer waits for the standby (%q): the scenario did not hold", ev)
	}
	release()
	for _, done := range []chan error{doneA, doneB} {
		if done == doneB && !blocked {
			continue
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("commit did not finish after the standby requirement was lifted")
		}
	}
	return blocked, waits
}

// TestNotifyWakesTheRelaysOfItsTable: Writer.Notify reaches the relays of
// the same table in this process (any schema for an unqualified name), and
// only those.
func TestNotifyWakesTheRelaysOfItsTable(t *testing.T) {
	t.Parallel()
	mine, unregisterMine := registerWake("shop", "notify_test_outbox")
	defer unregisterMine()
	other, unregisterOther := registerWake("shop", "notify_test_other")
	defer unregisterOther()
	for _, tc := range []struct {
		table string
		want  bool
	}{{"notify_test_outbox", true}, {"shop.notify_test_outbox", true}, {"billing.notify_test_outbox", false}} {
		w, err := NewWriter(WithTable(tc.table))
		if err != nil {
			t.Fatal(err)
		}
		w.Notify()
		if got, _ := wokenBy(mine); got != tc.want {
			t.Errorf("Notify on %s woke the relay of shop.notify_test_outbox: %v, want %v", tc.table, got, tc.want)
		}
		if got, _ := wokenBy(other); got {
			t.Errorf("Notify on %s woke the relay of another table", tc.table)
		}
	}
	third, unregister := registerWake("shop", "notify_test_third")
	unregister()
	w, _ := NewWriter(WithTable("notify_test_third"))
	w.Notify()
	if got, _ := wokenBy(third); got {
		t.Error("an unregistered relay was woken")
	}
}

// wokenBy reports whether w holds a wake-up, taking it, and whether it
// announced rows not committed yet.
func wokenBy(w *waker) (woken, uncommitted bool) {
	select {
	case <-w.ch:
		return true, w.uncommitted.Swap(false)
	default:
		return false, false
	}
}

// TestWritersWakeTheRelaysWhenTheRowsCome: a CommitTx wakes the relays
// of this process once its COMMIT has made the rows visible, and says so
// (one poll finds them: no quick polls follow); a Write on a plain pgx
// transaction wakes them right after its INSERT, announcing rows still to
// be committed (quick polls follow, see wakeFastPolls), and so does a
// CommitTx that sends rows before its COMMIT, waking them again after it;
// a CommitTx that rolls back wakes nobody.
func TestWritersWakeTheRelaysWhenTheRowsCome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := servers.DB(t)
	const table = "wake_test_outbox"
	if err := Migrate(ctx, pool, WithTable(table)); err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter(WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	wk, unregister := registerWake("", table)
	defer unregister()
	d := descriptorFor("wake-test")

	ptx, err := Begin(ctx, pool, pgx.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, ptx, newEvent(d, "k", 1)); err != nil {
		t.Fatal(err)
	}
	if woken, _ := wokenBy(wk); woken {
		t.Fatal("a CommitTx woke the relays before its COMMIT, with its rows still held")
	}
	if err := ptx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if woken, uncommitted := wokenBy(wk); !woken || uncommitted {
		t.Fatalf("after a CommitTx's COMMIT: woken %v, announcing uncommitted rows %v; want a wake-up for committed rows", woken, uncommitted)
	}

	// Rows sent before the COMMIT (a fixed event ID is inserted at once; a
	// savepoint sends the held rows ahead of it): quick polls from then
	// on, and a wake-up for committed rows after the COMMIT.
	for _, tc := range []struct {
		name  string
		write func(pgx.Tx) error
	}{{"fixed event ID", func(tx pgx.Tx) error {
		_, err := w.Write(ctx, tx, newEvent(d, "k", 1), events.WithEventID(events.EventID{9, 9}))
		return err
	}}, {"savepoint after the write", func(tx pgx.Tx) error {
		if _, err := w.Write(ctx, tx, newEvent(d, "k", 1)); err != nil {
			return err
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		return sp.Commit(ctx)
	}}} {
		ptx, err := Begin(ctx, pool, pgx.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := tc.write(ptx); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if woken, uncommitted := wokenBy(wk); !woken || !uncommitted {
			t.Fatalf("%s, rows sent before the COMMIT: woken %v, announcing uncommitted rows %v; want both", tc.name, woken, uncommitted)
		}
		if err := ptx.Commit(ctx); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if woken, uncommitted := wokenBy(wk); !woken || uncommitted {
			t.Fatalf("%s, after the COMMIT: woken %v, announcing uncommitted rows %v; want a wake-up for committed rows", tc.name, woken, uncommitted)
		}
	}

	ptx, err = Begin(ctx, pool, pgx.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, ptx, newEvent(d, "k", 2)); err != nil {
		t.Fatal(err)
	}
	if err := ptx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if woken, _ := wokenBy(wk); woken {
		t.Fatal("a CommitTx that rolled back woke the relays")
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := w.Write(ctx, tx, newEvent(d, "k", 3)); err != nil {
		t.Fatal(err)
	}
	if woken, uncommitted := wokenBy(wk); !woken || !uncommitted {
		t.Fatalf("after a Write on a pgx transaction: woken %v, announcing uncommitted rows %v; want both", woken, uncommitted)
	}
}
