package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/protoevents/protoevents/runtime/consumer"
)

func runConsumer(ctx context.Context, env *cliEnv, args []string) error {
	usage := `Usage: eventsctl consumer <status|reset> [flags]

  status  a consumer group's members, assignments, committed offsets, lag
          and the age of its oldest unprocessed message, per partition
  reset   move a stopped group's offsets to the earliest message, a time or
          an offset, to replay events (refused while the group has members)

Run "eventsctl consumer <subcommand> -h" for its flags.`
	if len(args) == 0 {
		fmt.Fprintln(env.stderr, usage)
		return fmt.Errorf("%w: missing subcommand", errUsage)
	}
	switch args[0] {
	case "status":
		return runConsumerStatus(ctx, env, args[1:])
	case "reset":
		return runConsumerReset(ctx, env, args[1:])
	case "-h", "--help", "help":
		fmt.Fprintln(env.stdout, usage)
		return flag.ErrHelp
	}
	fmt.Fprintln(env.stderr, usage)
	return fmt.Errorf("%w: unknown subcommand %q", errUsage, args[0])
}

// listFlag is a flag that may be repeated and takes comma-separated values.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	*l = append(*l, splitList(v)...)
	return nil
}

// consumerFlags registers the flags both consumer subcommands share.
func consumerFlags(env *cliEnv, name, usage, desc string) (fs *cmdFlags, brokers, group *string, topics *listFlag) {
	fs = newFlags(env, "consumer "+name, usage, desc)
	brokers = brokersFlag(fs, env)
	group = fs.String("group", "", "consumer group ID: the consumer's WithGroupID, by default its name (required)")
	topics = &listFlag{}
	fs.Var(topics, "topic", "topic(s), comma-separated or repeated (default: the topics the group has committed offsets for or subscribes to)")
	return fs, brokers, group, topics
}

func checkConsumerFlags(brokers, group string) error {
	if err := need(brokers, "brokers", "PROTOEVENTS_KAFKA_BROKERS"); err != nil {
		return err
	}
	if strings.TrimSpace(group) == "" {
		return fmt.Errorf("%w: --group is required: the consumer group ID (the consumer's name unless its Config sets GroupID)", errUsage)
	}
	return nil
}

// groupError explains the runtime's group errors in the CLI's terms.
func groupError(brokers string, err error) error {
	if errors.Is(err, consumer.ErrNoTopic) {
		return fmt.Errorf("%w: check --topic (eventsctl topics check --lock events.lock lists the event topics)", err)
	}
	return kafkaError(brokers, err)
}

type memberJSON struct {
	ID          string           `json:"id"`
	ClientID    string           `json:"client_id"`
	Host        string           `json:"host"`
	Assignments map[string][]int `json:"assignments"`
}

type partitionStatusJSON struct {
	Topic                      string     `json:"topic"`
	Partition                  int        `json:"partition"`
	Member                     string     `json:"member,omitempty"`
	CommittedOffset            *int64     `json:"committed_offset"`
	LogStartOffset             int64      `json:"log_start_offset"`
	HighWatermark              int64      `json:"high_watermark"`
	Lag                        int64      `json:"lag"`
	OldestUnprocessedAt        *time.Time `json:"oldest_unprocessed_at,omitempty"`
	OldestUnprocessedAgeSecond float64    `json:"oldest_unprocessed_age_seconds"`
}

type groupStatusJSON struct {
	Group                       string                `json:"group"`
	State                       string                `json:"state"`
	Members                     []memberJSON          `json:"members"`
	Lag                         int64                 `json:"lag"`
	OldestUnprocessedAgeSeconds float64               `json:"oldest_unprocessed_age_seconds"`
	Partitions                  []partitionStatusJSON `json:"partitions"`
	Topics                      []topicRetentionJSON  `json:"topics"`
	DedupRetentionSeconds       *float64              `json:"dedup_retention_seconds,omitempty"`
}

// topicRetentionJSON is a topic's retention; -1 seconds means for ever.
type topicRetentionJSON struct {
	Topic            string  `json:"topic"`
	RetentionSeconds float64 `json:"retention_seconds"`
	SegmentSeconds   float64 `json:"segment_seconds"`
	CleanupPolicy    string  `json:"cleanup_policy"`
}

// retentionSeconds renders a retention for JSON, -1 for consumer.Forever.
func retentionSeconds(d time.Duration) float64 {
	if d == consumer.Forever {
		return -1
	}
	return d.Seconds()
}

