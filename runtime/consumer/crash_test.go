package consumer

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/protoevents/protoevents/eventstest/kafkacluster"
	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
)

// Environment of the consumer child process of TestCrashKill.
const (
	envChild        = "PROTOEVENTS_CONSUMER_CHILD"
	envChildDB      = "PROTOEVENTS_CONSUMER_CHILD_DB"
	envChildSchema  = "PROTOEVENTS_CONSUMER_CHILD_SCHEMA"
	envChildBrokers = "PROTOEVENTS_CONSUMER_CHILD_BROKERS"
	envChildTopic   = "PROTOEVENTS_CONSUMER_CHILD_TOPIC"
	// envChildNamespace is the suffix of the parent's group IDs on a shared
	// cluster (kafkacluster.Cluster.Namespace).
	envChildNamespace = "PROTOEVENTS_CONSUMER_CHILD_NAMESPACE"
	// envChildCommit is the child's offset commit interval (default 50ms).
	envChildCommit = "PROTOEVENTS_CONSUMER_CHILD_COMMIT_INTERVAL"
)

// TestHelperProcess is the consumer process TestCrashKill starts and kills;
// it does nothing in a normal test run.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(envChild) != "1" {
		t.Skip("child process of TestCrashKill")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	b := childBundle(t, ctx)
	pool := b.pool
	// Duplicates are recorded outside the transaction, so the parent can
	// tell that kills did hit between a DB commit and its offset commit.
	seen := Hooks{Duplicate: func(events.Delivery, string) {
		_, _ = pool.Exec(context.Background(), `INSERT INTO redeliveries DEFAULT VALUES`)
	}}
	commitEvery := 50 * time.Millisecond
	if v := os.Getenv(envChildCommit); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		commitEvery = d
	}
	c := b.newConsumer(t, "crash", b.handler("crash", nil), WithCommitInterval(commitEvery), WithHooks(seen),
		WithGroupTimeouts(100*time.Millisecond, 600*time.Millisecond, time.Second))
	if err := c.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// childBundle connects a child process (of TestCrashKill or
