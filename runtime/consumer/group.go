package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// GroupStatus is a consumer group as the broker sees it: its live members
// with their assignments, and per partition of its topics the committed
// offset, the end of the log and what lies between.
type GroupStatus struct {
	// Group is the group ID (WithGroupID, by default the consumer name).
	Group string
	// State is the coordinator's group state: "Stable", "Empty",
	// "PreparingRebalance", "CompletingRebalance" or "Dead".
	State string
	// Members are the live members, sorted by ID.
	Members []GroupMember
	// Partitions are the partitions of the described topics, sorted by
	// topic, then partition.
	Partitions []PartitionStatus
}

// Lag is the group's total lag over its partitions.
func (g GroupStatus) Lag() int64 {
	var n int64
	for _, p := range g.Partitions {
		n += p.Lag
	}
	return n
}

// OldestUnprocessed is the age of the oldest message not yet processed
// over all partitions (0 when there is none).
func (g GroupStatus) OldestUnprocessed() time.Duration {
	var d time.Duration
	for _, p := range g.Partitions {
		d = max(d, p.OldestUnprocessedAge)
	}
	return d
}

// GroupMember is one live member of a consumer group.
type GroupMember struct {
	// ID is the member ID the coordinator gave it.
	ID string
	// ClientID and Host identify the process (Host is the address the
	// coordinator saw it connect from).
	ClientID string
	Host     string
	// Assignments maps each topic to the partitions the member holds.
	Assignments map[string][]int
}

// PartitionStatus is where a group stands in one partition.
type PartitionStatus struct {
	Topic     string
	Partition int
	// Committed is the group's committed offset: the next offset it will
	// process; -1 when the group never committed one here (it then starts
	// at the log start, the consumer's default, or at the end with
	// WithStartFromLatest).
	Committed int64
	// LogStart is the first offset the partition still retains and
	// HighWatermark the offset the next message will get.
	LogStart      int64
	HighWatermark int64
	// Lag is how many messages are not processed yet: HighWatermark minus
	// Committed (minus LogStart when nothing is committed, or when the
	// committed offset fell out of retention).
	Lag int64
	// Member is the ID of the member holding the partition; empty when no
	// member does.
	Member string
	// OldestUnprocessed is the timestamp of the first message after the
	// committed offset, and OldestUnprocessedAge its age at the time of the
	// call; zero when the lag is 0.
	OldestUnprocessed    time.Time
	OldestUnprocessedAge time.Duration
}

// GroupOption changes how DescribeGroup and ResetGroup reach Kafka.
type GroupOption func(*groupSettings)

type groupSettings struct {
	dialer *kafka.Dialer
	dryRun bool
	now    func() time.Time
}

// WithGroupDialer sets the dialer (TLS, SASL, timeouts) DescribeGroup and
// ResetGroup use; default kafka.DefaultDialer.
func WithGroupDialer(d *kafka.Dialer) GroupOption {
	return func(s *groupSettings) {
		if d != nil {
			s.dialer = d
		}
	}
}

// ResetDryRun makes ResetGroup compute and return the new offsets without
// committing them (the live-member check still applies).
func ResetDryRun() GroupOption {
	return func(s *groupSettings) { s.dryRun = true }
}

func groupSettingsFrom(opts []GroupOption) groupSettings {
	s := groupSettings{dialer: kafka.DefaultDialer, now: time.Now}
	for _, o := range opts {
		if o != nil {
			o(&s)
		}
	}
	return s
}

// groupAdmin is one DescribeGroup or ResetGroup call's connection to the
// cluster.
type groupAdmin struct {
	s         groupSettings
	brokers   []string
	cl        *kafka.Client
	transport *kafka.Transport
}

func newGroupAdmin(brokers []string, opts []GroupOption) (*groupAdmin, error) {
	if len(brokers) == 0 {
		return nil, errors.New("no brokers")
	}
	s := groupSettingsFrom(opts)
	t := transportFor(s.dialer)
	return &groupAdmin{s: s, brokers: brokers, transport: t,
		cl: &kafka.Client{Addr: kafka.TCP(brokers...), Transport: t, Timeout: 30 * time.Second}}, nil
}

