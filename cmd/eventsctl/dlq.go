package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/oklog/ulid/v2"

	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/envelope"
)

func runDLQ(ctx context.Context, env *cliEnv, args []string) error {
	usage := `Usage: eventsctl dlq <list|show|redrive> [flags]

  list     list the messages of a DLQ topic with their errors
  show     print one DLQ message: headers, error and envelope
  redrive  republish DLQ messages to their original topic (event IDs kept,
           so consumers that already applied an event skip it)

Run "eventsctl dlq <subcommand> -h" for its flags.`
	if len(args) == 0 {
		fmt.Fprintln(env.stderr, usage)
		return fmt.Errorf("%w: missing subcommand", errUsage)
	}
	switch args[0] {
	case "list":
		return runDLQList(ctx, env, args[1:])
	case "show":
		return runDLQShow(ctx, env, args[1:])
	case "redrive":
		return runDLQRedrive(ctx, env, args[1:])
	case "-h", "--help", "help":
		fmt.Fprintln(env.stdout, usage)
		return flag.ErrHelp
	}
	fmt.Fprintln(env.stderr, usage)
	return fmt.Errorf("%w: unknown subcommand %q", errUsage, args[0])
}

// dlqFlags registers the flags every dlq subcommand shares.
func dlqFlags(env *cliEnv, name, usage, desc string) (fs *cmdFlags, brokers, topic *string) {
	fs = newFlags(env, "dlq "+name, usage, desc)
	brokers = brokersFlag(fs, env)
	topic = fs.String("topic", "", `DLQ topic, e.g. "shop.orders.order-placed.v1.dlq" (required)`)
	return fs, brokers, topic
}

// dlqError explains a missing DLQ topic in the CLI's terms.
func dlqError(topic string, err error) error {
	if errors.Is(err, consumer.ErrNoTopic) {
		return fmt.Errorf("DLQ topic %s does not exist: check --topic (the event's topic + \".dlq\" unless its schema sets dlq_topic); eventsctl topics create makes it", topic)
	}
	return err
}

// kafkaError names the brokers when they could not be reached (exit 3).
func kafkaError(brokers string, err error) error {
	if isNetworkFailure(err) {
		return unreachableError{fmt.Errorf("cannot reach Kafka at %s (check --brokers and that the brokers are up): %w", brokers, err)}
	}
	return err
}

func checkDLQFlags(brokers, topic string) error {
	if err := need(brokers, "brokers", "PROTOEVENTS_KAFKA_BROKERS"); err != nil {
		return err
	}
	if topic == "" {
		return fmt.Errorf("%w: --topic is required: the DLQ topic (the event's topic + \".dlq\" unless its schema sets dlq_topic)", errUsage)
	}
	return nil
}

