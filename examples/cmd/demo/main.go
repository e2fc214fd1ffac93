// Command demo runs the protoevents example end to end on embedded
// defaults: a throwaway Postgres cluster (or $PROTOEVENTS_DATABASE_URL) and
// an in-process Kafka cluster over TCP (or $PROTOEVENTS_KAFKA_BROKERS).
//
//	go run ./examples/cmd/demo                 # the whole flow, then a report
//	go run ./examples/cmd/demo -keep           # ... and keep Postgres and Kafka up for eventsctl
//	go run ./examples/cmd/demo ship -order ID  # run the shipping consumer until order ID is applied
//
// It exits non-zero if any invariant is violated.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/eventstest/apachekafka"
	"github.com/protoevents/protoevents/eventstest/kafkacluster"
	"github.com/protoevents/protoevents/eventstest/pgcluster"
	"github.com/protoevents/protoevents/examples/demo"
	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	"github.com/protoevents/protoevents/examples/shipping"
	"github.com/protoevents/protoevents/runtime/outbox"
	"github.com/protoevents/protoevents/runtime/walrelay"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if len(os.Args) > 1 && os.Args[1] == "ship" {
		err = ship(ctx, os.Args[2:])
	} else {
		err = runDemo(ctx, os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	dbURL := fs.String("database-url", os.Getenv("PROTOEVENTS_DATABASE_URL"), "Postgres URL; empty starts a throwaway cluster")
	brokersFlag := fs.String("brokers", os.Getenv(kafkacluster.EnvBrokers), "Kafka brokers; empty starts a cluster (see -kafka)")
	kafkaKind := fs.String("kafka", "embedded", `the cluster started when -brokers is empty: "embedded" (in-process kfake) or "apache" (a real Apache Kafka node, fetched through Maven; needs java and mvn)`)
	n := fs.Int("orders", 1000, "orders to place")
	poison := fs.String("poison-country", "ZZ", "shipping country no carrier serves (its order is the poison message)")
	keep := fs.Bool("keep", false, "after the run, keep Postgres and Kafka up (until Ctrl-C) and print eventsctl commands to try")
	verbose := fs.Bool("v", false, "show the runtime's logs")
	relay := fs.String("relay", "table", `relay: "table" (poll the outbox table) or "wal" (stream a logical replication slot; the throwaway cluster starts with wal_level = logical)`)
	if err := fs.Parse(args); err != nil {
		return err
	}
	logOut := io.Discard
	if *verbose {
		logOut = os.Stderr
	}
	log := slog.New(slog.NewTextHandler(logOut, nil))

	fmt.Println("protoevents demo: orders → outbox → relay → Kafka → shipping")
	if *relay != "table" && *relay != "wal" {
		return fmt.Errorf("-relay %q: want table or wal", *relay)
	}
	pool, url, cleanupDB, err := database(ctx, *dbURL, *relay == "wal")
	if err != nil {
		return err
	}
	defer cleanupDB()
	brokers, cleanupKafka, err := kafkaBrokers(ctx, *brokersFlag, *kafkaKind)
	if err != nil {
		return err
	}
	defer cleanupKafka()
	kafkaName := "in-process (kfake)"
	if *brokersFlag != "" {
		kafkaName = "given"
	} else if *kafkaKind == "apache" {
		kafkaName = "Apache Kafka " + apacheVersion()
	}
	fmt.Printf("  Postgres %s\n  Kafka    %s, %s\n", redact(url), strings.Join(brokers, ","), kafkaName)
	if err := demo.Setup(ctx, pool, brokers); err != nil {
		return err
	}
	if *relay == "wal" {
		if err := walrelay.Setup(ctx, pool); err != nil {
			return err
		}
		fmt.Printf("  relay    WAL (slot %q)\n", walrelay.DefaultSlot)
	}
	cfg := demo.Config{DB: pool, Brokers: brokers, Orders: *n, PoisonCountry: *poison, Progress: os.Stdout, Log: log, Relay: *relay}
	rep, err := demo.Run(ctx, cfg)
	if err != nil {
		return err
	}
	rep.Print(os.Stdout)
	if !rep.OK() {
		return errors.New("invariants violated")
	}
	if *keep {
		fmt.Printf(`
Postgres and Kafka stay up until Ctrl-C. In another terminal:

  export PROTOEVENTS_DATABASE_URL='%s' PROTOEVENTS_KAFKA_BROKERS='%s'
  go run ./cmd/eventsctl outbox status
  go run ./cmd/eventsctl dlq list --topic %s
  go run ./cmd/eventsctl dlq redrive --topic %s --all
  go run ./examples/cmd/demo ship -unserved= -order %s    # shipping, fixed: serves %s now
`, url, strings.Join(brokers, ","), ordersv1.OrderPlacedDLQTopic, ordersv1.OrderPlacedDLQTopic, rep.PoisonOrderID, *poison)
		<-ctx.Done()
		return nil
	}
	fmt.Printf("\nfixing shipping (now serving %s) and redriving the poison message from %s\n", *poison, ordersv1.OrderPlacedDLQTopic)
	w, err := demo.NewWriter(*relay)
	if err != nil {
		return err
	}
	times, err := demo.Redrive(ctx, cfg, shipping.New(w), rep.PoisonOrderID)
	if err != nil {
		return err
	}
	fmt.Printf("  order %s applied %d time(s) after redrive\n", rep.PoisonOrderID, times)
	if times != 1 {
		return fmt.Errorf("redriven order applied %d times, want 1", times)
	}
	if err := runSagaDemo(ctx, pool, brokers, log); err != nil {
		return err
	}
	fmt.Println("\ndemo: OK")
	return nil
}

// ship runs the shipping consumer until one order's shipment exists.
func ship(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo ship", flag.ContinueOnError)
	dbURL := fs.String("database-url", os.Getenv("PROTOEVENTS_DATABASE_URL"), "Postgres URL (required)")
	brokers := fs.String("brokers", os.Getenv(kafkacluster.EnvBrokers), "Kafka brokers (required)")
	unserved := fs.String("unserved", "ZZ", "comma-separated countries no carrier serves; -unserved= serves all (the fix)")
	order := fs.String("order", "", "order ID to wait for (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dbURL == "" || *brokers == "" || *order == "" {
		return errors.New("ship: -database-url, -brokers and -order are required (or PROTOEVENTS_DATABASE_URL / PROTOEVENTS_KAFKA_BROKERS)")
	}
	pool, err := pgxpool.New(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	w, err := outbox.NewWriter()
	if err != nil {
		return err
	}
	var countries []string
	for _, c := range strings.Split(*unserved, ",") {
		if c = strings.TrimSpace(c); c != "" {
			countries = append(countries, c)
		}
	}
	cfg := demo.Config{DB: pool, Brokers: strings.Split(*brokers, ",")}
	n, err := demo.ApplyRedriven(ctx, cfg, shipping.New(w, countries...), *order)
	if err != nil {
		return err
	}
	fmt.Printf("order %s: applied %d time(s)\n", *order, n)
	return nil
}

// database connects to url, or starts a throwaway cluster.
func database(ctx context.Context, url string, logical bool) (*pgxpool.Pool, string, func(), error) {
	cleanup := func() {}
	if url == "" {
		fmt.Println("  starting a throwaway Postgres cluster (initdb + pg_ctl)…")
		var opts []pgcluster.Option
		if logical {
			opts = append(opts, pgcluster.WithSetting("wal_level", "logical"))
		}
		c, err := pgcluster.Start(ctx, opts...)
		if err != nil {
			return nil, "", nil, err
		}
		url, cleanup = c.URL, func() { _ = c.Stop() }
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		cleanup()
		return nil, "", nil, err
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		cleanup()
		return nil, "", nil, fmt.Errorf("database %s: %w", redact(url), err)
	}
	return pool, url, func() { pool.Close(); cleanup() }, nil
}

// kafkaBrokers returns the given brokers, or starts a cluster of kind
// "embedded" (in-process) or "apache" (a real single node).
func kafkaBrokers(ctx context.Context, list, kind string) ([]string, func(), error) {
	if list != "" {
		return strings.Split(list, ","), func() {}, nil
	}
	switch kind {
	case "embedded":
	case "apache":
		fmt.Printf("  starting Apache Kafka %s (first run: fetched through Maven)\n", apacheVersion())
		c, err := apachekafka.Start(ctx, apachekafka.Config{})
		if err != nil {
			return nil, nil, err
		}
		return c.Brokers(), func() { _ = c.Stop() }, nil
	default:
		return nil, nil, fmt.Errorf("-kafka %q: want embedded or apache", kind)
	}
	c, err := kafkacluster.StartFake()
	if err != nil {
		return nil, nil, err
	}
	return c.Brokers, c.Close, nil
}

// apacheVersion is the Apache Kafka version -kafka apache runs.
func apacheVersion() string {
	if v := os.Getenv(apachekafka.EnvVersion); v != "" {
		return v
	}
	return apachekafka.DefaultVersion
}

// redact hides a password in a URL.
func redact(url string) string {
	if at := strings.Index(url, "@"); at > 0 {
		if colon := strings.LastIndex(url[:at], ":"); colon > strings.Index(url, "://")+2 {
			return url[:colon+1] + "***" + url[at:]
		}
	}
	return url
}
