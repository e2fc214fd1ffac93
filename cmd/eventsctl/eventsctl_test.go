package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/examples/demo"
	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	"github.com/protoevents/protoevents/examples/shipping"
	"github.com/protoevents/protoevents/runtime/outbox"
)

func TestMain(m *testing.M) { servers.Main(m) }

// cli runs one eventsctl command line in-process.
func cli(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	e := &cliEnv{stdout: &out, stderr: &errOut, getenv: func(k string) string { return env[k] }}
	code = run(context.Background(), e, args)
	return code, out.String(), errOut.String()
}

func TestHelpAndUsageErrors(t *testing.T) {
	code, out, _ := cli(t, nil, "help")
	if code != 0 {
		t.Fatalf("help exit %d", code)
	}
	if code, out, _ := cli(t, nil, "--version"); code != 0 || !strings.HasPrefix(out, "eventsctl (protoevents runtime) v") {
		t.Errorf("--version: exit %d, %q", code, out)
	}
	for _, c := range commands {
		if !strings.Contains(out, "  "+c.name) {
			t.Errorf("help does not list %s:\n%s", c.name, out)
		}
	}
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"migrate"}, 2, "--database-url is required (or set PROTOEVENTS_DATABASE_URL)"},
		{[]string{"relay", "--database-url", "postgres://x"}, 2, "--brokers is required (or set PROTOEVENTS_KAFKA_BROKERS)"},
		{[]string{"dlq"}, 2, "missing subcommand"},
		{[]string{"dlq", "list", "--brokers", "b:9092"}, 2, "--topic is required"},
		{[]string{"dlq", "redrive", "--brokers", "b:9092", "--topic", "t.dlq"}, 2, "choose exactly one of --offset, --event-id or --all"},
		{[]string{"dlq", "redrive", "--brokers", "b:9092", "--topic", "t.dlq", "--offset", "x"}, 2, `offset "x" is not a non-negative integer`},
		{[]string{"outbox"}, 2, "missing subcommand"},
		{[]string{"outbox", "purge"}, 2, `unknown subcommand "purge"`},
		{[]string{"dlq", "purge"}, 2, `unknown subcommand "purge"`},
		{[]string{"outbox", "list", "--database-url", "postgres://x"}, 2, "choose one of --stuck, --parked or --log"},
		{[]string{"outbox", "park", "--database-url", "postgres://x", "--id", "7"}, 2, "--reason is required"},
		{[]string{"outbox", "drop", "--database-url", "postgres://x", "--id", "seven", "--reason", "r"}, 2, `--id "seven" is not a row id`},
		{[]string{"migrate", "--database-url", "postgres://x", "--lanes", "0"}, 2, "--lanes 0: want 1..1024"},
		{[]string{"version", "--bogus"}, 2, "flag provided but not defined"},
		{[]string{"topics", "create", "--brokers", "b:9092"}, 2, "give one of --lock (the plugin's events.lock) or --topic"},
		{[]string{"migrate", "--bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"migrate", "--database-url", "postgres://x", "--only", "both"}, 2, "--only must be outbox or consumer"},
		{[]string{"compat"}, 2, ""},
		{[]string{"migrate", "extra", "--database-url", "postgres://x"}, 2, `unexpected argument "extra"`},
		{[]string{"outbox", "status", "extra", "--json"}, 2, `unexpected argument "extra"`},
		{[]string{"relay", "--database-url", "postgres://x", "--brokers", "b:9092", "--batch", "0"}, 2, "--batch 0: want 1..10000"},
		{[]string{"relay", "--database-url", "postgres://x", "--brokers", "b:9092", "--shutdown-grace", "-1s"}, 2, "--shutdown-grace -1s must not be negative"},
	}
	for _, c := range cases {
		code, _, errOut := cli(t, nil, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("eventsctl %s: exit %d, stderr %q; want exit %d with %q", strings.Join(c.args, " "), code, errOut, c.code, c.want)
		}
	}
	// Every command answers -h with its flags and exit 0.
	for _, c := range commands {
		if c.name == "version" {
			continue
		}
		args := []string{c.name, "-h"}
		if c.name == "outbox" {
			args = []string{"outbox", "status", "-h"}
		}
		if c.name == "dlq" {
			args = []string{"dlq", "redrive", "-h"}
		}
		if c.name == "topics" {
			args = []string{"topics", "create", "-h"}
		}
		code, out, _ := cli(t, nil, args...)
		if code != 0 || !strings.Contains(strings.ToLower(out), "usage:") {
			t.Errorf("eventsctl %s: exit %d, help on stdout %q", strings.Join(args, " "), code, out)
		}
	}
}

