package outbox

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/faultinject"
)

// TestRelayPublishesCommittedEventsOnly: a rolled-back transaction leaves no
// message, committed ones arrive exactly once each, in order per key, and a
// relay whose idle poll has backed off to once an hour still delivers
// promptly because the Writer in the same process wakes it.
func TestRelayPublishesCommittedEventsOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, false, 3)
	b.startRelay(t, WithPollInterval(time.Hour), WithRebalanceInterval(time.Hour))
	b.writer.Notify() // the relay may have backed off before the first write

	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	phantom, _ := sequence(descriptorFor(b.topic), 20, 4)
	if _, err := b.writer.WriteBatch(ctx, tx, phantom); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	evs, want := sequence(b.d, 300, 7)
	b.write(t, evs[:100])
	b.writer.Notify()
	b.waitDrained(t, 20*time.Second)
	// The relay is idle now, its poll backing off towards an hour; only the
	// wake-up brings it back in time.
	for _, ev := range evs[100:] {
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.writer.Write(ctx, tx, ev); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		b.writer.Notify()
	}
	b.waitDrained(t, 20*time.Second)
	if dups := checkDelivery(t, b.readAll(t), want); dups != 0 {
		t.Fatalf("%d duplicates without any failure", dups)
	}
	st, err := Status(ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if st.Published != 300 || st.Relays != 1 || st.Failing != 0 {
		t.Fatalf("status: %+v", st)
	}
}

// TestRelayCrashBetweenPublishAndMark: the broker has the batch but the
// relay dies before marking it; the next relay re-sends it, so nothing is
// lost and the duplicates carry the same event IDs.
func TestRelayCrashBetweenPublishAndMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, false, 3)
	evs, want := sequence(b.d, 50, 5)
	b.write(t, evs)

	var calls, sent atomic.Int32
	crashing := b.startRelayIn(t, faultinject.Relay(ctx, faultinject.RelayPoints{AfterPublish: func(_ context.Context, rows []faultinject.Row) error {
		calls.Add(1)
		sent.Store(int32(len(rows)))
		return errCrash
	}}))
	select {
	case err := <-crashing.done:
		crashing.done <- err
		if !errors.Is(err, errCrash) {
			t.Fatalf("Run returned %v, want the simulated crash", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("crashing relay did not stop")
	}
	if calls.Load() != 1 {
		t.Fatalf("hook ran %d times", calls.Load())
	}
	st, err := Status(ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 50 || st.Relays != 0 {
		t.Fatalf("after the crash: %+v, want 50 pending and no relay", st)
	}

	b.startRelay(t)
	b.waitDrained(t, 20*time.Second)
	if dups := checkDelivery(t, b.readAll(t), want); dups != int(sent.Load()) {
		t.Fatalf("%d duplicates, want the whole re-sent batch (%d)", dups, sent.Load())
	}
}

// TestRelayBacksOffWhileBrokerIsDown: produce requests fail for a while;
// the relay retries with backoff, records the error on the rows, marks
// nothing it was not acknowledged for, and delivers everything once the
// broker is back.
func TestRelayBacksOffWhileBrokerIsDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, true, 3)
	var refused atomic.Int32
	down := make(chan struct{})
	b.kafka.Fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		select {
		case <-down:
			b.kafka.Fake.DropControl()
			return nil, nil, false
		default:
		}
		b.kafka.Fake.KeepControl()
		refused.Add(1)
		return nil, errors.New("broker down"), true // closes the connection
	})
	evs, want := sequence(b.d, 200, 10)
	b.write(t, evs)
	rr := b.startRelay(t, WithBatchSize(50), WithStatusInterval(10*time.Millisecond),
		WithMaxAttempts(1))

	deadline := time.Now().Add(2 * time.Minute)
	for refused.Load() < 3 || rr.failures.Load() < 3 || rr.pending.Load() != 200 {
		if time.Now().After(deadline) {
			t.Fatalf("broker refused %d requests, relay saw %d failures, reported %d pending", refused.Load(), rr.failures.Load(), rr.pending.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	st, err := Status(ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pending != 200 || st.Failing == 0 || st.LastError == "" || st.Published != 0 {
		t.Fatalf("while the broker is down: %+v, want 200 pending, failures recorded, none published", st)
	}
	close(down)
	b.waitDrained(t, 30*time.Second)
	checkDelivery(t, b.readAll(t), want)
}

// TestRelaysKeepPerKeyOrder: three relays share 10,000 events over 50 keys
// while they are being written; midway one relay's database session is
// killed and another relay is stopped and replaced. Every event arrives and
// every key's events arrive in order.
func TestRelaysKeepPerKeyOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, false, 6)
	opts := []RelayOption{WithBatchSize(200), WithRebalanceInterval(50 * time.Millisecond), WithPollInterval(200 * time.Millisecond)}
	relays := []*runningRelay{b.startRelay(t, opts...), b.startRelay(t, opts...), b.startRelay(t, opts...)}
	// Let the relays share the lanes first, so that each has work.
	deadline := time.Now().Add(2 * time.Minute)
	for relays[0].lanes.Load() == 0 || relays[1].lanes.Load() == 0 || relays[2].lanes.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("lanes not shared: %d, %d, %d", relays[0].lanes.Load(), relays[1].lanes.Load(), relays[2].lanes.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}

	evs, want := sequence(b.d, 10000, 50)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < len(evs); i += 250 {
			b.write(t, evs[i:i+250])
			if i == 5000 {
				// Kill one relay's session (its locks go with it), and
				// replace another relay by a new one.
				var pid int
				if err := b.pool.QueryRow(ctx, `SELECT pid FROM pg_locks l JOIN pg_class c ON c.oid = l.classid
					WHERE l.locktype = 'advisory' AND l.objid = $1 AND c.oid = to_regclass('outbox') LIMIT 1`, uint32(presenceLane)).Scan(&pid); err != nil {
					t.Error(err)
					return
				}
				if _, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
					t.Error(err)
					return
				}
				if err := relays[0].stop(t); err != nil {
					t.Error(err)
				}
				relays = append(relays, b.startRelay(t, opts...))
			}
		}
	}()
	wg.Wait()
	b.waitDrained(t, 60*time.Second)
	dups := checkDelivery(t, b.readAll(t), want)
	t.Logf("%d duplicates after killing one relay session and replacing another", dups)
	active := 0
	for _, r := range relays {
		if r.published.Load() > 0 {
			active++
		}
	}
	if active < 3 {
		t.Fatalf("only %d of %d relays published anything; lanes were not shared", active, len(relays))
	}
}

