package saga

import (
	"fmt"
	"strings"

	"github.com/protoevents/protoevents/runtime/events"
)

// Mermaid returns a Mermaid state diagram of the saga, drawn from its
// definition: each step with the command it sends, the replies that move
// it on or into compensation, its timeout, and the compensations in
// reverse order ending in compensated or parked. Paste it into a
// ```mermaid block of a Markdown file to render it.
func (sg *Saga[D]) Mermaid() string {
	var b strings.Builder
	steps := sg.def.Steps
	id := func(i int) string { return fmt.Sprintf("s%d", i) }
	undo := func(i int) string { return fmt.Sprintf("u%d", i) }
	// undoFrom names the state compensation starts in when it must undo
	// the steps from i down: the first with a compensation, or the end.
	undoFrom := func(i int) string {
		for ; i >= 0; i-- {
			if steps[i].Compensation != nil || steps[i].CompensateLocal != nil {
				return undo(i)
			}
		}
		return "Compensated"
	}
	fmt.Fprintf(&b, "stateDiagram-v2\n    direction LR\n")
	for i, st := range steps {
		what := "local"
		if st.remote() {
			what = "sends " + shortType(sg.commandType(st.Command))
		}
		fmt.Fprintf(&b, "    %s: %s (%s)\n", id(i), st.Name, what)
		if st.Compensation != nil {
			fmt.Fprintf(&b, "    %s: undo %s (sends %s)\n", undo(i), st.Name, shortType(sg.commandType(st.Compensation)))
		} else if st.CompensateLocal != nil {
			fmt.Fprintf(&b, "    %s: undo %s (local)\n", undo(i), st.Name)
		}
	}
	fmt.Fprintf(&b, "    [*] --> %s\n", id(0))
	for i, st := range steps {
		next := "Completed"
		if i+1 < len(steps) {
			next = id(i + 1)
		}
		if !st.remote() {
			fmt.Fprintf(&b, "    %s --> %s: ok\n", id(i), next)
			fmt.Fprintf(&b, "    %s --> %s: failed\n", id(i), undoFrom(i-1))
		}
		for _, r := range st.OnReply {
			name := shortType(r.desc.Type)
			if r.kind != kindFails {
				fmt.Fprintf(&b, "    %s --> %s: %s\n", id(i), next, label(name, r.kind, false))
			}
			if r.kind != kindSucceeds {
				fmt.Fprintf(&b, "    %s --> %s: %s\n", id(i), undoFrom(i-1), label(name, r.kind, true))
			}
		}
		if st.Timeout > 0 {
			fmt.Fprintf(&b, "    %s --> %s: timeout %s\n", id(i), undoFrom(i), st.Timeout)
		}
	}
	for i := len(steps) - 1; i >= 0; i-- {
		st := steps[i]
		if st.Compensation == nil && st.CompensateLocal == nil {
			continue
		}
		prev := undoFrom(i - 1)
		if st.CompensateLocal != nil {
			fmt.Fprintf(&b, "    %s --> %s\n", undo(i), prev)
			continue
		}
		for _, r := range st.OnCompensationReply {
			name := shortType(r.desc.Type)
			if r.kind != kindFails {
				fmt.Fprintf(&b, "    %s --> %s: %s\n", undo(i), prev, label(name, r.kind, false))
			}
			if r.kind != kindSucceeds {
				fmt.Fprintf(&b, "    %s --> %s: %s, retry with backoff\n", undo(i), undo(i), label(name, r.kind, true))
			}
		}
		if st.CompensationTimeout > 0 {
			fmt.Fprintf(&b, "    %s --> %s: timeout %s, retry\n", undo(i), undo(i), st.CompensationTimeout)
		}
		fmt.Fprintf(&b, "    %s --> Parked: retries exhausted\n", undo(i))
	}
	fmt.Fprintf(&b, "    Completed --> [*]\n    Compensated --> [*]\n")
	if strings.Contains(b.String(), "--> Parked") {
		fmt.Fprintf(&b, "    Parked --> [*]: operator retry resumes compensation\n")
	}
	return b.String()
}

// label names a reply edge.
func label(name string, k replyKind, failed bool) string {
	switch {
	case k != kindDecides:
		return name
	case failed:
		return name + " (failure)"
	default:
		return name + " (success)"
	}
}

// commandType returns the event type a command builder makes, by calling
// it on zero data; "command" when it cannot tell.
func (sg *Saga[D]) commandType(build func(*D) events.Event) (name string) {
	defer func() {
		if recover() != nil {
			name = "command"
		}
	}()
	var d D
	ev := build(&d)
	if ev == nil || ev.EventDescriptor() == nil {
		return "command"
	}
	return ev.EventDescriptor().Type
}

// shortType drops the package of a full message name.
func shortType(t string) string {
	if i := strings.LastIndex(t, "."); i >= 0 {
		return t[i+1:]
	}
	return t
}
