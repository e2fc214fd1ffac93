package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/envelope"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
	"github.com/protoevents/protoevents/runtime/saga"
)

// TestSagaCommands drives a saga into parking through its reply handler
// (as a consumer would), then lists, shows and retries it with eventsctl.
func TestSagaCommands(t *testing.T) {
	ctx := context.Background()
	pool, schema := servers.DB(t)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := saga.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	desc := func(name string) *events.Descriptor {
		d := testenv.Descriptor("cli-" + name)
		d.Type = "test.cli." + name
		return d
	}
	cmdA, replyA, undoA, undoReplyA, cmdB, replyB := desc("cmd-a"), desc("reply-a"), desc("undo-a"), desc("undo-reply-a"), desc("cmd-b"), desc("reply-b")
	type data struct{ ID string }
	ok := func(d *data, ev testenv.Event) saga.Outcome {
		if ev.Fields["ok"].GetBoolValue() {
			return saga.Success()
		}
		return saga.Failure("refused")
	}
	w, err := outbox.NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	sg, err := saga.New(saga.Definition[data]{Name: "cli", Steps: []saga.Step[data]{
		{Name: "a", Command: func(d *data) events.Event { return testenv.NewEvent(cmdA, d.ID, 0) }, OnReply: []saga.Reply[data]{saga.On(replyA, ok)},
			Compensation: func(d *data) events.Event { return testenv.NewEvent(undoA, d.ID, 0) }, OnCompensationReply: []saga.Reply[data]{saga.On(undoReplyA, ok)}},
		{Name: "b", Command: func(d *data) events.Event { return testenv.NewEvent(cmdB, d.ID, 0) }, OnReply: []saga.Reply[data]{saga.On(replyB, ok)}},
	}}, w, saga.WithCompensationRetries(1, saga.DefaultBackoff, saga.DefaultBackoff))
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return sg.Start(ctx, tx, "s-1", data{ID: "s-1"}) }); err != nil {
		t.Fatal(err)
	}
	// reply answers the command the saga waits for, as a participant would.
	reply := func(d *events.Descriptor, okay bool) {
		t.Helper()
		info, err := saga.Get(ctx, pool, "s-1")
		if err != nil {
			t.Fatal(err)
		}
		ev := testenv.NewEvent(d, "s-1", 0)
		ev.Fields["ok"] = structpb.NewBoolValue(okay)
		meta := events.Meta{Metadata: events.Metadata{EventID: envelope.NewEventID(), CorrelationID: "s-1", CausationID: info.Awaiting}}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return sg.Handle(ctx, tx, meta, ev) }); err != nil {
			t.Fatal(err)
		}
	}
	reply(replyA, true)
	reply(replyB, false)
	reply(undoReplyA, false)

	env := map[string]string{"PROTOEVENTS_DATABASE_URL": servers.ServerURL(t)}
	table := []string{"--table", schema + ".sagas"}
	code, out, errOut := cli(t, env, append([]string{"saga", "list", "--status", "parked"}, table...)...)
	if code != 0 || !strings.Contains(out, "s-1") || !strings.Contains(out, "parked") || !strings.Contains(out, "0 pending, 0 compensating, 0 completed, 0 compensated, 1 parked") {
		t.Fatalf("saga list: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, env, append([]string{"saga", "show", "--id", "s-1"}, table...)...)
	for _, want := range []string{"saga s-1 (cli): parked at step 0 a", "failure: compensation of a failed 1 times", "step-succeeded", "step-failed", "compensation-sent", "parked", "test.cli.cmd-b"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("saga show: exit %d, want %q in\n%s%s", code, want, out, errOut)
		}
	}
	if code, out, errOut = cli(t, env, append([]string{"saga", "retry", "--id", "s-1"}, table...)...); code != 0 {
		t.Fatalf("saga retry: exit %d\n%s%s", code, out, errOut)
	}
	if info, err := saga.Get(ctx, pool, "s-1"); err != nil || info.Status != saga.StatusCompensating || info.DeadlineKind != "retry" {
		t.Fatalf("after retry: %+v %v; want compensating with a retry deadline", info, err)
	}
	if code, _, errOut = cli(t, env, append([]string{"saga", "retry", "--id", "s-1"}, table...)...); code != exitFailed || !strings.Contains(errOut, "not parked") {
		t.Fatalf("second retry: exit %d, %s", code, errOut)
	}
	if code, _, errOut = cli(t, env, append([]string{"saga", "show", "--id", "nope"}, table...)...); code != exitFailed || !strings.Contains(errOut, "no such saga") {
		t.Fatalf("show unknown: exit %d, %s", code, errOut)
	}
	if code, _, _ = cli(t, env, "saga", "list", "--status", "weird"); code != 2 {
		t.Fatalf("bad status: exit %d, want 2", code)
	}
	// The timer fires the operator's retry: the compensation is sent again.
	if fired, err := sg.FireDue(ctx, pool); err != nil || !fired {
		t.Fatalf("FireDue: %v %v", fired, err)
	}
	if info, _ := saga.Get(ctx, pool, "s-1"); info.Status != saga.StatusCompensating || info.Attempt != 1 || info.Awaiting == "" {
		t.Fatalf("after firing the retry: %+v", info)
	}
}