// dbURL is the URL of the test's own schema, for commands that connect by
// URL.
func dbURL(t *testing.T, schema string) string {
	u, err := url.Parse(servers.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// TestDemoPoisonRedrive is the operator's path through the demo's poison
// message: list it, fix the shipping service (it serves the country now),
// redrive it with eventsctl, and see it applied exactly once; a second
// redrive changes nothing.
func TestDemoPoisonRedrive(t *testing.T) {
	ctx := context.Background()
	pool, schema := servers.DB(t)
	// The example's topics and consumer groups are fixed by its schemas, so
	// runs would see each other's messages on a shared cluster: a cluster of
	// the test's own (a real node in the real tier, else in-process).
	k := servers.OwnKafka(t)
	env := map[string]string{"PROTOEVENTS_DATABASE_URL": dbURL(t, schema), "PROTOEVENTS_KAFKA_BROKERS": strings.Join(k.Brokers, ",")}

	if code, out, errOut := cli(t, env, "migrate"); code != 0 || !strings.Contains(out, "outbox table outbox: ready") {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut := cli(t, env, "topics", "create", "--topic", ordersv1.OrderPlacedTopic, "--partitions", "3")
	if code != 0 || !strings.Contains(out, ordersv1.OrderPlacedDLQTopic+": created (3 partitions") {
		t.Fatalf("topics create: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, env, "topics", "create", "--topic", ordersv1.OrderPlacedTopic)
	if code != 0 || strings.Count(out, "exists, unchanged") != 2 {
		t.Fatalf("topics create again: exit %d\n%s%s", code, out, errOut)
	}
	if err := demo.Setup(ctx, pool, k.Brokers); err != nil {
		t.Fatal(err)
	}
	cfg := demo.Config{DB: pool, Brokers: k.Brokers, Orders: 40}
	rep, err := demo.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		for _, e := range rep.DLQEntries {
			t.Logf("DLQ %d@%d %s attempts %d consumer %s first %s last %s from %s/%d@%d", e.Partition, e.Offset, e.EventID, e.Attempts, e.Consumer, e.FirstFailure, e.LastFailure, e.OriginalTopic, e.OriginalPartition, e.OriginalOffset)
		}
		t.Fatalf("demo invariants: %v", rep.Violations)
	}

	code, out, errOut = cli(t, env, "dlq", "list", "--topic", ordersv1.OrderPlacedDLQTopic)
	n := itoa(len(rep.DLQEntries))
	if code != 0 || !strings.Contains(out, n+" message(s) of "+n+" in "+ordersv1.OrderPlacedDLQTopic) || !strings.Contains(out, rep.DLQEntries[0].EventID) ||
		!strings.Contains(out, `no carrier serves country "ZZ"`) || !strings.Contains(out, ordersv1.OrderPlacedTopic+"/") {
		t.Fatalf("dlq list: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := cli(t, env, "dlq", "list", "--topic", "never.seen.dlq"); code != exitFailed || !strings.Contains(errOut, "DLQ topic never.seen.dlq does not exist") {
		t.Fatalf("dlq list of a missing topic: exit %d, %q", code, errOut)
	}
	e := rep.DLQEntries[0]
	code, out, errOut = cli(t, env, "dlq", "list", "--topic", ordersv1.OrderPlacedDLQTopic, "--consumer", e.Consumer, "--since", "1h", "--limit", "1")
	if code != 0 || !strings.Contains(out, "1 message(s) of "+n) || !strings.Contains(out, e.Consumer+" 1") {
		t.Fatalf("dlq list --consumer --since --limit: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut = cli(t, env, "dlq", "list", "--topic", ordersv1.OrderPlacedDLQTopic, "--consumer", "nobody"); code != 0 || !strings.Contains(out, "no message of "+ordersv1.OrderPlacedDLQTopic+" matches") {
		t.Fatalf("dlq list --consumer nobody: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut = cli(t, env, "dlq", "list", "--topic", ordersv1.OrderPlacedDLQTopic, "--json"); code != 0 || !strings.Contains(out, `"value_dropped": false`) || !strings.Contains(out, `"dead_lettered_at"`) {
		t.Fatalf("dlq list --json: exit %d\n%s%s", code, out, errOut)
	}
	// No --partition: the one partition holding the offset is found.
	code, out, errOut = cli(t, env, "dlq", "show", "--topic", ordersv1.OrderPlacedDLQTopic, "--offset", itoa(int(e.Offset)))
	if code != 0 || !strings.Contains(out, "dlq_error: ") || !strings.Contains(out, "event:     shop.orders.v1.OrderPlaced "+e.EventID) ||
		!strings.Contains(out, "envelope:  json, shop.orders.v1.OrderPlaced v1") {
		t.Fatalf("dlq show: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut = cli(t, env, "dlq", "redrive", "--topic", ordersv1.OrderPlacedDLQTopic, "--event-id", "nope"); code != exitUsage || !strings.Contains(errOut, `--event-id "nope" is not a valid event ID`) {
		t.Fatalf("redrive --event-id nope: exit %d, %q", code, errOut)
	}
	if code, out, errOut := cli(t, env, "outbox", "status"); code != 0 || !strings.Contains(out, "pending") {
		t.Fatalf("outbox status: exit %d\n%s%s", code, out, errOut)
	}
	// Pruning below the retention floor is refused; above it, the fresh
	// dedup rows are kept.
	if code, _, errOut := cli(t, env, "prune", "--older-than", "1h"); code != 2 || !strings.Contains(errOut, "--older-than 1h0m0s is below --retention-floor 168h0m0s") {
		t.Fatalf("prune below the floor: exit %d, stderr %q", code, errOut)
	}
	if code, out, errOut := cli(t, env, "prune", "--older-than", "1h", "--retention-floor", "1m"); code != 0 || !strings.Contains(out, "pruned 0 dedup rows") {
		t.Fatalf("prune: exit %d\n%s%s", code, out, errOut)
	}

	w, err := outbox.NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	fixed := shipping.New(w) // serves every country now
	for round := 1; round <= 2; round++ {
		code, out, errOut := cli(t, env, "dlq", "redrive", "--topic", ordersv1.OrderPlacedDLQTopic, "--event-id", e.EventID)
		if code != 0 || !strings.Contains(out, "redrove shop.orders.v1.OrderPlaced "+e.EventID) {
			t.Fatalf("redrive %d: exit %d\n%s%s", round, code, out, errOut)
		}
		n, err := demo.ApplyRedriven(ctx, cfg, fixed, rep.PoisonOrderID)
		if err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("after redrive %d the poison order is applied %d times, want 1", round, n)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestRelayProcess runs `eventsctl relay` as an operator would: it publishes
// the committed outbox rows, serves Prometheus metrics and a health check,
// and stops cleanly on cancellation (SIGTERM in the real process).
func TestRelayProcess(t *testing.T) {
	pool, schema := servers.DB(t)
	k := servers.OwnKafka(t)
	env := map[string]string{"PROTOEVENTS_DATABASE_URL": dbURL(t, schema), "PROTOEVENTS_KAFKA_BROKERS": strings.Join(k.Brokers, ",")}
	if code, out, errOut := cli(t, env, "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := cli(t, env, "topics", "create", "--topic", ordersv1.OrderPlacedTopic, "--partitions", "3"); code != 0 {
		t.Fatalf("topics create: exit %d\n%s%s", code, out, errOut)
	}
	ctx := context.Background()
	w, err := outbox.NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	p := ordersv1.NewOrderPlacedProducer(w)
	const n = 40
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i := 0; i < n; i++ {
			if _, err := p.Publish(ctx, tx, &ordersv1.OrderPlaced{OrderId: "o-" + strconv.Itoa(i%7)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	runCtx, stop := context.WithCancel(ctx)
	var out, errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		e := &cliEnv{stdout: &out, stderr: &errOut, getenv: func(k string) string { return env[k] }}
		done <- run(runCtx, e, []string{"relay", "--metrics-addr", addr, "--poll", "100ms"})
	}()
	get := func(path string) (int, string) { return httpGet(addr, path) }
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, metrics := get("/metrics")
		if strings.Contains(metrics, "protoevents_relay_published_total "+strconv.Itoa(n)) {
			break
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("relay did not publish %d rows in time; metrics:\n%s\nstderr:\n%s", n, metrics, errOut.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, path := range []string{"/livez", "/healthz", "/readyz"} {
		if code, body := get(path); code != http.StatusOK || !strings.HasPrefix(body, "ready\n") {
			t.Errorf("%s: %d %q", path, code, body)
		}
	}
	if code, out, _ := cli(t, env, "outbox", "status", "--json"); code != 0 || !strings.Contains(out, `"pending": 0,`) {
		t.Errorf("outbox status after the relay: exit %d\n%s", code, out)
	}
	stop()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("relay exit %d\n%s", code, errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not stop after cancellation")
	}
	got := 0
	for part := 0; part < 3; part++ {
		conn, err := kafka.DialLeader(ctx, "tcp", k.Brokers[0], ordersv1.OrderPlacedTopic, part)
		if err != nil {
			t.Fatal(err)
		}
		last, err := conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		got += int(last)
	}
	if got != n {
		t.Fatalf("%d messages on %s, want %d", got, ordersv1.OrderPlacedTopic, n)
	}
}

// TestRelayProcessWaitsForTheDatabase: `eventsctl relay` started while its
// database is unreachable keeps running, live but not ready, and exits 0
// when stopped.
func TestRelayProcessWaitsForTheDatabase(t *testing.T) {
	t.Parallel()
	k := servers.OwnKafka(t)
	closed := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	dbAddr, addr := closed(), closed()
	env := map[string]string{"PROTOEVENTS_DATABASE_URL": "postgres://postgres@" + dbAddr + "/postgres?sslmode=disable", "PROTOEVENTS_KAFKA_BROKERS": strings.Join(k.Brokers, ",")}
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	var out, errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		e := &cliEnv{stdout: &out, stderr: &errOut, getenv: func(k string) string { return env[k] }}
		done <- run(runCtx, e, []string{"relay", "--metrics-addr", addr})
	}()
	get := func(path string) (int, string) { return httpGet(addr, path) }
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := get("/readyz")
		if code == http.StatusServiceUnavailable && strings.Contains(body, "database: unreachable") {
			break
		}
		select {
		case code := <-done:
			t.Fatalf("relay exited (%d) while the database was unreachable\n%s", code, errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never reported the database down: %d %q", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, body := get("/livez"); code != http.StatusOK {
		t.Errorf("/livez while waiting for the database: %d %q", code, body)
	}
	stop()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("relay exit %d\n%s", code, errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("relay did not stop after cancellation")
	}
}

// httpGet fetches path from the server at addr: the status and the body,
// or 0 and the error.
func httpGet(addr, path string) (int, string) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
