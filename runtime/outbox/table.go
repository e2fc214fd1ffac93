package outbox

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/protoevents/protoevents/runtime/internal/sqlident"
)

// DefaultTable is the outbox table used when no WithTable option is given;
// unqualified, so it lives in the first schema of the connection's
// search_path.
const DefaultTable = "outbox"

// DefaultLanes is the number of key-hash lanes of a new outbox table.
const DefaultLanes = 16

// maxLanes bounds the lane count: more lanes than relays are useless, and
// each lane costs a lock and a share of every rebalance.
const maxLanes = 1024

// ErrNoTable is returned when the outbox table does not exist (yet): run
// Migrate (or "eventsctl migrate") first.
var ErrNoTable = errors.New("outbox: table does not exist: run `eventsctl migrate` (or outbox.Migrate) first")

// errNotOutbox marks a table that exists but was not made by Migrate.
var errNotOutbox = errors.New("is not a protoevents outbox")

// tableName is a validated, optionally schema-qualified table name.
type tableName struct {
	schema string // empty: resolved through search_path
	name   string
}

// parseTable validates "name" or "schema.name" (sqlident's rule).
func parseTable(s string) (tableName, error) {
	t, err := sqlident.ParseTable(s)
	if err != nil {
		return tableName{}, fmt.Errorf("outbox: %w", err)
	}
	return tableName{schema: t.Schema, name: t.Name}, nil
}

// sanitized returns the quoted name for use in SQL text.
func (t tableName) sanitized() string {
	return sqlident.Table{Schema: t.schema, Name: t.name}.Sanitize()
}

// String returns the name as given.
func (t tableName) String() string {
	if t.schema == "" {
		return t.name
	}
	return t.schema + "." + t.name
}

// resolvedTable is an existing outbox table as the database sees it.
type resolvedTable struct {
	oid    uint32
	schema string
	name   string
	lanes  int
	// laneGenerated is set for tables of earlier versions, whose lane
	// column is generated from the key; in later ones writers fill it in.
	laneGenerated bool
}

// writerLanes is the lane count a writer's statements compute the lane
// with: 0 when the table generates it.
func (r resolvedTable) writerLanes() int {
	if r.laneGenerated {
		return 0
	}
	return r.lanes
}

// qualified returns the quoted, schema-qualified name.
func (r resolvedTable) qualified() string {
	return sqlident.Table{Schema: r.schema, Name: r.name}.Sanitize()
}

// lockKey is the first half of the two-int4 advisory lock keys of the
// table's lanes: the table's OID, so two outboxes (also in two schemas of
// one database) never share locks.
func (r resolvedTable) lockKey() int32 { return int32(r.oid) }

// derivedName returns table+suffix, shortened with a hash when it would
// exceed Postgres' identifier length (sqlident.Derived).
func derivedName(table, suffix string) string { return sqlident.Derived(table, suffix) }

// tableComment is recorded as the table's comment: it marks the table as a
// protoevents outbox and records the lane count the relays must use.
type tableComment struct {
	Kind    string `json:"protoevents"`
	Version int    `json:"version"`
	Lanes   int    `json:"lanes"`
}

const commentKind = "outbox"

func encodeComment(lanes int) string {
	b, _ := json.Marshal(tableComment{Kind: commentKind, Version: 1, Lanes: lanes})
	return string(b)
}

func decodeComment(table, s string) (tableComment, error) {
	var c tableComment
	if err := json.Unmarshal([]byte(s), &c); err != nil || c.Kind != commentKind || c.Lanes < 1 || c.Lanes > maxLanes {
		return tableComment{}, fmt.Errorf("outbox: table %s exists but %w (comment %q)", table, errNotOutbox, s)
	}
	return c, nil
}

// quoteLiteral quotes s as a SQL string literal, for DDL text.
func quoteLiteral(s string) string { return sqlident.Literal(s) }