func runConsumerStatus(ctx context.Context, env *cliEnv, args []string) error {
	fs, brokers, group, topics := consumerFlags(env, "status", "--group G [--topic T,...] [flags]", `
Reports a consumer group as the Kafka coordinator sees it: its state and
live members (ID, client ID, host) with the partitions each holds, and per
partition the committed offset, the high watermark, the lag and the age of
the oldest unprocessed message (the first one after the committed offset),
and per topic how long it keeps messages (retention.ms, segment.ms,
cleanup.policy). A partition without a committed offset shows "-" (the
consumer starts at the log start). It reads only: it joins no group and
commits nothing. Exits 1 when the lag or the oldest unprocessed age exceeds
--max-lag or --max-age (for alerts), or when a topic keeps messages longer
than --dedup-retention (how long dedup rows are kept: a replay from the
earliest offset would apply events again), 3 when Kafka cannot be reached.`)
	asJSON := fs.Bool("json", false, "print JSON (snake_case, durations in seconds)")
	maxLag := fs.Int64("max-lag", 0, "fail (exit 1) if the group's total lag exceeds this (0: never)")
	maxAge := fs.Duration("max-age", 0, "fail (exit 1) if the oldest unprocessed message is older than this (0: never)")
	dedup := fs.Duration("dedup-retention", 0, "how long the group's dedup rows are kept (WithPruning, eventsctl prune --older-than): fail (exit 1) if a topic keeps messages longer (0: not checked)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *dedup < 0 {
		return fmt.Errorf("%w: --dedup-retention must not be negative", errUsage)
	}
	if err := checkConsumerFlags(*brokers, *group); err != nil {
		return err
	}
	if *maxLag < 0 || *maxAge < 0 {
		return fmt.Errorf("%w: --max-lag and --max-age must not be negative", errUsage)
	}
	st, err := consumer.DescribeGroup(ctx, splitList(*brokers), *group, *topics)
	if err != nil {
		return groupError(*brokers, err)
	}
	rets, err := consumer.DescribeRetention(ctx, splitList(*brokers), statusTopics(st))
	if err != nil {
		if *dedup > 0 {
			return groupError(*brokers, err)
		}
		// The lag does not need it (a principal may lack DescribeConfigs):
		// say so and go on.
		fmt.Fprintf(env.stderr, "eventsctl consumer status: the topics' retention is not shown: %v\n", err)
		rets = nil
	}
	if *asJSON {
		out := groupStatusJSON{Group: st.Group, State: st.State, Members: []memberJSON{}, Lag: st.Lag(),
			OldestUnprocessedAgeSeconds: seconds(st.OldestUnprocessed()), Partitions: []partitionStatusJSON{}, Topics: []topicRetentionJSON{}}
		for _, r := range rets {
			out.Topics = append(out.Topics, topicRetentionJSON{r.Topic, retentionSeconds(r.Retention), retentionSeconds(r.Segment), r.Policy})
		}
		if *dedup > 0 {
			d := dedup.Seconds()
			out.DedupRetentionSeconds = &d
		}
		for _, m := range st.Members {
			out.Members = append(out.Members, memberJSON{m.ID, m.ClientID, m.Host, m.Assignments})
		}
		for _, p := range st.Partitions {
			pj := partitionStatusJSON{Topic: p.Topic, Partition: p.Partition, Member: p.Member, LogStartOffset: p.LogStart,
				HighWatermark: p.HighWatermark, Lag: p.Lag, OldestUnprocessedAgeSecond: seconds(p.OldestUnprocessedAge)}
			if p.Committed >= 0 {
				pj.CommittedOffset = &p.Committed
			}
			if !p.OldestUnprocessed.IsZero() {
				at := p.OldestUnprocessed.UTC()
				pj.OldestUnprocessedAt = &at
			}
			out.Partitions = append(out.Partitions, pj)
		}
		if err := writeJSON(env.stdout, out); err != nil {
			return err
		}
	} else {
		printGroupStatus(env, st)
		printRetention(env, rets, *dedup)
	}
	var failed []string
	if *maxLag > 0 && st.Lag() > *maxLag {
		failed = append(failed, fmt.Sprintf("lag %d > --max-lag %d", st.Lag(), *maxLag))
	}
	if age := st.OldestUnprocessed(); *maxAge > 0 && age > *maxAge {
		failed = append(failed, fmt.Sprintf("oldest unprocessed message is %s old (> --max-age %s)", age.Round(time.Second), *maxAge))
	}
	var short []string
	if *dedup > 0 && len(rets) == 0 {
		fmt.Fprintf(env.stderr, "eventsctl consumer status: group %s: --dedup-retention checked nothing: the group has no committed offsets; give --topic\n", st.Group)
	}
	if *dedup > 0 {
		for _, r := range rets {
			if r.Outlives(*dedup) {
				short = append(short, fmt.Sprintf("topic %s keeps messages %s", r.Topic, retentionText(r.Retention)))
			}
		}
	}
	if len(failed) > 0 {
		hint := "is the consumer running and keeping up? (its logs, and the members above)"
		if len(st.Members) == 0 {
			hint = "the group has no live member: start its consumers"
		}
		fmt.Fprintf(env.stderr, "eventsctl consumer status: group %s: %s: %s\n", st.Group, strings.Join(failed, ", "), hint)
	}
	if len(short) > 0 {
		fmt.Fprintf(env.stderr, "eventsctl consumer status: group %s: %s, longer than --dedup-retention %s: a replay from the earliest offset would apply events again; "+
			"keep dedup rows longer (WithPruning, eventsctl prune --older-than) or shorten the topics' retention.ms\n", st.Group, strings.Join(short, ", "), *dedup)
	}
	if len(failed) > 0 || len(short) > 0 {
		return exitError(exitCheckFailed)
	}
	return nil
}