func runDLQList(ctx context.Context, env *cliEnv, args []string) error {
	fs, brokers, topic := dlqFlags(env, "list", "--topic T [flags]", `
Lists the messages in the DLQ topic, oldest first: where each failed
(original topic, partition, offset), its event ID and type, the consumer,
the attempts and the last error, and whether its value was dropped for
being too large. A summary per consumer follows. Reading commits nothing
and moves no consumer's offsets.`)
	consumerName := fs.String("consumer", "", "only messages this consumer dead-lettered")
	since := fs.String("since", "", `only messages dead-lettered since then: a duration ("24h") or an RFC 3339 time`)
	limit := fs.Int("limit", 0, "at most this many messages, the most recent (0: all)")
	asJSON := fs.Bool("json", false, "print JSON (snake_case)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := checkDLQFlags(*brokers, *topic); err != nil {
		return err
	}
	if *limit < 0 {
		return fmt.Errorf("%w: --limit %d: want 0 (all) or more", errUsage, *limit)
	}
	var from time.Time
	if *since != "" {
		if d, err := time.ParseDuration(*since); err == nil && d > 0 {
			from = time.Now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339, *since); err == nil {
			from = t
		} else {
			return fmt.Errorf("%w: --since %q is neither a positive duration (24h) nor an RFC 3339 time (2026-12-01T00:00:00Z)", errUsage, *since)
		}
	}
	all, err := consumer.ListDLQ(ctx, splitList(*brokers), *topic)
	if err != nil {
		return kafkaError(*brokers, dlqError(*topic, err))
	}
	var entries []consumer.DLQEntry
	for _, e := range all {
		if *consumerName != "" && e.Consumer != *consumerName {
			continue
		}
		if !from.IsZero() && e.Time.Before(from) {
			continue
		}
		entries = append(entries, e)
	}
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].Time.Before(entries[j].Time) })
	if *limit > 0 && len(entries) > *limit {
		entries = entries[len(entries)-*limit:]
	}
	if *asJSON {
		type row struct {
			Partition         int       `json:"partition"`
			Offset            int64     `json:"offset"`
			EventID           string    `json:"event_id"`
			EventType         string    `json:"event_type"`
			Consumer          string    `json:"consumer"`
			Attempts          int       `json:"attempts"`
			Error             string    `json:"error"`
			OriginalTopic     string    `json:"original_topic"`
			OriginalPartition int       `json:"original_partition"`
			OriginalOffset    int64     `json:"original_offset"`
			LastFailure       time.Time `json:"last_failure"`
			DeadLetteredAt    time.Time `json:"dead_lettered_at"`
			ValueDropped      bool      `json:"value_dropped"`
			ValueDroppedBytes int       `json:"value_dropped_bytes,omitempty"`
		}
		rows := make([]row, 0, len(entries))
		for _, e := range entries {
			rows = append(rows, row{e.Partition, e.Offset, e.EventID, e.EventType, e.Consumer, e.Attempts, e.Error,
				e.OriginalTopic, e.OriginalPartition, e.OriginalOffset, e.LastFailure.UTC(), e.Time.UTC(), e.ValueDropped > 0, e.ValueDropped})
		}
		return writeJSON(env.stdout, rows)
	}
	if len(entries) == 0 {
		if len(all) > 0 {
			fmt.Fprintf(env.stdout, "no message of %s matches (%d in all)\n", *topic, len(all))
			return nil
		}
		fmt.Fprintf(env.stdout, "%s is empty\n", *topic)
		return nil
	}
	w := tabwriter.NewWriter(env.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "PARTITION\tOFFSET\tDEAD-LETTERED\tEVENT ID\tTYPE\tCONSUMER\tATTEMPTS\tFROM\tVALUE\tERROR")
	byConsumer := map[string]int{}
	dropped := 0
	for _, e := range entries {
		value := "kept"
		if e.ValueDropped > 0 {
			value = fmt.Sprintf("DROPPED (%d bytes)", e.ValueDropped)
			dropped++
		}
		name := e.Consumer
		if name == "" {
			name = "(unknown)"
		}
		byConsumer[name]++
		fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\t%s\t%d\t%s/%d@%d\t%s\t%s\n", e.Partition, e.Offset, e.Time.UTC().Format(time.RFC3339),
			e.EventID, e.EventType, e.Consumer, e.Attempts, e.OriginalTopic, e.OriginalPartition, e.OriginalOffset, value, oneLine(e.Error, 80))
	}
	w.Flush()
	names := make([]string, 0, len(byConsumer))
	for n := range byConsumer {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %d", n, byConsumer[n]))
	}
	fmt.Fprintf(env.stdout, "\n%d message(s) of %d in %s, %s .. %s; by consumer: %s\n", len(entries), len(all), *topic,
		entries[0].Time.UTC().Format(time.RFC3339), entries[len(entries)-1].Time.UTC().Format(time.RFC3339), strings.Join(parts, ", "))
	if dropped > 0 {
		fmt.Fprintf(env.stdout, "%d message(s) had their value DROPPED (too large for the DLQ): redrive cannot restore them; find the events by ID in the producer's outbox or logs\n", dropped)
	}
	return nil
}

