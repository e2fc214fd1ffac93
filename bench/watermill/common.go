package main

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/protoevents/protoevents/eventstest/kafkacluster"
)

// partitions of every topic the benchmark creates.
const partitions = 6

func createTopics(ctx context.Context, brokers []string, topics ...string) error {
	return kafkacluster.CreateTopics(ctx, brokers, partitions, topics...)
}

// produce writes records with acks=all and waits for every one.
func produce(ctx context.Context, brokers []string, recs []*kgo.Record) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(0))
	if err != nil {
		return err
	}
	defer cl.Close()
	for i := 0; i < len(recs); i += 1000 {
		if err := cl.ProduceSync(ctx, recs[i:min(i+1000, len(recs))]...).FirstErr(); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
	}
	return nil
}

// waitFor polls cond until it holds, ctx ends or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not done after %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

// percentile of sorted durations, in milliseconds.
func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p)
	return float64(sorted[i]) / float64(time.Millisecond)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func sortDurations(d []time.Duration) { sort.Slice(d, func(i, j int) bool { return d[i] < d[j] }) }

// topicRecords sums the high watermarks of topic's partitions: how many
// records reached the broker, to check that a drain really delivered.
func topicRecords(ctx context.Context, brokers []string, topic string) (int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := range int32(partitions) {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p, -1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	shards := cl.RequestSharded(ctx, req)
	var total int64
	for _, sh := range shards {
		if sh.Err != nil {
			return 0, sh.Err
		}
		for _, t := range sh.Resp.(*kmsg.ListOffsetsResponse).Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					return 0, err
				}
				total += p.Offset
			}
		}
	}
	return total, nil
}

func minMax(v []float64) (lo, hi float64) {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[0], s[len(s)-1]
}

// runUntilStopped runs run in the background until the returned stop
// cancels its context; stop returns what run returned.
func runUntilStopped(run func(context.Context) error) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	return func() error { cancel(); return <-done }
}
