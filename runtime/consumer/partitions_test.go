package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/segmentio/kafka-go"
)

// TestAddedPartitionsAreConsumed: partitions added to a consumed topic
// while the consumer runs are picked up (the generation's own partition
// watch rebalances the group), and their events applied.
func TestAddedPartitionsAreConsumed(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	c := b.newConsumer(t, "grow", b.handler("grow", nil), withPartitionWatch(50*time.Millisecond))
	r := start(t, c)
	defer r.stop()
	select {
	case <-c.Ready():
	case <-time.After(60 * time.Second):
		t.Fatal("not ready")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := b.kafka.Client().CreatePartitions(ctx, &kafka.CreatePartitionsRequest{
		Topics: []kafka.TopicPartitionsConfig{{Name: b.topic, Count: 3}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Errors[b.topic]; err != nil {
		t.Fatal(err)
	}
	// One event on each new partition, written there directly.
	for p := 1; p <= 2; p++ {
		w := &kafka.Writer{Addr: kafka.TCP(b.kafka.Brokers...), Topic: b.topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond,
			Balancer: kafka.BalancerFunc(func(kafka.Message, ...int) int { return p })}
		testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("partition %d writable", p), func() (bool, string) {
			err := w.WriteMessages(ctx, message(t, b.event(t, fmt.Sprint("new-", p), p), nil))
			return err == nil, fmt.Sprint(err)
		})
		w.Close()
	}
	testenv.WaitFor(t, 60*time.Second, "the events of the added partitions applied", func() (bool, string) {
		n := query(t, b.pool, `SELECT count(DISTINCT part) FROM effects WHERE part > 0`)
		return n == 2, fmt.Sprint(n, " new partitions applied")
	})
}
