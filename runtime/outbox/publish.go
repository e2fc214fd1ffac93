package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/internal/kafkawriter"
)

// flight is a batch being published.
type flight struct {
	batch []claimed
	msgs  []kafka.Message
	done  chan struct{}
	err   error // the publish's outcome, once done is closed
}

// outcome is a published batch, split into what to mark.
type outcome struct {
	batch          []claimed
	pubErr         error
	acked, failed  []int64
	failing        []topicKey
	refusedTopics  []string
	abandoned      bool // shutdown grace ran out: nothing to mark
	wholeCallError bool // nothing went through and no topic was parked
	unreachable    bool // a whole-call error for want of reaching the brokers (unreachable)
}

// pump relays batches, pipelined, until no row is left to claim, a
// periodic task is due, ctx ends or a failure needs a pause; it returns
// with nothing in flight, and the number of rows published.
func (l *loop) pump(ctx context.Context) (int, error) {
	if len(l.s.owned) == 0 {
		l.lastLook = time.Now() // nothing to look at: idle waits its poll delay
		return 0, nil
	}
	// The claims run under the grace context: canceling a query makes pgx
	// close the connection, which would also lose the marks of the batch
	// in flight. ctx is checked between the steps instead.
	cur, err := l.claim(l.grace, nil)
	if err != nil || len(cur) == 0 || ctx.Err() != nil {
		return 0, err
	}
	total := 0
	var prev *outcome
	for {
		l.r.health.alive()
		fl, err := l.send(cur)
		if err != nil {
			n, serr := l.settle(prev)
			return total + n, errors.Join(err, serr)
		}
		// While the batch is in flight: mark the previous one and claim
		// the next, at once when rows are known or likely (claimDue), or
		// as soon as a wake-up announces some before the acknowledgement.
		var next []claimed
		n, dberr := l.settle(prev)
		total += n
		prev = nil
		mayClaim := func() bool { return dberr == nil && ctx.Err() == nil && !l.due() }
		if mayClaim() && l.claimDue() {
			next, dberr = l.claim(l.grace, fl.batch)
		} else {
			select {
			case <-fl.done:
			case <-l.wake.ch:
				l.gotWake()
				if mayClaim() {
					next, dberr = l.claim(l.grace, fl.batch)
				}
			}
		}
		<-fl.done
		out := l.judge(fl)
		if out.abandoned {
			return total, ctx.Err()
		}
		if f := l.faults.AfterPublish; f != nil && out.pubErr == nil {
			if ferr := f(ctx, faultRows(out.batch)); ferr != nil {
				return total, &crashError{err: ferr}
			}
		}
		if dberr != nil {
			n, _ := l.settle(out)
			return total + n, dberr
		}
		if out.wholeCallError {
			n, serr := l.settle(out)
			// Either the brokers could not be reached, or they answered,
			// refusing every row: then they are reachable, the rows are
			// the problem.
			dep := depPublish
			if out.unreachable {
				dep = depKafka
			}
			return total + n, errors.Join(&depError{dep: dep, err: &publishError{out: out}}, serr)
		}
		if out.pubErr != nil {
			l.report(&publishError{out: out})
		}
		prev = out
		if ctx.Err() != nil {
			break
		}
		// The next batch goes out only now that this one is acknowledged,
		// and without the keys and topics that just failed (parked).
		if out.pubErr != nil {
			next = slices.DeleteFunc(next, func(c claimed) bool { return failedIn(out, &c) })
		}
		if len(next) == 0 {
			break
		}
		cur = next
	}
	n, err := l.settle(prev)
	return total + n, err
}

