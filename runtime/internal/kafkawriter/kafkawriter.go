// Package kafkawriter builds the kafka-go Writer both relays publish with,
// so the polling relay and the WAL relay send records the same way: one
// set of settings their guarantees rest on.
package kafkawriter

import (
	"crypto/tls"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
)

// Config is what a relay chooses about its producer.
type Config struct {
	Brokers      []string
	Transport    *kafka.Transport // nil: kafka-go's default transport
	MaxAttempts  int
	WriteTimeout time.Duration
	BatchSize    int
	// Guard is the partitioner, shared by a relay's writers so that a
	// partition count change is reported once (nil: one of its own that
	// reports nothing).
	Guard *Guard
}

// MetadataTTL is how often a relay's transport refreshes the cluster's
// metadata (kafka-go's default is 6s). After brokers restart, a produce to
// a partition whose leader moved fails with NOT_LEADER_FOR_PARTITION until
// the next refresh; measured on a real three-node cluster brought back from
// a full outage, the relay's keys on those partitions waited for it. A
// metadata request a second per relay is nothing for a broker.
const MetadataTTL = time.Second

// Transport returns the transport of one relay's Run, shared by its
// Writers and its broker checks: the relay's own (not kafka-go's
// process-wide default, whose connections and metadata cache every other
// kafka-go user in the process shares), carrying its TLS and SASL
// settings and refreshing metadata every MetadataTTL. Close it with
// CloseIdleConnections when Run ends.
func Transport(t *tls.Config, m sasl.Mechanism) *kafka.Transport {
	return &kafka.Transport{TLS: t, SASL: m, MetadataTTL: MetadataTTL}
}

// New returns a producer with RequiredAcks = RequireAll, synchronous
// writes, per-message topics, murmur2 partitioning like the Java client
// (so a key lands on the same partition whichever relay sends it), and
// batch limits large enough that one call sends each partition's messages
// in one request (callers set BatchSize to each call's size). BatchTimeout
// is 1ns: every call hands over a whole batch, so there is nothing to wait
// for (docs/design.md, "The trickle path").
func New(c Config) *kafka.Writer {
	w := &kafka.Writer{
		Addr:            kafka.TCP(c.Brokers...),
		Balancer:        c.Guard,
		BatchTimeout:    time.Nanosecond,
		MaxAttempts:     c.MaxAttempts,
		WriteBackoffMin: 50 * time.Millisecond,
		WriteBackoffMax: 500 * time.Millisecond,
		WriteTimeout:    c.WriteTimeout,
		RequiredAcks:    kafka.RequireAll,
		BatchSize:       c.BatchSize,
		BatchBytes:      1 << 30, // never split a partition's share; the relay caps the batch itself
	}
	if c.Guard == nil {
		w.Balancer = &Guard{}
	}
	if c.Transport != nil {
		w.Transport = c.Transport // not a nil *Transport in the interface
	}
	return w
}

// MaxBatchBytes is the most a relay puts in one produce call by default,
// estimated with Size: under the brokers' default message.max.bytes
// (1 MiB), so every partition's share is a record batch the broker
// accepts.
const MaxBatchBytes = 900 << 10

// Size estimates a message's bytes on the wire, with room for the record
// and header framing.
func Size(m *kafka.Message) int {
	n := 64 + len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += 16 + len(h.Key) + len(h.Value)
	}
	return n
}

// Guard is the relays' partitioner: murmur2 like the Java client, and a
// watch on each topic's partition count. kafka-go hands the balancer the
// topic's current partitions with every message, so a change is seen at
// the first message after kafka-go's metadata refresh, at no extra cost.
// A grown topic maps keys to other partitions: a key's next events may
// then be consumed before its earlier ones still waiting on the old
// partition. The relays cannot prevent that (the operator chose to grow
// the topic); Changed lets them say so loudly (docs/runbook.md, "Growing
// a topic"). PartitionsMessage is what they log.
type Guard struct {
	Changed func(topic string, was, now int)

	mu    sync.Mutex
	count map[string]int
}

// PartitionsMessage is the relays' warning when a topic's partition count
// grew under them.
const PartitionsMessage = "topic partition count changed while publishing: keys now map to other partitions, so a key's new events may be consumed before its earlier ones on the old partition (per-key order is not guaranteed across the change); see the runbook, \"Growing a topic\""

// Balance picks msg's partition with murmur2 and reports a grown partition
// count once per change. Only growth is reported: topics never shrink, and
// a writer still holding older metadata than another may hand a smaller
// count after a larger one, which is no change of the topic.
func (g *Guard) Balance(msg kafka.Message, partitions ...int) int {
	if g.Changed != nil {
		g.mu.Lock()
		was, seen := g.count[msg.Topic]
		grew := seen && len(partitions) > was
		if !seen || grew {
			if g.count == nil {
				g.count = map[string]int{}
			}
			g.count[msg.Topic] = len(partitions)
		}
		g.mu.Unlock()
		if grew {
			g.Changed(msg.Topic, was, len(partitions))
		}
	}
	return kafka.Murmur2Balancer{}.Balance(msg, partitions...)
}
