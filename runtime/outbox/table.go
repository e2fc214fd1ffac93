package outbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
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

// identRE is what we accept as one part of a table name: a plain SQL
// identifier. Names are quoted anyway; the check keeps out names that would
// need quoting to be readable, and so surprise operators.
var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// maxIdentLen is Postgres' NAMEDATALEN-1: longer names are truncated.
const maxIdentLen = 63

// tableName is a validated, optionally schema-qualified table name.
type tableName struct {
	schema string // empty: resolved through search_path
	name   string
}

// parseTable validates "name" or "schema.name".
func parseTable(s string) (tableName, error) {
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return tableName{}, fmt.Errorf("outbox: table name %q: at most one schema qualifier allowed", s)
	}
	for _, p := range parts {
		if len(p) > maxIdentLen {
			return tableName{}, fmt.Errorf("outbox: table name %q: %q is longer than %d bytes", s, p, maxIdentLen)
		}
		if !identRE.MatchString(p) {
			return tableName{}, fmt.Errorf("outbox: table name %q: %q is not an identifier ([A-Za-z_][A-Za-z0-9_]*)", s, p)
		}
	}
	if len(parts) == 2 {
		return tableName{schema: parts[0], name: parts[1]}, nil
	}
	return tableName{name: parts[0]}, nil
}

// sanitized returns the quoted name for use in SQL text.
func (t tableName) sanitized() string {
	if t.schema == "" {
		return pgx.Identifier{t.name}.Sanitize()
	}
	return pgx.Identifier{t.schema, t.name}.Sanitize()
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
func (r resolvedTable) qualified() string { return pgx.Identifier{r.schema, r.name}.Sanitize() }

// lockKey is the first half of the two-int4 advisory lock keys of the
// table's lanes: the table's OID, so two outboxes (also in two schemas of
// one database) never share locks.
func (r resolvedTable) lockKey() int32 { return int32(r.oid) }

// derivedName returns table+suffix, shortened with a hash when it would
// exceed Postgres' identifier length (which would silently truncate and
// could make two tables' indexes collide).
func derivedName(table, suffix string) string {
	if len(table)+len(suffix) <= maxIdentLen {
		return table + suffix
	}
	sum := sha256.Sum256([]byte(table))
	h := hex.EncodeToString(sum[:4])
	return table[:maxIdentLen-len(suffix)-len(h)-1] + "_" + h + suffix
}

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

// quoteLiteral quotes s as a SQL string literal (standard_conforming_strings
// on, the default since Postgres 9.1). Used only for DDL text, where
// parameters are not allowed.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
