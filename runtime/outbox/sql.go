package outbox

import (
	"fmt"

	"github.com/jackc/pgx/v5"
)

// This file is the package's one place for SQL: the schema comes from
// outbox.sql, the statements below are built around a table name
// that was validated and quoted with pgx.Identifier.

// migrateLockKey serialises concurrent Migrate calls across the database
// (pg_advisory_xact_lock's one-bigint key space).
const migrateLockKey int64 = 0x70726f746f657631 // "protoev1"

// presenceLane is the second advisory-lock key every live relay holds in
// shared mode on the table's first key; counting its holders counts relays.
const presenceLane int32 = 2147483647

const (
	sqlMigrateLock   = `SELECT pg_advisory_xact_lock($1)`
	sqlCurrentSchema = `SELECT current_schema()`
	// sqlResolve finds an outbox table by its (quoted) name, as the
	// search_path resolves it.
	// Its last column tells whether the table generates its lane column
	// (tables of earlier versions) or a Writer fills it in.
	sqlResolve = `SELECT c.oid, n.nspname, c.relname, COALESCE(obj_description(c.oid, 'pg_class'), ''),
  EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'lane' AND a.attgenerated <> '' AND NOT a.attisdropped)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)`

	// sqlSessionSettings bounds how long a relay that vanished without
	// closing its connection (a network partition, a frozen VM, a hung
	// process) keeps its lanes: the server drops the session when
	// keepalives go unanswered for about a minute, or when it sits idle
	// (Postgres 14 and later) for five minutes, far longer than a publish
	// or an idle poll takes (a relay whose session was dropped reconnects).
	// Its commits (marks, cleanup) do not wait for the WAL flush: a mark
	// lost in a database crash only re-sends rows the consumers deduplicate,
	// and the lost marks are the latest ones, so per-key order holds.
	// Its plans read each lane's head in index order whatever the
	// statistics say: the rows it reads were written moments ago and sit
	// in shared buffers (random_page_cost 1.1 says so; at the default 4.0
	// the planner preferred filtering the primary key's order), and a
	// bitmap scan, the planner's choice when an analyzed lane holds about
	// a batch, reads the lane's every pending row and every index entry
	// the marks left dead, at every claim (docs/design.md, "Claims by
	// per-lane quotas; the relay session's plans").
	sqlSessionSettings = `SET idle_in_transaction_session_timeout = '5min'; SET synchronous_commit = off;
SET random_page_cost = 1.1; SET enable_bitmapscan = off;
SET tcp_keepalives_idle = 30; SET tcp_keepalives_interval = 10; SET tcp_keepalives_count = 3;
SELECT set_config('idle_session_timeout', '5min', false) WHERE current_setting('server_version_num')::int >= 140000`
	sqlPresenceLock = `SELECT pg_advisory_lock_shared($1, $2)`
	sqlLiveRelays   = `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 2
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND classid = $1 AND objid = $2`
	// sqlTryLanes takes free lanes until it holds $3 more; LIMIT stops the
	// scan, so no lock is taken beyond it.
	sqlTryLanes    = `SELECT l FROM unnest($2::int[]) AS l WHERE pg_try_advisory_lock($1, l) LIMIT $3`
	sqlUnlockAll   = `SELECT pg_advisory_unlock_all()`
	sqlUnlockLanes = `SELECT bool_and(pg_advisory_unlock($1, l)) FROM unnest($2::int[]) AS l`

	// sqlCommit ends a CommitTx, in the batch that carries its held rows.
	sqlCommit = `COMMIT`
)

// insertColumns opens the column list of every INSERT a Writer sends.
const insertColumns = `(event_id, event_type, topic, key, value, headers`

// inserts are a Writer's statements on one outbox table. A table created
// by this version has a plain lane column, which the statements fill in
// with laneOf (lanes > 0); tables of earlier versions generate it
// themselves (lanes 0). Both give a key the same lane.
type inserts struct {
	insert      string
	insertFixed string
	insertBatch string
}