func mustSchema(t *testing.T, b *bundle) string {
	var s string
	if err := b.pool.QueryRow(context.Background(), `SELECT current_schema()`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRelayCleanup: published rows older than the retention are deleted,
// younger ones kept.
func TestRelayCleanup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, false, 1)
	evs, _ := sequence(b.d, 30, 3)
	b.write(t, evs)
	keep := b.startRelay(t, WithRetention(time.Hour), WithCleanupInterval(10*time.Millisecond))
	b.waitDrained(t, 20*time.Second)
	time.Sleep(50 * time.Millisecond) // several cleanup rounds
	if err := keep.stop(t); err != nil {
		t.Fatal(err)
	}
	st, err := Status(ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if st.Published != 30 {
		t.Fatalf("%d published rows kept within the retention, want 30", st.Published)
	}
	b.startRelay(t, WithRetention(0), WithCleanupInterval(10*time.Millisecond))
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := Status(ctx, b.pool)
		if err != nil {
			t.Fatal(err)
		}
		if st.Published == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("published rows not cleaned up: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAckedRowsStopAtFirstFailurePerKey pins the partial-failure rule.
func TestAckedRowsStopAtFirstFailurePerKey(t *testing.T) {
	t.Parallel()
	row := func(id int64, key string) claimed {
		return claimed{rowMeta: rowMeta{ID: id, Topic: "t", Key: []byte(key)}}
	}
	batch := []claimed{row(1, "a"), row(2, "b"), row(3, "a"), row(4, "c"), row(5, "b")}
	boom := errors.New("boom")
	acked, failed, failing := ackedRows(batch, kafka.WriteErrors{nil, boom, nil, nil, nil})
	if want := []int64{1, 3, 4}; !equal(acked, want) {
		t.Fatalf("acked %v, want %v", acked, want)
	}
	if want := []int64{2, 5}; !equal(failed, want) {
		t.Fatalf("failed %v, want %v (b's later row must wait for its earlier one)", failed, want)
	}
	if len(failing) != 1 || failing[0] != (topicKey{"t", "b"}) {
		t.Fatalf("failing keys %v, want just b", failing)
	}
	acked, failed, failing = ackedRows(batch, boom)
	if len(acked) != 0 || len(failed) != 5 || len(failing) != 0 {
		t.Fatalf("a whole-call error must fail every row and park no key: %v %v %v", acked, failed, failing)
	}
	acked, failed, failing = ackedRows(batch, nil)
	if len(acked) != 5 || len(failed) != 0 || len(failing) != 0 {
		t.Fatalf("success must ack every row: %v %v %v", acked, failed, failing)
	}
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

var _ events.Event = testEvent{}

// TestRelayShutdownMarksAcknowledgedBatch: a shutdown that arrives after
// the broker acknowledged a batch still marks it (no needless duplicates),
// stops before the next batch, and frees the relay's lanes.
func TestRelayShutdownMarksAcknowledgedBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, false, 3)
	evs, want := sequence(b.d, 30, 3)
	b.write(t, evs)
	var self atomic.Pointer[runningRelay]
	ready, hooked := make(chan struct{}), make(chan struct{})
	var once sync.Once
	rr := b.startRelayIn(t, faultinject.Relay(ctx, faultinject.RelayPoints{AfterPublish: func(context.Context, []faultinject.Row) error {
		<-ready
		self.Load().cancel() // the shutdown signal lands between publish and mark
		once.Do(func() { close(hooked) })
		return nil
	}}), WithBatchSize(10))
	self.Store(rr)
	close(ready)
	select {
	case <-hooked:
	case <-time.After(20 * time.Second):
		t.Fatal("no batch was published")
	}
	if err := rr.stop(t); err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
	st, err := Status(ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if st.Published != 10 || st.Pending != 20 || st.Relays != 0 {
		t.Fatalf("after shutdown: %+v, want the acknowledged batch of 10 marked, 20 pending, no relay", st)
	}
	b.startRelay(t)
	b.waitDrained(t, 20*time.Second)
	if dups := checkDelivery(t, b.readAll(t), want); dups != 0 {
		t.Fatalf("%d duplicates; the acknowledged batch was re-sent", dups)
	}
}

// TestBackoffGrowsWithJitterWithinBounds pins the retry delays: doubling
// from the minimum, jittered into [d/2, d], capped at the maximum, and back
// to the minimum after a reset.
func TestBackoffGrowsWithJitterWithinBounds(t *testing.T) {
	t.Parallel()
	b := backoff{min: 10 * time.Millisecond, max: 200 * time.Millisecond}
	for i, ceil := range []time.Duration{10, 20, 40, 80, 160, 200, 200, 200} {
		ceil *= time.Millisecond
		if d := b.next(); d < ceil/2 || d > ceil {
			t.Fatalf("delay %d = %v, want within [%v, %v]", i, d, ceil/2, ceil)
		}
	}
	for range 100 {
		b.next() // no overflow however long it fails
	}
	if d := b.next(); d < 100*time.Millisecond || d > 200*time.Millisecond {
		t.Fatalf("delay after many failures = %v", d)
	}
	b.reset()
	if d := b.next(); d > 10*time.Millisecond {
		t.Fatalf("delay after reset = %v", d)
	}
}

// TestRelayPartitionOutageHoldsOnlyItsKeys: produce requests for one
// partition fail while the others succeed; the relay marks exactly the
// acknowledged rows, so keys on healthy partitions are delivered during the
// outage, the failing partition's keys wait, and everything arrives in
// order once the partition is back.
func TestRelayPartitionOutageHoldsOnlyItsKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, true, 3)
	const sick = 0
	var healed atomic.Bool
	var refused atomic.Int32
	b.kafka.Fake.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		b.kafka.Fake.KeepControl()
		if healed.Load() {
			return nil, nil, false
		}
		// kafka-go sends one request per partition; refuse the sick one's
		// with an error code (closing the connection would fail every
		// request multiplexed on it).
		preq := req.(*kmsg.ProduceRequest)
		resp := preq.ResponseKind().(*kmsg.ProduceResponse)
		resp.SetVersion(preq.GetVersion())
		hit := false
		for _, tp := range preq.Topics {
			rt := kmsg.NewProduceResponseTopic()
			rt.Topic = tp.Topic
			for _, p := range tp.Partitions {
				rp := kmsg.NewProduceResponseTopicPartition()
				rp.Partition = p.Partition
				rp.ErrorCode = kerr.NotEnoughReplicas.Code
				rt.Partitions = append(rt.Partitions, rp)
				hit = hit || p.Partition == sick
			}
			resp.Topics = append(resp.Topics, rt)
		}
		if !hit {
			return nil, nil, false
		}
		refused.Add(1)
		return resp, nil, true
	})
	evs, want := sequence(b.d, 300, 12)
	onSick := int64(0)
	for _, ev := range evs {
		if (kafka.Murmur2Balancer{}).Balance(kafka.Message{Key: ev.(testEvent).EventKey()}, 0, 1, 2) == sick {
			onSick++
		}
	}
	if onSick == 0 || onSick == int64(len(evs)) {
		t.Fatalf("test keys must span the sick and healthy partitions (%d of %d on the sick one)", onSick, len(evs))
	}
	b.write(t, evs)
	b.startRelay(t, WithBatchSize(40), WithMaxAttempts(1))

	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := Status(ctx, b.pool)
		if err != nil {
			t.Fatal(err)
		}
		if st.Pending == onSick && refused.Load() > 0 {
			if st.Failing == 0 || st.Published != int64(len(evs))-onSick {
				t.Fatalf("during the outage: %+v", st)
			}
			break
		}
		if st.Pending < onSick {
			t.Fatalf("%d rows pending, fewer than the %d on the failing partition: unacknowledged rows were marked", st.Pending, onSick)
		}
		if time.Now().After(deadline) {
			t.Fatalf("healthy keys not delivered during the outage: %+v (%d on the sick partition)", st, onSick)
		}
		time.Sleep(10 * time.Millisecond)
	}
	healed.Store(true)
	b.waitDrained(t, 30*time.Second)
	checkDelivery(t, b.readAll(t), want)
}

