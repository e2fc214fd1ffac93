// Package testenv holds the helpers of the project's own tests that are not
// part of the public test kit: a hand-written Event (the runtime's tests
// cannot use generated code), Sent (what a pool sent to the database) and
// OwnCluster (a Postgres server of the test's own, to stop and start). The
// shared servers (a Postgres schema per test, Kafka) are
// eventstest/servers; a package using its DB calls servers.Main from
// TestMain.
package testenv

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/eventstest/pgcluster"
)

// OwnCluster starts a throwaway Postgres cluster for this test alone, for
// tests that stop and start the server (Down/Up) or need settings of their
// own (pgcluster.WithSetting("wal_level", "logical")), and returns it with
// a pool on it; both end with the test.
func OwnCluster(t testing.TB, ctx context.Context, opts ...pgcluster.Option) (*pgcluster.Cluster, *pgxpool.Pool) {
	t.Helper()
	c, err := pgcluster.Start(ctx, opts...)
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
