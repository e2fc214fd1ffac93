// Package saga runs orchestrated sagas: business flows that span services
// without a distributed transaction, as a sequence of local transactions,
// each with a compensating action that undoes it when a later step fails.
//
// A saga adds no delivery mechanism of its own; it composes the two the
// runtime already trusts. Its state is a row in Postgres. Every transition
// is one database transaction that records the reply as consumed (the
// idempotent consumer's dedup row: saga reply handlers run inside consumer
// handlers), moves the state (the row is locked with SELECT … FOR UPDATE
// and its version checked) and writes the next command or compensation
// through the transactional outbox. So a crash anywhere either loses the
// whole transition (the reply is delivered again) or keeps all of it (the
// redelivered reply is absorbed by the dedup table), and every command a
// transition sends reaches its participant, whose own consumer applies it
// once.
//
// # Definition
//
// A Definition is typed over the saga's data D (any JSON-encodable type)
// and the generated event types. Each Step either sends a command event
// built from the data (Command) and waits for one of its replies (OnReply:
// Succeeds, Fails or On, which decides), or runs locally in the
// orchestrator's own transaction (Local). A remote step may have a
// Timeout. Its compensation is a command too (Compensation, with
// OnCompensationReply) or local (CompensateLocal).
//
// Replies are matched to their saga by correlation ID (the saga ID, which
// every command carries; participants reply with events.CausedBy) and to
// the command they answer by causation ID: a reply to anything but the
// command the saga is waiting for — a late reply after a timeout, a reply
// to a superseded compensation attempt — is recorded in the saga's path as
// ignored and changes nothing.
//
// # Failure semantics
//
//   - A step that fails (a Fails reply, or On deciding Failure) triggers
//     the compensation of every completed step, in reverse order; the
//     failed step itself is not compensated (it did not happen).
//   - A step whose timeout fires has an unknown outcome: it is compensated
//     too, so its compensation must tolerate "never happened" (and the
//     participant must refuse the original command if it arrives after the
//     compensation).
//   - A compensation that fails (or times out) is sent again, as a new
//     command, after a backoff (WithCompensationRetries); past the budget
//     the saga is parked for an operator, who retries it (Retry, eventsctl
//     saga retry). Nothing is dropped.
//   - Every saga ends completed, compensated or parked, and says which
//     (Get, List, Path).
//
// The timeout runner (RunTimeouts) fires step timeouts and compensation
// retries from the deadline column, with FOR UPDATE SKIP LOCKED, so any
// number of orchestrator instances may run it.
package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// Status is where a saga is in its life.
type Status string

// The statuses of a saga. Pending and compensating are in flight;
// completed, compensated and parked are where every saga ends (a parked
// saga waits for an operator's Retry).
const (
	StatusPending      Status = "pending"
	StatusCompensating Status = "compensating"
	StatusCompleted    Status = "completed"
	StatusCompensated  Status = "compensated"
	StatusParked       Status = "parked"
)

// Final reports whether the saga has stopped moving on its own.
func (s Status) Final() bool {
	return s == StatusCompleted || s == StatusCompensated || s == StatusParked
}

// Outcome is what a reply says about its step: success, or a business
// failure with a reason.
type Outcome struct {
	failed bool
	reason string
}

// Success is the outcome of a step (or compensation) that took effect.
func Success() Outcome { return Outcome{} }

// Failure is the outcome of a step (or compensation) that did not take
// effect, with the reason recorded in the saga's path.
func Failure(reason string) Outcome { return Outcome{failed: true, reason: reason} }

// Failed reports whether the outcome is a failure.
func (o Outcome) Failed() bool { return o.failed }

// replyKind says what a reply rule can decide; Mermaid draws from it.
type replyKind int

const (
	kindSucceeds replyKind = iota
	kindFails
	kindDecides
)

// Reply is how a step reacts to one reply event type. Build it with
// Succeeds, Fails or On.
type Reply[D any] struct {
	desc   *events.Descriptor
	kind   replyKind
	decide func(d *D, ev events.Event) (Outcome, error)
}

func typed[R events.Event](desc *events.Descriptor, ev events.Event) (R, error) {
	r, ok := ev.(R)
	if !ok {
		return r, fmt.Errorf("saga: reply %s decoded as %T, want %T", desc.Type, ev, r)
	}
	return r, nil
}

