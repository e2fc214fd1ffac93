package consumer

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/runtime/internal/sqlident"
	"github.com/protoevents/protoevents/runtime/internal/sqltmpl"
)

// schemaFile is the consumer's SQL: the dedup table's schema and, as the
// templates it defines, every statement on the table.
//
//go:embed consumer.sql
var schemaFile embed.FS

var schemaTemplates = sqltmpl.Must(schemaFile, "consumer.sql")

// DefaultTable is the dedup table's name when WithTable is not given.
const DefaultTable = "consumed_events"

// sqlSet is the consumer's SQL, rendered once per table name from
// consumer.sql.
type sqlSet struct {
	table   string // the table as given, e.g. "consumed_events" or "app.consumed_events"
	migrate string
	lock    string
	dedup   string
	batch   string // dedup insert of many event IDs, returning the new ones
	undo    string // delete the dedup rows of events not applied after all
	applied string
	prune   string
}

// parseTable validates a table name, optionally schema-qualified
// ("schema.table"), with the rule of every runtime table (sqlident).
func parseTable(name string) (sqlident.Table, error) {
	t, err := sqlident.ParseTable(name)
	if err != nil {
		return sqlident.Table{}, fmt.Errorf("consumer: %w", err)
	}
	return t, nil
}

// renderSQL renders every statement of the consumer for one table.
func renderSQL(table string) (*sqlSet, error) {
	id, err := parseTable(table)
	if err != nil {
		return nil, err
	}
	index := id.Name + "_consumed_at_idx"
	if len(index) > sqlident.MaxLen {
		return nil, fmt.Errorf("consumer: table %q: name too long for its index %q (at most %d bytes)", table, index, sqlident.MaxLen)
	}
	data := struct{ Table, Index string }{Table: id.Sanitize(), Index: pgx.Identifier{index}.Sanitize()}
	s := &sqlSet{table: table}
	for _, r := range []struct {
		name string
		dst  *string
	}{
		{"consumer.sql", &s.migrate},
		{"consumer_migrate_lock", &s.lock},
		{"consumer_dedup", &s.dedup},
		{"consumer_dedup_batch", &s.batch},
		{"consumer_undo_batch", &s.undo},
		{"consumer_applied", &s.applied},
		{"consumer_prune", &s.prune},
	} {
		if *r.dst, err = schemaTemplates.Render(r.name, data); err != nil {
			return nil, fmt.Errorf("consumer: %w", err)
		}
	}
	return s, nil
}

// Migrate creates the dedup table and its pruning index if they do not
// exist. It is idempotent and safe to run from many processes at once: an
// advisory lock held for the migration's transaction serialises them. The
// only option it reads is WithTable; others are ignored, so a program can
// pass Migrate the same options as New.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
	s, err := settingsFrom(opts)
	if err != nil {
		return err
	}
	sql, err := renderSQL(s.table)
	if err != nil {
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("consumer: migrate: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, sql.lock, sql.table); err != nil {
		return fmt.Errorf("consumer: migrate: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, sql.migrate); err != nil {
		return fmt.Errorf("consumer: migrate %s: %w", sql.table, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("consumer: migrate: commit: %w", err)
	}
	return nil
}
