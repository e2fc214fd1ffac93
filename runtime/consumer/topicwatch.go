package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// MissingTopicsError is what Run returns when a consumed topic or its DLQ
// does not exist: a consumer group on a missing topic would join, get no
// partitions and wait silently forever.
type MissingTopicsError struct {
	// Consumer is the consumer's name.
	Consumer string
	// Topics lists the missing topics, sorted.
	Topics []string
	// EventTopics lists the consumed topics that are missing or whose DLQ
	// is, sorted: what to pass to eventsctl topics create --topic.
	EventTopics []string
}

// Error names every missing topic and the fix.
func (e *MissingTopicsError) Error() string {
	return fmt.Sprintf("consumer %s: topics do not exist: %s; create them (and their DLQs) with `eventsctl topics create --topic %s` (or --lock events.lock), or topics.Ensure in the program; WithWaitForTopics makes Run wait for them instead",
		e.Consumer, strings.Join(e.Topics, ", "), strings.Join(e.EventTopics, ","))
}

// missingTopics returns the consumed topics and DLQs absent from the
// cluster, or nil.
func (c *Consumer) missingTopics(ctx context.Context) (*MissingTopicsError, error) {
	var names []string
	for _, t := range c.topics {
		names = append(names, t, c.routes[t].dlq)
	}
	exist, err := partitionCounts(ctx, c.s.dialer, c.brokers, names)
	if err != nil {
		return nil, err
	}
	var e MissingTopicsError
	for _, t := range c.topics {
		r := c.routes[t]
		missing := false
		for _, n := range []string{t, r.dlq} {
			if _, ok := exist[n]; !ok {
				e.Topics = append(e.Topics, n)
				missing = true
			}
		}
		if missing {
			e.EventTopics = append(e.EventTopics, t)
		}
	}
	if len(e.Topics) == 0 {
		return nil, nil
	}
	e.Consumer = c.name
	slices.Sort(e.Topics)
	slices.Sort(e.EventTopics)
	return &e, nil
}

// partitionCounts asks the cluster (a metadata request, which never
// creates topics) how many partitions each of names has; a missing topic
// is absent from the map, any other per-topic error fails the request.
func partitionCounts(ctx context.Context, dialer *kafka.Dialer, brokers []string, names []string) (map[string]int, error) {
	transport := transportFor(dialer)
	defer transport.CloseIdleConnections()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: transport, Timeout: 30 * time.Second}
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: names})
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	counts := map[string]int{}
	for _, t := range md.Topics {
		switch {
		case t.Error == nil:
			counts[t.Name] = len(t.Partitions)
		case errors.Is(t.Error, kafka.UnknownTopicOrPartition):
		default:
			return nil, fmt.Errorf("metadata of %s: %w", t.Name, t.Error)
		}
	}
	return counts, nil
}

// awaitTopics returns nil once every consumed topic and DLQ exists. Without
// WithWaitForTopics a missing topic is a *MissingTopicsError at once; with
// it, Run logs a warning naming them every wait interval until they exist.
func (c *Consumer) awaitTopics(ctx context.Context) error {
	var lastWarn time.Time
	defer c.health.waiting.Store(false)
	for {
		missing, err := c.missingTopics(ctx)
		if err == nil && missing == nil {
			return nil
		}
		if ctx.Err() != nil {
			return nil // Run ends without having joined
		}
		if err != nil {
			// The brokers are unreachable: the group join would retry too.
			if time.Since(lastWarn) >= c.s.topicWait {
				c.log.Warn("consumer: cannot check topics, retrying", "err", err)
				lastWarn = time.Now()
			}
		} else {
			if c.s.topicWait <= 0 {
				return missing
			}
			c.health.waiting.Store(true)
			if time.Since(lastWarn) >= c.s.topicWait {
				c.log.Warn("consumer: waiting for topics to be created; not consuming anything until they exist", "missing", missing.Topics,
					"fix", "eventsctl topics create --topic "+strings.Join(missing.EventTopics, ","))
				lastWarn = time.Now()
			}
		}
		if err := sleep(ctx, c.s.topicPoll); err != nil {
			return nil
		}
	}
}

// assignWatch records, per consumed topic, when this member last held a
// partition of it.
type assignWatch struct {
	mu     sync.Mutex
	since  map[string]time.Time // topic → when it became unassigned; zero while assigned
	warned map[string]time.Time
}

func newAssignWatch(topics []string) *assignWatch {
	w := &assignWatch{since: map[string]time.Time{}, warned: map[string]time.Time{}}
	now := time.Now()
	for _, t := range topics {
		w.since[t] = now
	}
	return w
}

// assigned records a generation's assignments.
func (w *assignWatch) assigned(a map[string][]kafka.PartitionAssignment) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	for t, since := range w.since {
		switch {
		case len(a[t]) > 0:
			w.since[t] = time.Time{}
		case since.IsZero():
			w.since[t] = now
		}
	}
}

// unassigned returns the topics held by no partition for at least d that
// were not reported in the last d.
func (w *assignWatch) unassigned(d time.Duration) map[string]time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	out := map[string]time.Duration{}
	for t, since := range w.since {
		if since.IsZero() || now.Sub(since) < d || now.Sub(w.warned[t]) < d {
			continue
		}
		w.warned[t] = now
		out[t] = now.Sub(since)
	}
	return out
}

// watchAssignments warns, once per interval, about each consumed topic of
// which this member has held no partition for that long: a missing topic, a
// group with more members than partitions, or a stuck rebalance.
func (c *Consumer) watchAssignments(ctx context.Context) {
	every := c.s.unassignedWarn
	t := time.NewTicker(max(every/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for topic, d := range c.watch.unassigned(every) {
			c.log.Warn("consumer: no partition of topic assigned to this member; nothing of it is consumed here (more members than partitions, a rebalance in progress, or the topic is missing)",
				"topic", topic, "group", c.groupID, "for", d.Round(time.Millisecond))
		}
	}
}

// watchPartitions ends the generation gen once a consumed topic's
// partition count differs from base (read before the generation's
// partitions started), so that the group rebalances and the new partitions
// are consumed. kafka-go's own watcher takes its baseline when its
// goroutine first runs, and so misses partitions added in between; this
// one's baseline is taken before Run reports ready. It checks every
// interval until the generation ends.
func (c *Consumer) watchPartitions(gctx context.Context, base map[string]int, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-gctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(gctx, interval)
		now, err := partitionCounts(ctx, c.s.dialer, c.brokers, c.topics)
		cancel()
		if err != nil {
			continue // kafka-go's group retries the coordinator; a later tick looks again
		}
		for _, topic := range c.topics {
			if n, ok := now[topic]; ok && n != base[topic] {
				c.log.Warn("consumer: partitions changed, rebalancing to consume them; a key's events published after the change may be applied before its earlier ones still queued on its old partition (runbook: Growing a topic)", "topic", topic, "partitions", n, "were", base[topic])
				return // ends the generation: the member rejoins
			}
		}
	}
}