func (a *groupAdmin) close() { a.transport.CloseIdleConnections() }

// DescribeGroup reports a consumer group: its live members and their
// assignments, and per partition of topics the committed offset, high
// watermark, lag and the age of the oldest unprocessed message. With no
// topics it describes the topics the group has committed offsets for or its
// members subscribe to. It only reads: it joins no group and commits
// nothing. A topic that does not exist is an error wrapping ErrNoTopic.
func DescribeGroup(ctx context.Context, brokers []string, group string, topics []string, opts ...GroupOption) (GroupStatus, error) {
	if group == "" {
		return GroupStatus{}, errors.New("consumer: describe group: empty group ID")
	}
	a, err := newGroupAdmin(brokers, opts)
	if err != nil {
		return GroupStatus{}, fmt.Errorf("consumer: describe group %s: %w", group, err)
	}
	defer a.close()
	var st GroupStatus
	err = retryCoordinator(ctx, func() (err error) {
		st, err = a.describe(ctx, group, topics, true)
		return err
	})
	if err != nil {
		return GroupStatus{}, fmt.Errorf("consumer: describe group %s: %w", group, err)
	}
	return st, nil
}

// describe does DescribeGroup's work; withAge also reads the timestamp of
// each partition's first unprocessed message.
func (a *groupAdmin) describe(ctx context.Context, group string, topics []string, withAge bool) (GroupStatus, error) {
	st := GroupStatus{Group: group}
	dg, err := a.cl.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
	if err != nil {
		return st, fmt.Errorf("describe groups: %w", err)
	}
	owner := map[string]map[int]string{} // topic → partition → member
	subscribed := map[string]bool{}
	for _, g := range dg.Groups {
		if g.GroupID != group {
			continue
		}
		if g.Error != nil {
			return st, fmt.Errorf("describe groups: %w", g.Error)
		}
		st.State = g.GroupState
		for _, m := range g.Members {
			gm := GroupMember{ID: m.MemberID, ClientID: m.ClientID, Host: m.ClientHost, Assignments: map[string][]int{}}
			for _, t := range m.MemberAssignments.Topics {
				ps := slices.Clone(t.Partitions)
				slices.Sort(ps)
				gm.Assignments[t.Topic] = ps
				if owner[t.Topic] == nil {
					owner[t.Topic] = map[int]string{}
				}
				for _, p := range ps {
					owner[t.Topic][p] = m.MemberID
				}
				subscribed[t.Topic] = true
			}
			for _, t := range m.MemberMetadata.Topics {
				subscribed[t] = true
			}
			st.Members = append(st.Members, gm)
		}
	}
	sort.Slice(st.Members, func(i, j int) bool { return st.Members[i].ID < st.Members[j].ID })

	// Committed offsets: of the given topics, or of every topic the group
	// has offsets for (a null topic list asks for all of them).
	req := &kafka.OffsetFetchRequest{GroupID: group}
	committed := map[string]map[int]int64{}
	if len(topics) > 0 {
		req.Topics = map[string][]int{}
		for _, t := range topics {
			parts, err := a.partitions(ctx, t)
			if err != nil {
				return st, err
			}
			req.Topics[t] = parts
		}
	}
	of, err := a.cl.OffsetFetch(ctx, req)
	if err != nil {
		return st, fmt.Errorf("offset fetch: %w", err)
	}
	// A group the coordinator does not know has no offsets (some brokers
	// answer GroupIdNotFound rather than offsets of -1).
	if of.Error != nil && !errors.Is(of.Error, kafka.GroupIdNotFound) {
		return st, fmt.Errorf("offset fetch: %w", of.Error)
	}
	for t, ps := range of.Topics {
		for _, p := range ps {
			if errors.Is(p.Error, kafka.GroupIdNotFound) {
				continue
			}
			if p.Error != nil {
				return st, fmt.Errorf("offset fetch %s/%d: %w", t, p.Partition, p.Error)
			}
			if committed[t] == nil {
				committed[t] = map[int]int64{}
			}
			committed[t][p.Partition] = p.CommittedOffset
		}
	}
	if len(topics) == 0 {
		set := map[string]bool{}
		for t, ps := range committed {
			for _, off := range ps {
				if off >= 0 {
					set[t] = true
				}
			}
		}
		for t := range subscribed {
			set[t] = true
		}
		for t := range set {
			topics = append(topics, t)
		}
	}
	topics = slices.Compact(slices.Sorted(slices.Values(topics)))

	now := a.s.now()
	for _, t := range topics {
		parts, err := a.partitions(ctx, t)
		if err != nil {
			return st, err
		}
		for _, p := range parts {
			first, hwm, err := a.bounds(ctx, t, p)
			if err != nil {
				return st, err
			}
			ps := PartitionStatus{Topic: t, Partition: p, Committed: -1, LogStart: first, HighWatermark: hwm, Member: owner[t][p]}
			if off, ok := committed[t][p]; ok && off >= 0 {
				ps.Committed = off
			}
			next := max(ps.Committed, first)
			ps.Lag = max(hwm-next, 0)
			if withAge && ps.Lag > 0 {
				at, err := a.timestampAt(ctx, t, p, next)
				if err != nil {
					return st, err
				}
				if !at.IsZero() {
					ps.OldestUnprocessed = at
					ps.OldestUnprocessedAge = max(now.Sub(at), 0)
				}
			}
			st.Partitions = append(st.Partitions, ps)
		}
	}
	return st, nil
}

