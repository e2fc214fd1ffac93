package main

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"

	"github.com/protoevents/protoevents/runtime/walrelay"
)

const walUsage = `Usage: eventsctl wal <setup|status|drop> [flags]

  setup    create the WAL relay's publication and logical replication slot
           (idempotent); run it before the first write with the WAL source
  status   the slot: active relay, confirmed position, WAL retained, and
           how close it is to invalidation (max_slot_wal_keep_size)
  drop     drop the slot and publication; events not yet published are
           lost: move the writers to the outbox table and let the relay
           catch up first (docs/runbook.md, "Moving between relays")

The database needs wal_level = logical. Run "eventsctl wal <subcommand> -h"
for its flags.`

func runWAL(ctx context.Context, env *cliEnv, args []string) error {
	if len(args) == 0 {
		fmt.Fprintln(env.stderr, walUsage)
		return fmt.Errorf("%w: missing subcommand", errUsage)
	}
	switch args[0] {
	case "setup", "status", "drop":
	case "-h", "--help", "help":
		fmt.Fprintln(env.stdout, walUsage)
		return flag.ErrHelp
	default:
		fmt.Fprintln(env.stderr, walUsage)
		return fmt.Errorf("%w: unknown subcommand %q", errUsage, args[0])
	}
	sub := args[0]
	desc := map[string]string{
		"setup":  "\nCreates the publication and the logical replication slot the WAL relay\nreads, if they do not exist yet. Refuses a server below wal_level = logical.",
		"status": "\nReports the slot. Exits 1 when the slot retains more than --max-lag-bytes\nof WAL, is at risk of invalidation (wal_status unreserved) or invalidated\n(lost), or does not exist.",
		"drop":   "\nDrops the slot and the publication. Refused while a relay streams from it.",
	}[sub]
	fs := newFlags(env, "wal "+sub, "[flags]", desc)
	db := dbFlag(fs, env)
	slot := fs.String("slot", walrelay.DefaultSlot, "logical replication slot")
	publication := fs.String("publication", walrelay.DefaultPublication, "publication the slot is read with")
	asJSON := fs.Bool("json", false, "print JSON (status)")
	maxLag := fs.Int64("max-lag-bytes", 0, "status: fail (exit 1) when the slot retains more WAL than this (0: never)")
	if err := parse(fs, args[1:]); err != nil {
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
	opts := []walrelay.Option{walrelay.WithSlot(*slot), walrelay.WithPublication(*publication)}
	switch sub {
	case "setup":
		if err := walrelay.Setup(ctx, pool, opts...); err != nil {
			return unreachable(err)
		}
		fmt.Fprintf(env.stdout, "slot %q and publication %q ready\n", *slot, *publication)
		return nil
	case "drop":
		if err := walrelay.Drop(ctx, pool, opts...); err != nil {
			return unreachable(err)
		}
		fmt.Fprintf(env.stdout, "slot %q and publication %q dropped\n", *slot, *publication)
		return nil
	}
	st, err := walrelay.SlotStatus(ctx, pool, opts...)
	if err != nil {
		return unreachable(err)
	}
	if *asJSON {
		if err := writeJSON(env.stdout, slotJSON{Slot: st.Name, Exists: st.Exists, Active: st.Active, ActivePID: st.ActivePID,
			Confirmed: st.Confirmed, LagBytes: st.LagBytes, WALStatus: st.WALStatus, SafeWALBytes: st.SafeWALBytes}); err != nil {
			return err
		}
	} else {
		w := tabwriter.NewWriter(env.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintf(w, "slot\t%s\n", st.Name)
		fmt.Fprintf(w, "exists\t%v\n", st.Exists)
		if st.Exists {
			fmt.Fprintf(w, "active\t%v (pid %d)\n", st.Active, st.ActivePID)
			fmt.Fprintf(w, "confirmed\t%s\n", st.Confirmed)
			fmt.Fprintf(w, "retained WAL\t%d bytes\n", st.LagBytes)
			fmt.Fprintf(w, "wal status\t%s\n", st.WALStatus)
			if st.SafeWALBytes >= 0 {
				fmt.Fprintf(w, "safe WAL left\t%d bytes\n", st.SafeWALBytes)
			} else {
				fmt.Fprintf(w, "safe WAL left\tunlimited (max_slot_wal_keep_size = -1)\n")
			}
		}
		w.Flush()
	}
	switch {
	case !st.Exists:
		fmt.Fprintf(env.stderr, "slot %q does not exist: run eventsctl wal setup\n", st.Name)
		return exitError(exitCheckFailed)
	case st.WALStatus == "lost":
		fmt.Fprintf(env.stderr, "slot %q is invalidated: follow docs/runbook.md, \"WAL relay: an invalidated slot\"\n", st.Name)
		return exitError(exitCheckFailed)
	case st.WALStatus == "unreserved":
		fmt.Fprintf(env.stderr, "slot %q is past max_wal_size and will be invalidated at max_slot_wal_keep_size: is its relay running?\n", st.Name)
		return exitError(exitCheckFailed)
	case *maxLag > 0 && st.LagBytes > *maxLag:
		fmt.Fprintf(env.stderr, "slot %q retains %d bytes of WAL, over --max-lag-bytes %d\n", st.Name, st.LagBytes, *maxLag)
		return exitError(exitCheckFailed)
	}
	return nil
}

// slotJSON is `wal status --json`.
type slotJSON struct {
	Slot         string `json:"slot"`
	Exists       bool   `json:"exists"`
	Active       bool   `json:"active"`
	ActivePID    int32  `json:"active_pid,omitempty"`
	Confirmed    string `json:"confirmed_lsn,omitempty"`
	LagBytes     int64  `json:"lag_bytes"`
	WALStatus    string `json:"wal_status,omitempty"`
	SafeWALBytes int64  `json:"safe_wal_bytes"`
}
