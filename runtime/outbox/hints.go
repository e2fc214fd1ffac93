package outbox

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// missingTable turns Postgres' "relation does not exist" (SQLSTATE 42P01)
// into ErrNoTable, whose message tells the operator to migrate; other
// errors pass through.
func missingTable(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return fmt.Errorf("%w (%s)", ErrNoTable, pgErr.Message)
	}
	return err
}