func runDLQShow(ctx context.Context, env *cliEnv, args []string) error {
	fs, brokers, topic := dlqFlags(env, "show", "--topic T --offset N [--partition P] [flags]", `
Prints one DLQ message in full: every header (including the error with its
stack), the key and the envelope, decoded (a Protobuf payload is shown as
its bytes, since the DLQ does not carry its schema). Without --partition
the offset is looked up in every partition; if several have it, say which.`)
	partition := fs.Int("partition", -1, "DLQ partition of the message (default: the one partition that has --offset)")
	offset := fs.Int64("offset", -1, "DLQ offset of the message (required; see dlq list)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := checkDLQFlags(*brokers, *topic); err != nil {
		return err
	}
	if *offset < 0 {
		return fmt.Errorf("%w: --offset is required (see eventsctl dlq list)", errUsage)
	}
	entries, err := consumer.ListDLQ(ctx, splitList(*brokers), *topic)
	if err != nil {
		return kafkaError(*brokers, dlqError(*topic, err))
	}
	var match []consumer.DLQEntry
	for _, e := range entries {
		if e.Offset == *offset && (*partition < 0 || e.Partition == *partition) {
			match = append(match, e)
		}
	}
	switch {
	case len(match) == 0 && *partition >= 0:
		return fmt.Errorf("no message at %s partition %d offset %d (see eventsctl dlq list)", *topic, *partition, *offset)
	case len(match) == 0:
		return fmt.Errorf("no message at offset %d in any partition of %s (see eventsctl dlq list)", *offset, *topic)
	case len(match) > 1:
		var ps []string
		for _, e := range match {
			ps = append(ps, strconv.Itoa(e.Partition))
		}
		return fmt.Errorf("%w: partitions %s of %s all have offset %d: give --partition", errUsage, strings.Join(ps, ", "), *topic, *offset)
	}
	e := match[0]
	out := env.stdout
	fmt.Fprintf(out, "DLQ:       %s/%d@%d (written %s)\n", *topic, e.Partition, e.Offset, e.Time.UTC().Format(time.RFC3339))
	fmt.Fprintf(out, "from:      %s/%d@%d\n", e.OriginalTopic, e.OriginalPartition, e.OriginalOffset)
	fmt.Fprintf(out, "event:     %s %s\n", e.EventType, e.EventID)
	fmt.Fprintf(out, "key:       %s\n", readable(e.Key))
	fmt.Fprintf(out, "consumer:  %s, %d attempts, %s .. %s\n", e.Consumer, e.Attempts,
		e.FirstFailure.UTC().Format(time.RFC3339), e.LastFailure.UTC().Format(time.RFC3339))
	fmt.Fprintf(out, "headers:\n")
	for _, h := range e.Message.Headers {
		v := readable(h.Value)
		if utf8.Valid(h.Value) {
			v = strings.ReplaceAll(string(h.Value), "\n", "\n    ") // text as is, multi-line errors indented
		}
		fmt.Fprintf(out, "  %s: %s\n", h.Key, v)
	}
	if e.ValueDropped > 0 {
		fmt.Fprintf(out, "value:     DROPPED: the original value (%d bytes) was too large for the DLQ\n", e.ValueDropped)
		return nil
	}
	env2, derr := envelope.Decode(e.Message)
	if derr != nil {
		fmt.Fprintf(out, "value:     not a decodable envelope (%v), %d bytes:\n", derr, len(e.Message.Value))
		fmt.Fprint(out, dumpBytes(e.Message.Value))
		return nil
	}
	fmt.Fprintf(out, "envelope:  %s, %s v%d, produced by %q at %s\n", env2.Format, env2.Type, env2.SchemaVersion, env2.Producer, env2.OccurredAt.Format(time.RFC3339Nano))
	if env2.CorrelationID != "" || env2.CausationID != "" || env2.TraceParent != "" {
		fmt.Fprintf(out, "           correlation %q, causation %q, traceparent %q\n", env2.CorrelationID, env2.CausationID, env2.TraceParent)
	}
	if env2.Format == envelope.FormatJSON {
		fmt.Fprintf(out, "payload:\n%s\n", env2.Payload)
		return nil
	}
	fmt.Fprintf(out, "payload:   %d bytes of Protobuf %s (decode with its schema, e.g. buf convert):\n", len(env2.Payload), env2.Type)
	fmt.Fprint(out, dumpBytes(env2.Payload))
	return nil
}

