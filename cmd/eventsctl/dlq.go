package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/protoevents/protoevents/runtime/consumer"
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
Lists every message in the DLQ topic: where it failed (original topic,
partition, offset), its event ID and type, the attempts and the last error.
Reading commits nothing and moves no consumer's offsets.`)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := checkDLQFlags(*brokers, *topic); err != nil {
		return err
	}
	entries, err := consumer.ListDLQ(ctx, splitList(*brokers), *topic)
	if err != nil {
		return dlqError(*topic, err)
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
		}
		rows := make([]row, 0, len(entries))
		for _, e := range entries {
			rows = append(rows, row{e.Partition, e.Offset, e.EventID, e.EventType, e.Consumer, e.Attempts, e.Error,
				e.OriginalTopic, e.OriginalPartition, e.OriginalOffset, e.LastFailure})
		}
		enc := json.NewEncoder(env.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	if len(entries) == 0 {
		fmt.Fprintf(env.stdout, "%s is empty\n", *topic)
		return nil
	}
	w := tabwriter.NewWriter(env.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "PARTITION\tOFFSET\tEVENT ID\tTYPE\tCONSUMER\tATTEMPTS\tFROM\tERROR")
	for _, e := range entries {
		fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\t%d\t%s/%d@%d\t%s\n", e.Partition, e.Offset, e.EventID, e.EventType,
			e.Consumer, e.Attempts, e.OriginalTopic, e.OriginalPartition, e.OriginalOffset, oneLine(e.Error, 80))
	}
	return w.Flush()
}

func runDLQShow(ctx context.Context, env *cliEnv, args []string) error {
	fs, brokers, topic := dlqFlags(env, "show", "--topic T --offset N [flags]", `
Prints one DLQ message in full: every header (including the error with its
stack), the key and the envelope.`)
	partition := fs.Int("partition", 0, "DLQ partition of the message")
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
		return dlqError(*topic, err)
	}
	for _, e := range entries {
		if e.Partition != *partition || e.Offset != *offset {
			continue
		}
		fmt.Fprintf(env.stdout, "DLQ:       %s/%d@%d (written %s)\n", *topic, e.Partition, e.Offset, e.Time.UTC().Format(time.RFC3339))
		fmt.Fprintf(env.stdout, "from:      %s/%d@%d\n", e.OriginalTopic, e.OriginalPartition, e.OriginalOffset)
		fmt.Fprintf(env.stdout, "event:     %s %s\n", e.EventType, e.EventID)
		fmt.Fprintf(env.stdout, "key:       %q\n", e.Key)
		fmt.Fprintf(env.stdout, "consumer:  %s, %d attempts, %s .. %s\n", e.Consumer, e.Attempts,
			e.FirstFailure.UTC().Format(time.RFC3339), e.LastFailure.UTC().Format(time.RFC3339))
		fmt.Fprintf(env.stdout, "headers:\n")
		for _, h := range e.Message.Headers {
			fmt.Fprintf(env.stdout, "  %s: %s\n", h.Key, h.Value)
		}
		fmt.Fprintf(env.stdout, "value:\n%s\n", e.Message.Value)
		return nil
	}
	return fmt.Errorf("no message at %s partition %d offset %d (see eventsctl dlq list)", *topic, *partition, *offset)
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
		return dlqError(*topic, err)
	}
	if len(done) == 0 {
		if *offsets != "" {
			return fmt.Errorf("nothing at offset(s) %s of %s partition %d (see eventsctl dlq list; --partition picks the partition)", *offsets, *topic, *partition)
		}
		return fmt.Errorf("nothing selected in %s (see eventsctl dlq list)", *topic)
	}
	for _, e := range done {
		fmt.Fprintf(env.stdout, "redrove %s %s (DLQ %d@%d) to %s\n", e.EventType, e.EventID, e.Partition, e.Offset, e.OriginalTopic)
	}
	return nil
}