// TestRebalanceStall) to the database schema, brokers and topic its parent
// passed in the environment; the pool closes with the test.
func childBundle(t *testing.T, ctx context.Context) *bundle {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(os.Getenv(envChildDB))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = os.Getenv(envChildSchema)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &bundle{pool: pool, kafka: kafkacluster.Shared(strings.Split(os.Getenv(envChildBrokers), ","), os.Getenv(envChildNamespace)), d: descriptorFor(os.Getenv(envChildTopic))}
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

// TestCrashKill kills the consumer process (SIGKILL) at random points while
// it works through 5,000 events on 3 partitions, restarting it each time:
// in the end every event is applied exactly once. Kafka (kfake) lives in
// this process, so it survives its consumers. Each kill waits for progress
// and freezes the consumer before killing it (see killAt), so the test
// proves its kills land mid-stream on a loaded machine as on an idle one.
func TestCrashKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills child processes; skipped with -short")
	}
	t.Parallel()
	// The children rely on short group session timeouts to take over
	// quickly: kfake's are set here, the real test broker's in apachekafka.
	b := setupOn(t, 3, servers.Kafka(t, kfake.GroupMinSessionTimeout(100*time.Millisecond)))
	const n = 5000
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = message(t, b.event(t, "key-"+strconv.Itoa(i%50), i), nil)
	}
	b.produce(t, msgs...)
	if _, err := b.pool.Exec(context.Background(), `CREATE TABLE redeliveries (at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}

	var logs lockedBuffer
	// spawn starts a consumer child committing its offsets every
	// commitEvery.
	spawn := func(commitEvery time.Duration) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(),
			envChild+"=1",
			envChildCommit+"="+commitEvery.String(),
			envChildDB+"="+withAppName(t, servers.ServerURL(t), childApp(b.schema)),
			envChildSchema+"="+b.schema,
			envChildBrokers+"="+strings.Join(b.kafka.Brokers, ","),
			envChildTopic+"="+b.topic,
			envChildNamespace+"="+b.kafka.Namespace(),
		)
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		return cmd
	}
	kill := func(cmd *exec.Cmd) {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	applied := func() int64 { return query(t, b.pool, `SELECT count(*) FROM effects`) }

	// A gate freezes the consumer at a given count, whatever the machine's
	// speed: once effects has cap rows (as a transaction sees them: the
	// committed ones and its own batch's), every further insert waits for
	// an advisory lock the test holds. Each round sets a random cap above
	// the last kill, waits until the consumer committed more (progress
	// after the restart) and a transaction of it waits at the gate, and
	// kills it there: the kill lands mid-stream, inside open transactions
	// (rolled back), with the
	// offsets of the events applied since the consumer's last offset commit
	// uncommitted (redelivered and skipped by the dedup table).
	gateKey := "crash-gate-" + b.schema
	if _, err := b.pool.Exec(context.Background(), `
		CREATE TABLE gate (cap bigint NOT NULL, key text NOT NULL);
		INSERT INTO gate VALUES (0, '`+gateKey+`');
		CREATE FUNCTION gate_effects() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF (SELECT count(*) FROM effects) >= (SELECT cap FROM gate) THEN
				PERFORM pg_advisory_xact_lock_shared(hashtext((SELECT key FROM gate)));
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER gate BEFORE INSERT ON effects FOR EACH ROW EXECUTE FUNCTION gate_effects();`); err != nil {
		t.Fatal(err)
	}
	gateConn, err := b.pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer gateConn.Release()
	if _, err := gateConn.Exec(context.Background(), `SELECT pg_advisory_lock(hashtext($1))`, gateKey); err != nil {
		t.Fatal(err)
	}
	openGate := func() {
		if _, err := b.pool.Exec(context.Background(), `UPDATE gate SET cap = 9223372036854775807`); err != nil {
			t.Fatal(err)
		}
		if _, err := gateConn.Exec(context.Background(), `SELECT pg_advisory_unlock(hashtext($1))`, gateKey); err != nil {
			t.Fatal(err)
		}
	}
	// killFrozen kills the frozen child and ends its database sessions,
	// whose transactions wait at the gate and would otherwise hold their
	// dedup rows' locks against the next consumer.
	killFrozen := func(cmd *exec.Cmd) {
		kill(cmd)
		testenv.WaitFor(t, time.Minute, "the killed consumer's sessions to end", func() (bool, string) {
			n := query(t, b.pool, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1) x`, childApp(b.schema))
			return n == 0, fmt.Sprintf("%d sessions left", n)
		})
	}
	// gateWaiters counts the child's sessions waiting at the gate.
	gateWaiters := func() int64 {
		return query(t, b.pool, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name = $1`, childApp(b.schema))
	}
	midStream, prev := 0, int64(0)
	for round := 0; round < 5; round++ {
		// The trigger counts the committed rows and its own transaction's:
		// a batch of up to DefaultMaxBatch rows must fit under the cap for
		// the consumer to commit anything before it freezes.
		target := prev + 2*DefaultMaxBatch + int64(rand.IntN(800))
		if _, err := b.pool.Exec(context.Background(), `UPDATE gate SET cap = $1`, target); err != nil {
			t.Fatal(err)
		}
		// Every other child commits its offsets often (a kill lands after
		// most of its DB commits were followed by their offset commits:
		// an offset committed too early would lose events), the others
		// not before they are killed (every event they applied comes
		// again and must be skipped by the dedup table): the check below
		// holds whatever the machine's speed.
		commitEvery := 50 * time.Millisecond
		if round%2 == 1 {
			commitEvery = time.Hour
		}
		cmd := spawn(commitEvery)
		testenv.WaitFor(t, 3*time.Minute, fmt.Sprintf("consumer %d to apply events past %d and reach the gate at %d", round+1, prev, target), func() (bool, string) {
			got := applied()
			return got > prev && gateWaiters() > 0, fmt.Sprintf("%d applied\n%s", got, logs.String())
		})
		killFrozen(cmd)
		got := applied()
		t.Logf("killed consumer %d with %d/%d events applied (frozen at %d)", round+1, got, n, target)
		if got > prev && got < n {
			midStream++
		}
		prev = got
	}
	if midStream < 3 {
		t.Fatalf("only %d kills landed mid-stream; the test proved nothing\n%s", midStream, logs.String())
	}
	openGate()
	cmd := spawn(50 * time.Millisecond)
	defer kill(cmd)
	testenv.WaitFor(t, 3*time.Minute, "all events applied", func() (bool, string) {
		got := query(t, b.pool, `SELECT count(DISTINCT event_id) FROM effects`)
		return got >= n, strconv.FormatInt(got, 10) + " applied\n" + logs.String()
	})
	time.Sleep(200 * time.Millisecond) // let a stray double application show
	kill(cmd)
	total, distinct := applied(), query(t, b.pool, `SELECT count(DISTINCT event_id) FROM effects`)
	dedup := query(t, b.pool, `SELECT count(*) FROM consumed_events`)
	if total != n || distinct != n || dedup != n {
		t.Fatalf("%d effects of %d distinct events, %d dedup rows; want %d each", total, distinct, dedup, n)
	}
	if bad := query(t, b.pool, `SELECT count(*) FROM (
		SELECT n < lag(n) OVER (PARTITION BY k ORDER BY seq) AS backwards FROM effects) x WHERE backwards`); bad != 0 {
		t.Fatalf("%d events applied before an older event of their key", bad)
	}
	redelivered := query(t, b.pool, `SELECT count(*) FROM redeliveries`)
	t.Logf("%d applied events were redelivered after a kill and skipped", redelivered)
	if redelivered == 0 {
		t.Fatal("no kill landed between a DB commit and its offset commit; dedup was never exercised")
	}
}

// childApp is the application_name of TestCrashKill's consumer sessions.
func childApp(schema string) string { return "crash-child-" + schema }

// withAppName sets application_name in a Postgres URL.
func withAppName(t testing.TB, raw, app string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	return u.String()
}
