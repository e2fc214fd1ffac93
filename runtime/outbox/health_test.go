package outbox

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/protoevents/protoevents/eventstest/servers"
)

// syncBuffer is a log sink the relay's goroutines can share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// repeatedLine returns the first log line with msg whose error (err=...)
// was already logged with that msg, or "": folding logs an identical error
// once per log interval (the tests use an hour), a different one at once.
func repeatedLine(logs, msg string) string {
	seen := map[string]bool{}
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		_, errText, _ := strings.Cut(line, " err=")
		errText, _, _ = strings.Cut(errText, " backoff=")
		if seen[errText] {
			return line
		}
		seen[errText] = true
	}
	return ""
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func serve(h http.Handler) (int, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	return rec.Code, rec.Body.String()
}

func waitHealth(t *testing.T, r *Relay, what string, ok func(Health) bool) Health {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		h := r.Health()
		if ok(h) {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; health:\n%s", what, h)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRelayReadinessFollowsTheBrokers: a relay pointed at brokers that do
// not answer is live but not ready (503 on /readyz, 200 on /livez) and
// keeps running; a relay whose brokers answer is ready, and stops being
// ready when they go away.
func TestRelayReadinessFollowsTheBrokers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, true, 1)

	logs := &syncBuffer{}
	down, err := NewRelay(b.pool, []string{closedPort(t)}, WithHealthInterval(20*time.Millisecond),
		WithBackoff(10*time.Millisecond, 100*time.Millisecond), WithLogInterval(time.Hour),
		WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	if h := down.Health(); h.Live || h.Ready {
		t.Fatalf("a relay that is not running reports %+v", h)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- down.Run(runCtx) }()
	h := waitHealth(t, down, "the brokers to be seen down", func(h Health) bool {
		return h.Live && h.Database.Reachable && !h.Kafka.Checked.IsZero() && !h.Kafka.Reachable
	})
	if h.Ready {
		t.Fatalf("ready with the brokers down:\n%s", h)
	}
	if code, body := serve(down.ReadyHandler()); code != http.StatusServiceUnavailable || !strings.Contains(body, "kafka: unreachable") {
		t.Fatalf("/readyz: %d\n%s", code, body)
	}
	if code, body := serve(down.LiveHandler()); code != http.StatusOK {
		t.Fatalf("/livez: %d\n%s", code, body)
	}
	// The relay keeps waiting (and folds its repeated errors).
	waitHealth(t, down, "a few more checks", func(h Health) bool { return time.Since(h.Kafka.Since) > 200*time.Millisecond })
	select {
	case err := <-done:
		t.Fatalf("Run returned during a broker outage: %v", err)
	default:
	}
	if dup := repeatedLine(logs.String(), `msg="outbox relay: waiting for the Kafka brokers"`); dup != "" {
		t.Fatalf("an identical broker error was logged twice (not folded): %s\n%s", dup, logs.String())
	}
	if !strings.Contains(logs.String(), `msg="outbox relay: waiting for the Kafka brokers"`) {
		t.Fatalf("the broker outage was not logged:\n%s", logs.String())
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if h := down.Health(); h.Live {
		t.Fatalf("a stopped relay reports live:\n%s", h)
	}

	up, err := NewRelay(b.pool, b.brokers, WithHealthInterval(20*time.Millisecond), WithLogger(quietLogger()),
		WithBackoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop = context.WithCancel(ctx)
	defer stop()
	go func() { done <- up.Run(runCtx) }()
	waitHealth(t, up, "readiness", func(h Health) bool { return h.Ready })
	if code, body := serve(up.ReadyHandler()); code != http.StatusOK || !strings.HasPrefix(body, "ready\n") {
		t.Fatalf("/readyz: %d\n%s", code, body)
	}
	b.kafka.Close()
	waitHealth(t, up, "the brokers to be seen gone", func(h Health) bool { return !h.Ready && !h.Kafka.Reachable })
	if code, _ := serve(up.ReadyHandler()); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with the brokers gone: %d", code)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestRelayStartedBeforePostgres: the relay starts while its database is
// down, waits (not ready, logging once), and delivers everything once the
// database comes up, logging the recovery.
func TestRelayStartedBeforePostgres(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, b := bundleOnOwnCluster(t, ctx, servers.Kafka(t))
	evs, want := sequence(b.d, 200, 5)
	b.write(t, evs)
	b.pool.Reset()
	if err := c.Down(ctx); err != nil {
		t.Fatal(err)
	}

	logs := &syncBuffer{}
	r, err := NewRelay(b.pool, b.brokers, WithHealthInterval(20*time.Millisecond), WithLogInterval(time.Hour),
		WithBackoff(10*time.Millisecond, 200*time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	h := waitHealth(t, r, "the database to be seen down", func(h Health) bool {
		return h.Live && !h.Database.Checked.IsZero() && !h.Database.Reachable
	})
	if h.Ready {
		t.Fatalf("ready without a database:\n%s", h)
	}
	waitHealth(t, r, "a few more attempts", func(h Health) bool { return time.Since(h.Database.Since) > 300*time.Millisecond })
	select {
	case err := <-done:
		t.Fatalf("Run returned while the database was down: %v", err)
	default:
	}
	if err := c.Up(ctx); err != nil {
		t.Fatal(err)
	}
	b.waitDrained(t, 60*time.Second)
	if dups := checkDelivery(t, b.readAll(t), want); dups != 0 {
		t.Fatalf("%d duplicates", dups)
	}
	waitHealth(t, r, "readiness", func(h Health) bool { return h.Ready })
	out := logs.String()
	if dup := repeatedLine(out, `msg="outbox relay: waiting for the database"`); dup != "" {
		t.Errorf("an identical database error was logged twice (not folded): %s\n%s", dup, out)
	}
	if !strings.Contains(out, "database reachable again after") {
		t.Errorf("no recovery line in the log:\n%s", out)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestRelayNotReadyWithoutProgress: rows for a topic that does not exist
// sit pending with nothing published; past the stall timeout the relay is
// live but not ready, saying why, and ready again once the topic exists and
// the rows go out.
func TestRelayNotReadyWithoutProgress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, true, 1)
	missing := missingTopic(b)
	evs, want := sequence(missing.d, 10, 2)
	b.write(t, evs)
	r, err := NewRelay(b.pool, b.brokers, WithLogger(quietLogger()), WithHealthInterval(20*time.Millisecond),
		WithStallTimeout(300*time.Millisecond), WithBackoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	h := waitHealth(t, r, "the stall to be reported", func(h Health) bool { return !h.Ready && h.Live && h.OldestPending > 300*time.Millisecond })
	if !h.Database.Reachable || !h.Kafka.Reachable || len(h.Problems) != 1 || !strings.Contains(h.Problems[0], "no progress for") {
		t.Fatalf("want exactly the stall as the problem:\n%s", h)
	}
	if code, body := serve(r.ReadyHandler()); code != http.StatusServiceUnavailable || !strings.Contains(body, "no progress for") {
		t.Fatalf("/readyz: %d\n%s", code, body)
	}
	if err := b.kafka.CreateTopics(ctx, missing.parts, missing.topic); err != nil {
		t.Fatal(err)
	}
	b.waitDrained(t, time.Minute)
	waitHealth(t, r, "readiness after the rows went out", func(h Health) bool { return h.Ready })
	checkDelivery(t, missing.readAll(t), want)
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestFolderLogsRepeatsOnce: an error repeated within the log interval is
// logged once; the recovery reports how many repeats went unlogged and
// forgets them, so the next outage is logged again.
func TestFolderLogsRepeatsOnce(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	f := folder{log: slog.New(slog.NewTextHandler(logs, nil)), every: time.Hour}
	err := errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	for range 5 {
		f.warn(depDatabase, "outbox relay: retrying", err)
	}
	f.warn(depKafka, "outbox relay: retrying", errors.New("broker down"))
	// The same network error from another local port is the same error.
	f.warn(depKafka, "outbox relay: retrying", errors.New("read tcp 127.0.0.1:38284->127.0.0.1:9092: i/o timeout"))
	f.warn(depKafka, "outbox relay: retrying", errors.New("read tcp 127.0.0.1:38290->127.0.0.1:9092: i/o timeout"))
	if n := strings.Count(logs.String(), "i/o timeout"); n != 1 {
		t.Fatalf("one network error from two local ports logged %d times, want once:\n%s", n, logs)
	}
	if n := strings.Count(logs.String(), "connection refused"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, logs)
	}
	f.recovered(depDatabase)
	if !strings.Contains(logs.String(), "outbox relay: retrying: 4 more times until it recovered") {
		t.Fatalf("no repeat count on recovery:\n%s", logs)
	}
	f.warn(depDatabase, "outbox relay: retrying", err)
	if n := strings.Count(logs.String(), `err="dial tcp`); n != 2 {
		t.Fatalf("a new outage after the recovery was not logged (%d lines):\n%s", n, logs)
	}
	if n := strings.Count(logs.String(), "broker down"); n != 1 {
		t.Fatalf("another dependency's error was forgotten or repeated (%d lines):\n%s", n, logs)
	}
}
