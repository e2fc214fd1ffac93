package saga

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/runtime/internal/sqlident"
	"github.com/protoevents/protoevents/runtime/internal/sqltmpl"
)

// schemaFile is the package's SQL: the state and path tables' schema and,
// as the templates it defines, every statement on them.
//
//go:embed saga.sql
var schemaFile embed.FS

var schemaTemplates = sqltmpl.Must(schemaFile, "saga.sql")

// DefaultTable is the saga state table when WithTable is not given; the
// path (history) table is the same name plus "_history".
const DefaultTable = "sagas"

// historyIndexSuffix ends the longest name derived from the state table's:
// the path table's saga_id index.
const historyIndexSuffix = "_history_saga_id_idx"

// sqlSet is every statement of the package, rendered once per table name
// from saga.sql.
type sqlSet struct {
	table                                string
	migrate, lock, insert, lockRow       string
	lockDue, update, history, get, list  string
	counts, historyList, retry, postpone string
}

// parseTable validates "table" or "schema.table" (sqlident's rule) and
// returns the state table and its history table, in the same schema.
func parseTable(name string) (table, history sqlident.Table, err error) {
	if table, err = sqlident.ParseTable(name); err != nil {
		return table, history, fmt.Errorf("saga: %w", err)
	}
	if len(table.Name+historyIndexSuffix) > sqlident.MaxLen {
		return table, history, fmt.Errorf("saga: table %q: name too long for its history table and indexes (at most %d bytes with suffixes)", name, sqlident.MaxLen)
	}
	history, err = table.Sibling("_history")
	return table, history, err
}

// renderSQL renders every statement for one table name.
func renderSQL(name string) (*sqlSet, error) {
	table, history, err := parseTable(name)
	if err != nil {
		return nil, err
	}
	data := struct{ Table, History, DueIndex, HistoryIndex string }{
		Table: table.Sanitize(), History: history.Sanitize(),
		DueIndex:     sqlident.Table{Name: table.Name + "_due_idx"}.Sanitize(),
		HistoryIndex: sqlident.Table{Name: table.Name + historyIndexSuffix}.Sanitize(),
	}
	s := &sqlSet{table: name}
	for _, r := range []struct {
		name string
		dst  *string
	}{
		{"saga.sql", &s.migrate},
		{"saga_migrate_lock", &s.lock},
		{"saga_insert", &s.insert},
		{"saga_lock", &s.lockRow},
		{"saga_lock_due", &s.lockDue},
		{"saga_update", &s.update},
		{"saga_history_insert", &s.history},
		{"saga_get", &s.get},
		{"saga_list", &s.list},
		{"saga_counts", &s.counts},
		{"saga_history", &s.historyList},
		{"saga_retry", &s.retry},
		{"saga_postpone", &s.postpone},
	} {
		if *r.dst, err = schemaTemplates.Render(r.name, data); err != nil {
			return nil, fmt.Errorf("saga: %w", err)
		}
	}
	return s, nil
}

// Migrate creates the saga state table and its path (history) table if
// they do not exist. It is idempotent and safe to run from many processes
// at once (an advisory lock serialises them). Only WithTable is read.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
	s, err := settingsFrom(opts)
	if err != nil {
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("saga: migrate %s: begin: %w", s.sql.table, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, s.sql.lock, s.sql.table); err != nil {
		return fmt.Errorf("saga: migrate %s: lock: %w", s.sql.table, err)
	}
	if _, err := tx.Exec(ctx, s.sql.migrate); err != nil {
		return fmt.Errorf("saga: migrate %s: %w", s.sql.table, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("saga: migrate %s: commit: %w", s.sql.table, err)
	}
	return nil
}
