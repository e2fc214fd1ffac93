package consumer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
)

// Environment of TestRebalanceStall and its consumer processes.
const (
	// envStall runs the measurement: "1" measures the consumer's default
	// group timeouts, "kafka-go" kafka-go's own defaults (heartbeat 3s,
	// session 30s, rebalance 30s, join backoff 5s: the consumer's defaults
	// before they were set), or "hb,session,rebalance" (Go durations).
	envStall = "PROTOEVENTS_STALL"
	// envStallKills sets the number of kills (default 8).
	envStallKills = "PROTOEVENTS_STALL_KILLS"
	// envStallChild marks a consumer process of the measurement and
	// carries the timeouts to use.
	envStallChild = "PROTOEVENTS_STALL_CHILD"
)

// stallTimeouts turns envStall's value into the child's options.
func stallTimeouts(mode string) ([]Option, error) {
	switch mode {
	case "1", "default":
		return nil, nil
	case "kafka-go":
		return []Option{func(c *Consumer) {
			c.s.heartbeat, c.s.session, c.s.rebalance, c.s.joinBackoff = 3*time.Second, 30*time.Second, 30*time.Second, 5*time.Second
		}}, nil
	}
	parts := strings.Split(mode, ",")
	if len(parts) != 3 {
		return nil, fmt.Errorf("%s=%q: want 1, kafka-go or heartbeat,session,rebalance", envStall, mode)
	}
	var d [3]time.Duration
	for i, p := range parts {
		var err error
		if d[i], err = time.ParseDuration(p); err != nil {
			return nil, fmt.Errorf("%s=%q: %w", envStall, mode, err)
		}
	}
	return []Option{WithGroupTimeouts(d[0], d[1], d[2])}, nil
}