// On reacts to reply events of desc's type with fn, which may update the
// saga's data and decides whether the step succeeded or failed.
func On[D any, R events.Event](desc *events.Descriptor, fn func(d *D, r R) Outcome) Reply[D] {
	return Reply[D]{desc: desc, kind: kindDecides, decide: func(d *D, ev events.Event) (Outcome, error) {
		r, err := typed[R](desc, ev)
		if err != nil {
			return Outcome{}, err
		}
		return fn(d, r), nil
	}}
}

// Succeeds marks reply events of desc's type as the step's success; fn,
// if not nil, may record what the reply says in the saga's data.
func Succeeds[D any, R events.Event](desc *events.Descriptor, fn func(d *D, r R)) Reply[D] {
	return Reply[D]{desc: desc, kind: kindSucceeds, decide: func(d *D, ev events.Event) (Outcome, error) {
		r, err := typed[R](desc, ev)
		if err != nil {
			return Outcome{}, err
		}
		if fn != nil {
			fn(d, r)
		}
		return Success(), nil
	}}
}

// Fails marks reply events of desc's type as the step's failure; fn, if
// not nil, returns the reason recorded (default: the event type).
func Fails[D any, R events.Event](desc *events.Descriptor, fn func(d *D, r R) string) Reply[D] {
	return Reply[D]{desc: desc, kind: kindFails, decide: func(d *D, ev events.Event) (Outcome, error) {
		r, err := typed[R](desc, ev)
		if err != nil {
			return Outcome{}, err
		}
		reason := desc.Type
		if fn != nil {
			reason = fn(d, r)
		}
		return Failure(reason), nil
	}}
}

// Step is one step of a saga: remote (Command and OnReply) or local
// (Local), each with an optional compensation.
type Step[D any] struct {
	// Name identifies the step in the saga's path and diagram.
	Name string
	// Command builds the command event the step sends from the saga's
	// data. It must be deterministic enough to be idempotent for the
	// participant: it is sent once per transition, with the saga ID as
	// correlation ID.
	Command func(d *D) events.Event
	// OnReply lists the reply events that complete (or fail) the step.
	OnReply []Reply[D]
	// Timeout, if positive, bounds the wait for a reply. When it fires the
	// step's outcome is unknown: it is compensated along with the
	// completed steps. Without one the saga waits for the reply as long as
	// it takes (the consumer never drops it).
	Timeout time.Duration
	// CompensationTimeout, if positive, bounds the wait for a compensation
	// reply; when it fires the attempt counts as failed and the
	// compensation is sent again after the backoff (or the saga parked).
	CompensationTimeout time.Duration
	// Compensation builds the command that undoes the step. It must be
	// idempotent and tolerate a step that never happened.
	Compensation func(d *D) events.Event
	// OnCompensationReply lists the replies to the compensation command.
	OnCompensationReply []Reply[D]
	// Local runs the step in the orchestrator's own transaction instead of
	// sending a command. An error rolls the whole transition back (it is
	// retried with the reply that led to it); a Failure outcome starts the
	// compensation.
	Local func(ctx context.Context, tx pgx.Tx, sagaID string, d *D) (Outcome, error)
	// CompensateLocal undoes the step in the orchestrator's transaction.
	CompensateLocal func(ctx context.Context, tx pgx.Tx, sagaID string, d *D) error
}

func (st *Step[D]) remote() bool { return st.Command != nil }

