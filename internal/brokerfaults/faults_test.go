package brokerfaults

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/internal/testenv"
)

// Generous bounds for a loaded two-core machine: every wait returns as
// soon as its condition holds.
const (
	flowing  = 2 * time.Minute // for the next events to be applied
	settling = 4 * time.Minute // for the whole backlog to drain after a fault
)

// mostLeading returns the node leading the most partitions of leaders.
func mostLeading(leaders map[int]int) int {
	count := map[int]int{}
	best := 0
	for _, node := range leaders {
		count[node]++
		if count[node] > count[best] {
			best = node
		}
	}
	return best
}

// killAndRestart kills node victim with SIGKILL, waits until the flow
// goes on without it, starts it again and waits for more progress.
func (p *pipeline) killAndRestart(victim int) {
	p.t.Helper()
	if err := p.kafka.Node(victim).Kill(); err != nil {
		p.t.Fatal(err)
	}
	p.progress(300, flowing)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := p.kafka.Node(victim).Start(ctx); err != nil {
		p.t.Fatal(err)
	}
	p.progress(100, flowing)
}

// TestLeaderKilledMidBatch: while the relay publishes a steady flow, the
// node leading most of the topic's partitions is killed with SIGKILL
// (in-flight produce requests die with it; the controller moves leadership
// to an in-sync replica), the flow goes on on the two left, and the node
// comes back. Every event is applied exactly once, in per-key order.
// (On loopback the followers are never behind, so acks=1 survives this
// one: TestLeaderKilledWhileFollowersLag is the test for acks=all.)
func TestLeaderKilledMidBatch(t *testing.T) {
	for _, kind := range []relayKind{pollingRelay, walRelay} {
		t.Run(string(kind), func(t *testing.T) {
			p := newPipeline(t, kind)
			p.write(4)
			p.progress(300, flowing)
			victim := mostLeading(p.leaders(p.d.Topic))
			t.Logf("killing node %d, leader of partitions %v", victim, p.leaders(p.d.Topic))
			p.killAndRestart(victim)
			p.check(settling)
		})
	}
}

// TestLeaderKilledWhileFollowersLag: the followers of a leader fall behind
// (frozen with SIGSTOP for 2s, as in a long GC pause) while the relay
// keeps producing, then the leader is killed with SIGKILL and the followers
// thaw: one of them, still in the ISR, becomes leader without the records
// only the dead leader had. With acks=all the relay was never acknowledged
// for those records (its produce waited for the followers), so it re-sends
// them: nothing is lost. Mutation that makes it fail: acks=1 in
// kafkawriter (acknowledged by the leader alone, marked published, then
// truncated away with the leader: lost).
func TestLeaderKilledWhileFollowersLag(t *testing.T) {
	for _, kind := range []relayKind{pollingRelay, walRelay} {
		t.Run(string(kind), func(t *testing.T) {
			p := newPipeline(t, kind)
			p.write(4)
			p.progress(300, flowing)
			victim := mostLeading(p.leaders(p.d.Topic))
			var others []int
			for _, n := range p.kafka.Nodes() {
				if n.ID() != victim {
					others = append(others, n.ID())
					if err := n.Pause(); err != nil {
						t.Fatal(err)
					}
				}
			}
			// The followers' lag lasts 2s: the fault's length, not a wait
			// for a result.
			time.Sleep(2 * time.Second)
			t.Logf("killing node %d after nodes %v lagged 2s", victim, others)
			if err := p.kafka.Node(victim).Kill(); err != nil {
				t.Fatal(err)
			}
			for _, id := range others {
				if err := p.kafka.Node(id).Resume(); err != nil {
					t.Fatal(err)
				}
			}
			p.progress(300, flowing)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := p.kafka.Node(victim).Start(ctx); err != nil {
				t.Fatal(err)
			}
			p.check(settling)
		})
	}
}

// TestCoordinatorKilledUnderConsumer: the node coordinating the consumer
// group (and leading some partitions) is killed with SIGKILL while the
// consumer handles and commits; the group finds its new coordinator, the
// partitions their new leaders, and nothing is applied twice (the dedup
// rows absorb what was applied but not yet committed) or lost.
// Mutation that makes it fail: the dedup insert's answer ignored (every
// redelivered event applied again: 241 effects too many in its run).
func TestCoordinatorKilledUnderConsumer(t *testing.T) {
	p := newPipeline(t, pollingRelay)
	p.write(4)
	p.progress(300, flowing)
	victim := p.coordinator("faults")
	t.Logf("killing node %d, coordinator of the group", victim)
	p.killAndRestart(victim)
	p.check(settling)
}

