package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/internal/faults"
)

// Kinds of deadline a saga row may carry.
const (
	deadlineTimeout = "timeout" // no reply to the awaited command in time
	deadlineRetry   = "retry"   // send the compensation again
)

// Transition describes one committed (or about to commit) change of a
// saga, for hooks.
type Transition struct {
	SagaID string
	Saga   string
	// Kind is the last path entry the transition wrote, e.g. "sent",
	// "compensation-sent", "completed", "late-reply-ignored".
	Kind string
	// Status and Step are the saga's state after the transition.
	Status Status
	Step   int
}

// state is one saga row.
type state struct {
	id, typ      string
	status       Status
	step         int
	stepName     string
	data         []byte
	awaiting     string
	attempt      int
	deadline     *time.Time
	deadlineKind string
	failure      string
	version      int64
	created      time.Time
	updated      time.Time

	// after is the deadline to write, relative to the database's clock;
	// nil clears it. keep leaves the stored deadline as it is.
	after *time.Duration
	keep  bool
	// last is the kind of the last path entry written.
	last string
}

func scanState(row pgx.Row) (*state, error) {
	st := &state{}
	var status string
	err := row.Scan(&st.id, &st.typ, &status, &st.step, &st.stepName, &st.data, &st.awaiting, &st.attempt,
		&st.deadline, &st.deadlineKind, &st.failure, &st.version, &st.created, &st.updated)
	st.status = Status(status)
	return st, err
}

// txn is one transition in progress: a locked saga row, its decoded data
// and the transaction everything is written in.
type txn[D any] struct {
	sg    *Saga[D]
	ctx   context.Context
	tx    pgx.Tx
	st    *state
	data  *D
	cause string // the event ID that caused the transition, if any
}

func (t *txn[D]) errorf(format string, args ...any) error {
	return fmt.Errorf("saga %s %s: "+format, append([]any{t.sg.def.Name, t.st.id}, args...)...)
}

// at moves the saga to step i.
func (t *txn[D]) at(i int) {
	t.st.step = i
	if i >= 0 && i < len(t.sg.def.Steps) {
		t.st.stepName = t.sg.def.Steps[i].Name
	}
}

// record appends one entry to the saga's path.
func (t *txn[D]) record(kind, eventID, commandID, detail string) error {
	t.st.last = kind
	if _, err := t.tx.Exec(t.ctx, t.sg.s.sql.history, t.st.id, t.st.step, t.st.stepName, kind, string(t.st.status), eventID, commandID, detail); err != nil {
		return t.errorf("record %s: %w", kind, err)
	}
	return nil
}

// send writes a command through the outbox, correlated with the saga and
// caused by the transition's cause.
func (t *txn[D]) send(ev events.Event) (string, error) {
	if ev == nil {
		return "", t.errorf("step %q built a nil command", t.st.stepName)
	}
	opts := []events.PublishOption{events.WithCorrelationID(t.st.id)}
	if t.cause != "" {
		opts = append(opts, events.WithCausationID(t.cause))
	}
	id, err := t.sg.w.Write(t.ctx, t.tx, ev, opts...)
	if err != nil {
		return "", t.errorf("step %q: send %s: %w", t.st.stepName, ev.EventDescriptor().Type, err)
	}
	return id.String(), nil
}

func (t *txn[D]) setDeadline(kind string, after time.Duration) {
	t.st.deadlineKind, t.st.after, t.st.keep = kind, &after, false
}

func (t *txn[D]) clearDeadline() { t.st.deadlineKind, t.st.after, t.st.keep = "", nil, false }

// advance runs the steps from i on: local ones in this transaction, until
// a remote step sends its command (and the saga waits) or the saga
// completes.
func (t *txn[D]) advance(i int) error {
	for ; i < len(t.sg.def.Steps); i++ {
		step := &t.sg.def.Steps[i]
		t.at(i)
		t.st.status = StatusPending
		if !step.remote() {
			out, err := step.Local(t.ctx, t.tx, t.st.id, t.data)
			if err != nil {
				return t.errorf("local step %q: %w", step.Name, err)
			}
			if out.failed {
				t.st.failure = fmt.Sprintf("step %s failed: %s", step.Name, out.reason)
				if err := t.record("local-failed", "", "", out.reason); err != nil {
					return err
				}
				return t.compensate(i - 1)
			}
			if err := t.record("local-succeeded", "", "", ""); err != nil {
				return err
			}
			continue
		}
		ev := step.Command(t.data)
		id, err := t.send(ev)
		if err != nil {
			return err
		}
		t.st.awaiting, t.st.attempt = id, 0
		if step.Timeout > 0 {
			t.setDeadline(deadlineTimeout, step.Timeout)
		} else {
			t.clearDeadline()
		}
		return t.record("sent", "", id, ev.EventDescriptor().Type)
	}
	t.at(len(t.sg.def.Steps) - 1)
	t.st.status, t.st.awaiting = StatusCompleted, ""
	t.clearDeadline()
	return t.record("completed", "", "", "")
}

