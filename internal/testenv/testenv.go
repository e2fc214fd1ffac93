// Package testenv gives the project's integration tests their real
// dependencies. It forwards to the public test kit, eventstest, which now
// holds the code: a Postgres schema of the test's own on a shared server
// ($PROTOEVENTS_TEST_DATABASE_URL or a throwaway cluster) and a Kafka cluster
// reached over TCP ($PROTOEVENTS_KAFKA_BROKERS or in-process). A package
// using DB must call Main from its TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
package testenv

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/protoevents/protoevents/eventstest"
	"github.com/protoevents/protoevents/eventstest/kafkacluster"
)

// EnvDatabaseURL is eventstest.EnvDatabaseURL.
const EnvDatabaseURL = eventstest.EnvDatabaseURL

// Main is eventstest.Main.
func Main(m *testing.M) { eventstest.Main(m) }

// ServerURL is eventstest.ServerURL.
func ServerURL(t testing.TB) string { t.Helper(); return eventstest.ServerURL(t) }

// DB is eventstest.DB.
func DB(t testing.TB) (*pgxpool.Pool, string) { t.Helper(); return eventstest.DB(t) }

// Kafka is eventstest.Kafka.
func Kafka(t testing.TB, opts ...kfake.Opt) *kafkacluster.Cluster {
	t.Helper()
	return eventstest.Kafka(t, opts...)
}

// FakeKafka is eventstest.FakeKafka.
func FakeKafka(t testing.TB, opts ...kfake.Opt) *kafkacluster.Cluster {
	t.Helper()
	return eventstest.FakeKafka(t, opts...)
}

// Topic is eventstest.Topic.
func Topic(t testing.TB, base string) string { t.Helper(); return eventstest.Topic(t, base) }
