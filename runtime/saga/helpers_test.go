package saga

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/protoevents/protoevents/eventstest/kafkacluster"
	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

func TestMain(m *testing.M) { servers.Main(m) }

// The test saga: A (remote) → L (local) → B (remote) → C (remote). A and B
// have remote compensations, L a local one; C is the last step and needs
// none. Participants answer every command with a reply carrying "ok".
var actions = []string{"A", "B", "C"}

// testData is the saga's data.
type testData struct {
	ID        string   `json:"id"` // the saga ID: commands are keyed by it
	FailLocal bool     `json:"fail_local,omitempty"`
	Replies   []string `json:"replies,omitempty"` // the replies the saga took, in order
}

// descriptors are the test's event types over one topic suffix: commands
// "cmd-X"/"undo-X" and replies "reply-X"/"undo-reply-X".
type descriptors map[string]*events.Descriptor

func newDescriptors(suffix string) descriptors {
	ds := descriptors{}
	for _, a := range actions {
		for _, kind := range []string{"cmd", "undo", "reply", "undo-reply"} {
			name := kind + "-" + a
			d := testenv.Descriptor("saga-" + name + "-" + suffix)
			d.Type = "test.saga." + name
			ds[name] = d
		}
	}
	return ds
}

func (ds descriptors) topics() []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Topic, d.DLQTopic)
	}
	return out
}

// event returns an event of the named type keyed by the saga ID, with an
// "ok" field.
func (ds descriptors) event(name, sagaID string, ok bool) events.Event {
	ev := testenv.NewEvent(ds[name], sagaID, 0)
	ev.Fields["ok"] = structpb.NewBoolValue(ok)
	return ev
}

func isOK(ev testenv.Event) bool { return ev.Fields["ok"].GetBoolValue() }

// definition builds the test saga; timeout applies to steps B and C.
func (ds descriptors) definition(name string, timeout time.Duration) Definition[testData] {
	remote := func(a string, compensated bool) Step[testData] {
		st := Step[testData]{
			Name:    a,
			Command: func(d *testData) events.Event { return ds.event("cmd-"+a, d.ID, true) },
			OnReply: []Reply[testData]{On(ds["reply-"+a], func(d *testData, r testenv.Event) Outcome {
				d.Replies = append(d.Replies, a)
				if isOK(r) {
					return Success()
				}
				return Failure(a + " refused")
			})},
		}
		if a != "A" {
			st.Timeout = timeout
		}
		if compensated {
			st.Compensation = func(d *testData) events.Event { return ds.event("undo-"+a, d.ID, true) }
			st.OnCompensationReply = []Reply[testData]{On(ds["undo-reply-"+a], func(d *testData, r testenv.Event) Outcome {
				d.Replies = append(d.Replies, "undo-"+a)
				if isOK(r) {
					return Success()
				}
				return Failure("undo " + a + " failed")
			})}
		}
		return st
	}
	local := Step[testData]{
		Name: "L",
		Local: func(ctx context.Context, tx pgx.Tx, id string, d *testData) (Outcome, error) {
			if d.FailLocal {
				return Failure("local step refused"), nil
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects (saga_id, action) VALUES ($1, 'L')`, id)
			return Success(), err
		},
		CompensateLocal: func(ctx context.Context, tx pgx.Tx, id string, d *testData) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects (saga_id, action) VALUES ($1, 'undo-L')`, id)
			return err
		},
	}
	return Definition[testData]{Name: name, Steps: []Step[testData]{remote("A", true), local, remote("B", true), remote("C", false)}}
}

// world is one test's database, Kafka cluster and participants.
type world struct {
	pool   *pgxpool.Pool
	schema string
	kafka  *kafkacluster.Cluster
	ds     descriptors
	w      *outbox.Writer
	// behave decides a participant's answer to the n-th command (from 0)
	// of an action ("A", "undo-B", ...) for a saga; reply false means the
	// participant swallows the command (no effect, no reply).
	mu     sync.Mutex
	behave func(sagaID, action string, n int) (ok, reply bool)
}

