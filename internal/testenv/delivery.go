package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
)

// The delivery checks both relays' tests share: read a topic back over
// the Kafka protocol and check per-key order, loss and duplicates.

// Delivered is one message read back from Kafka.
type Delivered struct {
	Partition int
	Offset    int64
	Key       string
	Seq       int
	ID        events.EventID
}

// ReadTopic reads every message of topic (partitions 0..parts-1), each in
// log order. It fetches with plain Fetch requests from offset 0 to the end
// offset, so it waits only on the broker's answers; the deadline bounds a
// hang, generously, for loaded machines.
func ReadTopic(t testing.TB, brokers []string, topic string, parts int) [][]Delivered {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: time.Minute}
	out := make([][]Delivered, parts)
	var wg sync.WaitGroup
	errs := make(chan error, parts)
	for _, po := range lastOffsets(ctx, t, cl, topic, parts) {
		if po.LastOffset == 0 {
			continue
		}
		wg.Add(1)
		go func(p int, end int64) {
			defer wg.Done()
			msgs, err := FetchPartition(ctx, cl, topic, p, end)
			if err != nil {
				errs <- fmt.Errorf("partition %d: %w", p, err)
				return
			}
			for _, m := range msgs {
				env, err := envelope.Decode(m)
				if err != nil {
					errs <- fmt.Errorf("partition %d offset %d: %w", p, m.Offset, err)
					return
				}
				var s structpb.Struct
				if err := env.UnmarshalPayload(&s); err != nil {
					errs <- err
					return
				}
				if got := s.Fields["key"].GetStringValue(); got != string(m.Key) {
					errs <- fmt.Errorf("message key %q but payload key %q", m.Key, got)
					return
				}
				out[p] = append(out[p], Delivered{Partition: p, Offset: m.Offset, Key: string(m.Key), Seq: int(s.Fields["seq"].GetNumberValue()), ID: env.EventID})
			}
		}(po.Partition, po.LastOffset)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return out
}

// FetchPartition returns the messages of a partition from offset 0 up to
// end, in log order, retrying failed fetches until ctx ends.
func FetchPartition(ctx context.Context, cl *kafka.Client, topic string, p int, end int64) ([]kafka.Message, error) {
	var msgs []kafka.Message
	offset := int64(0)
	for offset < end {
		resp, err := cl.Fetch(ctx, &kafka.FetchRequest{Topic: topic, Partition: p, Offset: offset, MinBytes: 1, MaxBytes: 8 << 20, MaxWait: 100 * time.Millisecond})
		if err == nil && resp.Error != nil {
			err = resp.Error
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("fetch at offset %d of %d: %w", offset, end, err)
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		for {
			rec, err := resp.Records.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("read record at offset %d: %w", offset, err)
			}
			if rec.Offset < offset {
				continue
			}
			key, err := kafka.ReadAll(rec.Key)
			if err != nil {
				return nil, err
			}
			value, err := kafka.ReadAll(rec.Value)
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, kafka.Message{Topic: topic, Partition: p, Offset: rec.Offset, Key: key, Value: value, Headers: rec.Headers})
			offset = rec.Offset + 1
		}
	}
	return msgs, nil
}

// CheckDelivery asserts that what Kafka holds is exactly the events of want
// (count per key), each key on one partition, in per-key order once
// duplicates (same event ID, re-sent after a failure) are dropped the way a
// consumer's dedup table would. It returns the number of duplicates.
func CheckDelivery(t testing.TB, parts [][]Delivered, want map[string]int) int {
	t.Helper()
	next := map[string]int{}
	partOf := map[string]int{}
	seen := map[events.EventID]Delivered{}
	dups := 0
	for _, msgs := range parts {
		for _, m := range msgs {
			if p, ok := partOf[m.Key]; ok && p != m.Partition {
				t.Fatalf("key %s on partitions %d and %d", m.Key, p, m.Partition)
			}
			partOf[m.Key] = m.Partition
			if first, ok := seen[m.ID]; ok {
				if first.Key != m.Key || first.Seq != m.Seq {
					t.Fatalf("event %s delivered as %s/%d and %s/%d", m.ID, first.Key, first.Seq, m.Key, m.Seq)
				}
				dups++
				continue
			}
			seen[m.ID] = m
			if m.Seq != next[m.Key] {
				t.Fatalf("key %s: got seq %d at partition %d offset %d, want %d (order broken or event lost)", m.Key, m.Seq, m.Partition, m.Offset, next[m.Key])
			}
			next[m.Key]++
		}
	}
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if next[k] != want[k] {
			t.Errorf("key %s: %d events delivered, want %d", k, next[k], want[k])
		}
	}
	for k := range next {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected key %s delivered (%d events)", k, next[k])
		}
	}
	return dups
}

// CountRecords counts the records of topic's partitions (0..parts-1).
func CountRecords(t testing.TB, brokers []string, topic string, parts int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := 0
	for _, po := range lastOffsets(ctx, t, &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: time.Minute}, topic, parts) {
		n += int(po.LastOffset)
	}
	return n
}

// lastOffsets returns the end offsets of topic's partitions 0..parts-1.
func lastOffsets(ctx context.Context, t testing.TB, cl *kafka.Client, topic string, parts int) []kafka.PartitionOffsets {
	t.Helper()
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for p := range parts {
		req.Topics[topic] = append(req.Topics[topic], kafka.LastOffsetOf(p))
	}
	resp, err := cl.ListOffsets(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for _, po := range resp.Topics[topic] {
		if po.Error != nil {
			t.Fatal(po.Error)
		}
	}
	return resp.Topics[topic]
}