func newInserts(table string, lanes int) inserts {
	cols, one, batch := ``, ``, ``
	if lanes > 0 {
		cols, one, batch = `, lane`, `, `+laneOf(`$4::bytea`, lanes), `, `+laneOf(`k`, lanes)
	}
	return inserts{
		insert: fmt.Sprintf(`INSERT INTO %s `+insertColumns+`%s)
VALUES ($1, $2, $3, $4, $5, $6::jsonb%s)`, table, cols, one),
		// insertFixed writes an event whose ID the producer fixed: the
		// partial unique index refuses a duplicate of it.
		insertFixed: fmt.Sprintf(`INSERT INTO %s `+insertColumns+`%s, fixed_event_id)
VALUES ($1, $2, $3, $4, $5, $6::jsonb%s, true)`, table, cols, one),
		// One statement, one round trip for any number of events; WITH
		// ORDINALITY keeps ids in the caller's order.
		insertBatch: fmt.Sprintf(`INSERT INTO %s `+insertColumns+`%s)
SELECT e, t, tp, k, v, h::jsonb%s
FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::bytea[], $6::text[]) WITH ORDINALITY AS r(e, t, tp, k, v, h, n)
ORDER BY n`, table, cols, batch),
	}
}

// laneOf is the SQL of the lane of key (an expression of type bytea) in a
// table of the given number of lanes. It is the formula the generated lane
// column of earlier tables computes (outbox.sql), so a key has
// one lane whichever way its rows got it, and it lives in the statement,
// which Postgres plans once per connection, where a generated column
// re-plans its expression on every insert.
func laneOf(key string, lanes int) string {
	return fmt.Sprintf(`(hashtext(encode(%s, 'hex')) & 2147483647) %% %d`, key, lanes)
}

// queries are the relay's and status's statements on one outbox table.
type queries struct {
	claim         string
	claimUnparked string
	oldestOwned   string
	pendingOwned  string
	markPublished string
	markFailed    string
	cleanup       string
	statusPending string
	statusDone    string
	statusError   string
}

