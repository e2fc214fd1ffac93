package outbox

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/runtime/internal/sqltmpl"
)

// schemaFiles are the outbox's schema: outbox.sql (the table and its
// indexes) and outbox_dead.sql (stuck-row bookkeeping), rendered by
// renderSchema and renderStuckSchema.
//
//go:embed outbox.sql outbox_dead.sql
var schemaFiles embed.FS

var schemaTemplates = sqltmpl.Must(schemaFiles, "outbox.sql", "outbox_dead.sql")

// querier is what resolve needs: a pool, a connection or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func schemaOptions(opts []Option) (schemaConfig, tableName, error) {
	c := schemaConfig{table: DefaultTable, lanes: DefaultLanes}
	for _, o := range opts {
		if o != nil {
			o.applySchema(&c)
		}
	}
	if c.err != nil {
		return c, tableName{}, c.err
	}
	t, err := parseTable(c.table)
	return c, t, err
}

// Migrate creates the outbox table and its indexes, or brings them up to
// date (it drops the NOTIFY trigger of earlier versions, which serialised
// the commits of concurrent writers). It is idempotent and safe to run from several
// processes at once: the work happens in one transaction holding an
// advisory lock. An unqualified table goes in the first schema of the
// search_path. The lane count (WithLanes, default 16) is fixed at creation:
// without WithLanes an existing table keeps its count, and asking for
// another one is an error.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
	c, t, err := schemaOptions(opts)
	if err != nil {
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("outbox: migrate %s: begin: %w", t, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, sqlMigrateLock, migrateLockKey); err != nil {
		return fmt.Errorf("outbox: migrate %s: lock: %w", t, err)
	}
	schema := t.schema
	if schema == "" {
		if err := tx.QueryRow(ctx, sqlCurrentSchema).Scan(&schema); err != nil {
			return fmt.Errorf("outbox: migrate %s: current schema: %w", t, err)
		}
		if schema == "" {
			return fmt.Errorf("outbox: migrate %s: no schema in search_path to create it in", t)
		}
	}
	qualified := tableName{schema: schema, name: t.name}
	existing, err := resolve(ctx, tx, qualified)
	switch {
	case errors.Is(err, ErrNoTable):
	case err != nil:
		return fmt.Errorf("outbox: migrate: %w", err)
	case !c.lanesSet:
		c.lanes = existing.lanes // keep what the table was created with
	case existing.lanes != c.lanes:
		return fmt.Errorf("outbox: migrate %s: table has %d lanes, asked for %d; the lane count cannot change in place", qualified, existing.lanes, c.lanes)
	}
	ddl, err := renderSchema(schema, t.name, c.lanes)
	if err != nil {
		return fmt.Errorf("outbox: migrate %s: %w", qualified, err)
	}
	if _, err := tx.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("outbox: migrate %s: %w", qualified, err)
	}
	stuckDDL, err := renderStuckSchema(schema, t.name)
	if err != nil {
		return fmt.Errorf("outbox: migrate %s: %w", qualified, err)
	}
	if _, err := tx.Exec(ctx, stuckDDL); err != nil {
		return fmt.Errorf("outbox: migrate %s: stuck-row tables: %w", qualified, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("outbox: migrate %s: commit: %w", qualified, err)
	}
	return nil
}

// resolve looks the table up as the session's search_path sees it and
// reads its lane count from the comment Migrate left.
func resolve(ctx context.Context, q querier, t tableName) (resolvedTable, error) {
	return lookUp(ctx, q, t, true)
}

// lookUp finds the table as the session's search_path sees it; it reads
// the lane count from the comment Migrate left when always is set, or
// else only when the table does not generate its lanes (a Writer needs
// the count only to compute them).
func lookUp(ctx context.Context, q querier, t tableName, always bool) (resolvedTable, error) {
	var r resolvedTable
	var comment string
	err := q.QueryRow(ctx, sqlResolve, t.sanitized()).Scan(&r.oid, &r.schema, &r.name, &comment, &r.laneGenerated)
	if errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("%w: %s", ErrNoTable, t)
	}
	if err != nil {
		return r, fmt.Errorf("outbox: look up table %s: %w", t, err)
	}
	if !always && r.laneGenerated {
		return r, nil
	}
	c, err := decodeComment(t.String(), comment)
	if err != nil {
		return r, err
	}
	r.lanes = c.Lanes
	return r, nil
}