func quietLogger() *slog.Logger {
	if os.Getenv("PROTOEVENTS_SAGA_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func newWorld(t *testing.T) *world {
	t.Helper()
	pool, schema := servers.DB(t)
	k := servers.OwnKafka(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	wd := &world{pool: pool, schema: schema, kafka: k, ds: newDescriptors(schema)}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := k.CreateTopics(ctx, 2, wd.ds.topics()...); err != nil {
		t.Fatal(err)
	}
	for _, m := range []func(context.Context, *pgxpool.Pool) error{
		func(ctx context.Context, p *pgxpool.Pool) error { return outbox.Migrate(ctx, p) },
		func(ctx context.Context, p *pgxpool.Pool) error { return consumer.Migrate(ctx, p) },
		func(ctx context.Context, p *pgxpool.Pool) error { return Migrate(ctx, p) },
	} {
		if err := m(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `
		CREATE TABLE effects (seq bigserial PRIMARY KEY, saga_id text NOT NULL, action text NOT NULL, event_id text);
		CREATE TABLE tries (saga_id text NOT NULL, action text NOT NULL, event_id text NOT NULL);
		CREATE TABLE tombstones (saga_id text NOT NULL, action text NOT NULL, PRIMARY KEY (saga_id, action))`); err != nil {
		t.Fatal(err)
	}
	var err error
	if wd.w, err = outbox.NewWriter(); err != nil {
		t.Fatal(err)
	}
	wd.behave = func(string, string, int) (bool, bool) { return true, true }
	return wd
}

func (wd *world) setBehaviour(fn func(sagaID, action string, n int) (ok, reply bool)) {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	wd.behave = fn
}

// participant handles one command type: it counts the try, decides, applies
// the effect (once, in the dedup transaction) and replies through its
// outbox, caused by the command. It returns the command's descriptor and
// the handler.
func (wd *world) participant(action string) (*events.Descriptor, func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testenv.Event) error) {
	cmd, reply := "cmd-"+action, "reply-"+action
	if strings.HasPrefix(action, "undo-") {
		cmd, reply = action, "undo-reply-"+strings.TrimPrefix(action, "undo-")
	}
	return wd.ds[cmd], func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev testenv.Event) error {
		id := meta.CorrelationID
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM tries WHERE saga_id = $1 AND action = $2`, id, action).Scan(&n); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO tries VALUES ($1, $2, $3)`, id, action, meta.EventID.String()); err != nil {
			return err
		}
		wd.mu.Lock()
		ok, answer := wd.behave(id, action, n)
		wd.mu.Unlock()
		if !answer {
			return nil
		}
		if strings.HasPrefix(action, "undo-") {
			// Tolerate "never happened": leave a tombstone so the original
			// command, arriving late, is refused.
			if _, err := tx.Exec(ctx, `INSERT INTO tombstones VALUES ($1, $2) ON CONFLICT DO NOTHING`, id, strings.TrimPrefix(action, "undo-")); err != nil {
				return err
			}
		} else {
			var dead bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM tombstones WHERE saga_id = $1 AND action = $2)`, id, action).Scan(&dead); err != nil {
				return err
			}
			ok = ok && !dead
		}
		if ok && strings.HasPrefix(action, "undo-") {
			// Undo only what happened: a compensation of a step that never
			// took effect is a successful no-op.
			var done bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM effects WHERE saga_id = $1 AND action = $2)`, id, strings.TrimPrefix(action, "undo-")).Scan(&done); err != nil {
				return err
			}
			if !done {
				_, err := wd.w.Write(ctx, tx, wd.ds.event(reply, id, true), events.CausedBy(meta))
				return err
			}
		}
		if ok {
			if _, err := tx.Exec(ctx, `INSERT INTO effects (saga_id, action, event_id) VALUES ($1, $2, $3)`, id, action, meta.EventID.String()); err != nil {
				return err
			}
		}
		_, err := wd.w.Write(ctx, tx, wd.ds.event(reply, id, ok), events.CausedBy(meta))
		return err
	}
}