// printGroupStatus prints the status as text: a summary, the members, and
// a table of partitions.
func printGroupStatus(env *cliEnv, st consumer.GroupStatus) {
	w := tabwriter.NewWriter(env.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "group\t%s\n", st.Group)
	fmt.Fprintf(w, "state\t%s\n", st.State)
	fmt.Fprintf(w, "members\t%d\n", len(st.Members))
	fmt.Fprintf(w, "lag\t%d\n", st.Lag())
	fmt.Fprintf(w, "oldest unprocessed\t%s\n", st.OldestUnprocessed().Round(time.Millisecond))
	w.Flush()
	if len(st.Members) > 0 {
		fmt.Fprintln(env.stdout)
		w = tabwriter.NewWriter(env.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "MEMBER\tCLIENT ID\tHOST\tASSIGNMENTS")
		for _, m := range st.Members {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", m.ID, m.ClientID, m.Host, assignments(m.Assignments))
		}
		w.Flush()
	}
	if len(st.Partitions) == 0 {
		fmt.Fprintf(env.stdout, "\ngroup %s has no committed offsets and no members: give --topic to see the lag of a group that has not started yet\n", st.Group)
		return
	}
	fmt.Fprintln(env.stdout)
	w = tabwriter.NewWriter(env.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "TOPIC\tPARTITION\tMEMBER\tCOMMITTED\tHIGH WATERMARK\tLAG\tOLDEST UNPROCESSED")
	unowned := 0
	for _, p := range st.Partitions {
		committed, member, oldest := "-", p.Member, "-"
		if p.Committed >= 0 {
			committed = strconv.FormatInt(p.Committed, 10)
		}
		if member == "" {
			member = "-"
			unowned++
		}
		if !p.OldestUnprocessed.IsZero() {
			oldest = fmt.Sprintf("%s (%s)", p.OldestUnprocessedAge.Round(time.Second), p.OldestUnprocessed.UTC().Format(time.RFC3339))
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%d\t%d\t%s\n", p.Topic, p.Partition, member, committed, p.HighWatermark, p.Lag, oldest)
	}
	w.Flush()
	if len(st.Members) > 0 && unowned > 0 {
		fmt.Fprintf(env.stdout, "\n%d partition(s) held by no member: the group is rebalancing, or its members do not subscribe to the topic\n", unowned)
	}
}

// statusTopics are the topics of a group status's partitions, sorted.
func statusTopics(st consumer.GroupStatus) []string {
	var ts []string
	for _, p := range st.Partitions {
		if !slices.Contains(ts, p.Topic) {
			ts = append(ts, p.Topic)
		}
	}
	slices.Sort(ts)
	return ts
}

// retentionText renders a topic's retention for people.
func retentionText(d time.Duration) string {
	if d == consumer.Forever {
		return "forever"
	}
	return d.String()
}

// printRetention prints how long each topic keeps messages, and how that
// compares with the dedup retention when one is given.
func printRetention(env *cliEnv, rets []consumer.TopicRetention, dedup time.Duration) {
	if len(rets) == 0 {
		return
	}
	fmt.Fprintln(env.stdout)
	w := tabwriter.NewWriter(env.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "TOPIC\tRETENTION\tSEGMENT\tCLEANUP POLICY\tDEDUP ROWS")
	for _, r := range rets {
		verdict := "-"
		switch {
		case dedup == 0:
		case r.Outlives(dedup):
			verdict = fmt.Sprintf("%s: too short, a replay would apply events again", dedup)
		case r.OutlivesBySegment(dedup):
			verdict = fmt.Sprintf("%s: covers retention.ms, not a quiet topic's last segment", dedup)
		default:
			verdict = fmt.Sprintf("%s: covers it", dedup)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", r.Topic, retentionText(r.Retention), retentionText(r.Segment), r.Policy, verdict)
	}
	w.Flush()
}

// assignments renders a member's assignments as "topic[0,1] other[2]".
func assignments(a map[string][]int) string {
	topics := make([]string, 0, len(a))
	for t := range a {
		topics = append(topics, t)
	}
	sort.Strings(topics)
	parts := make([]string, 0, len(topics))
	for _, t := range topics {
		ps := make([]string, 0, len(a[t]))
		for _, p := range a[t] {
			ps = append(ps, strconv.Itoa(p))
		}
		parts = append(parts, t+"["+strings.Join(ps, ",")+"]")
	}
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, " ")
}

type offsetResetJSON struct {
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	From      *int64 `json:"from_offset"`
	To        int64  `json:"to_offset"`
	Clamped   bool   `json:"clamped,omitempty"`
}

func runConsumerReset(ctx context.Context, env *cliEnv, args []string) error {
	fs, brokers, group, topics := consumerFlags(env, "reset", "--group G (--to-earliest | --to-time T | --to-offset N) [--topic T,...] [flags]", `
Moves a consumer group's committed offsets so that its consumers, when
started again, process the events from there on: a replay. Events the
consumer already applied are skipped by its dedup table (counted as
duplicates); to rebuild a read model from scratch, run the consumer under a
new name instead (see docs/runbook.md, "Consumer lag and replay").

Refused (exit 4) while the group has live members: stop every consumer of
the group first (a clean shutdown leaves the group at once; a killed one
is dropped after its session timeout). --to-offset is clamped to each
partition's retained range.`)
	earliest := fs.Bool("to-earliest", false, "move to the first retained message of each partition")
	toTime := fs.String("to-time", "", `move to the first message at or after this RFC 3339 time, e.g. "2026-12-01T00:00:00Z"`)
	toOffset := fs.Int64("to-offset", -1, "move to this offset in every partition (clamped to the retained range)")
	dryRun := fs.Bool("dry-run", false, "print the moves without committing them")
	asJSON := fs.Bool("json", false, "print JSON (snake_case)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := checkConsumerFlags(*brokers, *group); err != nil {
		return err
	}
	var to consumer.ResetTo
	chosen := 0
	if *earliest {
		chosen++
		to = consumer.ResetToEarliest()
	}
	if *toTime != "" {
		chosen++
		t, err := time.Parse(time.RFC3339, *toTime)
		if err != nil {
			return fmt.Errorf("%w: --to-time %q is not an RFC 3339 time (2026-12-01T00:00:00Z)", errUsage, *toTime)
		}
		to = consumer.ResetToTime(t)
	}
	if flagGiven(fs, "to-offset") {
		chosen++
		if *toOffset < 0 {
			return fmt.Errorf("%w: --to-offset %d: want 0 or more", errUsage, *toOffset)
		}
		to = consumer.ResetToOffset(*toOffset)
	}
	if chosen != 1 {
		return fmt.Errorf("%w: choose exactly one of --to-earliest, --to-time or --to-offset", errUsage)
	}
	var opts []consumer.GroupOption
	if *dryRun {
		opts = append(opts, consumer.ResetDryRun())
	}
	moves, err := consumer.ResetGroup(ctx, splitList(*brokers), *group, *topics, to, opts...)
	if err != nil {
		return groupError(*brokers, err)
	}
	if *asJSON {
		out := make([]offsetResetJSON, 0, len(moves))
		for _, m := range moves {
			r := offsetResetJSON{Topic: m.Topic, Partition: m.Partition, To: m.To, Clamped: m.Clamped}
			if m.From >= 0 {
				r.From = &m.From
			}
			out = append(out, r)
		}
		return writeJSON(env.stdout, out)
	}
	w := tabwriter.NewWriter(env.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "TOPIC\tPARTITION\tFROM\tTO")
	for _, m := range moves {
		from := "-"
		if m.From >= 0 {
			from = strconv.FormatInt(m.From, 10)
		}
		to := strconv.FormatInt(m.To, 10)
		if m.Clamped {
			to += " (clamped)"
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", m.Topic, m.Partition, from, to)
	}
	w.Flush()
	if *dryRun {
		fmt.Fprintf(env.stdout, "\ndry run: group %s not changed (reset to %s)\n", *group, to)
	} else {
		fmt.Fprintf(env.stdout, "\ngroup %s reset to %s in %d partition(s); start its consumers to replay\n", *group, to, len(moves))
	}
	return nil
}
