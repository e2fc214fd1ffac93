package kafkawriter

import (
	"fmt"
	"testing"

	"github.com/segmentio/kafka-go"
)

// TestGuardPartitionsLikeMurmur2AndReportsChanges: the guard picks the
// partition the Java client's murmur2 would, and reports a topic's
// partition count growth once per change, per topic, never the first
// sighting nor a writer's older, smaller count.
func TestGuardPartitionsLikeMurmur2AndReportsChanges(t *testing.T) {
	var changes []string
	g := &Guard{Changed: func(topic string, was, now int) {
		changes = append(changes, fmt.Sprintf("%s:%d→%d", topic, was, now))
	}}
	three, six := []int{0, 1, 2}, []int{0, 1, 2, 3, 4, 5}
	for i := range 100 {
		m := kafka.Message{Topic: "a", Key: []byte(fmt.Sprint("k", i))}
		if got, want := g.Balance(m, three...), (kafka.Murmur2Balancer{}).Balance(m, three...); got != want {
			t.Fatalf("key %s: partition %d, murmur2 says %d", m.Key, got, want)
		}
	}
	g.Balance(kafka.Message{Topic: "b", Key: []byte("x")}, three...)
	if len(changes) != 0 {
		t.Fatalf("changes %v on first sight", changes)
	}
	g.Balance(kafka.Message{Topic: "a", Key: []byte("x")}, six...)
	g.Balance(kafka.Message{Topic: "a", Key: []byte("y")}, three...) // a writer with older metadata
	g.Balance(kafka.Message{Topic: "a", Key: []byte("y")}, six...)
	g.Balance(kafka.Message{Topic: "b", Key: []byte("x")}, three...)
	if len(changes) != 1 || changes[0] != "a:3→6" {
		t.Fatalf("changes %v, want one: a:3→6", changes)
	}
	// A writer with no guard of its own still partitions with murmur2.
	if _, ok := New(Config{Brokers: []string{"b:1"}}).Balancer.(*Guard); !ok {
		t.Fatal("default balancer is not a Guard")
	}
}
