// Package kafkawriter builds the kafka-go Writer both relays publish with,
// so the polling relay and the WAL relay send records the same way: one
// set of settings their guarantees rest on.
package kafkawriter

import (
	"crypto/tls"
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
}

// Transport returns the transport that carries a relay's TLS and SASL
// settings, or nil without them (kafka-go's default transport). A relay
// builds one per Run and shares it between its Writers.
func Transport(t *tls.Config, m sasl.Mechanism) *kafka.Transport {
	if t == nil && m == nil {
		return nil
	}
	return &kafka.Transport{TLS: t, SASL: m}
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
		Balancer:        kafka.Murmur2Balancer{},
		BatchTimeout:    time.Nanosecond,
		MaxAttempts:     c.MaxAttempts,
		WriteBackoffMin: 50 * time.Millisecond,
		WriteBackoffMax: 500 * time.Millisecond,
		WriteTimeout:    c.WriteTimeout,
		RequiredAcks:    kafka.RequireAll,
		BatchSize:       c.BatchSize,
		BatchBytes:      1 << 30, // never split a partition's share; the relay caps the batch itself
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
