// Package testenv gives the project's integration tests their real
// dependencies. It forwards to eventstest/servers, the base of the public
// test kit, which now holds the code: a Postgres schema of the test's own on a shared server
// ($PROTOEVENTS_TEST_DATABASE_URL or a throwaway cluster) and a Kafka cluster
// reached over TCP ($PROTOEVENTS_KAFKA_BROKERS or in-process). A package
// using DB must call Main from its TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
package testenv

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/protoevents/protoevents/eventstest/kafkacluster"
	"github.com/protoevents/protoevents/eventstest/pgcluster"
	"github.com/protoevents/protoevents/eventstest/servers"
)

// EnvDatabaseURL is servers.EnvDatabaseURL.
const EnvDatabaseURL = servers.EnvDatabaseURL

// Main is servers.Main.
func Main(m *testing.M) { servers.Main(m) }

// ServerURL is servers.ServerURL.
func ServerURL(t testing.TB) string { t.Helper(); return servers.ServerURL(t) }

// DB is servers.DB.
func DB(t testing.TB) (*pgxpool.Pool, string) { t.Helper(); return servers.DB(t) }

// Kafka is servers.Kafka.
func Kafka(t testing.TB, opts ...kfake.Opt) *kafkacluster.Cluster {
	t.Helper()
	return servers.Kafka(t, opts...)
}

// FakeKafka is servers.FakeKafka.
func FakeKafka(t testing.TB, opts ...kfake.Opt) *kafkacluster.Cluster {
	t.Helper()
	return servers.FakeKafka(t, opts...)
}

// Topic is servers.Topic.
func Topic(t testing.TB, base string) string { t.Helper(); return servers.Topic(t, base) }

// OwnCluster starts a throwaway Postgres cluster for this test alone, for
// tests that stop and start the server (Down/Up), and returns it with a
// pool on it; both end with the test.
func OwnCluster(t testing.TB, ctx context.Context) (*pgcluster.Cluster, *pgxpool.Pool) {
	t.Helper()
	c, err := pgcluster.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	pool, err := pgxpool.New(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return c, pool
}
