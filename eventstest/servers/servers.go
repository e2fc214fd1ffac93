// Package servers gives tests their real servers: a Postgres schema of the
// test's own on a shared server ($PROTOEVENTS_TEST_DATABASE_URL, or a
// throwaway cluster started once per test binary) and a Kafka cluster reached
// over TCP: $PROTOEVENTS_KAFKA_BROKERS; else, with
// $PROTOEVENTS_TEST_KAFKA=apache, a real Apache Kafka node started once per
// test binary (package apachekafka); else an in-process kfake cluster per
// test. It depends on no runtime package but topics, so the runtime's own
// tests use it too; eventstest builds its kit on it and forwards its
// functions.
package servers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/protoevents/protoevents/eventstest/apachekafka"
	"github.com/protoevents/protoevents/eventstest/kafkacluster"
	"github.com/protoevents/protoevents/eventstest/pgcluster"
)

// EnvDatabaseURL names the variable holding the URL of a server tests may
// create schemas in. Without it a throwaway cluster is started.
const EnvDatabaseURL = "PROTOEVENTS_TEST_DATABASE_URL"

var server struct {
	once    sync.Once
	url     string
	err     error
	cluster *pgcluster.Cluster
}

// EnvTestKafka names the variable that picks the Kafka of the tests when
// $PROTOEVENTS_KAFKA_BROKERS is unset: "apache" starts a real Apache Kafka
// node once per test binary ($PROTOEVENTS_KAFKA_VERSION picks the version;
// it needs java and mvn) and runs the broker-fault tests on a three-node
// cluster; empty or "kfake" uses an in-process cluster per test.
const EnvTestKafka = "PROTOEVENTS_TEST_KAFKA"

var apache struct {
	once    sync.Once
	cluster *apachekafka.Cluster
	err     error
}

// Main runs the package's tests, then stops the throwaway servers, if any
// were started, and exits with the tests' status; when tests failed it
// prints the end of a real broker's log. Call it from TestMain in every
// package that uses DB or Kafka.
func Main(m *testing.M) {
	code := m.Run()
	if server.cluster != nil {
		if err := server.cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "servers:", err)
		}
	}
	if c := apache.cluster; c != nil {
		if code != 0 {
			fmt.Fprintf(os.Stderr, "servers: Apache Kafka %s log (end):\n%s", c.Version, c.Logs(80))
		}
		if err := c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "servers:", err)
		}
	}
	os.Exit(code)
}

// RealKafka reports whether the tests' Kafka is a real cluster (the
// brokers in $PROTOEVENTS_KAFKA_BROKERS, or the real tier's Apache Kafka)
// rather than the in-process kfake.
func RealKafka() bool {
	return kafkacluster.EnvBrokerList() != nil || os.Getenv(EnvTestKafka) == "apache"
}

// ApacheKafka starts a real Apache Kafka cluster of nodes (1 or 3) for this
// test alone, stopped when the test ends (its log printed if the test
// failed). Outside the real tier ($PROTOEVENTS_TEST_KAFKA=apache) the test
// is skipped with the command that runs it.
func ApacheKafka(t testing.TB, nodes int) *apachekafka.Cluster {
	t.Helper()
	if os.Getenv(EnvTestKafka) != "apache" {
		t.Skipf("a real Apache Kafka test: run it with %s=apache (make test-kafka)", EnvTestKafka)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := apachekafka.Start(ctx, apachekafka.Config{Nodes: nodes})
	if err != nil {
		t.Fatalf("servers: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Apache Kafka %s logs (end):\n%s", c.Version, c.Logs(60))
		}
		if err := c.Stop(); err != nil {
			t.Errorf("servers: %v", err)
		}
	})
	return c
}

// ServerURL returns the URL of the shared server, starting a throwaway one
// on first use when $PROTOEVENTS_TEST_DATABASE_URL is unset.
func ServerURL(t testing.TB) string {
	t.Helper()
	server.once.Do(func() {
		if u := os.Getenv(EnvDatabaseURL); u != "" {
			server.url = u
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		server.cluster, server.err = pgcluster.Start(ctx)
		if server.err == nil {
			server.url = server.cluster.URL
		}
	})
	if server.err != nil {
		t.Fatalf("servers: no database: %v (set %s to use an existing server)", server.err, EnvDatabaseURL)
	}
	return server.url
}

// DB returns a pool whose connections use a new, empty schema of the test's
// own (search_path), so tests run in parallel without seeing each other's
// tables. The schema and pool go away when the test ends. It also returns the
// schema's name.
func DB(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := ServerURL(t)
	schema := "t_" + randomSuffix()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("servers: connect: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("servers: create schema: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("servers: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("servers: pool: %v", err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Errorf("servers: drop schema: %v", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("servers: drop schema: %v", err)
		}
	})
	return pool, schema
}

// Kafka returns a cluster for the test: the real one named in
// $PROTOEVENTS_KAFKA_BROKERS, the test binary's Apache Kafka node
// ($PROTOEVENTS_TEST_KAFKA=apache), or a new in-process cluster closed when
// the test ends. On a shared cluster the kfake options do not apply, and
// Group gives the test consumer group IDs of its own.
func Kafka(t testing.TB, opts ...kfake.Opt) *kafkacluster.Cluster {
	t.Helper()
	if brokers := kafkacluster.EnvBrokerList(); brokers != nil {
		c := kafkacluster.Shared(brokers, randomSuffix())
		t.Cleanup(c.Close)
		return c
	}
	if os.Getenv(EnvTestKafka) == "apache" {
		apache.once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			apache.cluster, apache.err = apachekafka.Start(ctx, apachekafka.Config{})
		})
		if apache.err != nil {
			t.Fatalf("servers: %v", apache.err)
		}
		c := kafkacluster.Shared(apache.cluster.Brokers(), randomSuffix())
		t.Cleanup(c.Close)
		return c
	}
	c, err := kafkacluster.Start(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// OwnKafka returns a cluster of the test's own, for tests whose topics and
// consumer groups have fixed names (generated events, the CLI's commands):
// in the real tier ($PROTOEVENTS_TEST_KAFKA=apache) a new Apache Kafka node,
// else a new in-process cluster (with opts). It ends with the test.
func OwnKafka(t testing.TB, opts ...kfake.Opt) *kafkacluster.Cluster {
	t.Helper()
	if os.Getenv(EnvTestKafka) == "apache" {
		c := &kafkacluster.Cluster{Brokers: ApacheKafka(t, 1).Brokers()}
		t.Cleanup(c.Close)
		return c
	}
	return FakeKafka(t, opts...)
}

// FakeKafka returns an in-process cluster even when a real one is
// configured, for tests that inject faults through kfake's control hooks.
func FakeKafka(t testing.TB, opts ...kfake.Opt) *kafkacluster.Cluster {
	t.Helper()
	c, err := kafkacluster.StartFake(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Topic returns a topic name unique to this run, so tests can share a real
// cluster.
func Topic(t testing.TB, base string) string {
	t.Helper()
	return base + "-" + randomSuffix()
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
