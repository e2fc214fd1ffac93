// Package servers gives tests their real servers: a Postgres schema of the
// test's own on a shared server ($PROTOEVENTS_TEST_DATABASE_URL, or a
// throwaway cluster started once per test binary) and a Kafka cluster reached
// over TCP ($PROTOEVENTS_KAFKA_BROKERS, or in-process per test). It depends on
// no runtime package but topics, so the runtime's own tests use it too;
// eventstest builds its kit on it and forwards its functions.
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

// Main runs the package's tests, then stops the throwaway server, if one was
// started, and exits with the tests' status. Call it from TestMain in every
// package that uses DB.
func Main(m *testing.M) {
	code := m.Run()
	if server.cluster != nil {
		if err := server.cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "servers:", err)
		}
	}
	os.Exit(code)
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
// $PROTOEVENTS_KAFKA_BROKERS, or a new in-process cluster closed when the
// test ends.
func Kafka(t testing.TB, opts ...kfake.Opt) *kafkacluster.Cluster {
	t.Helper()
	c, err := kafkacluster.Start(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// FakeKafka returns an in-process cluster even when a real one is
// configured, for tests that inject broker faults or use fixed topic names.
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