// consumerOptions are fast settings for tests.
func consumerOptions() []consumer.Option {
	return []consumer.Option{
		consumer.WithLogger(quietLogger()),
		consumer.WithCommitInterval(50 * time.Millisecond),
		consumer.WithGroupTimeouts(100*time.Millisecond, 600*time.Millisecond, time.Second),
		consumer.WithBackoff(10*time.Millisecond, 100*time.Millisecond),
		consumer.WithMaxAttempts(50),
	}
}

// runParticipants starts the relay and the participants' consumers until
// the test ends.
func (wd *world) runParticipants(t *testing.T) {
	t.Helper()
	var runners []interface{ Run(context.Context) error }
	relay, err := outbox.NewRelay(wd.pool, wd.kafka.Brokers, outbox.WithLogger(quietLogger()), outbox.WithPollInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	runners = append(runners, relay)
	for _, a := range actions {
		for _, action := range []string{a, "undo-" + a} {
			c, err := consumer.New(wd.pool, wd.kafka.Brokers, "participant-"+action, consumerOptions()...)
			if err != nil {
				t.Fatal(err)
			}
			d, h := wd.participant(action)
			if err := consumer.Handle(c, d, h); err != nil {
				t.Fatal(err)
			}
			runners = append(runners, c)
		}
	}
	wd.run(t, runners...)
}

// run runs rs until the test ends; a failure fails the test.
func (wd *world) run(t *testing.T, rs ...interface{ Run(context.Context) error }) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Go(func() {
			if err := r.Run(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("%T: %v", r, err)
			}
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// orchestrator runs sg's reply consumers and timeout runner until the test
// ends.
func (wd *world) orchestrator(t *testing.T, sg *Saga[testData]) {
	t.Helper()
	wd.run(t, runFunc(func(ctx context.Context) error {
		return sg.Run(ctx, wd.pool, wd.kafka.Brokers, consumerOptions()...)
	}))
}

type runFunc func(ctx context.Context) error

func (f runFunc) Run(ctx context.Context) error { return f(ctx) }

// newSaga returns the test saga with fast retries.
func (wd *world) newSaga(t testing.TB, name string, timeout time.Duration, opts ...Option) *Saga[testData] {
	t.Helper()
	opts = append([]Option{WithCompensationRetries(3, 50*time.Millisecond, 200*time.Millisecond), WithPollInterval(50 * time.Millisecond), WithLogger(quietLogger())}, opts...)
	sg, err := New(wd.ds.definition(name, timeout), wd.w, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return sg
}

// start begins a saga in its own transaction.
func (wd *world) start(t testing.TB, sg *Saga[testData], id string, data testData) {
	t.Helper()
	data.ID = id
	if err := pgx.BeginFunc(context.Background(), wd.pool, func(tx pgx.Tx) error { return sg.Start(context.Background(), tx, id, data) }); err != nil {
		t.Fatal(err)
	}
}

// waitFinal waits until every saga named is in a final status and returns
// their states.
func (wd *world) waitFinal(t *testing.T, timeout time.Duration, ids ...string) map[string]Info {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out := map[string]Info{}
		var waiting []string
		for _, id := range ids {
			info, err := Get(context.Background(), wd.pool, id)
			if err != nil {
				t.Fatal(err)
			}
			out[id] = info
			if !info.Status.Final() {
				waiting = append(waiting, fmt.Sprintf("%s=%s@%s", id, info.Status, info.StepName))
			}
		}
		if len(waiting) == 0 {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("sagas not final after %s: %v", timeout, waiting)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// effects returns the effects applied for a saga, in order.
func (wd *world) effects(t testing.TB, id string) []string {
	t.Helper()
	rows, err := wd.pool.Query(context.Background(), `SELECT action FROM effects WHERE saga_id = $1 ORDER BY seq`, id)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// transitions returns the kinds of a saga's path entries, "kind@step".
func (wd *world) transitions(t testing.TB, id string) []string {
	t.Helper()
	p, err := Path(context.Background(), wd.pool, id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range p {
		out = append(out, e.Transition+"@"+e.StepName)
	}
	return out
}

type outboxWriter = outbox.Writer

func newOutboxWriter() (*outbox.Writer, error) { return outbox.NewWriter() }

func testenvURL(t testing.TB) string { return servers.ServerURL(t) }
