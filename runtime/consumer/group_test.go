package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/segmentio/kafka-go"
)

// describe is DescribeGroup of the group of the consumer named name, with a
// test timeout.
func (b *bundle) describe(t testing.TB, name string, topics ...string) GroupStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := DescribeGroup(ctx, b.kafka.Brokers, b.kafka.Group(name), topics)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitGroup waits until the status of the group of the consumer named name
// satisfies cond.
func (b *bundle) waitGroup(t testing.TB, name, what string, cond func(GroupStatus) bool) GroupStatus {
	t.Helper()
	var st GroupStatus
	testenv.WaitFor(t, 30*time.Second, what, func() (bool, string) {
		st = b.describe(t, name)
		return cond(st), fmt.Sprintf("%+v", st)
	})
	return st
}

// TestGroupDescribeAndReset: a running consumer shows as a live member
// holding every partition, and a reset is refused naming it; once it
// stopped (leaving the group), the lag and the age of the oldest
// unprocessed message show new events, and the reset moves the committed
// offsets to an offset (clamped to the retained range), a time and the
// start.
func TestGroupDescribeAndReset(t *testing.T) {
	t.Parallel()
	b := setup(t, 3)
	var msgs []kafka.Message
	for i := range 30 {
		msgs = append(msgs, message(t, b.event(t, fmt.Sprintf("k%d", i%6), i), nil))
	}
	b.produce(t, msgs...)
	c := b.newConsumer(t, "admin", b.handler("admin", nil), WithCommitInterval(0))
	r := start(t, c)
	b.effectsAtLeast(t, 30, 30*time.Second)
	st := b.waitGroup(t, "admin", "one member holding 3 partitions, lag 0", func(st GroupStatus) bool {
		if len(st.Members) != 1 || len(st.Partitions) != 3 || st.Lag() != 0 {
			return false
		}
		for _, p := range st.Partitions {
			if p.Member != st.Members[0].ID || p.Committed < 0 {
				return false
			}
		}
		return true
	})
	if got := st.Members[0].Assignments[b.topic]; len(got) != 3 || st.State != "Stable" {
		t.Fatalf("state %s, assignments %v; want Stable with 3 partitions", st.State, st.Members[0].Assignments)
	}
	var hwm int64
	for _, p := range st.Partitions {
		if p.Topic != b.topic || p.Committed != p.HighWatermark || p.OldestUnprocessedAge != 0 {
			t.Fatalf("partition %+v: want committed at the high watermark, no age", p)
		}
		hwm += p.HighWatermark
	}
	if hwm != 30 {
		t.Fatalf("high watermarks add up to %d, want 30", hwm)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := ResetGroup(ctx, b.kafka.Brokers, b.kafka.Group("admin"), nil, ResetToEarliest())
	var live *LiveMembersError
	if !errors.As(err, &live) || !errors.Is(err, ErrGroupActive) || !strings.Contains(err.Error(), st.Members[0].ID) ||
		!strings.Contains(err.Error(), "stop every consumer of the group") {
		t.Fatalf("reset of a live group: %v; want a LiveMembersError naming %s and the fix", err, st.Members[0].ID)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	b.waitGroup(t, "admin", "no members after a clean stop", func(st GroupStatus) bool { return len(st.Members) == 0 })

	// New events while the consumer is down: lag and age show them.
	mid := time.Now()
	time.Sleep(5 * time.Millisecond) // the new events' timestamps are after mid (millisecond resolution)
	msgs = msgs[:0]
	for i := range 6 {
		msgs = append(msgs, message(t, b.event(t, fmt.Sprintf("k%d", i), 100+i), nil))
	}
	b.produce(t, msgs...)
	st = b.describe(t, "admin")
	if st.Lag() != 6 || len(st.Partitions) != 3 {
		t.Fatalf("lag %d over %d partitions, want 6 over 3: %+v", st.Lag(), len(st.Partitions), st)
	}
	for _, p := range st.Partitions {
		if p.Lag > 0 && (p.OldestUnprocessed.Before(mid.Truncate(time.Millisecond)) || p.OldestUnprocessedAge < 0) {
			t.Fatalf("partition %d: oldest unprocessed %v, want at or after %v", p.Partition, p.OldestUnprocessed, mid)
		}
		if p.Lag == 0 && !p.OldestUnprocessed.IsZero() {
			t.Fatalf("partition %d: no lag but an oldest unprocessed message at %v", p.Partition, p.OldestUnprocessed)
		}
	}

	reset := func(to ResetTo) []OffsetReset {
		t.Helper()
		got, err := ResetGroup(ctx, b.kafka.Brokers, b.kafka.Group("admin"), []string{b.topic}, to)
		if err != nil {
			t.Fatalf("reset to %s: %v", to, err)
		}
		if len(got) != 3 {
			t.Fatalf("reset to %s moved %d partitions, want 3", to, len(got))
		}
		after := b.describe(t, "admin", b.topic)
		for i, p := range after.Partitions {
			if p.Committed != got[i].To {
				t.Fatalf("reset to %s: %s/%d committed %d, want %d", to, p.Topic, p.Partition, p.Committed, got[i].To)
			}
		}
		return got
	}
	for _, r := range reset(ResetToOffset(3)) {
		if p := st.Partitions[r.Partition]; r.To != min(3, p.HighWatermark) || r.Clamped != (p.HighWatermark < 3) || r.From != p.Committed {
			t.Fatalf("reset to offset 3: %+v (partition had %+v)", r, p)
		}
	}
	for _, r := range reset(ResetToOffset(1 << 40)) {
		if r.To != st.Partitions[r.Partition].HighWatermark || !r.Clamped {
			t.Fatalf("reset past the end: %+v, want clamped to the high watermark", r)
		}
	}
	for _, r := range reset(ResetToTime(mid)) {
		// The first event after mid: where the 6 new events begin.
		if p := st.Partitions[r.Partition]; r.To != p.HighWatermark-p.Lag {
			t.Fatalf("reset to time: %+v, want %d (the first event produced after the stop)", r, p.HighWatermark-p.Lag)
		}
	}
	if st := b.describe(t, "admin"); st.Lag() != 6 {
		t.Fatalf("lag %d after the reset to the stop time, want 6", st.Lag())
	}
	for _, r := range reset(ResetToEarliest()) {
		if r.To != 0 {
			t.Fatalf("reset to earliest: %+v, want 0", r)
		}
	}
	if st := b.describe(t, "admin"); st.Lag() != 36 {
		t.Fatalf("lag %d after the reset to earliest, want 36", st.Lag())
	}
	dry, err := ResetGroup(ctx, b.kafka.Brokers, b.kafka.Group("admin"), nil, ResetToOffset(1<<40), ResetDryRun())
	if err != nil || len(dry) != 3 {
		t.Fatalf("dry run: %v, %v", dry, err)
	}
	if st := b.describe(t, "admin"); st.Lag() != 36 {
		t.Fatalf("a dry run moved the offsets: lag %d, want 36", st.Lag())
	}
	if _, err := DescribeGroup(ctx, b.kafka.Brokers, b.kafka.Group("admin"), []string{b.topic + ".missing"}); !errors.Is(err, ErrNoTopic) {
		t.Fatalf("describe of a missing topic: %v, want ErrNoTopic", err)
	}
}

// TestCleanShutdownLeavesGroup: a consumer that stops cleanly leaves its
// group (kafka-go's ConsumerGroup.Close sends LeaveGroup) rather than
// waiting out its session timeout, set to a minute here: the group has no
// member as soon as Run returned, and a second consumer gets the partitions
// with no wait.
func TestCleanShutdownLeavesGroup(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	b.produce(t, message(t, b.event(t, "a", 1), nil))
	slowSession := WithGroupTimeouts(time.Second, time.Minute, 10*time.Second)
	r := start(t, b.newConsumer(t, "leaver", b.handler("leaver", nil), slowSession))
	b.effectsAtLeast(t, 1, 30*time.Second)
	b.waitGroup(t, "leaver", "one member", func(st GroupStatus) bool { return len(st.Members) == 1 })
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if st := b.describe(t, "leaver"); len(st.Members) != 0 || st.State != "Empty" {
		t.Fatalf("after a clean stop the group is %s with members %+v; want Empty (LeaveGroup sent)", st.State, st.Members)
	}
	r2 := start(t, b.newConsumer(t, "leaver", b.handler("leaver", nil), slowSession))
	b.produce(t, message(t, b.event(t, "a", 2), nil))
	b.effectsAtLeast(t, 2, 30*time.Second)
	if err := r2.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestGroupTimeoutDefaults: the group timeouts default to 1s/10s/10s, a
// zero in WithGroupTimeouts keeps the default, and a heartbeat not below the
// session timeout is refused with the fix.
func TestGroupTimeoutDefaults(t *testing.T) {
	s, err := settingsFrom(nil)
	if err != nil || s.heartbeat != time.Second || s.session != 10*time.Second || s.rebalance != 10*time.Second || s.joinBackoff != time.Second {
		t.Fatalf("defaults: heartbeat %v, session %v, rebalance %v, join backoff %v (%v)", s.heartbeat, s.session, s.rebalance, s.joinBackoff, err)
	}
	s, err = settingsFrom([]Option{WithGroupTimeouts(0, 20*time.Second, 0)})
	if err != nil || s.heartbeat != time.Second || s.session != 20*time.Second || s.rebalance != 10*time.Second {
		t.Fatalf("session only: heartbeat %v, session %v, rebalance %v (%v)", s.heartbeat, s.session, s.rebalance, err)
	}
	if _, err := settingsFrom([]Option{WithGroupTimeouts(10*time.Second, 0, 0)}); err == nil || !strings.Contains(err.Error(), "must be below the session timeout") {
		t.Fatalf("heartbeat 10s with session 10s: %v", err)
	}
	if _, err := settingsFrom([]Option{WithGroupTimeouts(-time.Second, 0, 0)}); err == nil || !strings.Contains(err.Error(), "negative timeout") {
		t.Fatalf("negative heartbeat: %v", err)
	}
}
