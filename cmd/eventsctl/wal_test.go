package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/protoevents/protoevents/eventstest/pgcluster"
	"github.com/protoevents/protoevents/eventstest/servers"
	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// TestWALCommands: wal setup, status and drop on a logical cluster, and
// `relay --source wal` publishing what a WAL-source producer wrote, with
// its metrics and readiness; wal setup on the shared server (wal_level =
// replica) names the fix.
func TestWALCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster, pool := testenv.OwnCluster(t, ctx, pgcluster.WithSetting("wal_level", "logical"))
	k := servers.OwnKafka(t)
	env := map[string]string{"PROTOEVENTS_DATABASE_URL": cluster.URL, "PROTOEVENTS_KAFKA_BROKERS": strings.Join(k.Brokers, ",")}
	if code, out, errOut := cli(t, env, "wal", "status"); code != 1 || !strings.Contains(errOut, "eventsctl wal setup") {
		t.Fatalf("status before setup: exit %d\n%s%s", code, out, errOut)
	}
	for range 2 {
		if code, out, errOut := cli(t, env, "wal", "setup"); code != 0 {
			t.Fatalf("wal setup: exit %d\n%s%s", code, out, errOut)
		}
	}
	if code, out, errOut := cli(t, env, "wal", "status", "--json"); code != 0 || !strings.Contains(out, `"exists": true`) {
		t.Fatalf("wal status: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := cli(t, env, "topics", "create", "--topic", ordersv1.OrderPlacedTopic, "--partitions", "3"); code != 0 {
		t.Fatalf("topics create: exit %d\n%s%s", code, out, errOut)
	}
	w, err := outbox.NewWriter(outbox.WithWALSource("protoevents"))
	if err != nil {
		t.Fatal(err)
	}
	p := ordersv1.NewOrderPlacedProducer(w)
	const n = 40
	if err := outbox.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i := 0; i < n; i++ {
			if _, err := p.Publish(ctx, tx, &ordersv1.OrderPlaced{OrderId: "o-" + strconv.Itoa(i%7)}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var out, errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		e := &cliEnv{stdout: &out, stderr: &errOut, getenv: func(k string) string { return env[k] }}
		done <- run(runCtx, e, []string{"relay", "--source", "wal", "--metrics-addr", addr})
	}()
	get := func(path string) (int, string) { return httpGet(addr, path) }
	deadline := time.Now().Add(3 * time.Minute)
	for {
		_, metrics := get("/metrics")
		if strings.Contains(metrics, "protoevents_relay_published_total "+strconv.Itoa(n)) && strings.Contains(metrics, "protoevents_walrelay_active 1") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay did not publish %d records in time; metrics:\n%s\nstderr:\n%s", n, metrics, errOut.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, body := get("/readyz"); code != http.StatusOK || !strings.HasPrefix(body, "walrelay: active") {
		t.Errorf("/readyz: %d %q", code, body)
	}
	if code, out, errOut := cli(t, env, "wal", "drop"); code == 0 || !strings.Contains(errOut, "stop the relays first") {
		t.Errorf("drop under a running relay: exit %d\n%s%s", code, out, errOut)
	}
	stop()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("relay exit %d\n%s", code, errOut.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("relay did not stop after cancellation")
	}
	got := testenv.CountRecords(t, k.Brokers, ordersv1.OrderPlacedTopic, 3)
	if got != n {
		t.Fatalf("%d records on %s, want %d", got, ordersv1.OrderPlacedTopic, n)
	}
	// The walsender may take a moment to let the slot go.
	deadline = time.Now().Add(time.Minute)
	for {
		code, out, errOut := cli(t, env, "wal", "drop")
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("wal drop: exit %d\n%s%s", code, out, errOut)
		}
		time.Sleep(100 * time.Millisecond)
	}

	_, schema := servers.DB(t)
	replica := map[string]string{"PROTOEVENTS_DATABASE_URL": dbURL(t, schema)}
	var level string
	if err := pool.QueryRow(ctx, `SHOW wal_level`).Scan(&level); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := cli(t, replica, "wal", "setup"); code == 0 {
		t.Logf("the shared server runs wal_level = logical: setup succeeded\n%s", out)
	} else if !strings.Contains(errOut, "ALTER SYSTEM SET wal_level = logical") {
		t.Errorf("wal setup below logical: exit %d\n%s", code, errOut)
	}
}
