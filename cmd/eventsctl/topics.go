package main

import (
	"context"
	"errors"
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
