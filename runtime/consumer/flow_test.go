package consumer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
)

// lagReport is one call of the Lag hook.
type lagReport struct {
	messages int64
	age      time.Duration
}

// TestSlowHandlerPausesFetching: a handler stuck on its first message
// while 2,000 messages wait. The partition fetches no further than its
// queue and one fetch ahead (the broker sees no fetch request beyond),
// the Lag hook reports the messages and the age behind, and once the
// handler moves on everything is applied and the lag falls to zero. It
// runs on the in-process cluster, whose request hook shows the fetch
// offsets the consumer asks for.
func TestSlowHandlerPausesFetching(t *testing.T) {
	t.Parallel()
	b := setupOn(t, 1, servers.FakeKafka(t, kfake.GroupMinSessionTimeout(100*time.Millisecond)))
	const total, queued = 2000, 10
	var fetchedTo atomic.Int64 // highest fetch offset asked for
	b.kafka.Fake.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		b.kafka.Fake.KeepControl()
		for _, tp := range req.(*kmsg.FetchRequest).Topics {
			for _, p := range tp.Partitions {
				for {
					cur := fetchedTo.Load()
					if p.FetchOffset <= cur || fetchedTo.CompareAndSwap(cur, p.FetchOffset) {
						break
					}
				}
			}
		}
		return nil, nil, false
	})
	pad := strings.Repeat("x", 1000)
	msgs := make([]kafka.Message, total)
	for i := range msgs {
		ev := b.event(t, fmt.Sprintf("k%d", i%7), i)
		ev.Fields["pad"] = structpb.NewStringValue(pad)
		msgs[i] = message(t, ev, nil)
	}
	// Record batches of 10: the broker hands out whole record batches, so
	// the fetch offsets move in steps of 10 and show how far the partition
	// reads ahead.
	w := &kafka.Writer{Addr: kafka.TCP(b.kafka.Brokers...), Topic: b.topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: 10}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	release := make(chan struct{})
	var first sync.Once
	blocked := make(chan struct{})
	var mu sync.Mutex
	var lags []lagReport
	h := b.handler("slow", func(testEvent, events.Meta) error {
		first.Do(func() { close(blocked) })
		<-release
		return nil
	})
	r := start(t, b.newConsumer(t, "slow", h, WithFetchLimits(queued, 16<<10), WithMaxBatch(1),
		WithHooks(Hooks{Lag: func(_ string, _ int, n int64, age time.Duration) {
			mu.Lock()
			lags = append(lags, lagReport{n, age})
			mu.Unlock()
		}})))
	// A failing check must not leave the handler stuck: cleanups run last
	// registered first, so this one frees it before the consumer stops.
	var freed sync.Once
	free := func() { freed.Do(func() { close(release) }) }
	t.Cleanup(free)
	<-blocked
	// Give the partition every chance to read ahead; with the handler stuck
	// it may hold its queue and the record batch being decoded, nothing more.
	time.Sleep(time.Second)
	// It reads ahead up to its queue (the handler holds message 0, the
	// queue the next 10), then stops: one fetch of 16 KiB is about 15 of
	// these messages, in record batches of 10.
	if to := fetchedTo.Load(); to < queued || to > 1+queued+2*20 {
		t.Fatalf("with the handler stuck on message 0 the partition asked for offset %d: want it to read ahead to its queue of %d and stop", to, queued)
	}
	mu.Lock()
	if len(lags) == 0 || lags[0].messages != total-1 || lags[0].age <= 0 {
		t.Fatalf("first lag report %+v, want %d messages behind and an age", lags, total-1)
	}
	mu.Unlock()
	free()
	b.effectsAtLeast(t, total, time.Minute)
	testenv.WaitFor(t, time.Minute, "the lag to fall to zero", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		last := lags[len(lags)-1]
		return last == (lagReport{}), fmt.Sprintf("%+v", last)
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if to := fetchedTo.Load(); to < total {
		t.Fatalf("fetched up to %d of %d after the handler moved on", to, total)
	}
}

func TestFetchLimitsRefused(t *testing.T) {
	b := setup(t, 1)
	for _, args := range [][2]int{{0, 1}, {1, 0}} {
		if _, err := New(b.pool, b.kafka.Brokers, "x", WithFetchLimits(args[0], args[1])); err == nil || !strings.Contains(err.Error(), "WithFetchLimits") {
			t.Errorf("WithFetchLimits(%d, %d): %v", args[0], args[1], err)
		}
	}
}
