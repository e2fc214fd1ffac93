package outbox

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Tx is the caller's open transaction a Writer writes in. A pgx.Tx (from
// pgx.Conn or pgxpool.Pool, or a *CommitTx) satisfies it as is; a
// database/sql transaction does through SQLTx. The Writer inserts its rows
// with Exec, and with QueryRow reads its table's shape once in its life.
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// SQLTx adapts a database/sql transaction for Writer (and generated
// producers), so code on database/sql (sqlx, sqlc's database/sql mode, ent,
// GORM's underlying *sql.Tx) writes its events in its own transaction. The
// connection must use pgx's stdlib driver (github.com/jackc/pgx/v5/stdlib,
// e.g. stdlib.OpenDBFromPool), which passes the batch insert's arrays
// through as Postgres arrays.
func SQLTx(tx *sql.Tx) Tx { return sqlTx{tx} }

type sqlTx struct{ tx *sql.Tx }

// Exec runs the statement in the database/sql transaction. The command tag
// is not reported (database/sql has none); the Writer does not read it.
func (s sqlTx) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	_, err := s.tx.ExecContext(ctx, query, args...)
	return pgconn.CommandTag{}, err
}

// QueryRow runs a query in the database/sql transaction; a Writer reads
// its table's shape with it on first use.
func (s sqlTx) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return s.tx.QueryRowContext(ctx, query, args...)
}