// Definition is a saga type: its name and its steps, run in order.
type Definition[D any] struct {
	// Name identifies the saga type: it is recorded with every instance
	// and names its consumers ("saga.<name>"). Letters, digits, '.', '_'
	// and '-'.
	Name  string
	Steps []Step[D]
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$`)

// Saga runs the instances of one Definition. It is safe for concurrent use.
type Saga[D any] struct {
	def     Definition[D]
	w       *outbox.Writer
	s       settings
	replies map[string]*events.Descriptor // every reply type, by event type
}

// New checks def and returns a Saga that writes its commands through w.
func New[D any](def Definition[D], w *outbox.Writer, opts ...Option) (*Saga[D], error) {
	s, err := settingsFrom(opts)
	errs := []error{err}
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("saga %s: "+format, append([]any{def.Name}, args...)...))
	}
	if !nameRE.MatchString(def.Name) {
		bad("name must be letters, digits, '.', '_' or '-'")
	}
	if w == nil {
		bad("outbox writer is nil")
	}
	if len(def.Steps) == 0 {
		bad("no steps")
	}
	sg := &Saga[D]{def: def, w: w, s: s, replies: map[string]*events.Descriptor{}}
	names := map[string]bool{}
	checkReplies := func(step, what string, rs []Reply[D]) {
		seen := map[string]bool{}
		for _, r := range rs {
			if r.desc == nil || r.desc.Type == "" || r.decide == nil {
				bad("step %q: %s: a reply without a descriptor", step, what)
				continue
			}
			if seen[r.desc.Type] {
				bad("step %q: %s: reply %s listed twice", step, what, r.desc.Type)
			}
			seen[r.desc.Type] = true
			if old, ok := sg.replies[r.desc.Type]; ok && old != r.desc {
				bad("reply type %s has two descriptors", r.desc.Type)
			}
			sg.replies[r.desc.Type] = r.desc
		}
	}
	for i, st := range def.Steps {
		switch {
		case st.Name == "":
			bad("step %d has no name", i)
		case names[st.Name]:
			bad("step name %q used twice", st.Name)
		}
		names[st.Name] = true
		switch {
		case st.Command != nil && st.Local != nil:
			bad("step %q: both Command and Local; a step is remote or local", st.Name)
		case st.Command == nil && st.Local == nil:
			bad("step %q: neither Command nor Local", st.Name)
		case st.Command != nil && len(st.OnReply) == 0:
			bad("step %q: Command without OnReply: nothing could complete the step", st.Name)
		case st.Local != nil && (len(st.OnReply) > 0 || st.Timeout != 0):
			bad("step %q: a local step takes no replies and no timeout", st.Name)
		case st.Timeout < 0 || st.CompensationTimeout < 0:
			bad("step %q: negative timeout", st.Name)
		}
		switch {
		case st.Compensation != nil && st.CompensateLocal != nil:
			bad("step %q: both Compensation and CompensateLocal", st.Name)
		case st.Compensation != nil && len(st.OnCompensationReply) == 0:
			bad("step %q: Compensation without OnCompensationReply", st.Name)
		case st.Compensation == nil && len(st.OnCompensationReply) > 0:
			bad("step %q: OnCompensationReply without Compensation", st.Name)
		}
		checkReplies(st.Name, "OnReply", st.OnReply)
		checkReplies(st.Name, "OnCompensationReply", st.OnCompensationReply)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return sg, nil
}

// Name returns the saga type's name.
func (sg *Saga[D]) Name() string { return sg.def.Name }

// ConsumerName is the dedup scope of the saga's reply consumers:
// "saga.<name>".
func (sg *Saga[D]) ConsumerName() string { return "saga." + sg.def.Name }

// ReplyTypes returns the descriptors of every reply event the saga reacts
// to, for wiring consumers and provisioning topics.
func (sg *Saga[D]) ReplyTypes() []*events.Descriptor {
	out := make([]*events.Descriptor, 0, len(sg.replies))
	for _, st := range sg.def.Steps {
		for _, rs := range [][]Reply[D]{st.OnReply, st.OnCompensationReply} {
			for _, r := range rs {
				if !containsDesc(out, r.desc) {
					out = append(out, r.desc)
				}
			}
		}
	}
	return out
}

func containsDesc(ds []*events.Descriptor, d *events.Descriptor) bool {
	for _, x := range ds {
		if x.Type == d.Type {
			return true
		}
	}
	return false
}

// ErrExists is returned by Start for a saga ID that is already taken.
var ErrExists = errors.New("saga: a saga with this ID exists already")

// Start begins a saga with the given ID and data inside the caller's
// transaction tx (typically the one that made the business change the saga
// follows up): the state row, the first steps (local ones run right away)
// and the first command all commit or roll back with tx. The ID is the
// correlation ID of every command the saga sends.
func (sg *Saga[D]) Start(ctx context.Context, tx pgx.Tx, id string, data D) error {
	if id == "" {
		return fmt.Errorf("saga %s: start: empty saga ID", sg.def.Name)
	}
	b, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("saga %s: start %s: encode data: %w", sg.def.Name, id, err)
	}
	tag, err := tx.Exec(ctx, sg.s.sql.insert, id, sg.def.Name, StatusPending, 0, sg.def.Steps[0].Name, b)
	if err != nil {
		return fmt.Errorf("saga %s: start %s: insert state into %s (run saga.Migrate?): %w", sg.def.Name, id, sg.s.sql.table, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("saga %s: start %s: %w", sg.def.Name, id, ErrExists)
	}
	st := &state{id: id, typ: sg.def.Name, status: StatusPending, stepName: sg.def.Steps[0].Name, version: 1}
	t := &txn[D]{sg: sg, ctx: ctx, tx: tx, st: st, data: &data}
	if err := t.record("started", "", "", ""); err != nil {
		return err
	}
	if err := t.advance(0); err != nil {
		return err
	}
	return t.save()
}
