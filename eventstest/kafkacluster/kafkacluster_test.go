package kafkacluster

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// TestRoundTripOverTCP produces and consumes through kafka-go, the client the
// runtime uses, to prove the cluster speaks the wire protocol it needs:
// topic creation, keyed produce with acks=all, and group consumption with
// offset commits.
func TestRoundTripOverTCP(t *testing.T) {
	c, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	topic := "kafkacluster-roundtrip-" + time.Now().Format("150405.000000")
	if err := c.CreateTopics(ctx, 3, topic); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateTopics(ctx, 3, topic); err != nil {
		t.Fatalf("creating an existing topic must be a no-op: %v", err)
	}
	w := &kafka.Writer{Addr: kafka.TCP(c.Brokers...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	const n = 50
	var msgs []kafka.Message
	for i := 0; i < n; i++ {
		msgs = append(msgs, kafka.Message{Key: []byte{byte('a' + i%5)}, Value: []byte{byte(i)}})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: c.Brokers, GroupID: topic, Topic: topic, MaxWait: 50 * time.Millisecond, StartOffset: kafka.FirstOffset})
	defer r.Close()
	lastByKey := map[string]int{}
	for i := 0; i < n; i++ {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		v := int(m.Value[0])
		if prev, ok := lastByKey[string(m.Key)]; ok && prev > v {
			t.Fatalf("key %s: %d after %d", m.Key, v, prev)
		}
		lastByKey[string(m.Key)] = v
		if err := r.CommitMessages(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if len(lastByKey) != 5 {
		t.Fatalf("saw %d keys, want 5", len(lastByKey))
	}
}
