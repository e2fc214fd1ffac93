package apachekafka_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/eventstest/apachekafka"
)

// start runs a cluster for the test, in the real tier only.
func start(t *testing.T, nodes int) *apachekafka.Cluster {
	t.Helper()
	if os.Getenv("PROTOEVENTS_TEST_KAFKA") != "apache" {
		t.Skip("a real Apache Kafka test: run it with PROTOEVENTS_TEST_KAFKA=apache (make test-kafka)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	began := time.Now()
	c, err := apachekafka.Start(ctx, apachekafka.Config{Nodes: nodes})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Apache Kafka %s, %d node(s), ready in %v", c.Version, nodes, time.Since(began).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.Logs(60))
		}
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// roundTrip writes n keyed messages with acks=all to a new topic of rf
// replicas and reads them back.
func roundTrip(t *testing.T, brokers []string, topic string, rf, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	for {
		// Right after a node died the metadata may still name it: retry.
		res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 3, ReplicationFactor: rf}}})
		if err == nil {
			err = res.Errors[topic]
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("create %s: %v", topic, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, MaxAttempts: 20}
	defer w.Close()
	var msgs []kafka.Message
	for i := range n {
		msgs = append(msgs, kafka.Message{Key: []byte(fmt.Sprint("k", i%7)), Value: []byte(fmt.Sprint(i))})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: topic, Topic: topic, MaxWait: 50 * time.Millisecond, StartOffset: kafka.FirstOffset})
	defer r.Close()
	seen := map[string]bool{}
	for len(seen) < n {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read %d of %d: %v", len(seen), n, err)
		}
		seen[string(m.Value)] = true
	}
}

// TestSingleNode starts one combined node, round-trips messages, kills it
// with SIGKILL and starts it again on the same port and data: a message
// acknowledged before the kill is read back after it.
func TestSingleNode(t *testing.T) {
	c := start(t, 1)
	if len(c.Brokers()) != 1 || !strings.HasPrefix(c.Brokers()[0], "127.0.0.1:") {
		t.Fatalf("brokers %v, want one on loopback", c.Brokers())
	}
	roundTrip(t, c.Brokers(), "single", 1, 50)
	t.Log("round trip done")
	n := c.Node(1)
	if err := n.Kill(); err != nil {
		t.Fatal(err)
	}
	if n.Running() {
		t.Fatal("node still running after Kill")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: c.Brokers(), Topic: "single", Partition: 0, MaxWait: 50 * time.Millisecond})
	defer r.Close()
	t.Log("restarted")
	if _, err := r.ReadMessage(ctx); err != nil {
		t.Fatalf("after restart: %v", err)
	}
	t.Log("read after restart")
}

// TestThreeNodes starts three nodes and shows the durability settings hold:
// with one node killed, acks=all writes still succeed (two in sync); with
// two of three down, an acks=all write is not accepted on the one left (it
// is refused or times out: the controller quorum is lost too).
func TestThreeNodes(t *testing.T) {
	c := start(t, 3)
	roundTrip(t, c.Brokers(), "three", 3, 30)
	if err := c.Node(2).Kill(); err != nil {
		t.Fatal(err)
	}
	// The topic made before the kill: acks=all still succeeds with two of
	// its three replicas in sync.
	ctx0, cancel0 := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel0()
	w0 := &kafka.Writer{Addr: kafka.TCP(c.Brokers()...), Topic: "three", Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, MaxAttempts: 20}
	defer w0.Close()
	if err := w0.WriteMessages(ctx0, kafka.Message{Key: []byte("after"), Value: []byte("kill")}); err != nil {
		t.Fatalf("acks=all write with one node of three killed: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Node(3).Stop(ctx); err != nil {
		t.Fatal(err)
	}
	w := &kafka.Writer{Addr: kafka.TCP(c.Brokers()[0]), Topic: "three", RequiredAcks: kafka.RequireAll, MaxAttempts: 1, BatchTimeout: time.Millisecond}
	defer w.Close()
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if err := w.WriteMessages(wctx, kafka.Message{Partition: 0, Value: []byte("x")}); err == nil {
		t.Fatal("an acks=all write with one of three nodes up was accepted")
	}
	for _, id := range []int{2, 3} {
		if err := c.Node(id).Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
}
