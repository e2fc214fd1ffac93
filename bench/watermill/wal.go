package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/eventstest/pgcluster"
	ordersv1 "github.com/protoevents/protoevents/examples/gen/shop/orders/v1"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
	"github.com/protoevents/protoevents/runtime/walrelay"
)

// The WAL relay's measurements (issue 29) run on a Postgres of their own
// with wal_level = logical and durable commits (fsync, synchronous_commit
// and full_page_writes on, like the shared server): the shared server runs
// wal_level = replica. Every ratio here compares two variants on that same
// server, measured in the same interleaved way as the rest.

// startLogical starts the logical cluster, unless
// $PROTOEVENTS_TEST_LOGICAL_DATABASE_URL names one.
func startLogical(ctx context.Context, e *env) error {
	if u := os.Getenv("PROTOEVENTS_TEST_LOGICAL_DATABASE_URL"); u != "" {
		e.walURL = u
		return nil
	}
	pg, err := pgcluster.Start(ctx, pgcluster.WithSetting("wal_level", "logical"), pgcluster.WithSetting("fsync", "on"),
		pgcluster.WithSetting("synchronous_commit", "on"), pgcluster.WithSetting("full_page_writes", "on"),
		pgcluster.WithSetting("max_wal_size", "4GB"))
	if err != nil {
		return fmt.Errorf("logical Postgres for the WAL relay: %w", err)
	}
	e.walURL = pg.URL
	e.stops = append(e.stops, func() { _ = pg.Stop() })
	return nil
}

// walSchema is a schema on the logical server with the outbox table, a
// slot of its own (dropped with it) and both kinds of Writer.
type walSchema struct {
	*schema
	slot  string
	table *outbox.Writer // the outbox table
	wal   *outbox.Writer // the WAL source
}

func (e *env) newWALSchema(ctx context.Context, prefix string) (*walSchema, error) {
	s, err := e.newSchemaOn(ctx, e.walURL, prefix)
	if err != nil {
		return nil, err
	}
	ws := &walSchema{schema: s, slot: s.name} // schema names are valid slot names
	if err := outbox.Migrate(ctx, s.pool); err != nil {
		s.drop()
		return nil, err
	}
	if err := walrelay.Setup(ctx, s.pool, walrelay.WithSlot(ws.slot)); err != nil {
		s.drop()
		return nil, err
	}
	if ws.table, err = outbox.NewWriter(); err == nil {
		ws.wal, err = outbox.NewWriter(outbox.WithWALSource(ws.slot))
	}
	if err != nil {
		ws.drop()
		return nil, err
	}
	return ws, nil
}

func (ws *walSchema) drop() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = walrelay.Drop(ctx, ws.pool, walrelay.WithSlot(ws.slot))
	ws.schema.drop()
}

func (ws *walSchema) publisher(w *outbox.Writer, d *events.Descriptor) publishFunc {
	return func(ctx context.Context, tx pgx.Tx, ord *ordersv1.OrderPlaced) error {
		_, err := w.Write(ctx, tx, orderEvent{OrderPlaced: ord, d: d})
		return err
	}
}

// walWriteRound measures the write on the logical server: the bare
// business transaction, the table outbox and the WAL source, each on
// outbox.BeginFunc (a CommitTx) and on a plain pgx.Tx.
func walWriteRound(ctx context.Context, e *env, c config, res results) error {
	ws, err := e.newWALSchema(ctx, "wmb_walw")
	if err != nil {
		return err
	}
	defer ws.drop()
	d := descriptorFor("wal-write-" + suffix())
	// Watermill on the same server: issue 31 compares the deployed shape
	// (a plain pgx.Tx) with it, as the write round does on the shared one.
	w, err := newWM(ctx, ws.schema)
	if err != nil {
		return err
	}
	wmTopic := "wal-write-wm-" + suffix()
	variants := []struct {
		name string
		p    producer
	}{
		{"bare", producer{}},
		{"table", producer{begin: outbox.BeginFunc, publish: ws.publisher(ws.table, d)}},
		{"wal", producer{begin: outbox.BeginFunc, publish: ws.publisher(ws.wal, d)}},
		{"wal-plain", producer{publish: ws.publisher(ws.wal, d)}},
		{"table-plain", producer{publish: ws.publisher(ws.table, d)}},
		// The floor under wal: a message of the record's size sent with the
		// COMMIT by pgx alone, no protoevents code.
		{"raw-wal", producer{begin: rawBatchBegin, publish: rawWALHold}},
		// The floor under wal-plain: a round trip and nothing else.
		{"raw-roundtrip", producer{publish: rawRoundTrip}},
		{"watermill", producer{publish: func(ctx context.Context, tx pgx.Tx, ord *ordersv1.OrderPlaced) error {
			return w.publish(ctx, tx, wmTopic, ord)
		}}},
	}
	ps := make([]producer, len(variants))
	for i, v := range variants {
		ps[i] = v.p
	}
	for _, clients := range []int{1, 8} {
		ns, err := writeCosts(ctx, ws.schema, clients, c.write, ps)
		if err != nil {
			return fmt.Errorf("WAL write, %d clients: %w", clients, err)
		}
		for i, v := range variants {
			res.add(fmt.Sprintf("wal-write-%d/%s", clients, v.name), "ns/op", ns[i])
		}
	}
	return nil
}

