package main

import (
	"context"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/eventstest/servers"
)

// TestTopicsFromLock: topics create --lock makes every event topic and its
// effective DLQ topic (a custom dlq_topic respected, shared DLQs once)
// with the asked settings; check then finds no drift, and reports the
// differences when the plan changes.
func TestTopicsFromLock(t *testing.T) {
	ctx := context.Background()
	k := servers.OwnKafka(t)
	env := map[string]string{"PROTOEVENTS_KAFKA_BROKERS": strings.Join(k.Brokers, ",")}
	const lock = "../../events.lock" // orders.v1.OrderCancelled has dlq_topic "orders.dead-letters"

	code, out, errOut := cli(t, env, "topics", "check", "--lock", lock)
	if code != exitCheckFailed || !hasRow(out, "orders.dead-letters", "missing", "-", "exists") || !strings.Contains(errOut, "eventsctl topics create") {
		t.Fatalf("check before create: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, env, "topics", "create", "--lock", lock, "--partitions", "3", "--config", "retention.ms=604800000")
	if code != 0 {
		t.Fatalf("create: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("eventsctl topics create --lock events.lock --partitions 3 --config retention.ms=604800000\n%s", out)
	for _, want := range []string{
		"dlq   orders.dead-letters: created (3 partitions, replication factor 1, retention.ms=604800000)",
		"topic orders.order-cancelled.v1: created (3 partitions",
		"dlq   orders.order-placed.v1.dlq: created",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("create output lacks %q", want)
		}
	}
	if strings.Contains(out, " orders.order-cancelled.v1.dlq:") {
		t.Errorf("created the default DLQ of an event whose schema names another:\n%s", out)
	}
	md, err := k.Client().Metadata(ctx, &kafka.MetadataRequest{Topics: []string{"orders.dead-letters"}})
	if err != nil || len(md.Topics) != 1 || md.Topics[0].Error != nil || len(md.Topics[0].Partitions) != 3 {
		t.Fatalf("orders.dead-letters on the broker: %+v, %v", md, err)
	}
	if code, out, errOut = cli(t, env, "topics", "check", "--lock", lock, "--partitions", "3", "--config", "retention.ms=604800000"); code != 0 || !strings.Contains(out, "topics match the plan") {
		t.Fatalf("check after create: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, env, "topics", "check", "--lock", lock, "--partitions", "6", "--config", "retention.ms=86400000")
	if code != exitCheckFailed || !hasRow(out, "orders.dead-letters", "partitions", "3", "6") ||
		!hasRow(out, "orders.dead-letters", "retention.ms", "604800000", "86400000") {
		t.Fatalf("check with another plan: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("eventsctl topics check --lock events.lock --partitions 6 --config retention.ms=86400000\n%s%s", out, errOut)
	code, out, errOut = cli(t, env, "topics", "create", "--lock", lock)
	if code != 0 || strings.Contains(out, ": created (") {
		t.Fatalf("create again: exit %d\n%s%s", code, out, errOut)
	}
}

// TestTopicsRefuseInvalidInput: bad names, counts and configs are usage
// errors, refused before any broker is contacted.
func TestTopicsRefuseInvalidInput(t *testing.T) {
	env := map[string]string{"PROTOEVENTS_KAFKA_BROKERS": "127.0.0.1:1"}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"topics", "create", "--topic", "bad topic"}, `topic name "bad topic" has ' '`},
		{[]string{"topics", "create", "--topic", ".."}, `topic name ".." is not allowed`},
		{[]string{"topics", "create", "--topic", strings.Repeat("t", 250)}, "Kafka allows 249"},
		{[]string{"topics", "create", "--topic", "orders", "--partitions", "0"}, "--partitions 0: a topic needs at least 1 partition"},
		{[]string{"topics", "create", "--topic", "orders", "--replication-factor", "0"}, "--replication-factor 0"},
		{[]string{"topics", "create", "--topic", "orders", "--config", "retention.ms"}, "is not key=value"},
		{[]string{"topics", "create", "--topic", "orders", "--config", "Retention MS=1"}, "is not a Kafka topic config"},
		{[]string{"topics", "create"}, "give one of --lock"},
		{[]string{"topics", "create", "--lock", "nope.lock"}, "--lock nope.lock does not exist"},
		{[]string{"topics", "drop"}, `unknown subcommand "drop"`},
	}
	for _, c := range cases {
		code, _, errOut := cli(t, env, c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("eventsctl %s: exit %d, %q; want exit 2 with %q", strings.Join(c.args, " "), code, errOut, c.want)
		}
	}
	// A broker that is not there: named, exit 3.
	code, _, errOut := cli(t, env, "topics", "create", "--topic", "orders")
	if code != exitUnreachable || !strings.Contains(errOut, "Kafka at 127.0.0.1:1") {
		t.Errorf("unreachable broker: exit %d, %q", code, errOut)
	}
	code, _, errOut = cli(t, env, "dlq", "list", "--topic", "orders.dlq")
	if code != exitUnreachable || !strings.Contains(errOut, "cannot reach Kafka at 127.0.0.1:1") {
		t.Errorf("dlq list, unreachable broker: exit %d, %q", code, errOut)
	}
}

// hasRow reports whether a line of the table out has exactly these
// whitespace-separated fields.
func hasRow(out string, fields ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		if strings.Join(strings.Fields(line), " ") == strings.Join(fields, " ") {
			return true
		}
	}
	return false
}
