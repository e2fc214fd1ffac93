package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/protoevents/protoevents/runtime/saga"
)

func runSaga(ctx context.Context, env *cliEnv, args []string) error {
	usage := `Usage: eventsctl saga <list|show|retry> [flags]

  list   list sagas with their status (pending, compensating, completed,
         compensated, parked) and counts per status
  show   print one saga: its state and the path it took, with timestamps,
         the replies consumed and the commands sent
  retry  hand a parked saga back to its orchestrator: the compensation
         budget is reset and the compensation sent again

Run "eventsctl saga <subcommand> -h" for its flags.`
	if len(args) == 0 {
		fmt.Fprintln(env.stderr, usage)
		return fmt.Errorf("%w: missing subcommand", errUsage)
	}
	switch args[0] {
	case "list":
		return runSagaList(ctx, env, args[1:])
	case "show":
		return runSagaShow(ctx, env, args[1:])
	case "retry":
		return runSagaRetry(ctx, env, args[1:])
	case "-h", "--help", "help":
		fmt.Fprintln(env.stdout, usage)
		return flag.ErrHelp
	}
	fmt.Fprintln(env.stderr, usage)
	return fmt.Errorf("%w: unknown subcommand %q", errUsage, args[0])
}

// sagaFlags registers the flags every saga subcommand shares.
func sagaFlags(env *cliEnv, name, usage, desc string) (fs *cmdFlags, db, table *string) {
	fs = newFlags(env, "saga "+name, usage, desc)
	db = dbFlag(fs, env)
	table = fs.String("table", saga.DefaultTable, `saga state table, "name" or "schema.name" (its path table is <name>_history)`)
	return fs, db, table
}

func sagaWhen(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func runSagaList(ctx context.Context, env *cliEnv, args []string) error {
	fs, db, table := sagaFlags(env, "list", "[flags]", `
Lists sagas, oldest first, with their status and the step they are at, and
then the number of sagas in each status.`)
	typ := fs.String("type", "", "only sagas of this type (the definition's name)")
	status := fs.String("status", "", "only sagas in this status: pending, compensating, completed, compensated or parked")
	limit := fs.Int("limit", 100, "at most this many sagas")
	asJSON := fs.Bool("json", false, "print JSON lines instead of a table")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := need(*db, "database-url", "PROTOEVENTS_DATABASE_URL"); err != nil {
		return err
	}
	switch saga.Status(*status) {
	case "", saga.StatusPending, saga.StatusCompensating, saga.StatusCompleted, saga.StatusCompensated, saga.StatusParked:
	default:
		return fmt.Errorf("%w: --status %q: want pending, compensating, completed, compensated or parked", errUsage, *status)
	}
	if *limit < 1 {
		return fmt.Errorf("%w: --limit must be at least 1", errUsage)
	}
	pool, err := connect(ctx, *db)
	if err != nil {
		return err
	}
	defer pool.Close()
	opt := saga.WithTable(*table)
	list, err := saga.List(ctx, pool, saga.Filter{Type: *typ, Status: saga.Status(*status), Limit: *limit}, opt)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(env.stdout)
		for _, s := range list {
			if err := enc.Encode(s); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTYPE\tSTATUS\tSTEP\tATTEMPT\tDEADLINE\tUPDATED\tFAILURE")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", s.ID, s.Type, s.Status, s.StepName, s.Attempt, sagaWhen(s.Deadline),
			s.UpdatedAt.UTC().Format(time.RFC3339), s.Failure)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	counts, err := saga.Counts(ctx, pool, *typ, opt)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "\n%d pending, %d compensating, %d completed, %d compensated, %d parked\n",
		counts[saga.StatusPending], counts[saga.StatusCompensating], counts[saga.StatusCompleted], counts[saga.StatusCompensated], counts[saga.StatusParked])
	return nil
}

func runSagaShow(ctx context.Context, env *cliEnv, args []string) error {
	fs, db, table := sagaFlags(env, "show", "--id ID [flags]", `
Prints one saga's state and its path: every transition with its time, the
step, the status after it, the reply event consumed and the command sent.`)
	id := fs.String("id", "", "saga ID (required)")
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := need(*db, "database-url", "PROTOEVENTS_DATABASE_URL"); err != nil {
		return err
	}
	if *id == "" {
		return fmt.Errorf("%w: --id is required", errUsage)
	}
	pool, err := connect(ctx, *db)
	if err != nil {
		return err
	}
	defer pool.Close()
	opt := saga.WithTable(*table)
	info, err := saga.Get(ctx, pool, *id, opt)
	if err != nil {
		return err
	}
	path, err := saga.Path(ctx, pool, *id, opt)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(env.stdout).Encode(struct {
			saga.Info
			Path []saga.Entry
		}{info, path})
	}
	fmt.Fprintf(env.stdout, "saga %s (%s): %s at step %d %s, version %d\n", info.ID, info.Type, info.Status, info.Step, info.StepName, info.Version)
	if info.Failure != "" {
		fmt.Fprintf(env.stdout, "failure: %s\n", info.Failure)
	}
	if info.Awaiting != "" {
		fmt.Fprintf(env.stdout, "awaiting a reply to: %s\n", info.Awaiting)
	}
	if info.Deadline != nil {
		fmt.Fprintf(env.stdout, "deadline: %s (%s)\n", sagaWhen(info.Deadline), info.DeadlineKind)
	}
	fmt.Fprintf(env.stdout, "data: %s\n\npath:\n", info.Data)
	tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tTRANSITION\tSTEP\tSTATUS\tEVENT\tCOMMAND\tDETAIL")
	for _, e := range path {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.At.UTC().Format("2006-01-02T15:04:05.000Z"), e.Transition, e.StepName, e.Status,
			orDash(e.EventID), orDash(e.CommandID), e.Detail)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func runSagaRetry(ctx context.Context, env *cliEnv, args []string) error {
	fs, db, table := sagaFlags(env, "retry", "--id ID [flags]", `
Hands a parked saga back to its orchestrator: its compensation budget is
reset and the orchestrator's timeout runner sends the compensation again at
once. Fix whatever made the compensation fail first. Only parked sagas can
be retried.`)
	id := fs.String("id", "", "saga ID (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := need(*db, "database-url", "PROTOEVENTS_DATABASE_URL"); err != nil {
		return err
	}
	if *id == "" {
		return fmt.Errorf("%w: --id is required", errUsage)
	}
	pool, err := connect(ctx, *db)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := saga.Retry(ctx, pool, *id, saga.WithTable(*table)); err != nil {
		if errors.Is(err, saga.ErrNotParked) {
			return fmt.Errorf("%w (see eventsctl saga show --id %s)", err, *id)
		}
		return err
	}
	fmt.Fprintf(env.stdout, "saga %s: compensation will be retried by its orchestrator\n", *id)
	return nil
}
