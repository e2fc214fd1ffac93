package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/protoevents/protoevents/internal/compat"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
	"github.com/protoevents/protoevents/runtime/prommetrics"
	"github.com/protoevents/protoevents/runtime/topics"
	"github.com/protoevents/protoevents/runtime/walrelay"
)

// connectTimeout bounds how long connect waits for the server (a variable
// so tests of a hanging server finish sooner).
var connectTimeout = 10 * time.Second

// connect opens a pool and checks that the server answers, explaining a
// failure in operator terms: refused (role, password, database: fix the
// URL), timed out or unreachable (exit 3: is the server up?).
func connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	pool, err := openPool(ctx, url)
	if err != nil {
		return nil, err
	}
	cfg := pool.Config()
	addr := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	pingCtx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, connectError(addr, cfg.ConnConfig.User, cfg.ConnConfig.Database, err)
	}
	return pool, nil
}

// openPool makes a pool for url without connecting yet: the relay uses it
// as is, and waits for the database itself.
func openPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("%w: --database-url: %v", errUsage, err)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > connectTimeout {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	return pool, nil
}

// connectError explains why the database at addr did not accept us.
func connectError(addr, user, database string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "28P01", "28000":
			return fmt.Errorf("database at %s refused role %q: %s (SQLSTATE %s): check the user and password in --database-url and pg_hba.conf", addr, user, pgErr.Message, pgErr.Code)
		case "3D000":
			return fmt.Errorf("database at %s: database %q does not exist (SQLSTATE 3D000): check the database name in --database-url", addr, database)
		case "53300":
			return unreachableError{fmt.Errorf("database at %s: too many connections (SQLSTATE 53300): try again, or raise max_connections", addr)}
		case "57P03":
			return unreachableError{fmt.Errorf("database at %s is starting up or shutting down (SQLSTATE 57P03): try again shortly", addr)}
		}
		return fmt.Errorf("database at %s refused the connection: %w", addr, err)
	}
	if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return unreachableError{fmt.Errorf("database: timed out after %s connecting to %s: is Postgres up and reachable from here? (check --database-url): %w", connectTimeout, addr, err)}
	}
	if isNetworkFailure(err) {
		return unreachableError{fmt.Errorf("database: cannot reach %s: is Postgres running there? (check --database-url): %w", addr, err)}
	}
	return fmt.Errorf("database at %s: %w", addr, err)
}