// compensate undoes the steps from i down to the first: local
// compensations run in this transaction; the first remote one is sent and
// the saga waits for its reply. With nothing left, the saga is
// compensated.
func (t *txn[D]) compensate(i int) error {
	t.st.status, t.st.awaiting = StatusCompensating, ""
	t.clearDeadline()
	for ; i >= 0; i-- {
		step := &t.sg.def.Steps[i]
		t.at(i)
		switch {
		case step.CompensateLocal != nil:
			if err := step.CompensateLocal(t.ctx, t.tx, t.st.id, t.data); err != nil {
				return t.errorf("local compensation of %q: %w", step.Name, err)
			}
			if err := t.record("compensated-local", "", "", ""); err != nil {
				return err
			}
		case step.Compensation != nil:
			t.st.attempt = 0
			return t.sendCompensation()
		}
	}
	t.at(0)
	t.st.status = StatusCompensated
	return t.record("compensated", "", "", t.st.failure)
}

// sendCompensation sends the current step's compensation (again).
func (t *txn[D]) sendCompensation() error {
	step := &t.sg.def.Steps[t.st.step]
	ev := step.Compensation(t.data)
	id, err := t.send(ev)
	if err != nil {
		return err
	}
	t.st.status, t.st.awaiting = StatusCompensating, id
	t.st.attempt++
	if step.CompensationTimeout > 0 {
		t.setDeadline(deadlineTimeout, step.CompensationTimeout)
	} else {
		t.clearDeadline()
	}
	return t.record("compensation-sent", "", id, fmt.Sprintf("%s (attempt %d)", ev.EventDescriptor().Type, t.st.attempt))
}

// compensationFailed schedules the next try of the current compensation,
// or parks the saga when the budget is spent.
func (t *txn[D]) compensationFailed(eventID, reason string) error {
	t.st.awaiting = ""
	if t.st.attempt >= t.sg.s.attempts {
		t.st.status = StatusParked
		t.clearDeadline()
		t.st.failure = fmt.Sprintf("compensation of %s failed %d times: %s", t.st.stepName, t.st.attempt, reason)
		if err := t.record("compensation-failed", eventID, "", reason); err != nil {
			return err
		}
		return t.record("parked", "", "", t.st.failure)
	}
	wait := t.sg.s.backoffFor(t.st.attempt)
	t.setDeadline(deadlineRetry, wait)
	return t.record("compensation-failed", eventID, "", fmt.Sprintf("%s; retry in %s", reason, wait))
}

