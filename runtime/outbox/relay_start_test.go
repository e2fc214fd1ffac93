package outbox

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/eventstest/servers"
)

// TestRelayRetriesDatabaseOutageAtStart: the database refuses connections
// when the relay starts; Run keeps retrying (and reporting) instead of
// returning, and once the database is back it publishes everything.
func TestRelayRetriesDatabaseOutageAtStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, true, 3)
	evs, want := sequence(b.d, 30, 3)
	b.write(t, evs)

	var down atomic.Bool
	var refused atomic.Int32
	down.Store(true)
	cfg := b.pool.Config()
	cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
		if down.Load() {
			refused.Add(1)
			return errors.New("database down")
		}
		return nil
	}
	flaky, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(flaky.Close)
	rb := *b
	rb.pool = flaky
	rr := rb.startRelay(t)

	deadline := time.Now().Add(2 * time.Minute)
	for refused.Load() < 3 || rr.failures.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections refused, %d failures reported: the relay is not retrying", refused.Load(), rr.failures.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-rr.done:
		rr.done <- err
		t.Fatalf("Run returned during a database outage: %v", err)
	default:
	}
	down.Store(false)
	b.waitDrained(t, 15*time.Second)
	checkDelivery(t, b.readAll(t), want)
}

// TestRelayStopsDuringDatabaseOutageAtStart: a relay that never reached the
// database returns nil when canceled.
func TestRelayStopsDuringDatabaseOutageAtStart(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/postgres?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	r, err := NewRelay(pool, []string{"127.0.0.1:1"}, WithLogger(quietLogger()), WithBackoff(10*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case err := <-done:
		t.Fatalf("Run returned while the database was unreachable: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v on cancel, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop within 10s of cancel")
	}
}

// TestRelayFailsOnMissingTable: a table that does not exist ends Run at
// once with ErrNoTable, its message prefixed once.
func TestRelayFailsOnMissingTable(t *testing.T) {
	t.Parallel()
	pool, _ := servers.DB(t)
	r, err := NewRelay(pool, []string{"127.0.0.1:1"}, WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = r.Run(ctx)
	if !errors.Is(err, ErrNoTable) {
		t.Fatalf("Run = %v, want ErrNoTable", err)
	}
	if strings.Count(err.Error(), "outbox:") != 1 {
		t.Fatalf("error %q: want one \"outbox:\" prefix", err)
	}
}