// TestStallHelperProcess is one consumer of TestRebalanceStall's group; it
// does nothing in a normal test run.
func TestStallHelperProcess(t *testing.T) {
	mode := os.Getenv(envStallChild)
	if mode == "" {
		t.Skip("child process of TestRebalanceStall")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	b := childBundle(t, ctx)
	pool := b.pool
	opts, err := stallTimeouts(mode)
	if err != nil {
		t.Fatal(err)
	}
	name := "stall-" + b.d.Topic
	c := newConsumerOn(t, pool, b.kafka, name, b.handler(name, nil),
		append([]Option{withMaxWait(50 * time.Millisecond), WithLogger(testLogger())}, opts...)...)
	if err := c.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRebalanceStall measures the longest stretch without progress of a
// 3-process consumer group while one of its processes is killed (SIGKILL:
// no LeaveGroup, its connections just drop) and restarted every 4.5s, with
// events produced steadily at about 200/s on 6 partitions. Progress is an
// event applied (the effects table stamps each row with clock_timestamp()).
// It is a measurement, not a test: it runs only with PROTOEVENTS_STALL set
// (`make stall`), logs the numbers, and fails only if an event is lost or
// applied twice.
func TestRebalanceStall(t *testing.T) {
	mode := os.Getenv(envStall)
	if mode == "" {
		t.Skip("a measurement: set " + envStall + "=1 (or kafka-go, or hb,session,rebalance) to run it")
	}
	if _, err := stallTimeouts(mode); err != nil {
		t.Fatal(err)
	}
	kills := 8
	if s := os.Getenv(envStallKills); s != "" {
		var err error
		if kills, err = strconv.Atoi(s); err != nil || kills < 1 {
			t.Fatalf("%s=%q: want a positive number", envStallKills, s)
		}
	}
	// The real cluster named in PROTOEVENTS_KAFKA_BROKERS, else in-process
	// Kafka with a real broker's group limits (session timeout 6s to 5min),
	// so the timeouts measured are ones a real cluster takes.
	b := setupOn(t, 6, servers.Kafka(t))
	group := "stall-" + b.topic
	if _, err := b.pool.Exec(context.Background(), `ALTER TABLE effects ADD COLUMN at timestamptz NOT NULL DEFAULT clock_timestamp()`); err != nil {
		t.Fatal(err)
	}

	// Steady production until the kills are over.
	var produced atomic.Int64
	prodCtx, stopProducing := context.WithCancel(context.Background())
	var prodWG sync.WaitGroup
	prodWG.Go(func() {
		w := &kafka.Writer{Addr: kafka.TCP(b.kafka.Brokers...), Topic: b.topic, Balancer: &kafka.Hash{},
			RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
		defer w.Close()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i += 2 {
			select {
			case <-prodCtx.Done():
				return
			case <-tick.C:
			}
			err := w.WriteMessages(context.Background(),
				message(t, b.event(t, "key-"+strconv.Itoa(i%60), i), nil), message(t, b.event(t, "key-"+strconv.Itoa((i+1)%60), i+1), nil))
			if err != nil {
				t.Errorf("produce: %v", err)
				return
			}
			produced.Add(2)
		}
	})
	defer func() { stopProducing(); prodWG.Wait() }()

	var logs lockedBuffer
	spawn := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestStallHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(),
			envStallChild+"="+mode,
			envChildDB+"="+servers.ServerURL(t),
			envChildSchema+"="+b.schema,
			envChildBrokers+"="+strings.Join(b.kafka.Brokers, ","),
			envChildTopic+"="+b.topic,
			envChildNamespace+"="+b.kafka.Namespace(),
		)
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	kill := func(cmd *exec.Cmd) {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	procs := []*exec.Cmd{spawn(), spawn(), spawn()}
	defer func() {
		for _, p := range procs {
			if p != nil {
				kill(p)
			}
		}
	}()
	b.waitGroup(t, group, "3 members holding the 6 partitions", func(st GroupStatus) bool {
		held := 0
		for _, p := range st.Partitions {
			if p.Member != "" {
				held++
			}
		}
		return len(st.Members) == 3 && held == 6
	})
	b.effectsAtLeast(t, 1, 60*time.Second)

	var from time.Time
	if err := b.pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&from); err != nil {
		t.Fatal(err)
	}
	for k := 0; k < kills; k++ {
		time.Sleep(4500 * time.Millisecond) // the kill schedule of the measurement
		i := rand.IntN(len(procs))
		kill(procs[i])
		procs[i] = spawn()
	}
	time.Sleep(4500 * time.Millisecond)
	var to time.Time
	if err := b.pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&to); err != nil {
		t.Fatal(err)
	}
	stopProducing()
	prodWG.Wait()
	total := produced.Load()

	// The longest stretch without any event applied, and the longest a
	// single partition went without one, from the first kill's window to
	// 4.5s after the last kill (a stretch still open then ends there).
	var groupGap, partGap float64
	if err := b.pool.QueryRow(context.Background(), `
		SELECT coalesce(max(extract(epoch FROM gap)), 0) FROM (
			SELECT at - lag(at) OVER (ORDER BY at) AS gap FROM (
				SELECT at FROM effects WHERE at BETWEEN $1 AND $2 UNION ALL SELECT $2) a) g`, from, to).Scan(&groupGap); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(context.Background(), `
		SELECT coalesce(max(extract(epoch FROM gap)), 0) FROM (
			SELECT at - lag(at) OVER (PARTITION BY part ORDER BY at) AS gap FROM (
				SELECT part, at FROM effects WHERE at BETWEEN $1 AND $2
				UNION ALL SELECT p, $2 FROM generate_series(0, 5) p) a) g`, from, to).Scan(&partGap); err != nil {
		t.Fatal(err)
	}

	line := fmt.Sprintf("rebalance stall (%s=%s): %d kills every 4.5s over %s, %d events; longest stretch without progress: group %.1fs, one partition %.1fs",
		envStall, mode, kills, to.Sub(from).Round(100*time.Millisecond), total, groupGap, partGap)
	t.Log(line)
	fmt.Println(line)

	// Drain. kfake, unlike a real broker, never expires a member whose
	// connection died while its JoinGroup was pending (the session timer
	// starts only once the reply is delivered), and restarts the rebalance
	// timer at every join, so a killed joiner can keep the group
	// rebalancing for as long as members keep (re)joining. A real broker
	// drops such a member after its session timeout. When the group has
	// not drained a minute after the last kill, every consumer stops
	// cleanly, the group settles without the ghosts, and three new ones
	// finish the work.
	drained := func() (bool, string) {
		got := query(t, b.pool, `SELECT count(DISTINCT event_id) FROM effects`)
		return got >= total, fmt.Sprintf("%d of %d", got, total)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		if ok, _ := drained(); ok {
			break
		}
		if time.Now().After(deadline) {
			st := b.describe(t, group)
			t.Logf("kfake ghost members: not drained a minute after the last kill, group %s with %d members for 3 processes; restarting the group", st.State, len(st.Members))
			for i, p := range procs {
				_ = p.Process.Signal(syscall.SIGTERM)
				_ = p.Wait()
				procs[i] = nil
			}
			testenv.WaitFor(t, 2*time.Minute, "the group to settle without members", func() (bool, string) {
				st := b.describe(t, group)
				return len(st.Members) == 0, fmt.Sprintf("%s, %d members", st.State, len(st.Members))
			})
			for i := range procs {
				procs[i] = spawn()
			}
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	testenv.WaitFor(t, 3*time.Minute, "every produced event applied", func() (bool, string) {
		ok, state := drained()
		return ok, state + "\n" + logs.String()
	})
	applied, distinct := query(t, b.pool, `SELECT count(*) FROM effects`), query(t, b.pool, `SELECT count(DISTINCT event_id) FROM effects`)
	if applied != total || distinct != total {
		t.Fatalf("%d effects of %d distinct events, want %d each", applied, distinct, total)
	}
}
