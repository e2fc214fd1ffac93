// Package sqlident validates and quotes the table names the runtime's
// packages are configured with: one rule for the outbox, the consumers'
// dedup table and the saga tables. Names are always quoted in SQL text;
// the rule also refuses names that would need quoting to be typed in psql,
// so the names operators see are the names the code uses.
package sqlident

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// MaxLen is Postgres' NAMEDATALEN-1: longer identifiers are truncated.
const MaxLen = 63

// part is one plain, unquoted identifier.
var part = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Table is a validated table name, optionally schema-qualified.
type Table struct {
	Schema string // empty: resolved through the connection's search_path
	Name   string
}

// ParseTable validates "table" or "schema.table": each part a plain
// identifier (letters, digits and _, not starting with a digit) of at most
// MaxLen bytes. The error names the offending part and the rule.
func ParseTable(s string) (Table, error) {
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return Table{}, fmt.Errorf("table name %q: want table or schema.table", s)
	}
	for _, p := range parts {
		if !part.MatchString(p) || len(p) > MaxLen {
			return Table{}, fmt.Errorf("table name %q: %q is not a plain identifier (letters, digits and _, not starting with a digit; at most %d bytes)", s, p, MaxLen)
		}
	}
	if len(parts) == 2 {
		return Table{Schema: parts[0], Name: parts[1]}, nil
	}
	return Table{Name: parts[0]}, nil
}

// Ident is the name as a pgx.Identifier.
func (t Table) Ident() pgx.Identifier {
	if t.Schema == "" {
		return pgx.Identifier{t.Name}
	}
	return pgx.Identifier{t.Schema, t.Name}
}

// Sanitize is the quoted name for SQL text.
func (t Table) Sanitize() string { return t.Ident().Sanitize() }

// String is the name as given.
func (t Table) String() string {
	if t.Schema == "" {
		return t.Name
	}
	return t.Schema + "." + t.Name
}

// Sibling is a table in the same schema named Name+suffix, as the history
// table of a saga table; an error if that name is longer than MaxLen.
func (t Table) Sibling(suffix string) (Table, error) {
	if len(t.Name)+len(suffix) > MaxLen {
		return Table{}, fmt.Errorf("table name %q: too long for %q (at most %d bytes with the suffix)", t, t.Name+suffix, MaxLen)
	}
	return Table{Schema: t.Schema, Name: t.Name + suffix}, nil
}

// Derived returns name+suffix for an index or a sibling object, shortened
// with a hash of name when it would exceed MaxLen (Postgres would silently
// truncate it, and two tables' objects could collide).
func Derived(name, suffix string) string {
	if len(name)+len(suffix) <= MaxLen {
		return name + suffix
	}
	sum := sha256.Sum256([]byte(name))
	h := hex.EncodeToString(sum[:4])
	return name[:MaxLen-len(suffix)-len(h)-1] + "_" + h + suffix
}

// Literal quotes s as a SQL string literal (standard_conforming_strings on,
// the default since Postgres 9.1), for DDL text, where parameters are not
// allowed.
func Literal(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// slotName is Postgres' rule for replication slot names.
var slotName = regexp.MustCompile(`^[a-z0-9_]+$`)

// CheckSlot validates a replication slot name by Postgres' own rule (lower
// case letters, digits and _, at most MaxLen bytes), so a bad name is
// refused before any connection, with the rule in the message.
func CheckSlot(s string) error {
	if !slotName.MatchString(s) || len(s) > MaxLen {
		return fmt.Errorf("replication slot name %q: use lower case letters, digits and _ only, at most %d bytes", s, MaxLen)
	}
	return nil
}

// CheckName validates a plain identifier of the given kind ("publication",
// ...): letters, digits and _, not starting with a digit, at most MaxLen
// bytes.
func CheckName(kind, s string) error {
	if !part.MatchString(s) || len(s) > MaxLen {
		return fmt.Errorf("%s name %q is not a plain identifier (letters, digits and _, not starting with a digit; at most %d bytes)", kind, s, MaxLen)
	}
	return nil
}
