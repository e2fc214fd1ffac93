package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/protoevents/protoevents/internal/compat"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/topics"
)

const topicsUsage = `Usage: eventsctl topics <create|check> (--lock events.lock | --topic T[,T...]) [flags]

  create   create the event topics and their dead-letter topics that do not exist
  check    compare them with the cluster: missing topics, partition counts,
           replication factors and --config values (exit 1 on any drift)

With --lock, the topics are every event's topic and its effective DLQ topic
(the schema's dlq_topic, else "<topic>.dlq") from the lock file the plugin
generates. Programs do the same from the generated registries with
topics.Ensure and topics.Check.
Run "eventsctl topics <subcommand> -h" for its flags.`

// configFlag collects repeated --config key=value flags.
type configFlag map[string]string

func (c configFlag) String() string {
	var parts []string
	for k, v := range c {
		parts = append(parts, k+"="+v)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

func (c configFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || strings.TrimSpace(k) == "" {
		return fmt.Errorf("%q is not key=value (e.g. retention.ms=604800000)", s)
	}
	c[strings.TrimSpace(k)] = v
	return nil
}

func runTopics(ctx context.Context, env *cliEnv, args []string) error {
	if len(args) == 0 {
		fmt.Fprintln(env.stderr, topicsUsage)
		return fmt.Errorf("%w: missing subcommand", errUsage)
	}
	switch args[0] {
	case "create", "check":
	case "-h", "--help", "help":
		fmt.Fprintln(env.stdout, topicsUsage)
		return flag.ErrHelp
	default:
		fmt.Fprintln(env.stderr, topicsUsage)
		return fmt.Errorf("%w: unknown subcommand %q", errUsage, args[0])
	}
	sub := args[0]
	desc := map[string]string{
		"create": `Creates the event topics and their dead-letter topics that do not exist
yet. Existing topics are never changed: a new partition count would move
keys and break per-key order (see "eventsctl topics check").`,
		"check": `Compares the planned topics with the cluster and lists each difference:
missing topics, partition counts, replication factors and the values of
the --config settings. Exits 1 when anything differs, 3 when the brokers
cannot be reached. Changes nothing.`,
	}[sub]
	fs := newFlags(env, "topics "+sub, "(--lock events.lock | --topic T[,T...]) [flags]", desc)
	brokers := brokersFlag(fs, env)
	lock := fs.String("lock", "", "events.lock: plan every event's topic and effective DLQ topic")
	names := fs.String("topic", "", "comma-separated event topics (instead of --lock)")
	dlq := fs.Bool("dlq", true, `with --topic: also each topic's "<topic>.dlq"`)
	partitions := fs.Int("partitions", 6, "partitions of each topic (bounds consumer parallelism; fixed for good)")
	replication := fs.Int("replication-factor", 1, "replication factor of each topic (3 in production)")
	cfgs := configFlag{}
	fs.Var(cfgs, "config", "topic config key=value for every topic, repeatable (e.g. --config retention.ms=604800000)")
	dlqCfgs := configFlag{}
	fs.Var(dlqCfgs, "dlq-config", "topic config key=value for DLQ topics instead of --config, repeatable")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if err := need(*brokers, "brokers", "PROTOEVENTS_KAFKA_BROKERS"); err != nil {
		return err
	}
	if (*lock == "") == (*names == "") {
		return fmt.Errorf("%w: give one of --lock (the plugin's events.lock) or --topic", errUsage)
	}
	if *partitions < 1 {
		return fmt.Errorf("%w: --partitions %d: a topic needs at least 1 partition", errUsage, *partitions)
	}
	if *replication < 1 {
		return fmt.Errorf("%w: --replication-factor %d: want at least 1", errUsage, *replication)
	}
	cfg := topics.Config{Partitions: *partitions, ReplicationFactor: *replication, Configs: cfgs, DLQConfigs: cfgs}
	if len(dlqCfgs) > 0 {
		cfg.DLQConfigs = dlqCfgs
	}
	var specs []topics.Spec
	var err error
	if *lock != "" {
		ds, lerr := lockDescriptors(*lock)
		if lerr != nil {
			return lerr
		}
		specs, err = topics.Plan(cfg, ds...)
	} else {
		specs, err = topics.PlanNames(cfg, *dlq, splitList(*names)...)
	}
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if len(specs) == 0 {
		return fmt.Errorf("%w: no topics to %s", errUsage, sub)
	}
	if sub == "check" {
		return topicsCheck(ctx, env, splitList(*brokers), specs)
	}
	created, err := topics.CreateSpecs(ctx, splitList(*brokers), nil, specs)
	for _, s := range specs {
		state := "exists, unchanged (see eventsctl topics check)"
		if slices.Contains(created, s.Name) {
			state = fmt.Sprintf("created (%d partitions, replication factor %d%s)", s.Partitions, s.ReplicationFactor, configSuffix(s.Configs))
		}
		kind := "topic"
		if s.DLQ {
			kind = "dlq"
		}
		fmt.Fprintf(env.stdout, "%-5s %s: %s\n", kind, s.Name, state)
	}
	return unreachable(err)
}

func configSuffix(m map[string]string) string {
	if len(m) == 0 {
		return ""
	}
	return ", " + configFlag(m).String()
}

func topicsCheck(ctx context.Context, env *cliEnv, brokers []string, specs []topics.Spec) error {
	drift, err := topics.Check(ctx, brokers, nil, specs)
	if err != nil {
		return unreachable(err)
	}
	if len(drift) == 0 {
		fmt.Fprintf(env.stdout, "%d topics match the plan\n", len(specs))
		return nil
	}
	w := tabwriter.NewWriter(env.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "TOPIC\tDRIFT\tCLUSTER\tPLANNED")
	missing := 0
	for _, d := range drift {
		got := d.Got
		if d.Field == "missing" {
			missing++
			got = "-"
		} else if got == "" {
			got = "(unset)"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", d.Topic, d.Field, got, d.Want)
	}
	w.Flush()
	fmt.Fprintf(env.stderr, "eventsctl topics check: %d difference(s) from the plan", len(drift))
	if missing > 0 {
		fmt.Fprintf(env.stderr, "; eventsctl topics create (same flags) creates the %d missing topic(s); partition counts and configs of existing topics are changed by hand", missing)
	}
	fmt.Fprintln(env.stderr)
	return exitError(exitCheckFailed)
}

// lockDescriptors reads the events of a lock file as descriptors carrying
// their topic and effective DLQ topic.
func lockDescriptors(path string) ([]*events.Descriptor, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: --lock %s does not exist (the plugin writes events.lock with its lock= option)", errUsage, path)
		}
		return nil, fmt.Errorf("read --lock: %w", err)
	}
	l, err := compat.ParseLock(data)
	if err != nil {
		return nil, fmt.Errorf("--lock %s: %w", path, err)
	}
	if len(l.Events) == 0 {
		return nil, fmt.Errorf("--lock %s lists no events", path)
	}
	ds := make([]*events.Descriptor, 0, len(l.Events))
	for _, e := range l.Events {
		ds = append(ds, &events.Descriptor{Type: e.Name, Topic: e.Topic, DLQTopic: e.DLQTopic, Version: e.Version})
	}
	return ds, nil
}
