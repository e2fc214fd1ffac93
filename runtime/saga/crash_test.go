package saga

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/faultinject"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// Environment of the orchestrator child process of TestOrchestratorKilled.
const (
	envChild        = "PROTOEVENTS_SAGA_CHILD"
	envChildDB      = "PROTOEVENTS_SAGA_CHILD_DB"
	envChildSchema  = "PROTOEVENTS_SAGA_CHILD_SCHEMA"
	envChildBrokers = "PROTOEVENTS_SAGA_CHILD_BROKERS"
)

// crashSagas are the two sagas of the crash test, with hooks; the
// timed saga gets a large compensation budget, since its compensation
// replies may be late while the orchestrator restarts.
func crashSagas(wd *world, t testing.TB, hooks Hooks) (*Saga[testData], *Saga[testData]) {
	main := wd.newSaga(t, "main", 0, WithHooks(hooks))
	timed := wd.newSaga(t, "timed", time.Second, WithHooks(hooks), WithCompensationRetries(50, 50*time.Millisecond, 200*time.Millisecond))
	return main, timed
}

// TestHelperOrchestrator is the orchestrator process TestOrchestratorKilled
// starts; it does nothing in a normal test run. It commits one transition
// and then kills itself (SIGKILL) inside the next one, before its commit:
// so the process dies between every pair of transitions, and every
// transition but the first is once cut off in the middle.
func TestHelperOrchestrator(t *testing.T) {
	if os.Getenv(envChild) != "1" {
		t.Skip("child process of TestOrchestratorKilled")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	cfg, err := pgxpool.ParseConfig(os.Getenv(envChildDB))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = os.Getenv(envChildSchema)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	wd := &world{pool: pool, schema: os.Getenv(envChildSchema), ds: newDescriptors(os.Getenv(envChildSchema))}
	brokers := strings.Split(os.Getenv(envChildBrokers), ",")

	var started, commits atomic.Int64
	points := faultinject.SagaPoints{
		InTransaction: func(tr faultinject.Transition) {
			if started.Add(1) < 2 {
				return
			}
			// Let the first transition's commit land, then die with this
			// one's transaction open.
			for deadline := time.Now().Add(2 * time.Second); commits.Load() == 0 && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			_, _ = pool.Exec(context.Background(), `INSERT INTO crash_points (saga_id, kind, step) VALUES ($1, $2, $3)`, tr.SagaID, tr.Kind, tr.Step)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		},
	}
	hooks := Hooks{TimerCommitted: func(Transition) { commits.Add(1) }}
	wd.w = mustWriter(t)
	main, timed := crashSagas(wd, t, hooks)
	opts := append(consumerOptions(),
		consumer.WithCommitInterval(time.Second), // offsets lag the DB commits: a kill forces redeliveries
		consumer.WithHooks(consumer.Hooks{Duplicate: func(events.Delivery, string) {
			_, _ = pool.Exec(context.Background(), `INSERT INTO redeliveries DEFAULT VALUES`)
		}}))
	// The fault points travel in the Run context: the consumer's and the
	// timeout runner's transitions both see them.
	fctx := faultinject.Saga(ctx, points)
	fctx = faultinject.Consumer(fctx, faultinject.ConsumerPoints{AfterDBCommit: func(kafka.Message) error { commits.Add(1); return nil }})
	var wg sync.WaitGroup
	for _, sg := range []*Saga[testData]{main, timed} {
		wg.Go(func() {
			if err := sg.Run(fctx, pool, brokers, opts...); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

// TestOrchestratorKilled runs three sagas (one completes; one compensates
// with a compensation that fails once and is retried by the timer; one
// times out and compensates) while the orchestrator process is killed with
// SIGKILL after every transition it commits, inside the next one.
// Participants, the relay and Kafka live in this process. Each saga still
// ends in its correct final state, and every effect is applied once.
func TestOrchestratorKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes; skipped with -short")
	}
	t.Parallel()
	wd := newWorld(t)
	if _, err := wd.pool.Exec(context.Background(), `
		CREATE TABLE redeliveries (at timestamptz NOT NULL DEFAULT now());
		CREATE TABLE crash_points (saga_id text, kind text, step int, at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	wd.setBehaviour(func(id, action string, n int) (ok, reply bool) {
		switch {
		case id == "k-flaky" && action == "C":
			return false, true
		case id == "k-flaky" && action == "undo-B":
			return n > 0, true
		case id == "k-timeout" && action == "B":
			return false, false
		}
		return true, true
	})
	wd.runParticipants(t)
	main, timed := crashSagas(wd, t, Hooks{})
	ids := []string{"k-happy", "k-flaky", "k-timeout"}
	var logs lockedBuffer
	spawn := func() (*exec.Cmd, chan error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperOrchestrator$", "-test.count=1")
		cmd.Env = append(os.Environ(), envChild+"=1", envChildDB+"="+testenvURL(t), envChildSchema+"="+wd.schema,
			envChildBrokers+"="+strings.Join(wd.kafka.Brokers, ","))
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		return cmd, exited
	}
	// The sagas run one after the other, so each orchestrator process sees
	// one transition at a time: process n commits transition n and is
	// killed inside transition n+1, which process n+1 commits.
	kills := map[string]int{}
	for _, id := range ids {
		sg := main
		if id == "k-timeout" {
			sg = timed
		}
		wd.start(t, sg, id, testData{})
		for final, round := false, 0; !final; round++ {
			if round == 40 {
				info, _ := Get(context.Background(), wd.pool, id)
				t.Fatalf("%s: %s at %s after %d orchestrator processes, path %v\n%s", id, info.Status, info.StepName, round, wd.transitions(t, id), logs.String())
			}
			cmd, exited := spawn()
			// A child that neither dies at its crash point nor sees the
			// saga end within three minutes is a stall: fail with what
			// there is to see rather than wait for the test binary's
			// timeout. (A minute was once not enough on a loaded CI
			// machine: the new child's group join can wait for the killed
			// member's session to expire.)
			stalled := time.After(3 * time.Minute)
			for waiting := true; waiting; {
				select {
				case <-stalled:
					_ = cmd.Process.Kill()
					<-exited
					info, _ := Get(context.Background(), wd.pool, id)
					st, _ := outbox.Status(context.Background(), wd.pool)
					t.Fatalf("%s: stalled for three minutes in orchestrator process %d at %s %s; outbox %+v; path %v\n%s", id, round+1, info.Status, info.StepName, st, wd.transitions(t, id), logs.String())
				case err := <-exited:
					if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
						t.Fatalf("orchestrator exited without being killed: %v\n%s", err, logs.String())
					}
					kills[id]++
					waiting = false
				case <-time.After(100 * time.Millisecond):
					if info, err := Get(context.Background(), wd.pool, id); err == nil && info.Status.Final() {
						_ = cmd.Process.Kill()
						<-exited
						waiting, final = false, true
					}
				}
			}
		}
	}

	final := wd.waitFinal(t, time.Second, ids...)
	want := map[string]struct {
		status  Status
		effects []string
	}{
		"k-happy":   {StatusCompleted, []string{"A", "L", "B", "C"}},
		"k-flaky":   {StatusCompensated, []string{"A", "L", "B", "undo-B", "undo-L", "undo-A"}},
		"k-timeout": {StatusCompensated, []string{"A", "L", "undo-L", "undo-A"}},
	}
	for _, id := range ids {
		if final[id].Status != want[id].status {
			t.Errorf("%s ended %s, want %s; path %v", id, final[id].Status, want[id].status, wd.transitions(t, id))
		}
		if got := wd.effects(t, id); !slices.Equal(got, want[id].effects) {
			t.Errorf("%s: effects %v, want %v; path %v", id, got, want[id].effects, wd.transitions(t, id))
		}
	}
	// Every command the sagas sent is in the outbox once per transition:
	// no transition ran twice (it would have sent its command twice).
	var sentTwice int
	if err := wd.pool.QueryRow(context.Background(), `SELECT count(*) FROM (
		SELECT saga_id, step, transition, count(*) FROM sagas_history
		WHERE transition IN ('sent', 'completed', 'compensated', 'timed-out', 'step-succeeded', 'step-failed', 'local-succeeded', 'compensated-local')
		GROUP BY 1, 2, 3 HAVING count(*) > 1) d`).Scan(&sentTwice); err != nil {
		t.Fatal(err)
	}
	if sentTwice != 0 {
		t.Errorf("%d transitions recorded twice", sentTwice)
	}
	// Every transition after a saga's first was cut off once inside its
	// transaction and then committed by the next process: the kills match
	// the transitions one for one.
	for _, id := range ids {
		rows, err := wd.pool.Query(context.Background(), `SELECT kind || '@' || step FROM crash_points WHERE saga_id = $1 ORDER BY at`, id)
		if err != nil {
			t.Fatal(err)
		}
		points, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		// version: 1 at insert, +1 for Start, +1 per transition since.
		transitions := int(final[id].Version) - 2
		t.Logf("%s: %d transitions after Start; orchestrator killed inside %v", id, transitions, points)
		if len(points) != transitions-1 || kills[id] != transitions-1 {
			t.Errorf("%s: %d transitions, %d kills inside one (%d processes killed); want one kill inside each transition but the first",
				id, transitions, len(points), kills[id])
		}
	}
	var redelivered int
	if err := wd.pool.QueryRow(context.Background(), `SELECT count(*) FROM redeliveries`).Scan(&redelivered); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d replies redelivered after a kill and absorbed by the dedup table", redelivered)
	if redelivered == 0 {
		t.Error("no reply was redelivered after a kill: the dedup path was never exercised")
	}
}

func mustWriter(t testing.TB) *outboxWriter {
	t.Helper()
	w, err := newOutboxWriter()
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// lockedBuffer collects the children's output; os/exec copies into it
// from its own goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