// TestRelayMissingTopicHoldsOnlyItsEvents: events for a topic that does not
// exist yet wait (and are reported) while the other topic's events in the
// same lanes flow; once the topic is created they are delivered too.
func TestRelayMissingTopicHoldsOnlyItsEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, true, 3)
	missing := &bundle{pool: b.pool, brokers: b.brokers, parts: 2, topic: b.topic + "-later"}
	missing.d = descriptorFor(missing.topic)
	good, wantGood := sequence(b.d, 100, 5)
	late, wantLate := sequence(missing.d, 40, 5)
	var evs []events.Event
	for i := range good {
		evs = append(evs, good[i])
		if i < len(late) {
			evs = append(evs, late[i])
		}
	}
	b.write(t, evs)
	b.startRelay(t)

	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := Status(ctx, b.pool)
		if err != nil {
			t.Fatal(err)
		}
		if st.Pending == 40 && st.Failing == 40 {
			if st.Published != 100 || st.LastError == "" {
				t.Fatalf("while the topic is missing: %+v", st)
			}
			break
		}
		if st.Pending < 40 {
			t.Fatalf("%d pending: events for the missing topic were marked", st.Pending)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the existing topic's events were held up: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	checkDelivery(t, b.readAll(t), wantGood)
	if err := b.kafka.CreateTopics(ctx, 2, missing.topic); err != nil {
		t.Fatal(err)
	}
	b.waitDrained(t, 30*time.Second)
	checkDelivery(t, missing.readAll(t), wantLate)
}