// walDrainRound drains the same number of events through the polling relay
// (from the table) and the WAL relay (from the slot), and decodes the WAL
// events with no Kafka at all (rawDecode) as the WAL relay's ceiling.
func walDrainRound(ctx context.Context, e *env, c config, res results, walFirst bool) error {
	ws, err := e.newWALSchema(ctx, "wmb_wald")
	if err != nil {
		return err
	}
	defer ws.drop()
	tableTopic, walTopic := "wal-drain-table-"+suffix(), "wal-drain-wal-"+suffix()
	if err := createTopics(ctx, e.brokers, tableTopic, walTopic); err != nil {
		return err
	}
	// The slots start after the table's prefill: the polling relay's rows
	// are in the same WAL, and a slot made before them would decode their
	// 20,000 inserts before its first message, charging the WAL relay (from
	// its start) with work raw decoding (from its first record) leaves out.
	if err := walrelay.Drop(ctx, ws.pool, walrelay.WithSlot(ws.slot)); err != nil {
		return err
	}
	o := &ours{s: ws.schema, w: ws.table}
	if err := o.prefill(ctx, descriptorFor(tableTopic), c.events); err != nil {
		return err
	}
	// A second slot, made with the first, before the events are written,
	// for the raw decoding of the same WAL.
	rawSlot := ws.slot + "_raw"
	for _, slot := range []string{ws.slot, rawSlot} {
		if err := walrelay.Setup(ctx, ws.pool, walrelay.WithSlot(slot)); err != nil {
			return err
		}
	}
	defer func() { _ = walrelay.Drop(context.Background(), ws.pool, walrelay.WithSlot(rawSlot)) }()
	if err := (&ours{s: ws.schema, w: ws.wal}).prefill(ctx, descriptorFor(walTopic), c.events); err != nil {
		return err
	}
	if err := ws.analyze(ctx); err != nil {
		return err
	}
	table := func() error {
		r, err := timeDrain(ctx, e.brokers, tableTopic, c.events, "polling relay", 2*time.Minute,
			func(p *progress) (func() error, error) { return o.startRelay(e.brokers, c.workers, p) })
		if err == nil {
			res.add("wal-drain/table", "events/s", r.rate)
		}
		return err
	}
	wal := func() error {
		r, err := timeDrain(ctx, e.brokers, walTopic, c.events, "WAL relay", 2*time.Minute,
			func(p *progress) (func() error, error) { return startWALRelay(ws.pool, ws.slot, e.brokers, p) })
		if err == nil {
			res.add("wal-drain/wal", "events/s", r.rate)
		}
		return err
	}
	if err := inOrder(walFirst, wal, table); err != nil {
		return err
	}
	rate, err := rawDecode(ctx, ws.pool, rawSlot, c.events)
	if err != nil {
		return fmt.Errorf("raw decoding: %w", err)
	}
	res.add("wal-drain/raw-decode", "events/s", rate)
	return nil
}

// startWALRelay runs a WAL relay in this process; p counts what it
// published and marks set-up done once it streams.
func startWALRelay(pool *pgxpool.Pool, slot string, brokers []string, p *progress) (stop func() error, err error) {
	r, err := walrelay.New(pool, brokers, walrelay.WithSlot(slot), walrelay.WithLogger(quietLogger()),
		walrelay.WithHooks(walrelay.Hooks{
			Published: func(n int) { p.delivered.Add(int64(n)) },
			Active: func(on bool) {
				if on {
					p.markReady()
				}
			},
		}))
	if err != nil {
		return nil, err
	}
	return runUntilStopped(r.Run), nil
}

// rawDecode reads n outbox records from slot as fast as the protocol
// allows — pgoutput decoded, each record parsed, the position confirmed —
// and publishes nothing, like pg_recvlogical writing to /dev/null: the
// ceiling of any relay reading that slot. The rate is from the first
// record to the n-th.
func rawDecode(ctx context.Context, pool *pgxpool.Pool, slot string, n int) (float64, error) {
	cc := pool.Config().ConnConfig.Config.Copy()
	cc.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cc)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	if err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: []string{
		"proto_version '1'", "publication_names '" + walrelay.DefaultPublication + "'", "messages 'true'"}}); err != nil {
		return 0, err
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var first time.Time
	var last pglogrepl.LSN
	got := 0
	for got < n {
		raw, err := conn.ReceiveMessage(rctx)
		if err != nil {
			return 0, fmt.Errorf("%d of %d records: %w", got, n, err)
		}
		cd, ok := raw.(*pgproto3.CopyData)
		if !ok || len(cd.Data) == 0 || cd.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		x, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			return 0, err
		}
		msg, err := pglogrepl.Parse(x.WALData)
		if err != nil {
			return 0, err
		}
		switch m := msg.(type) {
		case *pglogrepl.LogicalDecodingMessage:
			if m.Prefix != walrelay.MessagePrefix {
				continue
			}
			_ = bytes.Clone(m.Content) // what the relay keeps of each record
			if got == 0 {
				first = time.Now()
			}
			got++
		case *pglogrepl.CommitMessage:
			last = m.TransactionEndLSN
		}
	}
	elapsed := time.Since(first)
	if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: last}); err != nil {
		return 0, err
	}
	if elapsed <= 0 {
		return 0, errors.New("no time elapsed")
	}
	return float64(n-1) / elapsed.Seconds(), nil
}