func isTimeout(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) && netErr.Timeout()
}

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
Publishes committed events to Kafka, in per-key order, until SIGINT or
SIGTERM. --source table (the default) polls the outbox table: run several
for availability, they split the outbox's key-hash lanes between them (see
--lanes of migrate). --source wal reads the logical replication slot that
outbox writers with the WAL source emit into (see "eventsctl wal"): run
several, one streams and the others wait as standbys. Serves Prometheus
metrics (/metrics), liveness (/livez, also /healthz) and readiness
(/readyz: database and brokers reachable, progress on the backlog) on
--metrics-addr. Waits for Postgres and Kafka at start and through outages,
never exits on one.`)
	db := dbFlag(fs, env)
	brokers := brokersFlag(fs, env)
	source := fs.String("source", "table", `where events come from: "table" (poll the outbox table) or "wal" (stream a replication slot)`)
	table := fs.String("outbox-table", outbox.DefaultTable, `outbox table, "name" or "schema.name" (--source table)`)
	slot := fs.String("slot", walrelay.DefaultSlot, "logical replication slot (--source wal)")
	batch := fs.Int("batch", 500, "most rows per Kafka produce request (the batch size adapts to the backlog up to this)")
	workers := fs.Int("workers", 1, "lane workers, each with its own database session and share of the lanes (--source table)")
	poll := fs.Duration("poll", 100*time.Millisecond, "longest idle poll interval: the relay polls every 1ms right after work, backing off to this (--source table)")
	retention := fs.Duration("retention", 24*time.Hour, "keep published rows this long before deleting them (--source table)")
	grace := fs.Duration("shutdown-grace", 5*time.Second, "on SIGINT/SIGTERM, how long the batch in flight may take to be acknowledged and marked")
	stall := fs.Duration("stall-timeout", time.Minute, "/readyz fails when events have been pending this long with nothing published")
	readyPending := fs.Int64("ready-max-pending", 0, "/readyz fails while more rows of the relay's lanes are pending (0: no bound; give the producers' outbox.WithBacklogPolicy bound; --source table)")
	readyAge := fs.Duration("ready-max-age", 0, "/readyz fails while a pending row is older than this (0: no bound; --source table)")
	metricsAddr := fs.String("metrics-addr", ":9090", `address serving /metrics, /livez, /readyz and /healthz ("" disables)`)
	newLogger := logFlags(fs, env)
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := need(*db, "database-url", "PROTOEVENTS_DATABASE_URL"); err != nil {
		return err
	}
	if err := need(*brokers, "brokers", "PROTOEVENTS_KAFKA_BROKERS"); err != nil {
		return err
	}
	if *readyPending < 0 || *readyAge < 0 {
		return fmt.Errorf("%w: --ready-max-pending and --ready-max-age must not be negative", errUsage)
	}
	if *source == "wal" && (*readyPending > 0 || *readyAge > 0) {
		return fmt.Errorf("%w: --ready-max-pending and --ready-max-age bound the outbox table's rows; the WAL relay's /readyz bounds the slot's retained WAL instead", errUsage)
	}
	if *source != "table" && *source != "wal" {
		return fmt.Errorf("%w: --source %q: want table or wal", errUsage, *source)
	}
	if *batch < 1 || *batch > 10000 {
		return fmt.Errorf("%w: --batch %d: want 1..10000", errUsage, *batch)
	}
	if *workers < 1 || *workers > 64 {
		return fmt.Errorf("%w: --workers %d: want 1..64", errUsage, *workers)
	}
	if *poll <= 0 || *retention <= 0 || *stall <= 0 {
		return fmt.Errorf("%w: --poll, --retention and --stall-timeout must be positive", errUsage)
	}
	if *grace < 0 {
		return fmt.Errorf("%w: --shutdown-grace %v must not be negative", errUsage, *grace)
	}
	log, err := newLogger()
	if err != nil {
		return err
	}
	// No ping: the relay waits for the database (and the brokers) with
	// backoff and logs, and reports it on /readyz, rather than exiting when
	// it starts before them.
	pool, err := openPool(ctx, *db)
	if err != nil {
		return err
	}
	defer pool.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := prommetrics.New(reg)
	if err != nil {
		return err
	}
	if *source == "wal" {
		relay, err := walrelay.New(pool, splitList(*brokers), walrelay.WithSlot(*slot), walrelay.WithBatchSize(*batch),
			walrelay.WithHooks(metrics.WALRelay()), walrelay.WithLogger(log), walrelay.WithShutdownGrace(*grace), walrelay.WithStallTimeout(*stall))
		if err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		stop, err := serveHealth(log, *metricsAddr, reg, relay.LiveHandler(), relay.ReadyHandler())
		if err != nil {
			return err
		}
		defer stop()
		log.Info("relay starting", "source", "wal", "slot", *slot, "brokers", *brokers, "batch", *batch)
		return relay.Run(ctx)
	}
	reg.MustRegister(prommetrics.NewOutboxCollector(pool, outbox.WithTable(*table))) // per-topic backlog, failing keys, parked rows
	relay, err := outbox.NewRelay(pool, splitList(*brokers),
		outbox.WithTable(*table), outbox.WithBatchSize(*batch), outbox.WithWorkers(*workers), outbox.WithPollInterval(*poll),
		outbox.WithRetention(*retention), outbox.WithHooks(metrics.Relay()), outbox.WithLogger(log),
		outbox.WithShutdownGrace(*grace), outbox.WithStallTimeout(*stall),
		outbox.WithReadyBacklog(outbox.BacklogBound{MaxPending: *readyPending, MaxAge: *readyAge}))
	if err != nil {
		return err
	}
	stop, err := serveHealth(log, *metricsAddr, reg, relay.LiveHandler(), relay.ReadyHandler())
	if err != nil {
		return err
	}
	defer stop()
	log.Info("relay starting", "source", "table", "outbox", *table, "brokers", *brokers, "batch", *batch, "workers", *workers)
	return relay.Run(ctx)
}

// serveHealth serves /metrics, /livez (and its older name /healthz) and
// /readyz on addr until the returned stop is called; "" serves nothing.
func serveHealth(log *slog.Logger, addr string, reg *prometheus.Registry, live, ready http.Handler) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s (change --metrics-addr): %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.Handle("/livez", live)
	mux.Handle("/healthz", live) // the older name of /livez
	mux.Handle("/readyz", ready)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	log.Info("serving metrics", "addr", ln.Addr().String())
	return func() {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
		<-done
	}, nil
}

func runTopics(ctx context.Context, env *cliEnv, args []string) error {
	if len(args) == 0 {
		fmt.Fprintln(env.stderr, topicsUsage)
		return fmt.Errorf("%w: missing subcommand", errUsage)
	}
	switch args[0] {
	case "create", "check":
	case "-h", "--help", "help":
		fmt.Fprintln(env.stdout, topicsUsage)
		return flag.ErrHelp
	default:
		fmt.Fprintln(env.stderr, topicsUsage)
		return fmt.Errorf("%w: unknown subcommand %q", errUsage, args[0])
	}
	sub := args[0]
	desc := map[string]string{
		"create": `Creates the event topics and their dead-letter topics that do not exist
