package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/protoevents/protoevents/internal/compat"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
	"github.com/protoevents/protoevents/runtime/prommetrics"
)

func runMigrate(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "migrate", "[flags]", `
Creates the outbox table (with its key-hash lanes) and the consumers' dedup
table, or brings them up to date. Safe to run on every deploy and from
several instances at once.`)
	db := dbFlag(fs, env)
	outboxTable := fs.String("outbox-table", outbox.DefaultTable, `outbox table, "name" or "schema.name"`)
	dedupTable := fs.String("dedup-table", "consumed_events", `consumers' dedup table, "name" or "schema.name"`)
	lanes := fs.Int("lanes", 16, "key-hash lanes of a new outbox: the most relays that share the work (fixed at creation; an existing table keeps its count unless this is given)")
	only := fs.String("only", "", `migrate only "outbox" or "consumer"`)
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := need(*db, "database-url", "PROTOEVENTS_DATABASE_URL"); err != nil {
		return err
	}
	if flagGiven(fs, "lanes") && (*lanes < 1 || *lanes > 1024) {
		return fmt.Errorf("%w: --lanes %d: want 1..1024", errUsage, *lanes)
	}
	if *only != "" && *only != "outbox" && *only != "consumer" {
		return fmt.Errorf("%w: --only must be outbox or consumer, not %q", errUsage, *only)
	}
	pool, err := connect(ctx, *db)
	if err != nil {
		return err
	}
	defer pool.Close()
	if *only != "consumer" {
		opts := []outbox.Option{outbox.WithTable(*outboxTable)}
		if flagGiven(fs, "lanes") {
			opts = append(opts, outbox.WithLanes(*lanes))
		}
		if err := outbox.Migrate(ctx, pool, opts...); err != nil {
			return unreachable(err)
		}
		fmt.Fprintf(env.stdout, "outbox table %s: ready\n", *outboxTable)
	}
	if *only != "outbox" {
		if err := consumer.Migrate(ctx, pool, consumer.WithTable(*dedupTable)); err != nil {
			return err
		}
		fmt.Fprintf(env.stdout, "dedup table %s: ready\n", *dedupTable)
	}
	return nil
}

func runRelay(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "relay", "[flags]", `
Publishes committed outbox rows to Kafka, in per-key order, until SIGINT or
SIGTERM. Run several for availability: they split the outbox's key-hash
lanes between them (see --lanes of migrate). Serves Prometheus metrics and a
health check on --metrics-addr.`)
	db := dbFlag(fs, env)
	brokers := brokersFlag(fs, env)
	table := fs.String("outbox-table", outbox.DefaultTable, `outbox table, "name" or "schema.name"`)
	batch := fs.Int("batch", 500, "rows per Kafka produce request")
	poll := fs.Duration("poll", 5*time.Second, "fallback poll interval; new rows wake the relay at once via LISTEN/NOTIFY")
	retention := fs.Duration("retention", 24*time.Hour, "keep published rows this long before deleting them")
	metricsAddr := fs.String("metrics-addr", ":9090", `address serving /metrics and /healthz ("" disables)`)
	logJSON := fs.Bool("log-json", false, "log as JSON instead of text")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := need(*db, "database-url", "PROTOEVENTS_DATABASE_URL"); err != nil {
		return err
	}
	if err := need(*brokers, "brokers", "PROTOEVENTS_KAFKA_BROKERS"); err != nil {
		return err
	}
	if *batch < 1 || *batch > 10000 {
		return fmt.Errorf("%w: --batch %d: want 1..10000", errUsage, *batch)
	}
	if *poll <= 0 || *retention <= 0 {
		return fmt.Errorf("%w: --poll and --retention must be positive", errUsage)
	}
	var handler slog.Handler = slog.NewTextHandler(env.stderr, nil)
	if *logJSON {
		handler = slog.NewJSONHandler(env.stderr, nil)
	}
	log := slog.New(handler)
	pool, err := connect(ctx, *db)
	if err != nil {
		return err
	}
	defer pool.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(prommetrics.NewOutboxCollector(pool, outbox.WithTable(*table))) // per-topic backlog, failing keys, parked rows
	metrics, err := prommetrics.New(reg)
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(pool, splitList(*brokers),
		outbox.WithTable(*table), outbox.WithBatchSize(*batch), outbox.WithPollInterval(*poll),
		outbox.WithRetention(*retention), outbox.WithMetrics(metrics.Relay()), outbox.WithLogger(log))
	if err != nil {
		return err
	}
	if *metricsAddr != "" {
		ln, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			return fmt.Errorf("metrics: listen on %s (change --metrics-addr): %w", *metricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
			if err := pool.Ping(r.Context()); err != nil {
				http.Error(w, "database: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server stopped", "err", err)
			}
		}()
		defer func() {
			shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(shutdownCtx)
		}()
		log.Info("serving metrics", "addr", ln.Addr().String())
	}
	log.Info("relay starting", "outbox", *table, "brokers", *brokers, "batch", *batch)
	return relay.Run(ctx)
}

func runPrune(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "prune", "[flags]", `
Deletes dedup rows older than --older-than, in batches, alongside running
consumers. The retention must exceed the topics' retention on the broker (a
redelivery of an event whose dedup row is gone would apply it again), so
values under the floor are refused.`)
	db := dbFlag(fs, env)
	table := fs.String("dedup-table", "consumed_events", `dedup table, "name" or "schema.name"`)
	olderThan := fs.Duration("older-than", 14*24*time.Hour, "delete rows consumed longer ago than this")
	floor := fs.Duration("retention-floor", 7*24*time.Hour, "refuse --older-than below this (set it to your broker retention)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := need(*db, "database-url", "PROTOEVENTS_DATABASE_URL"); err != nil {
		return err
	}
	if *olderThan < *floor {
		return fmt.Errorf("%w: --older-than %s is below --retention-floor %s: dedup rows must outlive the topics' retention on the broker; lower --retention-floor only if they keep messages for less",
			errUsage, *olderThan, *floor)
	}
	pool, err := connect(ctx, *db)
	if err != nil {
		return err
	}
	defer pool.Close()
	n, err := consumer.Prune(ctx, pool, *olderThan, consumer.WithTable(*table), consumer.WithRetentionFloor(*floor))
	if err != nil {
		return migrateHint(err, "dedup table "+*table)
	}
	fmt.Fprintf(env.stdout, "pruned %d dedup rows older than %s\n", n, *olderThan)
	return nil
}

func runCompat(ctx context.Context, env *cliEnv, args []string) error {
	if code := compat.RunCLI(ctx, args, env.stdout, env.stderr); code != 0 {
		return exitError(code)
	}
	return nil
}

func runVersion(_ context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "version", "[--json]", "Prints the version of eventsctl and the protoevents runtime it carries.")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(env.stdout, map[string]string{"name": "eventsctl", "version": events.Version})
	}
	fmt.Fprintln(env.stdout, "eventsctl (protoevents runtime) v"+events.Version)
	return nil
}

// parseOffsets parses "12,15,20" into offsets.
func parseOffsets(s string) ([]int64, error) {
	var out []int64
	for _, p := range splitList(s) {
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%w: offset %q is not a non-negative integer", errUsage, p)
		}
		out = append(out, n)
	}
	return out, nil
}

// oneLine shortens a multi-line error for table output.
func oneLine(s string, max int) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > max {
		s = s[:max-1] + "…"
	}
	return s
}
