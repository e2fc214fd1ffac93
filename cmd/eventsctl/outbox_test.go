package main

import (
	"context"
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/outbox"
)

// TestOutboxStuckRowCommands walks the operator's path on a stuck row:
// status shows the topic's failing key, list --stuck shows the row, park
// moves it out, retry brings it back, drop moves it out for good, and the
// log says who did what and why.
func TestOutboxStuckRowCommands(t *testing.T) {
	ctx := context.Background()
	pool, schema := servers.DB(t)
	env := map[string]string{"PROTOEVENTS_DATABASE_URL": dbURL(t, schema), "USER": "oncall"}
	if code, out, errOut := cli(t, env, "outbox", "status"); code != exitFailed || !strings.Contains(errOut, "run `eventsctl migrate` first") {
		t.Fatalf("status before migrate: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := cli(t, env, "prune"); code != exitFailed || !strings.Contains(errOut, "dedup table consumed_events does not exist") || !strings.Contains(errOut, "run `eventsctl migrate`") {
		t.Fatalf("prune before migrate: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := cli(t, env, "migrate", "--only", "outbox"); code != 0 {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, errOut)
	}
	w, err := outbox.NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d := testenv.Descriptor("shop.orders.order-placed.v1")
	for i := range 3 {
		if _, err := w.Write(ctx, tx, testenv.NewEvent(d, "order-7", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// What a relay records when the broker refuses the key's head row.
	var head int64
	if err := pool.QueryRow(ctx, `UPDATE outbox SET attempts = 7, last_error = '[10] Message Size Too Large'
		WHERE id = (SELECT min(id) FROM outbox) RETURNING id`).Scan(&head); err != nil {
		t.Fatal(err)
	}
	id := strconv.FormatInt(head, 10)

	code, out, errOut := cli(t, env, "outbox", "status", "--json")
	var st statusJSON
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || len(st.Topics) != 1 || st.Topics[0].FailingKeys != 1 || st.Topics[0].Pending != 3 {
		t.Fatalf("status --json: exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, `"oldest_pending_seconds"`) || strings.Contains(out, "OldestPending") {
		t.Fatalf("status --json is not snake_case with seconds:\n%s", out)
	}
	code, out, errOut = cli(t, env, "outbox", "list", "--stuck")
	if code != 0 || !strings.Contains(out, id+"  ") || !strings.Contains(out, "order-7") || !strings.Contains(out, "Message Size Too Large") {
		t.Fatalf("list --stuck: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("eventsctl outbox list --stuck\n%s", out)
	code, out, errOut = cli(t, env, "outbox", "park", "--id", id, "--reason", "payload over the broker limit")
	if code != 0 || !strings.Contains(out, "pending -> parked") {
		t.Fatalf("park: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut = cli(t, env, "outbox", "park", "--id", id, "--reason", "again"); code != exitFailed || !strings.Contains(errOut, "already parked") {
		t.Fatalf("park twice: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, env, "outbox", "retry", "--id", id)
	if code != 0 || !strings.Contains(out, "parked -> pending as row") {
		t.Fatalf("retry: exit %d\n%s%s", code, out, errOut)
	}
	var newID int64
	if err := pool.QueryRow(ctx, `SELECT retried_as FROM outbox_dead WHERE outbox_id = $1`, head).Scan(&newID); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = cli(t, env, "outbox", "drop", "--id", strconv.FormatInt(newID, 10), "--reason", "superseded", "--by", "alice")
	if code != 0 || !strings.Contains(out, "pending -> dropped") {
		t.Fatalf("drop: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cli(t, env, "outbox", "list", "--parked")
	if code != 0 || !strings.Contains(out, "retried as "+strconv.FormatInt(newID, 10)) || !strings.Contains(out, "dropped") {
		t.Fatalf("list --parked: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("eventsctl outbox list --parked\n%s", out)
	code, out, errOut = cli(t, env, "outbox", "list", "--log")
	if code != 0 || strings.Count(out, "\n") != 4 || !strings.Contains(out, "oncall@") || !strings.Contains(out, "alice") {
		t.Fatalf("list --log: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("eventsctl outbox list --log\n%s", out)
	code, out, _ = cli(t, env, "outbox", "status")
	if code != 0 || !strings.Contains(out, "shop.orders.order-placed.v1") {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	t.Logf("eventsctl outbox status\n%s", out)
}

// TestDatabaseErrorsNameTheFix: each way a database can fail a command
// gets its own message and exit code.
func TestDatabaseErrorsNameTheFix(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hanging := ln.Addr().String()
	go func() { // accepts and never answers, like a frozen server
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusing := closed.Addr().String()
	closed.Close()
	old := connectTimeout
	connectTimeout = time.Second
	t.Cleanup(func() { connectTimeout = old })

	server := servers.ServerURL(t)
	withUser := strings.Replace(server, "postgres://postgres@", "postgres://no_such_role@", 1)
	withDB := strings.Replace(server, "/postgres?", "/no_such_db?", 1)
	cases := []struct {
		url  string
		code int
		want string
	}{
		{"postgres://postgres@" + refusing + "/postgres?sslmode=disable", exitUnreachable, "cannot reach " + refusing},
		{"postgres://postgres@" + hanging + "/postgres?sslmode=disable", exitUnreachable, "timed out after 1s connecting to " + hanging},
		{"postgres://x y:1/", exitUsage, "--database-url"},
	}
	if withUser != server {
		cases = append(cases, struct {
			url  string
			code int
			want string
		}{withUser, exitFailed, `refused role "no_such_role"`})
	}
	if withDB != server {
		cases = append(cases, struct {
			url  string
			code int
			want string
		}{withDB, exitFailed, `database "no_such_db" does not exist`})
	}
	for _, c := range cases {
		code, _, errOut := cli(t, map[string]string{"PROTOEVENTS_DATABASE_URL": c.url}, "outbox", "status")
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d, %q; want exit %d with %q", c.url, code, errOut, c.code, c.want)
		}
	}
}

// TestCLIEdges: version --json, compat outside a buf workspace, and how
// dlq show renders keys and binary values.
func TestCLIEdges(t *testing.T) {
	code, out, _ := cli(t, nil, "version", "--json")
	var v map[string]string
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v["name"] != "eventsctl" || v["version"] == "" {
		t.Errorf("version --json: exit %d, %q", code, out)
	}
	// The test runs in cmd/eventsctl, which has no buf.yaml.
	code, _, errOut := cli(t, nil, "compat", "--against", "../../events.lock")
	if code != 2 || !strings.Contains(errOut, "has no buf.yaml: run compat from the buf workspace root") {
		t.Errorf("compat outside a buf workspace: exit %d, %q", code, errOut)
	}
	if got := readable([]byte("order-7")); got != `"order-7"` {
		t.Errorf("readable(text) = %s", got)
	}
	if got := readable([]byte{0x0a, 0x03, 0xff}); got != "0x0a03ff" {
		t.Errorf("readable(binary) = %s", got)
	}
	if got := dumpBytes([]byte{0x0a, 0x03, 'a', 'b', 'c', 0xff}); !strings.HasPrefix(got, "00000000  0a 03 61 62 63 ff") || !strings.Contains(got, "|..abc.|") {
		t.Errorf("dumpBytes(binary) = %q", got)
	}
	if got := dumpBytes(make([]byte, maxDump+10)); !strings.HasSuffix(got, "... 10 more bytes\n") {
		t.Errorf("dumpBytes(large) does not stop at %d bytes: ...%q", maxDump, got[len(got)-40:])
	}
}