// send starts publishing batch (up to the batch byte cap: the rest is
// dropped from it and claimed again later) and returns the flight.
func (l *loop) send(batch []claimed) (*flight, error) {
	msgs := make([]kafka.Message, 0, len(batch))
	size := 0
	for i, row := range batch {
		hs, err := decodeHeaders(row.headers)
		if err != nil {
			return nil, fmt.Errorf("outbox: relay: row %d (%s): %w", row.ID, row.EventID, err)
		}
		hs = publishedHeaders(hs, row.EventID, row.EventType)
		m := kafka.Message{Topic: row.Topic, Key: row.Key, Value: row.value, Headers: hs}
		// Cap the batch in bytes so every partition's share fits one
		// produce request; the rest stays pending for the next batch.
		if size += kafkawriter.Size(&m); i > 0 && size > l.r.cfg.maxBatchBytes {
			batch = batch[:i]
			// Claim no more than fits next time: the rest would be read
			// again and again only to be dropped here. The rest waits:
			// claim it at once.
			l.pace.capped(i)
			l.backlog = true
			break
		}
		msgs = append(msgs, m)
	}
	if f := l.r.cfg.hooks.Batch; f != nil {
		f(len(batch))
	}
	fl := &flight{batch: batch, msgs: msgs, done: make(chan struct{})}
	// kafka-go gives every new partition batch room for BatchSize messages
	// up front (76 KB at 500), whatever the call holds: sized to the call,
	// a trickle of one-row batches no longer allocates a full batch each,
	// which drove the garbage collector, and a partition's share still
	// fits one batch, so one produce request. The loop's writer is its own
	// and one call runs at a time (the flight; retryByTopic sends subsets
	// of it), so nothing reads the field meanwhile.
	l.w.BatchSize = max(1, len(msgs))
	go func() {
		defer close(fl.done)
		ctx, end := l.r.tracer.start(l.grace, fl)
		fl.err = l.w.WriteMessages(ctx, fl.msgs...)
		if fl.err != nil && l.grace.Err() == nil {
			fl.err = l.retryByTopic(ctx, fl.msgs, fl.err)
		}
		end(fl.err)
	}()
	return fl, nil
}

// judge splits a finished flight into what to mark and parks the keys and
// topics that failed.
func (l *loop) judge(fl *flight) *outcome {
	out := &outcome{batch: fl.batch, pubErr: fl.err}
	if fl.err != nil && l.grace.Err() != nil {
		// The shutdown grace ran out mid-publish: abandon; nothing is
		// marked, the rows are re-sent by whoever owns the lanes next.
		out.abandoned = true
		return out
	}
	out.acked, out.failed, out.failing = ackedRows(fl.batch, fl.err)
	out.refusedTopics = refusedTopics(fl.batch, fl.err)
	if len(out.refusedTopics) > 0 {
		// The topic's rows wait as a whole; parking its keys as well
		// would only grow the claim's parameters.
		down := make(map[string]bool, len(out.refusedTopics))
		for _, t := range out.refusedTopics {
			down[t] = true
		}
		out.failing = slices.DeleteFunc(out.failing, func(k topicKey) bool { return down[k.topic] })
	}
	if len(out.acked) > 0 {
		l.r.dep(depKafka, nil)
	}
	if fl.err == nil {
		l.r.folds.recovered(depPublish)
	}
	if len(l.parked) > 0 && len(out.acked) > 0 {
		// Keys that got through are no longer parked.
		still := make(map[topicKey]bool, len(out.failing))
		for _, k := range out.failing {
			still[k] = true
		}
		for i := range fl.batch {
			if k := (topicKey{fl.batch[i].Topic, string(fl.batch[i].Key)}); !still[k] {
				delete(l.parked, k)
			}
		}
	}
	if len(l.parkedTopics) > 0 && len(out.acked) > 0 {
		// Topics that got through are no longer parked.
		ok := make(map[int64]bool, len(out.acked))
		for _, id := range out.acked {
			ok[id] = true
		}
		for i := range fl.batch {
			if ok[fl.batch[i].ID] {
				delete(l.parkedTopics, fl.batch[i].Topic)
			}
		}
	}
	if fl.err != nil {
		// Nothing went through and no topic was parked: the relay backs
		// off as a whole. Keys the brokers refused stay parked as well;
		// keys that failed for want of reaching the brokers are not at
		// fault, and parked they would sit out their own backoff after
		// the brokers are back, when the relay is woken to resume
		// (docs/design.md, "Recovery at the speed of the dependency").
		out.wholeCallError = len(out.acked) == 0 && len(out.refusedTopics) == 0
		out.unreachable = out.wholeCallError && unreachable(fl.err)
		if !out.unreachable {
			l.park(out.failing)
		}
		l.parkTopics(out.refusedTopics)
	}
	return out
}

