package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/runtime/outbox"
)

const outboxUsage = `Usage: eventsctl outbox <status|list|retry|park|drop> [flags]

  status   pending rows per topic, oldest pending age, failing keys, relays
  list     --stuck: the rows holding their key back (attempts, last error, age);
           --parked: the rows moved out by park or drop; --log: who did what
  retry    make a stuck, parked or dropped row publishable again
  park     move a stuck row out of the outbox so its key's later rows flow;
           it is kept in <outbox>_dead until retried
  drop     move a row out for good; kept in <outbox>_dead for the record

Every retry, park and drop is logged in <outbox>_ops (--by, --reason).
Run "eventsctl outbox <subcommand> -h" for its flags.`

func runOutbox(ctx context.Context, env *cliEnv, args []string) error {
	if len(args) == 0 {
		fmt.Fprintln(env.stderr, outboxUsage)
		return fmt.Errorf("%w: missing subcommand", errUsage)
	}
	switch args[0] {
	case "status":
		return runOutboxStatus(ctx, env, args[1:])
	case "list":
		return runOutboxList(ctx, env, args[1:])
	case "retry", "park", "drop":
		return runOutboxAction(ctx, env, args[0], args[1:])
	case "-h", "--help", "help":
		fmt.Fprintln(env.stdout, outboxUsage)
		return flag.ErrHelp
	}
	fmt.Fprintln(env.stderr, outboxUsage)
	return fmt.Errorf("%w: unknown subcommand %q", errUsage, args[0])
}

// outboxDB registers the flags every outbox subcommand shares.
func outboxDB(env *cliEnv, fs *cmdFlags) (db, table *string) {
	return dbFlag(fs, env), fs.String("outbox-table", outbox.DefaultTable, `outbox table, "name" or "schema.name"`)
}

// seconds renders a duration for JSON output: seconds, as every read
// command does.
func seconds(d time.Duration) float64 { return d.Round(time.Millisecond).Seconds() }

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// outboxError adds the operator's fix to the runtime's errors.
func outboxError(err error) error {
	if errors.Is(err, outbox.ErrNoTable) {
		return fmt.Errorf("%w: run `eventsctl migrate` first (or check --outbox-table)", err)
	}
	return unreachable(err)
}

type topicStatusJSON struct {
	Topic                string  `json:"topic"`
	Pending              int64   `json:"pending"`
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
	Failing              int64   `json:"failing"`
	FailingKeys          int64   `json:"failing_keys"`
	Parked               int64   `json:"parked"`
	Dropped              int64   `json:"dropped"`
}

type statusJSON struct {
	Table                string            `json:"table"`
	Lanes                int               `json:"lanes"`
	Relays               int               `json:"relays"`
	Pending              int64             `json:"pending"`
	OldestPendingSeconds float64           `json:"oldest_pending_seconds"`
	Failing              int64             `json:"failing"`
	LastError            string            `json:"last_error,omitempty"`
	Published            int64             `json:"published"`
	LastPublishedAt      *time.Time        `json:"last_published_at,omitempty"`
	Topics               []topicStatusJSON `json:"topics"`
}

