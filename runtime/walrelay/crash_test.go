package walrelay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/eventstest/pgcluster"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
)

// The crash test's child: a WAL relay in a process of its own, run by
// TestWALRelaySurvivesKillsAndAServerCrash until it is killed.
const (
	envChildDB      = "WALRELAY_CHILD_DATABASE_URL"
	envChildBrokers = "WALRELAY_CHILD_BROKERS"
)

func TestWALRelayChild(t *testing.T) {
	url := os.Getenv(envChildDB)
	if url == "" {
		t.Skip("runs only as the crash test's child process")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(pool, strings.Split(os.Getenv(envChildBrokers), ","), WithLogger(quietLogger()),
		WithStatusInterval(50*time.Millisecond), WithHeartbeat(100*time.Millisecond), WithStandbyRetry(50*time.Millisecond), WithBatchSize(100))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestWALRelaySurvivesKillsAndAServerCrash: while a writer commits events,
// the WAL relay runs in a child process that is SIGKILLed again and again
// (mid-batch, mid-confirm, mid-takeover), and Postgres itself is stopped
// in immediate mode once (crash recovery at restart). Every committed
// event reaches Kafka, in per-key order; duplicates (re-sent after a kill)
// are allowed, as the consumers' dedup absorbs them.
func TestWALRelaySurvivesKillsAndAServerCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes for a while")
	}
	t.Parallel()
	ctx := context.Background()
	// Commits are durable in this cluster (the throwaway default is
	// synchronous_commit = off, which loses acknowledged commits in a
	// crash: the writer would count events that never existed).
	b := setup(t, 3, pgcluster.WithSetting("synchronous_commit", "on"))
	evs, want := sequence(b.d, 3000, 11)
	ids := make([]events.EventID, len(evs))
	for i := range ids {
		ids[i] = envelope.NewEventID()
	}

	// The writer: transactions of 1–5 events; a write whose outcome is
	// unknown (the server went away) is written again under the same
	// event IDs, which the delivery check counts as duplicates.
	var written atomic.Int64
	writerDone := make(chan error, 1)
	wctx, stopWriter := context.WithCancel(ctx)
	defer stopWriter()
	go func() {
		for i := 0; i < len(evs); {
			n := min(1+rand.IntN(5), len(evs)-i)
			err := pgx.BeginFunc(wctx, b.pool, func(tx pgx.Tx) error {
				for j := i; j < i+n; j++ {
					if _, err := b.writer.Write(wctx, tx, evs[j], events.WithEventID(ids[j])); err != nil {
						return err
					}
				}
				return nil
			})
			if wctx.Err() != nil {
				writerDone <- wctx.Err()
				return
			}
			if err != nil {
				time.Sleep(20 * time.Millisecond) // the server is down: try again
				continue
			}
			i += n
			written.Store(int64(i))
			time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
		}
		writerDone <- nil
	}()

	kills, crashed := 0, false
	for {
		child := startChild(t, b)
		time.Sleep(time.Duration(150+rand.IntN(500)) * time.Millisecond)
		if !crashed && b.cluster != nil && written.Load() > int64(len(evs))/3 {
			// Postgres dies under the running relay and the writer.
			if err := b.cluster.Crash(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
			if err := b.cluster.Up(ctx); err != nil {
				t.Fatal(err)
			}
			crashed = true
			time.Sleep(300 * time.Millisecond)
		}
		_ = child.Process.Signal(syscall.SIGKILL)
		_ = child.Wait()
		kills++
		if written.Load() == int64(len(evs)) && kills >= 6 {
			break
		}
	}
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	b.startRelay(t)
	b.waitConfirmed(t)
	dups := testenv.CheckDelivery(t, b.readAll(t), want)
	t.Logf("%d events, %d SIGKILLs, server crashed: %v, %d duplicates", len(evs), kills, crashed, dups)
}

// startChild runs TestWALRelayChild in a new process of the test binary.
func startChild(t testing.TB, b *bundle) *exec.Cmd {
	t.Helper()
	cfg := b.pool.Config().ConnConfig
	url := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, cfg.Database)
	cmd := exec.Command(os.Args[0], "-test.run=^TestWALRelayChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envChildDB+"="+url, envChildBrokers+"="+strings.Join(b.brokers, ","))
	if testing.Verbose() {
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}