// walE2ERates are the WAL relay's end-to-end runs.
var walE2ERates = []int{500, 1000}

// walE2ERound measures end-to-end latency as users deploy it — plain
// pgx.BeginFunc producers, the relay in a process of its own — for the
// polling relay (table-apart) and the WAL relay (wal-apart), on the
// logical server.
func walE2ERound(ctx context.Context, e *env, c config, res results, walFirst bool) error {
	for _, rate := range walE2ERates {
		run := func(name string, wal bool) func() error {
			return func() error {
				ws, err := e.newWALSchema(ctx, "wmb_wale")
				if err != nil {
					return err
				}
				defer ws.drop()
				topic := "wal-e2e-" + name + "-" + suffix()
				if err := createTopics(ctx, e.brokers, topic); err != nil {
					return err
				}
				d := descriptorFor(topic)
				w, start := ws.table, func(p *progress) (func() error, error) { return startRelayProcess(ws.schema, e.brokers, 1, p) }
				if wal {
					w, start = ws.wal, func(p *progress) (func() error, error) {
						return startWALRelayProcess(ws.schema, ws.slot, e.brokers, p)
					}
				}
				r, err := endToEnd(ctx, e.brokers, topic, rate, e2eProducers, c.e2e, ws.schema, producer{publish: ws.publisher(w, d)}, start)
				if err != nil {
					return fmt.Errorf("%s at %d/s: %w", name, rate, err)
				}
				res.addE2E(fmt.Sprintf("wal-e2e-%d/%s", rate, name), r)
				return nil
			}
		}
		if err := inTurn(walFirst, run("wal-apart", true), run("table-apart", false), walE2EWatermill(ctx, e, c, res, rate)); err != nil {
			return err
		}
	}
	return nil
}

// walE2EWatermill is Watermill's end-to-end run at rate on the logical
// server: the peer of the WAL relay in the deployed shape (issue 31).
func walE2EWatermill(ctx context.Context, e *env, c config, res results, rate int) func() error {
	return func() error {
		return e.withWMOn(ctx, e.walURL, "wmb_wale_wm", func(w *wm) error {
			r, err := w.endToEnd(ctx, e, c, rate)
			if err != nil {
				return err
			}
			res.addE2E(fmt.Sprintf("wal-e2e-%d/watermill", rate), r)
			return nil
		})
	}
}

// walRound is one round of the WAL relay's measurements: "wal" runs them
// all, "wal-write", "wal-drain" and "wal-e2e" one each.
func walRound(ctx context.Context, e *env, c config, res results, walFirst bool) error {
	all := c.only["wal"]
	if all || c.only["wal-write"] {
		if err := walWriteRound(ctx, e, c, res); err != nil {
			return err
		}
	}
	if all || c.only["wal-drain"] {
		if err := walDrainRound(ctx, e, c, res, walFirst); err != nil {
			return err
		}
	}
	if all || c.only["wal-e2e"] {
		return walE2ERound(ctx, e, c, res, walFirst)
	}
	return nil
}

// wantsWAL reports whether any WAL measurement was asked for.
func wantsWAL(only map[string]bool) bool {
	return only["wal"] || only["wal-write"] || only["wal-drain"] || only["wal-e2e"]
}

// rawWALRecord stands for an encoded record: the demo's OrderPlaced with
// its headers is about 650 bytes.
var rawWALRecord = make([]byte, 650)

// rawWALHold is raw-wal's publish: the message waits for the COMMIT of a
// rawBatchBegin transaction, which sends it in one batch with it.
func rawWALHold(_ context.Context, tx pgx.Tx, _ *ordersv1.OrderPlaced) error {
	rt, ok := tx.(*rawBatchTx)
	if !ok {
		return fmt.Errorf("raw-wal: publish on a %T, not its own transaction", tx)
	}
	rt.held = append(rt.held, rawHeld{sql: `SELECT pg_logical_emit_message(true, $1, $2::bytea)`, args: []any{walrelay.MessagePrefix, rawWALRecord}})
	return nil
}