// TestAllBrokersDown: every node is killed and stays down for 30s while
// the writers go on committing into the outbox; the relay's and the
// consumer's /readyz say they are not ready while Kafka is unreachable
// (mutation: the consumer's broker check left out of its readiness, as it
// was: ready for the whole outage), and once the nodes are back
// the relay and the consumer resume on their own: the backlog drains,
// nothing dead-lettered (an outage is not a poison message), nothing lost
// or doubled.
func TestAllBrokersDown(t *testing.T) {
	for _, kind := range []relayKind{pollingRelay, walRelay} {
		t.Run(string(kind), func(t *testing.T) {
			p := newPipeline(t, kind)
			p.write(2)
			p.progress(200, flowing)
			for _, n := range p.kafka.Nodes() {
				if err := n.Kill(); err != nil {
					t.Fatal(err)
				}
			}
			down := time.Now()
			testenv.WaitFor(t, flowing, "the relay's /readyz to report Kafka down", func() (bool, string) {
				ready, why := p.relayHealth()
				return !ready, why
			})
			testenv.WaitFor(t, flowing, "the consumer's /readyz to report Kafka down", func() (bool, string) {
				ready, why := testenv.Ready(p.consumer.ReadyHandler())
				return !ready && strings.Contains(why, "kafka unreachable"), why
			})
			// The outage lasts 30s whatever the machine's speed: this is
			// the fault's length, not a wait for a result.
			time.Sleep(30*time.Second - time.Since(down))
			written := p.total()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			before := p.applied()
			back := time.Now()
			if err := p.kafka.StartAll(ctx); err != nil {
				t.Fatal(err)
			}
			up := time.Now()
			t.Logf("cluster answering %v after the restart began", up.Sub(back).Round(time.Millisecond))
			testenv.WaitFor(t, flowing, "the relay's first publish after the restore", func() (bool, string) {
				return p.published.Load() > up.UnixNano(), "none yet"
			})
			t.Logf("relay publishing again %v after the cluster answered", time.Unix(0, p.published.Load()).Sub(up).Round(time.Millisecond))
			testenv.WaitFor(t, flowing, "the first event applied after the restore", func() (bool, string) {
				return p.applied() > before, "none yet"
			})
			t.Logf("first event applied %v after the cluster answered", time.Since(up).Round(time.Millisecond))
			testenv.WaitFor(t, flowing, "the relay's /readyz to report ready again", func() (bool, string) {
				return p.relayHealth()
			})
			testenv.WaitFor(t, flowing, "the consumer's /readyz to report ready again", func() (bool, string) {
				return testenv.Ready(p.consumer.ReadyHandler())
			})
			testenv.WaitFor(t, settling, fmt.Sprintf("the %d events written by the end of the outage applied", written), func() (bool, string) {
				n := p.applied()
				return n >= written, fmt.Sprintf("%d applied", n)
			})
			t.Logf("what was written during the outage applied %v after the restart began", time.Since(back).Round(time.Millisecond))
			p.check(settling)
		})
	}
}

// TestPartitionsGrow: the topic grows from 3 to 6 partitions while events
// flow. Keys then map to other partitions (murmur2 of the key modulo the
// count), so a key's new events can be consumed before its earlier ones
// still waiting on the old partition: no relay can prevent that once the
// operator grew the topic. What must hold: the relay says so at once
// (an ERROR naming the topic and both counts), the consumer starts
// consuming the new partitions on its own, and nothing is lost, applied
// twice or dead-lettered. The order breaks, if any, are counted and
// logged; the runbook ("Growing a topic") says how to grow a topic without
// them (drain the consumers first).
func TestPartitionsGrow(t *testing.T) {
	p := newPipeline(t, pollingRelay)
	p.reorderAllowed = true
	p.write(4)
	p.progress(300, flowing)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(p.brokers...), Timeout: 30 * time.Second}
	res, err := cl.CreatePartitions(ctx, &kafka.CreatePartitionsRequest{Topics: []kafka.TopicPartitionsConfig{{Name: p.d.Topic, Count: 6}}})
	if err == nil {
		err = res.Errors[p.d.Topic]
	}
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, flowing, "the relay to report the grown topic", func() (bool, string) {
		return p.logs.logged("ERROR", "topic partition count changed", "topic="+p.d.Topic, "partitions=6", "were=3"), "not yet"
	})
	testenv.WaitFor(t, flowing, "the consumer to take the new partitions", func() (bool, string) {
		h := p.consumer.Health()
		return h.Partitions == 6, h.String()
	})
	p.progress(300, flowing)
	p.check(settling)
}