yet. Existing topics are never changed: a new partition count would move
keys and break per-key order (see "eventsctl topics check").`,
		"check": `Compares the planned topics with the cluster and lists each difference:
missing topics, partition counts, replication factors and the values of
the --config settings. Exits 1 when anything differs, 3 when the brokers
cannot be reached. Changes nothing.`,
	}[sub]
	fs := newFlags(env, "topics "+sub, "(--lock events.lock | --topic T[,T...]) [flags]", desc)
	brokers := brokersFlag(fs, env)
	lock := fs.String("lock", "", "events.lock: plan every event's topic and effective DLQ topic")
	names := fs.String("topic", "", "comma-separated event topics (instead of --lock)")
	dlq := fs.Bool("dlq", true, `with --topic: also each topic's "<topic>.dlq"`)
	partitions := fs.Int("partitions", 6, "partitions of each topic (bounds consumer parallelism; fixed for good)")
	replication := fs.Int("replication-factor", 1, "replication factor of each topic (3 in production)")
	cfgs := configFlag{}
	fs.Var(cfgs, "config", "topic config key=value for every topic, repeatable (e.g. --config retention.ms=604800000)")
	dlqCfgs := configFlag{}
	fs.Var(dlqCfgs, "dlq-config", "topic config key=value for DLQ topics instead of --config, repeatable")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if err := need(*brokers, "brokers", "PROTOEVENTS_KAFKA_BROKERS"); err != nil {
		return err
	}
	if (*lock == "") == (*names == "") {
		return fmt.Errorf("%w: give one of --lock (the plugin's events.lock) or --topic", errUsage)
	}
	if *partitions < 1 {
		return fmt.Errorf("%w: --partitions %d: a topic needs at least 1 partition", errUsage, *partitions)
	}
	if *replication < 1 {
		return fmt.Errorf("%w: --replication-factor %d: want at least 1", errUsage, *replication)
	}
	cfg := topics.Config{Partitions: *partitions, ReplicationFactor: *replication, Configs: cfgs, DLQConfigs: cfgs}
	if len(dlqCfgs) > 0 {
		cfg.DLQConfigs = dlqCfgs
	}
	var specs []topics.Spec
	var err error
	if *lock != "" {
		ds, lerr := lockDescriptors(*lock)
		if lerr != nil {
			return lerr
		}
		specs, err = topics.Plan(cfg, ds...)
	} else {
		specs, err = topics.PlanNames(cfg, *dlq, splitList(*names)...)
	}
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if len(specs) == 0 {
		return fmt.Errorf("%w: no topics to %s", errUsage, sub)
	}
	if sub == "check" {
		return topicsCheck(ctx, env, splitList(*brokers), specs)
	}
	created, err := topics.CreateSpecs(ctx, splitList(*brokers), nil, specs)
	for _, s := range specs {
		state := "exists, unchanged (see eventsctl topics check)"
		if slices.Contains(created, s.Name) {
			state = fmt.Sprintf("created (%d partitions, replication factor %d%s)", s.Partitions, s.ReplicationFactor, configSuffix(s.Configs))
		}
		kind := "topic"
		if s.DLQ {
			kind = "dlq"
		}
		fmt.Fprintf(env.stdout, "%-5s %s: %s\n", kind, s.Name, state)
	}
	return unreachable(err)
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
