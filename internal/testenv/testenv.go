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
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

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

// WaitFor polls cond until it holds, failing the test with what and the
// state cond last described when within passes. The bound is generous by
// design: the wait returns as soon as the condition holds, so a loaded
// machine only makes it slower, never red.
func WaitFor(t testing.TB, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s (%s)", within, what, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Ready asks an http.Handler of a /readyz probe and returns whether it
// answered 200, with its body.
func Ready(h http.Handler) (bool, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	return rec.Code == http.StatusOK, strings.TrimSpace(rec.Body.String())
}

// KafkaOutage returns a switch for an outage of the in-process cluster c:
// while it is on, every request to its brokers fails (as if they were
// down), and they answer again once it is off.
func KafkaOutage(c *kfake.Cluster) *atomic.Bool {
	var down atomic.Bool
	c.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if down.Load() {
			return nil, errors.New("broker down"), true
		}
		return nil, nil, false
	})
	return &down
}
