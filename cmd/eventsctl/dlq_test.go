package main

import (
	"context"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
)

// TestDLQShowFindsPartitionAndDecodesProto: dlq show without --partition
// finds the one partition holding the offset (and asks for --partition
// when several do), and shows a Protobuf envelope decoded, its payload as
// a hex dump, not as raw bytes.
func TestDLQShowFindsPartitionAndDecodesProto(t *testing.T) {
	ctx := context.Background()
	k := servers.OwnKafka(t)
	const topic = "shop.orders.order-placed.v1.dlq"
	if err := k.CreateTopics(ctx, 3, topic); err != nil {
		t.Fatal(err)
	}
	d := testenv.Descriptor("shop.orders.order-placed.v1")
	env, err := envelope.New(testenv.NewEvent(d, "order-7", 0), events.ApplyPublishOptions(nil), envelope.Options{Format: envelope.FormatProto})
	if err != nil {
		t.Fatal(err)
	}
	value, headers, err := env.Encode()
	if err != nil {
		t.Fatal(err)
	}
	headers = append(headers, kafka.Header{Key: consumer.HeaderDLQError, Value: []byte("no carrier serves country \"ZZ\"\nstack line")},
		kafka.Header{Key: consumer.HeaderDLQConsumer, Value: []byte("shipping")})
	// RequireAll: kafka-go's default (RequireNone) returns before the
	// broker appended the records, and the listing below raced them.
	w := &kafka.Writer{Addr: kafka.TCP(k.Brokers...), RequiredAcks: kafka.RequireAll, Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int {
		return int(m.Key[0] - '0')
	})}
	defer w.Close()
	if err := w.WriteMessages(ctx,
		kafka.Message{Topic: topic, Key: []byte("1"), Value: value, Headers: headers},
		kafka.Message{Topic: topic, Key: []byte("2"), Value: []byte("not an envelope")},
		kafka.Message{Topic: topic, Key: []byte("0"), Headers: []kafka.Header{
			{Key: consumer.HeaderDLQValueDropped, Value: []byte("2000000")},
			{Key: consumer.HeaderDLQConsumer, Value: []byte("billing")},
			{Key: envelope.HeaderID, Value: []byte("01JDQ2X7Y4Z8KQ3B6M9T5V0W1R")},
		}},
	); err != nil {
		t.Fatal(err)
	}
	envs := map[string]string{"PROTOEVENTS_KAFKA_BROKERS": strings.Join(k.Brokers, ",")}
	code, out, errOut := cli(t, envs, "dlq", "list", "--topic", topic)
	if code != 0 || !strings.Contains(out, "DROPPED (2000000 bytes)") || !strings.Contains(out, "3 message(s) of 3 in "+topic) ||
		!strings.Contains(out, "by consumer: (unknown) 1, billing 1, shipping 1") || !strings.Contains(out, "1 message(s) had their value DROPPED") {
		t.Fatalf("dlq list: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut = cli(t, envs, "dlq", "list", "--topic", topic, "--json", "--consumer", "billing"); code != 0 ||
		!strings.Contains(out, `"value_dropped": true`) || !strings.Contains(out, `"value_dropped_bytes": 2000000`) || strings.Contains(out, "shipping") {
		t.Fatalf("dlq list --json --consumer billing: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, envs, "dlq", "show", "--topic", topic, "--offset", "0")
	if code != exitUsage || !strings.Contains(errOut, "partitions 0, 1, 2 of "+topic+" all have offset 0: give --partition") {
		t.Fatalf("show with the offset in two partitions: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, envs, "dlq", "show", "--topic", topic, "--offset", "0", "--partition", "1")
	if code != 0 || !strings.Contains(out, "envelope:  proto, google.protobuf.Struct v1") || !strings.Contains(out, "payload:   ") ||
		!strings.Contains(out, "00000000  ") || !strings.Contains(out, "dlq_error: no carrier serves country \"ZZ\"\n    stack line") ||
		!strings.Contains(out, "event:     google.protobuf.Struct "+env.EventID.String()) {
		t.Fatalf("show of a Protobuf envelope: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("eventsctl dlq show --partition 1 --offset 0\n%s", out)
	code, out, errOut = cli(t, envs, "dlq", "show", "--topic", topic, "--offset", "0", "--partition", "2")
	if code != 0 || !strings.Contains(out, "value:     not a decodable envelope") || !strings.Contains(out, "not an envelope\n") {
		t.Fatalf("show of a non-envelope: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, envs, "dlq", "show", "--topic", topic, "--offset", "0", "--partition", "0")
	if code != 0 || !strings.Contains(out, "value:     DROPPED: the original value (2000000 bytes) was too large for the DLQ") {
		t.Fatalf("show of a dropped value: exit %d\n%s%s", code, out, errOut)
	}
}
