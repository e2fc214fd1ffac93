package eventstest

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/protoevents/protoevents/eventstest/kafkacluster"
	"github.com/protoevents/protoevents/eventstest/servers"
)

// EnvDatabaseURL names the variable holding the URL of a server tests may
// create schemas in. Without it a throwaway cluster is started.
const EnvDatabaseURL = servers.EnvDatabaseURL

// Main runs the package's tests, then stops the throwaway Postgres server,
// if one was started, and exits with the tests' status. Call it from
// TestMain in every package that uses New or DB:
//
//	func TestMain(m *testing.M) { eventstest.Main(m) }
func Main(m *testing.M) { servers.Main(m) }

// ServerURL returns the URL of the shared Postgres server, starting a
// throwaway one on first use when $PROTOEVENTS_TEST_DATABASE_URL is unset.
func ServerURL(t testing.TB) string { t.Helper(); return servers.ServerURL(t) }

// DB returns a pool on a new, empty schema of the test's own (dropped when
// the test ends) and the schema's name. New does the same and migrates it.
func DB(t testing.TB) (*pgxpool.Pool, string) { t.Helper(); return servers.DB(t) }

// Kafka returns the cluster named in $PROTOEVENTS_KAFKA_BROKERS, the test
// binary's real Apache Kafka node ($PROTOEVENTS_TEST_KAFKA=apache), or a new
// in-process one closed when the test ends. On a shared cluster, use
// Cluster.Group for consumer group IDs: a real broker keeps groups and
// their offsets across tests.
func Kafka(t testing.TB, opts ...kfake.Opt) *kafkacluster.Cluster {
	t.Helper()
	return servers.Kafka(t, opts...)
}

// OwnKafka returns a cluster of the test's own, for tests whose topics and
// consumer groups have fixed names (generated events): a new Apache Kafka
// node in the real tier ($PROTOEVENTS_TEST_KAFKA=apache), else a new
// in-process cluster.
func OwnKafka(t testing.TB, opts ...kfake.Opt) *kafkacluster.Cluster {
	t.Helper()
	return servers.OwnKafka(t, opts...)
}

// FakeKafka returns a new in-process cluster even when a real one is
// configured, for tests that inject faults through kfake's control hooks.
func FakeKafka(t testing.TB, opts ...kfake.Opt) *kafkacluster.Cluster {
	t.Helper()
	return servers.FakeKafka(t, opts...)
}

// Topic returns a topic name unique to this run, so tests can share a real
// cluster.
func Topic(t testing.TB, base string) string { t.Helper(); return servers.Topic(t, base) }
