// Command eventsctl operates protoevents in production: it migrates the
// schema, runs the outbox relay as a process, provisions and checks the
// event topics from events.lock, reports the outbox's backlog per topic,
// retries, parks or drops stuck outbox rows, lists, shows and redrives
// dead-lettered messages, shows a consumer group's lag and resets its
// offsets for a replay, prunes the dedup table and checks event schemas
// for breaking changes.
//
// Exit codes are the same for every command: 0 success, 1 a check failed
// (outbox status --max-age, consumer status --max-lag/--max-age, topics
// check, compat), 2 usage error, 3 a
// dependency (Postgres, Kafka) unreachable or timed out, 4 any other
// failure. compat keeps its own 0/1/2 (2: inputs unreadable).
//
// Every connection flag also reads an environment variable, so a
// deployment sets them once:
//
//	PROTOEVENTS_DATABASE_URL   --database-url  (also DATABASE_URL)
//	PROTOEVENTS_KAFKA_BROKERS  --brokers       (comma-separated host:port)
//
// Run "eventsctl help" for the commands and "eventsctl <command> -h" for a
// command's flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// command is one eventsctl subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *cliEnv, args []string) error
}

// commands lists the subcommands in help order.
var commands = []command{
	{"migrate", "create or upgrade the outbox and dedup tables (idempotent)", runMigrate},
	{"relay", "run the outbox relay: publish committed events to Kafka", runRelay},
	{"wal", "the WAL relay's replication slot: setup, status (lag, invalidation risk), drop", runWAL},
	{"topics", "create or check event topics and their DLQ topics (from events.lock)", runTopics},
	{"outbox", "outbox status per topic; list, retry, park or drop stuck rows", runOutbox},
	{"dlq", "dead-letter queues: list, show and redrive messages", runDLQ},
	{"consumer", "consumer groups: status (members, lag, oldest unprocessed) and reset for a replay", runConsumer},
	{"saga", "sagas: list, show (the path taken) and retry parked ones", runSaga},
	{"prune", "delete dedup rows older than the retention", runPrune},
	{"compat", "check event schemas for breaking changes against a baseline", runCompat},
	{"version", "print the version", runVersion},
	{"init", "scaffold protoevents in a Go module: buf config, options, a sample event, CI", runInit},
}

// cliEnv carries the process's streams and environment, so tests run
// commands in-process.
type cliEnv struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

// errUsage marks an error whose message is a usage problem (exit code 2).
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, &cliEnv{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}, os.Args[1:]))
}

// run executes one command line and returns the exit code (see
// exitcodes.go): 0 success, 1 a check failed, 2 usage error, 3 a
// dependency unreachable, 4 any other failure.
func run(ctx context.Context, env *cliEnv, args []string) int {
	if len(args) == 1 && (args[0] == "--version" || args[0] == "-version") {
		args = []string{"version"}
	}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) > 1 {
			return run(ctx, env, []string{args[1], "-h"})
		}
		printUsage(env.stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, env, args[1:])
		var exit exitError
		switch {
		case err == nil, errors.Is(err, flag.ErrHelp):
			return exitOK
		case errors.As(err, &exit):
			return int(exit)
		}
		fmt.Fprintf(env.stderr, "eventsctl %s: %v\n", c.name, err)
		return exitCode(err)
	}
	fmt.Fprintf(env.stderr, "eventsctl: unknown command %q; run \"eventsctl help\" for the list\n", args[0])
	return 2
}

// exitError is returned by commands that choose their own exit code.
type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit %d", int(e)) }

func printUsage(w io.Writer) {
	fmt.Fprint(w, `eventsctl operates protoevents: the outbox, its relay, consumers' DLQs and schemas.

Usage:
  eventsctl <command> [flags]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Exit codes:
  0 ok, 1 check failed, 2 usage error, 3 Postgres or Kafka unreachable, 4 other failure

Environment:
  PROTOEVENTS_DATABASE_URL   Postgres URL, for --database-url (DATABASE_URL also works)
  PROTOEVENTS_KAFKA_BROKERS  comma-separated Kafka brokers, for --brokers

Run "eventsctl <command> -h" for a command's flags.
`)
}

// newFlags returns a flag set for a subcommand whose help lists the usage
// line, a description and every flag. Asked-for help goes to stdout, the
// usage after a mistake to stderr.
func newFlags(env *cliEnv, name, usage, desc string) *cmdFlags {
	fs := flag.NewFlagSet("eventsctl "+name, flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: eventsctl %s %s\n\n%s\n\nFlags:\n", name, usage, strings.TrimSpace(desc))
		fs.PrintDefaults()
	}
	return &cmdFlags{FlagSet: fs, help: env.stdout}
}

// cmdFlags is a subcommand's flag set and where its asked-for help goes.
type cmdFlags struct {
	*flag.FlagSet
	help io.Writer
}

// parse parses args, turning flag errors into usage errors. Positional
// arguments are refused: every input is a flag, so a stray word is a
// mistake (and would make the flag package ignore the flags after it).
func parse(fs *cmdFlags, args []string) error {
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			fs.SetOutput(fs.help)
			fs.Usage()
			return flag.ErrHelp
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q (every input is a flag; see -h)", errUsage, fs.Arg(0))
	}
	return nil
}

// flagGiven reports whether the flag was set on the command line.
func flagGiven(fs *cmdFlags, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// dbFlag registers --database-url with its environment defaults.
func dbFlag(fs *cmdFlags, env *cliEnv) *string {
	def := env.getenv("PROTOEVENTS_DATABASE_URL")
	if def == "" {
		def = env.getenv("DATABASE_URL")
	}
	return fs.String("database-url", def, "Postgres URL (env PROTOEVENTS_DATABASE_URL or DATABASE_URL)")
}

// brokersFlag registers --brokers with its environment default.
func brokersFlag(fs *cmdFlags, env *cliEnv) *string {
	return fs.String("brokers", env.getenv("PROTOEVENTS_KAFKA_BROKERS"), "comma-separated Kafka brokers host:port (env PROTOEVENTS_KAFKA_BROKERS)")
}

// need returns a usage error naming the flag and its variable when v is
// empty.
func need(v, flagName, envName string) error {
	if strings.TrimSpace(v) == "" {
		return fmt.Errorf("%w: --%s is required (or set %s)", errUsage, flagName, envName)
	}
	return nil
}

// splitList splits a comma-separated flag value, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// onlySubcommand checks that args start with sub, the one subcommand of
// group (as in "outbox status"), answering -h with usage.
func onlySubcommand(env *cliEnv, args []string, group, sub, usage string) error {
	switch {
	case len(args) > 0 && args[0] == sub:
		return nil
	case len(args) > 0 && (args[0] == "-h" || args[0] == "--help"):
		fmt.Fprintf(env.stdout, "Usage: eventsctl %s %s %s\n", group, sub, usage)
		return flag.ErrHelp
	}
	return fmt.Errorf("%w: want \"eventsctl %s %s\"", errUsage, group, sub)
}