// partitions returns the sorted partition IDs of topic, without creating it.
func (a *groupAdmin) partitions(ctx context.Context, topic string) ([]int, error) {
	parts, err := partitionsOf(ctx, dlqSettings{dialer: a.s.dialer}, a.brokers, topic)
	if err != nil {
		return nil, fmt.Errorf("topic %s: %w", topic, err)
	}
	ids := make([]int, 0, len(parts))
	for _, p := range parts {
		ids = append(ids, p.ID)
	}
	slices.Sort(ids)
	return ids, nil
}

// bounds returns the log start and the high watermark of a partition.
func (a *groupAdmin) bounds(ctx context.Context, topic string, partition int) (first, last int64, err error) {
	err = a.onLeader(ctx, topic, partition, func(conn *kafka.Conn) error {
		first, last, err = conn.ReadOffsets()
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("%s/%d: read offsets: %w", topic, partition, err)
	}
	return first, last, nil
}

// offsetAt returns the offset of the first message at or after t, or the
// high watermark when there is none.
func (a *groupAdmin) offsetAt(ctx context.Context, topic string, partition int, t time.Time, hwm int64) (int64, error) {
	var off int64
	err := a.onLeader(ctx, topic, partition, func(conn *kafka.Conn) error {
		var err error
		off, err = conn.ReadOffset(t)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("%s/%d: offset at %s: %w", topic, partition, t.Format(time.RFC3339), err)
	}
	if off < 0 || off > hwm {
		return hwm, nil
	}
	return off, nil
}

// onLeader runs fn on a connection to the partition's leader.
func (a *groupAdmin) onLeader(ctx context.Context, topic string, partition int, fn func(*kafka.Conn) error) error {
	conn, err := a.s.dialer.DialLeader(ctx, "tcp", a.brokers[0], topic, partition)
	if err != nil {
		return fmt.Errorf("dial leader: %w", err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	}
	return fn(conn)
}

// timestampAt returns the timestamp of the first message at or after
// offset (zero if the fetch returns none).
func (a *groupAdmin) timestampAt(ctx context.Context, topic string, partition int, offset int64) (time.Time, error) {
	res, err := a.cl.Fetch(ctx, &kafka.FetchRequest{Topic: topic, Partition: partition, Offset: offset,
		MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 100 * time.Millisecond})
	if err != nil {
		return time.Time{}, fmt.Errorf("%s/%d: fetch at %d: %w", topic, partition, offset, err)
	}
	if res.Error != nil {
		return time.Time{}, fmt.Errorf("%s/%d: fetch at %d: %w", topic, partition, offset, res.Error)
	}
	if res.Records == nil {
		return time.Time{}, nil
	}
	for {
		r, err := res.Records.ReadRecord()
		if err != nil {
			return time.Time{}, nil // nothing (more) in this response
		}
		if r.Offset >= offset {
			return r.Time, nil
		}
	}
}

// ResetTo says where ResetGroup moves a group's offsets. Build one with
// ResetToEarliest, ResetToTime or ResetToOffset.
type ResetTo struct {
	kind   resetKind
	t      time.Time
	offset int64
}

type resetKind int

const (
	resetNone resetKind = iota
	resetEarliest
	resetTime
	resetOffset
)

// ResetToEarliest moves the group to the first retained message of each
// partition: it processes everything Kafka still has again.
func ResetToEarliest() ResetTo { return ResetTo{kind: resetEarliest} }

// ResetToTime moves the group, in each partition, to the first message
// whose timestamp is at or after t (the end of the partition when there is
// none).
func ResetToTime(t time.Time) ResetTo { return ResetTo{kind: resetTime, t: t} }

// ResetToOffset moves the group to offset n in every partition, clamped to
// the partition's retained range [log start, high watermark].
func ResetToOffset(n int64) ResetTo { return ResetTo{kind: resetOffset, offset: n} }

// String describes the target, as the CLI prints it.
func (r ResetTo) String() string {
	switch r.kind {
	case resetEarliest:
		return "earliest"
	case resetTime:
		return "time " + r.t.UTC().Format(time.RFC3339)
	case resetOffset:
		return fmt.Sprintf("offset %d", r.offset)
	}
	return "nothing"
}

// OffsetReset is one partition's move by ResetGroup.
type OffsetReset struct {
	Topic     string
	Partition int
	// From is the committed offset before the reset (-1: none), To the
	// offset committed.
	From, To int64
	// Clamped is set when ResetToOffset's offset was outside the
	// partition's retained range and To is the nearest end of it.
	Clamped bool
}

// ErrGroupActive is what ResetGroup's refusal wraps: the group has live
// members, whose own commits would overwrite the reset (and the broker
// rejects offset commits from outside a live generation anyway).
var ErrGroupActive = errors.New("consumer group has live members")

// LiveMembersError is ResetGroup's refusal to move the offsets of a group
// that has live members; it names them and the fix.
type LiveMembersError struct {
	Group   string
	State   string
	Members []GroupMember
}

// Error names the members and says how to proceed.
func (e *LiveMembersError) Error() string {
	names := make([]string, 0, len(e.Members))
	for _, m := range e.Members {
		names = append(names, fmt.Sprintf("%s (client %s, host %s)", m.ID, m.ClientID, m.Host))
	}
	return fmt.Sprintf("consumer: reset group %s refused: the group is %s with %d live member(s): %s; stop every consumer of the group (they leave it on a clean shutdown; a killed one is dropped after its session timeout), check with `eventsctl consumer status`, then reset",
		e.Group, e.State, len(e.Members), strings.Join(names, ", "))
}

// Unwrap makes errors.Is(err, ErrGroupActive) hold.
func (e *LiveMembersError) Unwrap() error { return ErrGroupActive }

// ResetGroup moves the committed offsets of group in every partition of
// topics to the target, for a replay (see docs/runbook.md, "Consumer lag
// and replay"). It refuses with a *LiveMembersError while the group has live
// members: stop the consumers first. It commits as a client outside the
// group (generation -1), which the broker also refuses should a member
// join in the meantime. With no topics it resets the topics the group has
// committed offsets for. It returns the moves, sorted by topic and
// partition.
func ResetGroup(ctx context.Context, brokers []string, group string, topics []string, to ResetTo, opts ...GroupOption) ([]OffsetReset, error) {
	if group == "" {
		return nil, errors.New("consumer: reset group: empty group ID")
	}
	if to.kind == resetNone {
		return nil, fmt.Errorf("consumer: reset group %s: no target (use ResetToEarliest, ResetToTime or ResetToOffset)", group)
	}
	if to.kind == resetOffset && to.offset < 0 {
		return nil, fmt.Errorf("consumer: reset group %s: offset %d < 0", group, to.offset)
	}
	a, err := newGroupAdmin(brokers, opts)
	if err != nil {
		return nil, fmt.Errorf("consumer: reset group %s: %w", group, err)
	}
	defer a.close()
	var st GroupStatus
	err = retryCoordinator(ctx, func() (err error) {
		st, err = a.describe(ctx, group, topics, false)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("consumer: reset group %s: %w", group, err)
	}
	if len(st.Members) > 0 {
		return nil, &LiveMembersError{Group: group, State: st.State, Members: st.Members}
	}
	if len(st.Partitions) == 0 {
		return nil, fmt.Errorf("consumer: reset group %s: no topics: the group has no committed offsets; name the topics to reset", group)
	}
	var out []OffsetReset
	commit := map[string][]kafka.OffsetCommit{}
	for _, p := range st.Partitions {
		r := OffsetReset{Topic: p.Topic, Partition: p.Partition, From: p.Committed}
		switch to.kind {
		case resetEarliest:
			r.To = p.LogStart
		case resetTime:
			if r.To, err = a.offsetAt(ctx, p.Topic, p.Partition, to.t, p.HighWatermark); err != nil {
				return nil, fmt.Errorf("consumer: reset group %s: %w", group, err)
			}
		case resetOffset:
			r.To = min(max(to.offset, p.LogStart), p.HighWatermark)
			r.Clamped = r.To != to.offset
		}
		out = append(out, r)
		commit[p.Topic] = append(commit[p.Topic], kafka.OffsetCommit{Partition: p.Partition, Offset: r.To, Metadata: "eventsctl consumer reset"})
	}
	if a.s.dryRun {
		return out, nil
	}
	err = retryCoordinator(ctx, func() error {
		res, err := a.cl.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1, Topics: commit})
		if err != nil {
			return fmt.Errorf("offset commit: %w", err)
		}
		var errs []error
		for t, ps := range res.Topics {
			for _, p := range ps {
				if p.Error != nil {
					errs = append(errs, fmt.Errorf("%s/%d: %w", t, p.Partition, p.Error))
				}
			}
		}
		return errors.Join(errs...)
	})
	if err != nil {
		if errors.Is(err, kafka.UnknownMemberId) || errors.Is(err, kafka.IllegalGeneration) || errors.Is(err, kafka.RebalanceInProgress) {
			return nil, fmt.Errorf("consumer: reset group %s refused by the broker, a member joined meanwhile (%w): stop every consumer of the group and run again: %w", group, ErrGroupActive, err)
		}
		return nil, fmt.Errorf("consumer: reset group %s: %w", group, err)
	}
	return out, nil
}

// retryCoordinator runs fn again while it fails because the group's
// coordinator is moving or loading (a broker restarted, the offsets topic's
// leadership changed): a real broker answers so for a few seconds, and an
// operator's describe or reset should wait that out, not fail. It gives up
// after 30s, returning the last error, or when ctx ends, returning ctx's
// error wrapped with the last one.
func retryCoordinator(ctx context.Context, fn func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	wait := 100 * time.Millisecond
	for {
		err := fn()
		if err == nil || !(errors.Is(err, kafka.NotCoordinatorForGroup) || errors.Is(err, kafka.GroupCoordinatorNotAvailable) || errors.Is(err, kafka.GroupLoadInProgress)) || time.Now().Add(wait).After(deadline) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}