// save writes the state back, checking that nobody moved it meanwhile.
func (t *txn[D]) save() error {
	b, err := json.Marshal(t.data)
	if err != nil {
		return t.errorf("encode data: %w", err)
	}
	var after *float64
	if t.st.after != nil {
		s := t.st.after.Seconds()
		after = &s
	}
	tag, err := t.tx.Exec(t.ctx, t.sg.s.sql.update, t.st.id, t.st.version, string(t.st.status), t.st.step, t.st.stepName,
		b, t.st.awaiting, t.st.attempt, after, t.st.deadlineKind, t.st.failure, t.st.keep)
	if err != nil {
		return t.errorf("update state: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return t.errorf("state moved under a FOR UPDATE lock (version %d)", t.st.version)
	}
	t.st.version++
	// A test's fault point (runtime/faultinject), carried by the context of
	// the Run the transition runs under: the reply consumer's (its handler
	// contexts derive from it) or the timeout runner's.
	if f := faults.SagaFrom(t.ctx).InTransaction; f != nil {
		tr := t.transition()
		f(faults.Transition{SagaID: tr.SagaID, Saga: tr.Saga, Kind: tr.Kind, Status: string(tr.Status), Step: tr.Step})
	}
	return nil
}

func (t *txn[D]) transition() Transition {
	return Transition{SagaID: t.st.id, Saga: t.st.typ, Kind: t.st.last, Status: t.st.status, Step: t.st.step}
}

// load locks the saga row through q and decodes its data.
func (sg *Saga[D]) load(ctx context.Context, tx pgx.Tx, row pgx.Row, cause string) (*txn[D], error) {
	st, err := scanState(row)
	if err != nil {
		return nil, err
	}
	var d D
	if err := json.Unmarshal(st.data, &d); err != nil {
		return nil, fmt.Errorf("saga %s %s: decode data: %w", sg.def.Name, st.id, err)
	}
	t := &txn[D]{sg: sg, ctx: ctx, tx: tx, st: st, data: &d, cause: cause}
	// Keep the deadline as it is unless the transition changes it.
	st.keep = true
	return t, nil
}

// rule returns the reply rule of the saga's current step and phase for an
// event type, or nil.
func (t *txn[D]) rule(eventType string) *Reply[D] {
	if t.st.step < 0 || t.st.step >= len(t.sg.def.Steps) {
		return nil
	}
	step := &t.sg.def.Steps[t.st.step]
	rs := step.OnReply
	if t.st.status == StatusCompensating {
		rs = step.OnCompensationReply
	}
	for i := range rs {
		if rs[i].desc.Type == eventType {
			return &rs[i]
		}
	}
	return nil
}

// Handle applies one reply event to the saga it is correlated with, inside
// tx: the consumer's dedup transaction, which records the reply as
// consumed. It returns nil for events that belong to no saga of this type
// (no correlation ID, an unknown one, another saga type's), so a reply
// topic may be shared. A reply that does not answer the command the saga
// waits for is recorded in the path as ignored. Handle must not commit or
// roll back tx; an error rolls the transition back and the consumer
// retries the reply.
func (sg *Saga[D]) Handle(ctx context.Context, tx pgx.Tx, meta events.Meta, ev events.Event) error {
	if meta.CorrelationID == "" || ev == nil {
		return nil
	}
	t, err := sg.load(ctx, tx, tx.QueryRow(ctx, sg.s.sql.lockRow, meta.CorrelationID), meta.EventID.String())
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("saga %s: reply %s for %s: %w", sg.def.Name, meta.EventID, meta.CorrelationID, err)
	}
	if t.st.typ != sg.def.Name {
		return nil
	}
	eventID, eventType := meta.EventID.String(), ev.EventDescriptor().Type
	var why string
	rule := t.rule(eventType)
	switch {
	case t.st.status.Final():
		why = "saga is " + string(t.st.status)
	case t.st.awaiting == "":
		why = "no command awaits a reply"
	case meta.CausationID != t.st.awaiting:
		why = fmt.Sprintf("answers %q, the saga awaits %q", meta.CausationID, t.st.awaiting)
	case rule == nil:
		why = fmt.Sprintf("not a reply step %q expects while %s", t.st.stepName, t.st.status)
	}
	if why != "" {
		sg.s.logger.Info("saga: reply ignored", "saga", sg.def.Name, "id", t.st.id, "event", eventID, "type", eventType, "why", why)
		if err := t.record("late-reply-ignored", eventID, "", eventType+": "+why); err != nil {
			return err
		}
		return t.save()
	}
	out, err := rule.decide(t.data, ev)
	if err != nil {
		return t.errorf("decide %s: %w", eventType, err)
	}
	switch {
	case t.st.status == StatusPending && !out.failed:
		if err := t.record("step-succeeded", eventID, "", eventType); err != nil {
			return err
		}
		err = t.advance(t.st.step + 1)
	case t.st.status == StatusPending:
		t.st.failure = fmt.Sprintf("step %s failed: %s", t.st.stepName, out.reason)
		if err := t.record("step-failed", eventID, "", eventType+": "+out.reason); err != nil {
			return err
		}
		err = t.compensate(t.st.step - 1)
	case !out.failed:
		if err := t.record("compensation-succeeded", eventID, "", eventType); err != nil {
			return err
		}
		err = t.compensate(t.st.step - 1)
	default:
		err = t.compensationFailed(eventID, eventType+": "+out.reason)
	}
	if err != nil {
		return err
	}
	return t.save()
}

// fire runs the transition of a due deadline.
func (t *txn[D]) fire() error {
	step := &t.sg.def.Steps[t.st.step]
	switch {
	case t.st.status == StatusPending && t.st.deadlineKind == deadlineTimeout:
		t.st.failure = fmt.Sprintf("step %s timed out after %s", step.Name, step.Timeout)
		if err := t.record("timed-out", "", "", fmt.Sprintf("no reply to %s within %s", t.st.awaiting, step.Timeout)); err != nil {
			return err
		}
		// The outcome is unknown: compensate this step too.
		return t.compensate(t.st.step)
	case t.st.status == StatusCompensating && t.st.deadlineKind == deadlineTimeout:
		return t.compensationFailed("", fmt.Sprintf("no reply to %s within %s", t.st.awaiting, step.CompensationTimeout))
	case t.st.status == StatusCompensating && t.st.deadlineKind == deadlineRetry:
		if step.Compensation == nil {
			return t.compensate(t.st.step - 1)
		}
		return t.sendCompensation()
	default:
		t.clearDeadline()
		return nil
	}
}
