package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/runtime/outbox"
	"github.com/protoevents/protoevents/runtime/walrelay"
)

// The relay in a process of its own, as users deploy it (eventsctl relay):
// the bench binary runs itself with -relay-process, and the relay there
// shares nothing with the producers but Postgres and Kafka — no in-process
// wake-up, only its polling.

// relayProcessFlag is the flag that turns the bench binary into the relay
// process; its value is the schema the relay works in.
const relayProcessFlag = "relay-process"

// relayProcessMain runs the relay of a child process until SIGTERM or
// SIGINT: Postgres from PROTOEVENTS_TEST_DATABASE_URL (set by the parent),
// the outbox in the given schema. It prints "ready" once a session of the
// relay holds lanes, so the parent starts its clock on a relay that claims.
func relayProcessMain(schema, brokers string, workers int, slot string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	cfg, err := pgxpool.ParseConfig(os.Getenv("PROTOEVENTS_TEST_DATABASE_URL"))
	if err != nil {
		return fmt.Errorf("relay process: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("relay process: %w", err)
	}
	defer pool.Close()
	var ready bool
	markReady := func() {
		if !ready {
			ready = true
			fmt.Println("ready")
		}
	}
	var run func(context.Context) error
	if slot != "" {
		// The WAL relay on slot (wal.go), ready once it streams.
		r, err := walrelay.New(pool, strings.Split(brokers, ","), walrelay.WithSlot(slot), walrelay.WithLogger(quietLogger()),
			walrelay.WithHooks(walrelay.Hooks{Active: func(on bool) {
				if on {
					markReady()
				}
			}}))
		if err != nil {
			return fmt.Errorf("relay process: %w", err)
		}
		run = r.Run
	} else {
		r, err := outbox.NewRelay(pool, strings.Split(brokers, ","), outbox.WithLogger(quietLogger()), outbox.WithWorkers(workers),
			outbox.WithHooks(outbox.Hooks{Lanes: func(owned int) {
				if owned > 0 {
					markReady()
				}
			}}))
		if err != nil {
			return fmt.Errorf("relay process: %w", err)
		}
		run = r.Run
	}
	if err := run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("relay process: %w", err)
	}
	return nil
}

// startRelayProcess starts the relay in a child process on the schema s
// and returns once it holds lanes; stop terminates it and waits.
func startRelayProcess(s *schema, brokers []string, workers int, p *progress) (stop func() error, err error) {
	return startRelayChild(s, brokers, workers, "", p)
}

// startWALRelayProcess is startRelayProcess for the WAL relay on slot.
func startWALRelayProcess(s *schema, slot string, brokers []string, p *progress) (stop func() error, err error) {
	return startRelayChild(s, brokers, 1, slot, p)
}

// startRelayChild starts the child: the polling relay, or the WAL relay
// when slot is set.
func startRelayChild(s *schema, brokers []string, workers int, slot string, p *progress) (stop func() error, err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("relay process: %w", err)
	}
	cmd := exec.Command(exe, "-"+relayProcessFlag, s.name, "-relay-brokers", strings.Join(brokers, ","),
		"-workers", strconv.Itoa(workers), "-relay-slot", slot)
	cmd.Env = append(os.Environ(), "PROTOEVENTS_TEST_DATABASE_URL="+s.url)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("relay process: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("relay process: %w", err)
	}
	exited := make(chan error, 1)
	readyc := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "ready" {
				p.markReady()
				close(readyc)
				break
			}
		}
		for sc.Scan() { // drain, so the child never blocks on its stdout
		}
		exited <- cmd.Wait()
	}()
	stop = func() error {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			return err
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			return fmt.Errorf("relay process: no exit within 30s of SIGTERM: %w", <-exited)
		}
	}
	select {
	case <-readyc:
		return stop, nil
	case err := <-exited:
		return nil, fmt.Errorf("relay process exited before taking lanes: %v", err)
	case <-time.After(time.Minute):
		_ = stop()
		return nil, errors.New("relay process: no lanes within a minute")
	}
}

// relayProcessFlags registers the child's flags; relayProcess reports
// whether this process is the child and, if so, runs it.
func relayProcessFlags() func(workers int) (bool, error) {
	schema := flag.String(relayProcessFlag, "", "internal: run only the relay, on this schema (the end-to-end runs start it as a child process)")
	brokers := flag.String("relay-brokers", "", "internal: the child relay's Kafka brokers")
	slot := flag.String("relay-slot", "", "internal: run the WAL relay on this slot instead of the polling relay")
	return func(workers int) (bool, error) {
		if *schema == "" {
			return false, nil
		}
		return true, relayProcessMain(*schema, *brokers, workers, *slot)
	}
}