// unreachable reports whether a publish that failed as a whole failed to
// reach the brokers rather than being refused by them: no per-message
// error is a broker's answer (a kafka.Error) but network errors and
// timeouts, or the call failed before producing (its metadata request).
func unreachable(err error) bool {
	var werrs kafka.WriteErrors
	if !errors.As(err, &werrs) {
		return true
	}
	for _, e := range werrs {
		var ke kafka.Error
		if errors.As(e, &ke) {
			return false
		}
	}
	return true
}

// settle marks a judged batch: the acknowledged rows published, the failed
// ones with their error. The broker has the acknowledged rows, so this runs
// even while ctx is being canceled, to spare the consumers duplicates. It
// returns the number of rows marked published.
func (l *loop) settle(out *outcome) (int, error) {
	if out == nil || out.abandoned {
		return 0, nil
	}
	mctx, cancel := context.WithTimeout(context.WithoutCancel(l.grace), 10*time.Second)
	defer cancel()
	if len(out.acked) > 0 {
		if _, err := l.s.conn.Exec(mctx, l.q.markPublished, out.acked); err != nil {
			return 0, dbErr(fmt.Errorf("outbox: relay: mark published: %w", err))
		}
	}
	if len(out.failed) > 0 {
		if _, err := l.s.conn.Exec(mctx, l.q.markFailed, out.failed, failureText(out.pubErr)); err != nil {
			return 0, dbErr(fmt.Errorf("outbox: relay: record failure: %w", err))
		}
	}
	if len(out.acked) > 0 {
		l.r.health.progress()
		if f := l.r.cfg.hooks.Published; f != nil {
			f(len(out.acked))
		}
	}
	return len(out.acked), nil
}

// publishError is a publish in which rows failed. Its text sums the
// per-message errors up (each distinct error once, with its row count and
// topics) where kafka.WriteErrors repeats one text per message.
type publishError struct{ out *outcome }

func (e *publishError) Error() string {
	out := e.out
	var werrs kafka.WriteErrors
	if !errors.As(out.pubErr, &werrs) || len(werrs) != len(out.batch) {
		return fmt.Sprintf("outbox: relay: publish %d rows: %v", len(out.batch), out.pubErr)
	}
	type group struct {
		rows   int
		topics []string
	}
	var order []string
	groups := map[string]*group{}
	for i, err := range werrs {
		if err == nil {
			continue
		}
		text := err.Error()
		g := groups[text]
		if g == nil {
			g = &group{}
			groups[text] = g
			order = append(order, text)
		}
		g.rows++
		if t := out.batch[i].Topic; !slices.Contains(g.topics, t) {
			g.topics = append(g.topics, t)
		}
	}
	parts := make([]string, len(order))
	for i, text := range order {
		g := groups[text]
		parts[i] = fmt.Sprintf("%s (%d rows, topics %q)", text, g.rows, g.topics)
	}
	return fmt.Sprintf("outbox: relay: publish: %d of %d rows failed: %s", len(out.failed), len(out.batch), strings.Join(parts, "; "))
}

func (e *publishError) Unwrap() error { return e.out.pubErr }

