package demo

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/protoevents/protoevents/eventstest/servers"
)

// TestSagaDemo runs the order-saga part of `make demo` on a schema of its
// own and holds it to its invariants.
func TestSagaDemo(t *testing.T) {
	ctx := context.Background()
	pool, _ := servers.DB(t)
	k := servers.OwnKafka(t)
	if err := SetupSaga(ctx, pool, k.Brokers); err != nil {
		t.Fatal(err)
	}
	var progress lockedBuilder // written by the run's goroutines
	rep, err := RunSaga(ctx, SagaConfig{DB: pool, Brokers: k.Brokers, Orders: 40, Progress: &progress})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	var out strings.Builder
	rep.Print(&out)
	t.Log(progress.String() + out.String())
	if !rep.OK() {
		t.Fatalf("invariants violated: %v", rep.Violations)
	}
	if rep.Completed+rep.Compensated+rep.Parked != int64(rep.Placed) || rep.Completed == 0 {
		t.Errorf("%d completed + %d compensated + %d parked of %d started", rep.Completed, rep.Compensated, rep.Parked, rep.Placed)
	}
	if rep.DuplicatesAbsorbed == 0 {
		t.Error("no duplicate absorbed, though the orchestrator and payments crashed before their offset commits")
	}
}

// lockedBuilder is a strings.Builder safe for concurrent writers.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
