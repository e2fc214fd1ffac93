package outbox

import (
	"fmt"

	"github.com/jackc/pgx/v5"
)

// This file holds the SQL of stuck-row handling (stuck.go): the schema comes
// from outbox_dead.sql, the statements below are built around
// table names that were validated and quoted with pgx.Identifier.

// stuckTables names an outbox's stuck-row bookkeeping tables.
type stuckTables struct {
	outbox, dead, ops string // quoted, schema-qualified
	deadName          string // for to_regclass and messages
	// lanes is the outbox's lane count when a row's writer fills in its
	// lane, 0 when the table generates it (see inserts).
	lanes int
}

func stuckTablesOf(rt resolvedTable) stuckTables {
	dead := derivedName(rt.name, "_dead")
	return stuckTables{
		lanes:    rt.writerLanes(),
		outbox:   rt.qualified(),
		dead:     pgx.Identifier{rt.schema, dead}.Sanitize(),
		ops:      pgx.Identifier{rt.schema, derivedName(rt.name, "_ops")}.Sanitize(),
		deadName: rt.schema + "." + dead,
	}
}

// reinsertInto is the statement that puts a retried row back in the
// outbox: it keeps its creation time, so its age stays honest, and its new
// id puts it behind the key's rows published meanwhile.
func reinsertInto(t stuckTables) string {
	if t.lanes == 0 {
		return fmt.Sprintf(`INSERT INTO %s (event_id, event_type, topic, key, value, headers, created_at)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7) RETURNING id`, t.outbox)
	}
	return fmt.Sprintf(`INSERT INTO %s (event_id, event_type, topic, key, value, headers, created_at, lane)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, %s) RETURNING id`, t.outbox, laneOf(`$4::bytea`, t.lanes))
}

func renderStuckSchema(schema, name string) (string, error) {
	return schemaTemplates.Render("outbox_dead.sql", struct{ Table, Dead, Ops string }{
		Table: pgx.Identifier{schema, name}.Sanitize(),
		Dead:  pgx.Identifier{schema, derivedName(name, "_dead")}.Sanitize(),
		Ops:   pgx.Identifier{schema, derivedName(name, "_ops")}.Sanitize(),
	})
}

const sqlTableExists = `SELECT to_regclass($1) IS NOT NULL`

// stuckQueries are the statements on one outbox's stuck rows.
type stuckQueries struct {
	listStuck, listDead, listOps  string
	locate                        string
	moveOut, restate, insertOp    string
	resetPending                  string
	takeDead, reinsert, markRetry string
	topicPending, topicDead       string
}

func newStuckQueries(t stuckTables) stuckQueries {
	const stuckCols = `id, event_id, event_type, topic, key, attempts, last_error, age, created_at, waiting`
	return stuckQueries{
		// The head (oldest pending row) of each key whose head has failed
		// at least $1 times and is at least $2 seconds old, with the
		// number of the key's pending rows waiting on it.
		listStuck: fmt.Sprintf(`SELECT `+stuckCols+` FROM (
  SELECT DISTINCT ON (topic, key) id, event_id, event_type, topic, key, attempts,
    COALESCE(last_error, '') AS last_error,
    EXTRACT(EPOCH FROM now() - created_at)::float8 AS age, created_at,
    count(*) OVER (PARTITION BY topic, key) AS waiting
  FROM %s WHERE published_at IS NULL AND ($3 = '' OR topic = $3)
  ORDER BY topic, key, id) head
WHERE attempts >= $1 AND age >= $2
ORDER BY id LIMIT $4`, t.outbox),
		listDead: fmt.Sprintf(`SELECT outbox_id, event_id, event_type, topic, key, attempts, COALESCE(last_error, ''),
  state, moved_at, moved_by, reason, retried_as, created_at
FROM %s WHERE ($1 = '' OR state = $1) AND ($2 = '' OR topic = $2)
ORDER BY moved_at, outbox_id LIMIT $3`, t.dead),
		listOps: fmt.Sprintf(`SELECT id, at, actor, db_user, action, outbox_id, event_id, topic, key, reason, detail
FROM %s WHERE ($1::bigint = 0 OR outbox_id = $1) ORDER BY id LIMIT $2`, t.ops),
		// Where a row is: in the outbox (pending or published) or moved out.
		locate: fmt.Sprintf(`SELECT CASE WHEN published_at IS NULL THEN 'pending' ELSE 'published' END FROM %s WHERE id = $1
UNION ALL SELECT state FROM %s WHERE outbox_id = $1`, t.outbox, t.dead),
		// moveOut moves a pending row to the dead table in one statement;
		// it waits for a relay holding the row and finds nothing if the
		// relay published it meanwhile.
		moveOut: fmt.Sprintf(`WITH moved AS (
  DELETE FROM %s WHERE id = $1 AND published_at IS NULL
  RETURNING id, event_id, event_type, topic, key, value, headers, created_at, attempts, last_error)
INSERT INTO %s (outbox_id, event_id, event_type, topic, key, value, headers, created_at, attempts, last_error, state, moved_by, reason)
SELECT id, event_id, event_type, topic, key, value, headers, created_at, attempts, last_error, $2, $3, $4 FROM moved
RETURNING event_id, topic, key`, t.outbox, t.dead),
		restate: fmt.Sprintf(`UPDATE %s SET state = $2, moved_at = now(), moved_by = $3, reason = $4
WHERE outbox_id = $1 AND state IN ('parked', 'dropped') AND state <> $2
RETURNING event_id, topic, key`, t.dead),
		insertOp: fmt.Sprintf(`INSERT INTO %s (actor, action, outbox_id, event_id, topic, key, reason, detail)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, t.ops),
		resetPending: fmt.Sprintf(`UPDATE %s o SET attempts = 0, last_error = NULL
FROM (SELECT id, attempts, last_error FROM %[1]s WHERE id = $1 AND published_at IS NULL FOR UPDATE) old
WHERE o.id = old.id
RETURNING o.event_id, o.topic, o.key, old.attempts, COALESCE(old.last_error, '')`, t.outbox),
		takeDead: fmt.Sprintf(`SELECT event_id, event_type, topic, key, value, headers::text, created_at, state
FROM %s WHERE outbox_id = $1 AND state IN ('parked', 'dropped') FOR UPDATE`, t.dead),
		reinsert:  reinsertInto(t),
		markRetry: fmt.Sprintf(`UPDATE %s SET state = 'retried', retried_as = $2 WHERE outbox_id = $1`, t.dead),
		topicPending: fmt.Sprintf(`SELECT topic, count(*), EXTRACT(EPOCH FROM now() - min(created_at))::float8,
  count(*) FILTER (WHERE attempts > 0), count(DISTINCT key) FILTER (WHERE attempts > 0)
FROM %s WHERE published_at IS NULL GROUP BY topic`, t.outbox),
		topicDead: fmt.Sprintf(`SELECT topic, count(*) FILTER (WHERE state = 'parked'), count(*) FILTER (WHERE state = 'dropped')
FROM %s GROUP BY topic`, t.dead),
	}
}