// retryByTopic handles a call that failed as a whole before sending
// anything (kafka-go checks every message's topic first, so one missing
// topic fails the call): if the batch spans several topics, it publishes
// them one topic at a time, so a bad topic fails alone and its keys get
// parked while the other topics flow. Topics are independent for ordering.
// It returns per-message errors (kafka.WriteErrors), or the original error
// when there is nothing to split.
func (l *loop) retryByTopic(ctx context.Context, msgs []kafka.Message, pubErr error) error {
	var werrs kafka.WriteErrors
	if errors.As(pubErr, &werrs) {
		return pubErr
	}
	var order []string
	byTopic := map[string][]int{}
	for i := range msgs {
		t := msgs[i].Topic
		if _, ok := byTopic[t]; !ok {
			order = append(order, t)
		}
		byTopic[t] = append(byTopic[t], i)
	}
	if len(order) < 2 {
		if isTopicError(pubErr) {
			// The one topic is refused as a whole: say so per message,
			// so the topic gets parked rather than the relay stopped.
			werrs = make(kafka.WriteErrors, len(msgs))
			for i := range werrs {
				werrs[i] = pubErr
			}
			return werrs
		}
		return pubErr
	}
	werrs = make(kafka.WriteErrors, len(msgs))
	failed := false
	for _, t := range order {
		idx := byTopic[t]
		sub := make([]kafka.Message, len(idx))
		for j, i := range idx {
			sub[j] = msgs[i]
		}
		err := l.w.WriteMessages(ctx, sub...)
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return err
		}
		failed = true
		var sw kafka.WriteErrors
		for j, i := range idx {
			if errors.As(err, &sw) && len(sw) == len(idx) {
				werrs[i] = sw[j]
			} else {
				werrs[i] = err
			}
		}
	}
	if !failed {
		return nil
	}
	return werrs
}

// isTopicError reports whether err (possibly wrapped) is the broker refusing
// a topic as a whole: it does not exist, its name is invalid, or the relay
// may not write to it.
func isTopicError(err error) bool {
	var ke kafka.Error
	if !errors.As(err, &ke) {
		return false
	}
	switch ke {
	case kafka.UnknownTopicOrPartition, kafka.InvalidTopic, kafka.TopicAuthorizationFailed:
		return true
	}
	return false
}

// refusedTopics returns the topics of a batch whose every message failed
// with a topic-level error (kafka.WriteErrors, per message): those are
// parked as a whole. A topic with one message through, or failing for
// another reason, is left to key parking.
func refusedTopics(batch []claimed, pubErr error) []string {
	var werrs kafka.WriteErrors
	if pubErr == nil || !errors.As(pubErr, &werrs) || len(werrs) != len(batch) {
		return nil
	}
	refused := map[string]bool{}
	var order []string
	for i := range batch {
		t := batch[i].Topic
		bad, seen := refused[t]
		if !seen {
			order = append(order, t)
			bad = true
		}
		refused[t] = bad && isTopicError(werrs[i])
	}
	return slices.DeleteFunc(order, func(t string) bool { return !refused[t] })
}

// failureText is the error recorded on failed rows: for per-message errors,
// the first of them, which kafka.WriteErrors' own text leaves out.
func failureText(err error) string {
	var werrs kafka.WriteErrors
	if errors.As(err, &werrs) {
		for _, e := range werrs {
			if e != nil {
				return fmt.Sprintf("%v: %v", err, e)
			}
		}
	}
	return err.Error()
}

// ackedRows splits a published batch into the rows to mark published and
// those to retry: a row is marked only if the broker acknowledged it and no
// earlier row with the same topic and key failed, so a key never gets ahead
// of one of its own unpublished events. failing lists the keys refused per
// message (kafka.WriteErrors), to be parked; it is empty when the whole
// call failed.
func ackedRows(batch []claimed, pubErr error) (acked, failed []int64, failing []topicKey) {
	if pubErr == nil {
		acked = make([]int64, len(batch))
		for i := range batch {
			acked[i] = batch[i].ID
		}
		return acked, nil, nil
	}
	var werrs kafka.WriteErrors
	if !errors.As(pubErr, &werrs) || len(werrs) != len(batch) {
		failed = make([]int64, len(batch))
		for i := range batch {
			failed[i] = batch[i].ID
		}
		return nil, failed, nil
	}
	blocked := map[topicKey]bool{}
	for i := range batch {
		k := topicKey{batch[i].Topic, string(batch[i].Key)}
		if werrs[i] != nil || blocked[k] {
			if !blocked[k] {
				failing = append(failing, k)
			}
			blocked[k] = true
			failed = append(failed, batch[i].ID)
			continue
		}
		acked = append(acked, batch[i].ID)
	}
	return acked, failed, failing
}