func newQueries(table string) queries {
	return queries{
		// The head of the relay's lanes: the first pending rows of each
		// lane $1, as many as its quota $2 (the pending index on (lane, id)
		// gives them in order and stops), without the rows of the batch in
		// flight ($3). Once the demand is known the quotas add up to the
		// batch (loop.quotas), so the claim reads its batch and nothing
		// more; the rows come lane after lane and the relay puts them in id
		// order. Always from the head: a
		// row that became visible late (its transaction committed after a
		// later row was claimed) or a key whose parking ended is taken
		// before the later rows of its key. No row locks: lanes are owned
		// by one relay (advisory locks), so nothing else claims these rows,
		// and the claim runs outside a transaction so that the next batch
		// can be claimed while the previous one is being published.
		claim: fmt.Sprintf(`SELECT o.id, o.event_id, o.event_type, o.topic, o.key, o.lane, o.value, o.headers::text, o.attempts
FROM unnest($1::int[], $2::int[]) AS l(lane, quota) CROSS JOIN LATERAL (
  SELECT id, event_id, event_type, topic, key, lane, value, headers, attempts FROM %s
  WHERE published_at IS NULL AND lane = l.lane AND id NOT IN (SELECT unnest($3::bigint[]))
  ORDER BY id LIMIT l.quota) o`, table),
		// claimUnparked is claim without the rows of parked keys ($4 topics,
		// $5 keys) and of parked topics ($6): all of a parked key's or
		// topic's rows wait, so its order holds. The arrays must not be NULL.
		claimUnparked: fmt.Sprintf(`SELECT o.id, o.event_id, o.event_type, o.topic, o.key, o.lane, o.value, o.headers::text, o.attempts
FROM unnest($1::int[], $2::int[]) AS l(lane, quota) CROSS JOIN LATERAL (
  SELECT id, event_id, event_type, topic, key, lane, value, headers, attempts FROM %s r
  WHERE published_at IS NULL AND lane = l.lane AND id NOT IN (SELECT unnest($3::bigint[]))
    AND topic <> ALL($6::text[])
    AND NOT EXISTS (SELECT 1 FROM unnest($4::text[], $5::bytea[]) AS p(topic, key) WHERE p.topic = r.topic AND p.key = r.key)
  ORDER BY id LIMIT l.quota) o`, table),
		// oldestOwned is the age in seconds of the first pending row of the
		// relay's lanes (0 if none), for readiness: the heads of its lanes,
		// without counting the backlog.
		oldestOwned: fmt.Sprintf(`SELECT COALESCE((SELECT EXTRACT(EPOCH FROM now() - o.created_at)::float8
FROM unnest($1::int[]) AS l(lane) CROSS JOIN LATERAL (
  SELECT id, created_at FROM %s WHERE published_at IS NULL AND lane = l.lane ORDER BY id LIMIT 1) o
ORDER BY o.id LIMIT 1), 0)`, table),
		// pendingOwned counts the pending rows of the relay's lanes $1, up
		// to $2 (WithReadyBacklog): as many pending-index entries as it
		// counts.
		pendingOwned: fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 FROM %s WHERE published_at IS NULL AND lane = ANY($1::int[]) LIMIT $2) p`, table),
		// markPublished finds its rows by primary key alone. Written as
		// "published_at IS NULL", the guard would match the pending index's
		// predicate, and with statistics from before a backlog the planner
		// scanned the whole pending index for every batch (20,000 entries
		// to mark 500); num_nulls says the same to the executor and
		// nothing to the planner.
		markPublished: fmt.Sprintf(`UPDATE %s SET published_at = now(), attempts = attempts + 1, last_error = NULL
WHERE id = ANY($1::bigint[]) AND num_nulls(published_at) = 1`, table),
		markFailed: fmt.Sprintf(`UPDATE %s SET attempts = attempts + 1, last_error = $2
WHERE id = ANY($1::bigint[])`, table),
		cleanup: fmt.Sprintf(`DELETE FROM %[1]s WHERE id IN (
  SELECT id FROM %[1]s WHERE published_at < now() - make_interval(secs => $1)
  ORDER BY published_at LIMIT $2 FOR UPDATE SKIP LOCKED)`, table),
		statusPending: fmt.Sprintf(`SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8,
  count(*) FILTER (WHERE attempts > 0)
FROM %s WHERE published_at IS NULL`, table),
		statusDone: fmt.Sprintf(`SELECT count(*), max(published_at) FROM %s WHERE published_at IS NOT NULL`, table),
		// statusError orders by id + 0 so that no plan walks the primary
		// key through the retained published rows: the pending rows come
		// from the pending index and are sorted.
		statusError: fmt.Sprintf(`SELECT last_error FROM %s WHERE published_at IS NULL AND last_error IS NOT NULL ORDER BY id + 0 LIMIT 1`, table),
	}
}

// backlogQueries are a Writer's backlog samples (WithBacklogPolicy) of
// the table and of one topic: how many rows are pending, counted up to $1,
// and the age in seconds of the oldest of those counted. The
// pending index (lane, id) holds only pending rows, so the count reads as
// many entries (and rows, for created_at) as it counts; when it stops at
// $1 the bound is broken whatever the age. The last column says whether
// the transaction reads at READ COMMITTED (a wait can see the backlog
// fall).
func backlogQueries(table string) (all, topic string) {
	// statement_timestamp, not now(): the caller's transaction may have
	// begun long ago, and now() is its start.
	const sample = `SELECT count(*), COALESCE(EXTRACT(EPOCH FROM statement_timestamp() - min(created_at)), 0)::float8,
  current_setting('transaction_isolation') = 'read committed'
FROM (SELECT created_at FROM %s WHERE published_at IS NULL%s LIMIT $1) p`
	return fmt.Sprintf(sample, table, ``), fmt.Sprintf(sample, table, ` AND topic = $2`)
}

// schemaData fills outbox.sql.
type schemaData struct {
	Table, Schema, TableLiteral                                          string
	PendingIndex, OldPendingIndex, PublishedIndex, FixedIDIndex, Trigger string
	Comment                                                              string
	Lanes                                                                int
}

func renderSchema(schema, name string, lanes int) (string, error) {
	return schemaTemplates.Render("outbox.sql", schemaData{
		Table:           pgx.Identifier{schema, name}.Sanitize(),
		TableLiteral:    quoteLiteral(pgx.Identifier{schema, name}.Sanitize()),
		FixedIDIndex:    pgx.Identifier{derivedName(name, "_fixed_event_id_idx")}.Sanitize(),
		Schema:          pgx.Identifier{schema}.Sanitize(),
		PendingIndex:    pgx.Identifier{derivedName(name, "_pending_lane_idx")}.Sanitize(),
		OldPendingIndex: pgx.Identifier{derivedName(name, "_pending_idx")}.Sanitize(),
		PublishedIndex:  pgx.Identifier{derivedName(name, "_published_idx")}.Sanitize(),
		Trigger:         pgx.Identifier{derivedName(name, "_notify")}.Sanitize(),
		Comment:         quoteLiteral(encodeComment(lanes)),
		Lanes:           lanes,
	})
}