func runOutboxStatus(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "outbox status", "[flags]", `
Reports the outbox's backlog: pending rows, the age of the oldest, rows
whose publishing failed (with the last error), the relays connected, and
per topic the pending rows, the oldest one's age, the failing keys (held
back by the relay) and the rows parked or dropped by operators.
Exits 1 when the oldest pending row is older than --max-age (for alerts),
3 when the database cannot be reached.`)
	db, table := outboxDB(env, fs)
	asJSON := fs.Bool("json", false, "print JSON (snake_case, durations in seconds)")
	maxAge := fs.Duration("max-age", 0, "fail (exit 1) if the oldest pending row is older than this (0: never)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := need(*db, "database-url", "PROTOEVENTS_DATABASE_URL"); err != nil {
		return err
	}
	pool, err := connect(ctx, *db)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := outbox.Status(ctx, pool, outbox.WithTable(*table))
	if err != nil {
		return outboxError(err)
	}
	if *asJSON {
		out := statusJSON{Table: st.Table, Lanes: st.Lanes, Relays: st.Relays, Pending: st.Pending,
			OldestPendingSeconds: seconds(st.OldestPending), Failing: st.Failing, LastError: st.LastError,
			Published: st.Published, Topics: []topicStatusJSON{}}
		if !st.LastPublishedAt.IsZero() {
			t := st.LastPublishedAt.UTC()
			out.LastPublishedAt = &t
		}
		for _, ts := range st.Topics {
			out.Topics = append(out.Topics, topicStatusJSON{ts.Topic, ts.Pending, seconds(ts.OldestPending), ts.Failing, ts.FailingKeys, ts.Parked, ts.Dropped})
		}
		if err := writeJSON(env.stdout, out); err != nil {
			return err
		}
	} else {
		w := tabwriter.NewWriter(env.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintf(w, "table\t%s\n", st.Table)
		fmt.Fprintf(w, "lanes\t%d\n", st.Lanes)
		fmt.Fprintf(w, "relays connected\t%d\n", st.Relays)
		fmt.Fprintf(w, "pending\t%d\n", st.Pending)
		fmt.Fprintf(w, "oldest pending\t%s\n", st.OldestPending.Round(time.Millisecond))
		fmt.Fprintf(w, "failing\t%d\n", st.Failing)
		if st.LastError != "" {
			fmt.Fprintf(w, "last error\t%s\n", oneLine(st.LastError, 200))
		}
		fmt.Fprintf(w, "published (retained)\t%d\n", st.Published)
		if !st.LastPublishedAt.IsZero() {
			fmt.Fprintf(w, "last published\t%s\n", st.LastPublishedAt.UTC().Format(time.RFC3339))
		}
		w.Flush()
		if len(st.Topics) > 0 {
			fmt.Fprintln(env.stdout)
			w = tabwriter.NewWriter(env.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(w, "TOPIC\tPENDING\tOLDEST\tFAILING KEYS\tPARKED\tDROPPED")
			for _, ts := range st.Topics {
				fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%d\t%d\n", ts.Topic, ts.Pending, ts.OldestPending.Round(time.Second), ts.FailingKeys, ts.Parked, ts.Dropped)
			}
			w.Flush()
		}
		if st.Failing > 0 {
			fmt.Fprintln(env.stdout, "\nsee the failing keys: eventsctl outbox list --stuck")
			if strings.Contains(st.LastError, "Unknown Topic") {
				fmt.Fprintln(env.stdout, "a topic is missing: eventsctl topics create --lock events.lock creates every event topic and its DLQ")
			}
		}
	}
	if *maxAge > 0 && st.OldestPending > *maxAge {
		fmt.Fprintf(env.stderr, "eventsctl outbox status: oldest pending row is %s old (> --max-age %s): is a relay running and can it reach Kafka? (eventsctl outbox list --stuck)\n",
			st.OldestPending.Round(time.Second), *maxAge)
		return exitError(exitCheckFailed)
	}
	return nil
}

type stuckJSON struct {
	ID         int64     `json:"id"`
	EventID    string    `json:"event_id"`
	EventType  string    `json:"event_type"`
	Topic      string    `json:"topic"`
	Key        string    `json:"key"`
	Attempts   int       `json:"attempts"`
	LastError  string    `json:"last_error"`
	CreatedAt  time.Time `json:"created_at"`
	AgeSeconds float64   `json:"age_seconds"`
	Waiting    int64     `json:"waiting"`
}

type deadJSON struct {
	ID        int64     `json:"id"`
	EventID   string    `json:"event_id"`
	EventType string    `json:"event_type"`
	Topic     string    `json:"topic"`
	Key       string    `json:"key"`
	State     string    `json:"state"`
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error"`
	MovedAt   time.Time `json:"moved_at"`
	MovedBy   string    `json:"moved_by"`
	Reason    string    `json:"reason"`
	RetriedAs int64     `json:"retried_as,omitempty"`
}

type opJSON struct {
	ID       int64     `json:"id"`
	At       time.Time `json:"at"`
	Actor    string    `json:"actor"`
	DBUser   string    `json:"db_user"`
	Action   string    `json:"action"`
	OutboxID int64     `json:"outbox_id"`
	EventID  string    `json:"event_id"`
	Topic    string    `json:"topic"`
	Key      string    `json:"key"`
	Reason   string    `json:"reason"`
	Detail   string    `json:"detail"`
}

// printableKey shows a key as text when it is printable, else as hex.
func printableKey(k []byte) string {
	s := string(k)
	if strconv.CanBackquote(s) && !strings.ContainsAny(s, "`") {
		return s
	}
	return fmt.Sprintf("0x%x", k)
}

func runOutboxList(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "outbox list", "(--stuck | --parked | --log) [flags]", `
--stuck lists, oldest first, the head row of every key the relay has failed
to publish (the row that holds the key's later rows back), with its
attempts, last error, age and the key's waiting rows. --parked lists the
rows moved out of the outbox by park or drop (and retried ones), --log the
operations on stuck rows: who, when, what and why.`)
	db, table := outboxDB(env, fs)
	stuck := fs.Bool("stuck", false, "list stuck rows")
	parked := fs.Bool("parked", false, "list parked, dropped and retried rows")
	oplog := fs.Bool("log", false, "list the operations on stuck rows")
	topic := fs.String("topic", "", "only this topic")
	state := fs.String("state", "", "with --parked: only parked, dropped or retried rows")
	minAttempts := fs.Int("min-attempts", 1, "with --stuck: the least failed attempts (0 also lists keys never tried)")
	minAge := fs.Duration("min-age", 0, "with --stuck: the least age")
	limit := fs.Int("limit", 100, "at most this many rows")
	asJSON := fs.Bool("json", false, "print JSON (snake_case, durations in seconds)")
	if err := parse(fs, args); err != nil {
		return err
	}
	chosen := 0
	for _, b := range []bool{*stuck, *parked, *oplog} {
		if b {
			chosen++
		}
	}
	if chosen != 1 {
		return fmt.Errorf("%w: choose one of --stuck, --parked or --log", errUsage)
	}
	if *limit < 1 || *minAttempts < 0 || *minAge < 0 {
		return fmt.Errorf("%w: --limit must be positive, --min-attempts and --min-age not negative", errUsage)
	}
	switch *state {
	case "", outbox.StateParked, outbox.StateDropped, outbox.StateRetried:
	default:
		return fmt.Errorf("%w: --state must be parked, dropped or retried, not %q", errUsage, *state)
	}
	if err := need(*db, "database-url", "PROTOEVENTS_DATABASE_URL"); err != nil {
		return err
	}
	pool, err := connect(ctx, *db)
	if err != nil {
		return err
	}
	defer pool.Close()
	opt := outbox.WithTable(*table)
	switch {
	case *stuck:
		rows, err := outbox.ListStuck(ctx, pool, outbox.StuckFilter{MinAttempts: *minAttempts, AnyAttempts: *minAttempts == 0,
			MinAge: *minAge, Topic: *topic, Limit: *limit}, opt)
		if err != nil {
			return outboxError(err)
		}
		if *asJSON {
			out := []stuckJSON{}
			for _, r := range rows {
				out = append(out, stuckJSON{r.ID, r.EventID, r.EventType, r.Topic, printableKey(r.Key), r.Attempts, r.LastError, r.CreatedAt.UTC(), seconds(r.Age), r.Waiting})
			}
			return writeJSON(env.stdout, out)
		}
		if len(rows) == 0 {
			fmt.Fprintln(env.stdout, "no stuck rows")
			return nil
		}
		w := tabwriter.NewWriter(env.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tTOPIC\tKEY\tATTEMPTS\tAGE\tWAITING\tEVENT\tLAST ERROR")
		for _, r := range rows {
			fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s\t%d\t%s %s\t%s\n", r.ID, r.Topic, printableKey(r.Key), r.Attempts,
				r.Age.Round(time.Second), r.Waiting, r.EventType, r.EventID, oneLine(r.LastError, 100))
		}
		w.Flush()
		fmt.Fprintln(env.stdout, "\nfix the cause, then: eventsctl outbox retry --id ID; or set the row aside: eventsctl outbox park --id ID --reason ...")
		return nil
	case *parked:
		rows, err := outbox.ListDead(ctx, pool, *state, *topic, *limit, opt)
		if err != nil {
			return outboxError(err)
		}
		if *asJSON {
			out := []deadJSON{}
			for _, r := range rows {
				out = append(out, deadJSON{r.ID, r.EventID, r.EventType, r.Topic, printableKey(r.Key), r.State, r.Attempts, r.LastError, r.MovedAt.UTC(), r.MovedBy, r.Reason, r.RetriedAs})
			}
			return writeJSON(env.stdout, out)
		}
		if len(rows) == 0 {
			fmt.Fprintln(env.stdout, "no parked or dropped rows")
			return nil
		}
		w := tabwriter.NewWriter(env.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tSTATE\tTOPIC\tKEY\tMOVED\tBY\tREASON\tEVENT")
		for _, r := range rows {
			st := r.State
			if r.RetriedAs != 0 {
				st += fmt.Sprintf(" as %d", r.RetriedAs)
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s %s\n", r.ID, st, r.Topic, printableKey(r.Key),
				r.MovedAt.UTC().Format(time.RFC3339), r.MovedBy, oneLine(r.Reason, 60), r.EventType, r.EventID)
		}
		return w.Flush()
	default:
		ops, err := outbox.Operations(ctx, pool, 0, *limit, opt)
		if err != nil {
			return outboxError(err)
		}
		if *asJSON {
			out := []opJSON{}
			for _, o := range ops {
				out = append(out, opJSON{o.ID, o.At.UTC(), o.Actor, o.DBUser, o.Action, o.OutboxID, o.EventID, o.Topic, printableKey(o.Key), o.Reason, o.Detail})
			}
			return writeJSON(env.stdout, out)
		}
		if len(ops) == 0 {
			fmt.Fprintln(env.stdout, "no operations recorded")
			return nil
		}
		w := tabwriter.NewWriter(env.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "AT\tBY\tACTION\tID\tTOPIC\tKEY\tREASON\tDETAIL")
		for _, o := range ops {
			fmt.Fprintf(w, "%s\t%s (%s)\t%s\t%d\t%s\t%s\t%s\t%s\n", o.At.UTC().Format(time.RFC3339), o.Actor, o.DBUser, o.Action,
				o.OutboxID, o.Topic, printableKey(o.Key), oneLine(o.Reason, 60), oneLine(o.Detail, 80))
		}
		return w.Flush()
	}
}

// defaultActor names the operator for the log: $USER@host.
func defaultActor(env *cliEnv) string {
	user := env.getenv("USER")
	if user == "" {
		user = env.getenv("LOGNAME")
	}
	if user == "" {
		user = "unknown"
	}
	if host, err := os.Hostname(); err == nil && host != "" {
		return user + "@" + host
	}
	return user
}

func runOutboxAction(ctx context.Context, env *cliEnv, action string, args []string) error {
	desc := map[string]string{
		"retry": `Makes rows publishable again. A stuck (pending) row has its failures
cleared (the relay retries its key when the key's backoff ends); a parked or dropped row is copied back
into the outbox under a new id (published after its key's rows that went
through meanwhile; the event ID is kept, so consumers deduplicate it).`,
		"park": `Moves pending rows out of the outbox into <outbox>_dead, so their keys'
later rows are published; "eventsctl outbox retry --id" puts them back.
Per-key order is given up for these rows: a retried row is published after
its key's later rows.`,
		"drop": `Moves pending (or parked) rows out of the outbox into <outbox>_dead as
dropped: they will not be published. Nothing is deleted: the row stays in
<outbox>_dead for the record, and "eventsctl outbox retry --id" can still
put it back.`,
	}[action]
	fs := newFlags(env, "outbox "+action, "--id N[,N...] [flags]", desc+"\n\nThe operation is logged in <outbox>_ops with --by and --reason.")
	db, table := outboxDB(env, fs)
	ids := fs.String("id", "", "comma-separated outbox row ids (see eventsctl outbox list --stuck) (required)")
	by := fs.String("by", defaultActor(env), "who asks, for the log")
	reason := fs.String("reason", "", "why, for the log (required for park and drop)")
	if err := parse(fs, args); err != nil {
		return err
	}
	var list []int64
	for _, p := range splitList(*ids) {
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil || n < 1 {
			return fmt.Errorf("%w: --id %q is not a row id (a positive integer; see eventsctl outbox list --stuck)", errUsage, p)
		}
		list = append(list, n)
	}
	if len(list) == 0 {
		return fmt.Errorf("%w: --id is required (see eventsctl outbox list --stuck)", errUsage)
	}
	if action != "retry" && strings.TrimSpace(*reason) == "" {
		return fmt.Errorf("%w: --reason is required: say why the row is set aside, for whoever reads the log", errUsage)
	}
	if err := need(*db, "database-url", "PROTOEVENTS_DATABASE_URL"); err != nil {
		return err
	}
	pool, err := connect(ctx, *db)
	if err != nil {
		return err
	}
	defer pool.Close()
	do := map[string]func(context.Context, *pgxpool.Pool, int64, outbox.Operation, ...outbox.Option) (outbox.Result, error){
		"retry": outbox.Retry, "park": outbox.Park, "drop": outbox.Drop,
	}[action]
	var errs []error
	for _, id := range list {
		res, err := do(ctx, pool, id, outbox.Operation{By: *by, Reason: *reason}, outbox.WithTable(*table))
		if err != nil {
			errs = append(errs, outboxError(err))
			continue
		}
		switch {
		case res.NewID != 0:
			fmt.Fprintf(env.stdout, "row %d (%s, key %s, event %s): %s -> pending as row %d\n", id, res.Topic, printableKey(res.Key), res.EventID, res.From, res.NewID)
		default:
			fmt.Fprintf(env.stdout, "row %d (%s, key %s, event %s): %s -> %s\n", id, res.Topic, printableKey(res.Key), res.EventID, res.From, res.To)
		}
	}
	return errors.Join(errs...)
}