// readable renders bytes as a quoted string when they are text, else as
// hex.
func readable(b []byte) string {
	if utf8.Valid(b) && !strings.ContainsFunc(string(b), func(r rune) bool { return r < 0x20 && r != '\t' }) {
		return strconv.Quote(string(b))
	}
	return "0x" + hex.EncodeToString(b)
}

// maxDump bounds a hex dump.
const maxDump = 1024

// dumpBytes renders bytes as a hex dump (text as is), at most maxDump
// bytes of it.
func dumpBytes(b []byte) string {
	if utf8.Valid(b) && !strings.ContainsFunc(string(b), func(r rune) bool { return r < 0x20 && r != '\t' && r != '\n' && r != '\r' }) {
		return string(b) + "\n"
	}
	if len(b) > maxDump {
		return hex.Dump(b[:maxDump]) + fmt.Sprintf("... %d more bytes\n", len(b)-maxDump)
	}
	return hex.Dump(b)
}

func runDLQRedrive(ctx context.Context, env *cliEnv, args []string) error {
	fs, brokers, topic := dlqFlags(env, "redrive", "--topic T (--offset N,... | --event-id ID,... | --all) [flags]", `
Republishes DLQ messages to the topic they failed on, with their original
key, value and headers (the event ID is kept, so a consumer that already
applied the event skips it). Fix the cause first: a message that fails
again returns to the DLQ after its retries. The DLQ itself is not modified.`)
	partition := fs.Int("partition", 0, "DLQ partition of --offset")
	offsets := fs.String("offset", "", "comma-separated DLQ offsets to redrive")
	ids := fs.String("event-id", "", "comma-separated event IDs to redrive")
	all := fs.Bool("all", false, "redrive every message in the DLQ")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := checkDLQFlags(*brokers, *topic); err != nil {
		return err
	}
	chosen := 0
	for _, set := range []bool{*offsets != "", *ids != "", *all} {
		if set {
			chosen++
		}
	}
	if chosen != 1 {
		return fmt.Errorf("%w: choose exactly one of --offset, --event-id or --all", errUsage)
	}
	var sel consumer.Selector
	switch {
	case *all:
		sel = consumer.SelectAll()
	case *ids != "":
		for _, id := range splitList(*ids) {
			if _, err := ulid.ParseStrict(id); err != nil {
				return fmt.Errorf("%w: --event-id %q is not a valid event ID (a 26-character ULID such as 01JDQ2X7Y4Z8KQ3B6M9T5V0W1R; see eventsctl dlq list)", errUsage, id)
			}
		}
		sel = consumer.SelectEventIDs(splitList(*ids)...)
	default:
		offs, err := parseOffsets(*offsets)
		if err != nil {
			return err
		}
		sel = consumer.SelectOffsets(*partition, offs...)
	}
	done, err := consumer.Redrive(ctx, splitList(*brokers), *topic, sel)
	if err != nil {
		return kafkaError(*brokers, dlqError(*topic, err))
	}
	if len(done) == 0 {
		if *offsets != "" {
			return fmt.Errorf("nothing at offset(s) %s of %s partition %d (see eventsctl dlq list; --partition picks the partition)", *offsets, *topic, *partition)
		}
		if *ids != "" {
			return fmt.Errorf("no message with event ID %s in %s (see eventsctl dlq list)", *ids, *topic)
		}
		return fmt.Errorf("%s is empty: nothing to redrive", *topic)
	}
	for _, e := range done {
		fmt.Fprintf(env.stdout, "redrove %s %s (DLQ %d@%d) to %s\n", e.EventType, e.EventID, e.Partition, e.Offset, e.OriginalTopic)
	}
	return nil
}
