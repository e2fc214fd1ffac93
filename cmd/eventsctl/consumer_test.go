package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
)

// TestConsumerStatusAndReset is the operator's path through a replay: the
// status of a running consumer (members, assignments, lag 0), a reset
// refused while it runs (exit 4, naming the member and the fix), the lag
// and its alert once it stopped and new events came, a dry run, and the
// reset to the start.
func TestConsumerStatusAndReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := servers.DB(t)
	k := servers.OwnKafka(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	const topic = "billing.invoice-due.v1"
	d := testenv.Descriptor(topic)
	if err := k.CreateTopics(ctx, 2, topic, d.DLQTopic); err != nil {
		t.Fatal(err)
	}
	if err := consumer.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	produce := func(from, n int) {
		t.Helper()
		var msgs []kafka.Message
		for i := from; i < from+n; i++ {
			env, err := envelope.New(testenv.NewEvent(d, fmt.Sprintf("k%d", i%4), i), events.ApplyPublishOptions(nil), envelope.Options{})
			if err != nil {
				t.Fatal(err)
			}
			value, headers, err := env.Encode()
			if err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, kafka.Message{Key: env.Key, Value: value, Headers: headers})
		}
		w := &kafka.Writer{Addr: kafka.TCP(k.Brokers...), Topic: topic, Balancer: &kafka.Hash{}, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
		defer w.Close()
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	produce(0, 10)
	c, err := consumer.New(pool, k.Brokers, "billing",
		consumer.WithGroupTimeouts(100*time.Millisecond, time.Second, 2*time.Second), consumer.WithCommitInterval(0),
		consumer.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	if err := consumer.Handle(c, d, func(context.Context, pgx.Tx, events.Meta, testenv.Event) error { return nil }); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	stopped := false
	stopConsumer := func() {
		if !stopped {
			stopped = true
			stop()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}
	defer stopConsumer()

	env := map[string]string{"PROTOEVENTS_KAFKA_BROKERS": strings.Join(k.Brokers, ",")}
	status := func(wantCode int, args ...string) groupStatusJSON {
		t.Helper()
		code, out, errOut := cli(t, env, append([]string{"consumer", "status", "--group", "billing", "--json"}, args...)...)
		var st groupStatusJSON
		if code != wantCode || json.Unmarshal([]byte(out), &st) != nil {
			t.Fatalf("consumer status --json %s: exit %d, want %d\n%s%s", strings.Join(args, " "), code, wantCode, out, errOut)
		}
		return st
	}
	var st groupStatusJSON
	for deadline := time.Now().Add(30 * time.Second); ; {
		st = status(0)
		if len(st.Members) == 1 && len(st.Partitions) == 2 && st.Lag == 0 && st.Partitions[0].CommittedOffset != nil && st.Partitions[1].CommittedOffset != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the consumer did not catch up: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	member := st.Members[0]
	if len(member.Assignments[topic]) != 2 || st.State != "Stable" || st.Partitions[0].Member != member.ID {
		t.Fatalf("status of the running consumer: %+v", st)
	}
	code, out, errOut := cli(t, env, "consumer", "status", "--group", "billing")
	if code != 0 || !hasRow(out, "members", "1") || !hasRow(out, "lag", "0") || !strings.Contains(out, member.ID) ||
		!strings.Contains(out, topic+"[0,1]") || !strings.Contains(out, "HIGH WATERMARK") {
		t.Fatalf("consumer status: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("eventsctl consumer status --group billing (running)\n%s", out)
	if !hasRow(out, topic, "168h0m0s", "168h0m0s", "delete", "-") {
		t.Fatalf("consumer status does not show the topic's retention:\n%s", out)
	}
	// Dedup rows kept an hour against a topic that keeps a week: a replay
	// would apply events again.
	if st := status(exitCheckFailed, "--dedup-retention", "1h"); len(st.Topics) != 1 || st.Topics[0].RetentionSeconds != 7*24*3600 ||
		st.Topics[0].CleanupPolicy != "delete" || st.DedupRetentionSeconds == nil || *st.DedupRetentionSeconds != 3600 {
		t.Fatalf("status --dedup-retention 1h: %+v", st)
	}
	code, out, errOut = cli(t, env, "consumer", "status", "--group", "billing", "--dedup-retention", "1h")
	if code != exitCheckFailed || !strings.Contains(errOut, "topic "+topic+" keeps messages 168h0m0s, longer than --dedup-retention 1h0m0s") ||
		!strings.Contains(out, "too short, a replay would apply events again") {
		t.Fatalf("status --dedup-retention 1h: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := cli(t, env, "consumer", "status", "--group", "billing", "--dedup-retention", "336h"); code != 0 || !strings.Contains(out, "covers it") {
		t.Fatalf("status --dedup-retention 336h: exit %d\n%s%s", code, out, errOut)
	}

	code, out, errOut = cli(t, env, "consumer", "reset", "--group", "billing", "--to-earliest")
	if code != exitFailed || !strings.Contains(errOut, "refused") || !strings.Contains(errOut, member.ID) || !strings.Contains(errOut, "stop every consumer of the group") {
		t.Fatalf("reset of a live group: exit %d, want %d\n%s%s", code, exitFailed, out, errOut)
	}
	t.Logf("eventsctl consumer reset --group billing --to-earliest (running)\n%s", errOut)

	stopConsumer()
	produce(10, 3)
	st = status(exitCheckFailed, "--max-lag", "2")
	if len(st.Members) != 0 || st.Lag != 3 || st.State != "Empty" {
		t.Fatalf("status of the stopped group with 3 new events: %+v", st)
	}
	if st.OldestUnprocessedAgeSeconds < 0 {
		t.Fatalf("negative age: %+v", st)
	}
	for _, p := range st.Partitions {
		if (p.Lag > 0) != (p.OldestUnprocessedAt != nil) {
			t.Fatalf("partition %d: lag %d, oldest unprocessed at %v", p.Partition, p.Lag, p.OldestUnprocessedAt)
		}
	}
	if code, _, errOut := cli(t, env, "consumer", "status", "--group", "billing", "--max-lag", "2"); code != exitCheckFailed ||
		!strings.Contains(errOut, "lag 3 > --max-lag 2") || !strings.Contains(errOut, "no live member") {
		t.Fatalf("status --max-lag 2: exit %d, %q", code, errOut)
	}

	code, out, errOut = cli(t, env, "consumer", "reset", "--group", "billing", "--to-earliest", "--dry-run")
	if code != 0 || !strings.Contains(out, "dry run: group billing not changed") || !hasRow(out, "TOPIC", "PARTITION", "FROM", "TO") {
		t.Fatalf("reset --dry-run: exit %d\n%s%s", code, out, errOut)
	}
	if st := status(0); st.Lag != 3 {
		t.Fatalf("a dry run changed the lag to %d", st.Lag)
	}
	code, out, errOut = cli(t, env, "consumer", "reset", "--group", "billing", "--to-earliest", "--topic", topic)
	if code != 0 || !strings.Contains(out, "group billing reset to earliest in 2 partition(s)") {
		t.Fatalf("reset --to-earliest: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("eventsctl consumer reset --group billing --to-earliest\n%s", out)
	if st := status(0); st.Lag != 13 {
		t.Fatalf("lag %d after the reset to earliest, want 13", st.Lag)
	}
	code, out, errOut = cli(t, env, "consumer", "reset", "--group", "billing", "--to-offset", "1000", "--json")
	var moves []offsetResetJSON
	if code != 0 || json.Unmarshal([]byte(out), &moves) != nil || len(moves) != 2 || !moves[0].Clamped || moves[0].From == nil || *moves[0].From != 0 {
		t.Fatalf("reset --to-offset 1000 --json: exit %d\n%s%s", code, out, errOut)
	}
	if st := status(0); st.Lag != 0 {
		t.Fatalf("lag %d after the reset to the end, want 0", st.Lag)
	}
	code, out, errOut = cli(t, env, "consumer", "reset", "--group", "billing", "--to-time", time.Now().Add(-time.Hour).UTC().Format(time.RFC3339))
	if code != 0 || !strings.Contains(out, "reset to time ") {
		t.Fatalf("reset --to-time: exit %d\n%s%s", code, out, errOut)
	}
	if st := status(0); st.Lag != 13 {
		t.Fatalf("lag %d after the reset to an hour ago, want 13", st.Lag)
	}
	if code, _, errOut := cli(t, env, "consumer", "status", "--group", "billing", "--topic", "no.such.topic"); code != exitFailed || !strings.Contains(errOut, "no such topic") || !strings.Contains(errOut, "check --topic") {
		t.Fatalf("status of a missing topic: exit %d, %q", code, errOut)
	}
	if code, out, errOut := cli(t, env, "consumer", "status", "--group", "never-started"); code != 0 || !strings.Contains(out, "has no committed offsets and no members") {
		t.Fatalf("status of an unknown group: exit %d\n%s%s", code, out, errOut)
	}
}

// TestConsumerUsageErrors: the consumer commands' flag mistakes are usage
// errors (exit 2) naming the fix.
func TestConsumerUsageErrors(t *testing.T) {
	env := map[string]string{"PROTOEVENTS_KAFKA_BROKERS": "127.0.0.1:1"}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"consumer"}, "missing subcommand"},
		{[]string{"consumer", "rewind"}, `unknown subcommand "rewind"`},
		{[]string{"consumer", "status"}, "--group is required"},
		{[]string{"consumer", "reset", "--group", "g"}, "choose exactly one of --to-earliest, --to-time or --to-offset"},
		{[]string{"consumer", "reset", "--group", "g", "--to-earliest", "--to-offset", "3"}, "choose exactly one"},
		{[]string{"consumer", "reset", "--group", "g", "--to-time", "yesterday"}, `--to-time "yesterday" is not an RFC 3339 time`},
		{[]string{"consumer", "reset", "--group", "g", "--to-offset", "-5"}, "--to-offset -5: want 0 or more"},
		{[]string{"consumer", "status", "--group", "g", "--max-lag", "-1"}, "must not be negative"},
	}
	for _, c := range cases {
		code, _, errOut := cli(t, env, c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("eventsctl %s: exit %d, stderr %q; want exit 2 with %q", strings.Join(c.args, " "), code, errOut, c.want)
		}
	}
	for _, sub := range []string{"status", "reset"} {
		if code, out, _ := cli(t, nil, "consumer", sub, "-h"); code != 0 || !strings.Contains(out, "Usage: eventsctl consumer "+sub) {
			t.Errorf("consumer %s -h: exit %d\n%s", sub, code, out)
		}
	}
	if code, _, errOut := cli(t, env, "consumer", "status", "--group", "g"); code != exitUnreachable || !strings.Contains(errOut, "cannot reach Kafka at 127.0.0.1:1") {
		t.Errorf("status with an unreachable broker: exit %d, %q", code, errOut)
	}
}
