package outbox

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/faultinject"
)

// TestRelayClaimsNextBatchWhileOneIsInFlight: the broker holds back the
// first produce request until the relay has claimed the next batch, which
// it does only if it pipelines; everything then arrives once, in per-key
// order.
func TestRelayClaimsNextBatchWhileOneIsInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, true, 3)
	evs, want := sequence(b.d, 1000, 10)
	b.write(t, evs)

	var claims atomic.Int32
	var sawAhead atomic.Bool
	b.kafka.Fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		// The first produce request of the first batch: hold it (so the
		// batch cannot be acknowledged) until the relay has claimed a
		// second batch, which happens only if it pipelines (or give up
		// after a while).
		deadline := time.Now().Add(60 * time.Second)
		for claims.Load() < 2 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		sawAhead.Store(claims.Load() >= 2)
		return nil, nil, false
	})
	b.startRelayIn(t, faultinject.Relay(context.Background(), faultinject.RelayPoints{AfterClaim: func(context.Context, []faultinject.Row) {
		claims.Add(1)
	}}), WithWriteTimeout(2*time.Minute))
	b.waitDrained(t, 60*time.Second)
	if !sawAhead.Load() {
		t.Fatal("the relay did not claim the next batch while the first one was in flight")
	}
	if dups := checkDelivery(t, b.readAll(t), want); dups != 0 {
		t.Fatalf("%d duplicates without any failure", dups)
	}
}

// TestRelayShutdownGraceWaitsForAcks: the relay is stopped while the broker
// holds back the acknowledgement of a batch. With the shutdown grace the
// batch is acknowledged and marked before Run returns, so the next relay
// re-sends nothing: Kafka holds exactly one record per row. Without grace
// (0) the batch is abandoned and re-sent, which the second half shows.
func TestRelayShutdownGraceWaitsForAcks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		grace time.Duration
	}{{"grace", 30 * time.Second}, {"no grace", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t, true, 3)
			evs, want := sequence(b.d, 300, 6)
			b.write(t, evs)
			r, err := NewRelay(b.pool, b.brokers, WithLogger(quietLogger()), WithShutdownGrace(tc.grace),
				WithBackoff(10*time.Millisecond, 200*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			runCtx, stop := context.WithCancel(ctx)
			defer stop()
			returned := make(chan error, 1)
			b.kafka.Fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
				// The first batch is in flight: stop the relay, then let
				// the broker answer after a moment (or as soon as Run
				// has returned without waiting).
				stop()
				select {
				case err := <-returned:
					returned <- err
				case <-time.After(time.Second):
				}
				return nil, nil, false
			})
			go func() { returned <- r.Run(runCtx) }()
			select {
			case err := <-returned:
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
				returned <- err
			case <-time.After(60 * time.Second):
				t.Fatal("relay did not stop")
			}
			st, err := Status(ctx, b.pool)
			if err != nil {
				t.Fatal(err)
			}
			if st.Relays != 0 {
				t.Fatalf("after Run returned: %+v, want no relay", st)
			}
			if tc.grace > 0 && st.Published == 0 {
				t.Fatalf("the batch in flight at shutdown was not marked: %+v", st)
			}
			b.startRelay(t)
			b.waitDrained(t, 60*time.Second)
			parts := b.readAll(t)
			records := 0
			for _, p := range parts {
				records += len(p)
			}
			dups := checkDelivery(t, parts, want)
			t.Logf("grace %v: %d records in Kafka for %d rows (%d duplicates)", tc.grace, records, len(evs), dups)
			if tc.grace > 0 && (dups != 0 || records != len(evs)) {
				t.Fatalf("%d records for %d rows: the batch acknowledged during the grace was re-sent", records, len(evs))
			}
			if tc.grace == 0 && dups == 0 {
				t.Fatal("without grace the abandoned batch should have been re-sent; the test no longer stops the relay mid-publish")
			}
		})
	}
}

// TestRelayFillsBatchesFromOneHotLane: every event has the same key, so one
// lane of the sixteen the relay owns holds the whole backlog. The claim
// splits its batch among the lanes by the demand it saw (loop.quotas); the
// hot lane's share must grow to the whole batch but the one row kept for
// each other lane (so that rows arriving there go out at once), rather than
// stay at an even split, and the key's order holds.
func TestRelayFillsBatchesFromOneHotLane(t *testing.T) {
	t.Parallel()
	b := setup(t, false, 3)
	const batch = 200
	evs, want := sequence(b.d, 2000, 1)
	b.write(t, evs)
	var largest atomic.Int32
	b.startRelayIn(t, faultinject.Relay(context.Background(), faultinject.RelayPoints{AfterClaim: func(_ context.Context, rows []faultinject.Row) {
		if n := int32(len(rows)); n > largest.Load() {
			largest.Store(n)
		}
	}}), WithBatchSize(batch))
	b.waitDrained(t, 60*time.Second)
	if got, min := largest.Load(), int32(batch-(DefaultLanes-1)); got < min {
		t.Fatalf("largest batch from one hot lane: %d rows, want at least %d (the batch size but one row for each other lane)", got, min)
	}
	if dups := checkDelivery(t, b.readAll(t), want); dups != 0 {
		t.Fatalf("%d duplicates without any failure", dups)
	}
}

// TestRelaySendsEachPartitionShareInOneRequest: every batch's rows bound for
// one partition reach the broker in exactly one produce request (which the
// broker appends or refuses as a whole), with the relay's batch sizes
// changing from call to call (a backlog in batches of up to 200, then a
// trickle of single rows) and two lane workers each with its own writer.
func TestRelaySendsEachPartitionShareInOneRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, true, 3)
	var mu sync.Mutex
	// shares counts "partition/rows" of the produce requests seen and of
	// the batches the relay published.
	sent, published := map[string]int{}, map[string]int{}
	b.kafka.Fake.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		b.kafka.Fake.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		for _, tp := range req.(*kmsg.ProduceRequest).Topics {
			for _, p := range tp.Partitions {
				var rb kmsg.RecordBatch
				if err := rb.ReadFrom(p.Records); err != nil {
					t.Errorf("produce request for partition %d: %v", p.Partition, err)
					continue
				}
				sent[fmt.Sprintf("%d/%d", p.Partition, rb.NumRecords)]++
			}
		}
		return nil, nil, false
	})
	afterPublish := func(_ context.Context, rows []faultinject.Row) error {
		per := map[int]int{}
		for _, r := range rows {
			per[(kafka.Murmur2Balancer{}).Balance(kafka.Message{Key: r.Key}, 0, 1, 2)]++
		}
		mu.Lock()
		defer mu.Unlock()
		for p, n := range per {
			published[fmt.Sprintf("%d/%d", p, n)]++
		}
		return nil
	}
	evs, want := sequence(b.d, 1200, 24)
	b.write(t, evs[:1000])
	b.startRelayIn(t, faultinject.Relay(context.Background(), faultinject.RelayPoints{AfterPublish: afterPublish}), WithBatchSize(200), WithWorkers(2))
	b.waitDrained(t, time.Minute)
	for _, ev := range evs[1000:] {
		b.write(t, []events.Event{ev})
	}
	b.waitDrained(t, time.Minute)
	if dups := checkDelivery(t, b.readAll(t), want); dups != 0 {
		t.Fatalf("%d duplicates without any failure", dups)
	}
	mu.Lock()
	defer mu.Unlock()
	if !maps.Equal(sent, published) {
		t.Fatalf("produce requests by partition/records %v, batches' shares by partition/rows %v: a share was split or merged", sent, published)
	}
}
