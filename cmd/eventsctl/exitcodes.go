package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
)

// Exit codes, the same for every command (listed in the README):
const (
	exitOK          = 0 // success
	exitCheckFailed = 1 // a check ran and failed: --max-age exceeded, topics drift, breaking schema changes
	exitUsage       = 2 // bad flags or arguments
	exitUnreachable = 3 // a dependency (Postgres, Kafka) could not be reached or timed out
	exitFailed      = 4 // anything else: refused by the server, not migrated, not found
)

// unreachableError marks an error as "a dependency could not be reached"
// (exit code 3).
type unreachableError struct{ err error }

func (e unreachableError) Error() string { return e.err.Error() }
func (e unreachableError) Unwrap() error { return e.err }

// unreachable wraps err as exit code 3 when it is a network failure or a
// timeout (and not, say, a server's refusal).
func unreachable(err error) error {
	if err == nil || !isNetworkFailure(err) {
		return err
	}
	return unreachableError{err}
}

func isNetworkFailure(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return false
	}
	var netErr net.Error
	var opErr *net.OpError
	var dnsErr *net.DNSError
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kafka.BrokerNotAvailable) || errors.Is(err, kafka.RequestTimedOut) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.As(err, &opErr) || errors.As(err, &dnsErr) || (errors.As(err, &netErr) && netErr.Timeout())
}

// exitCode maps a command's error to the process's exit code.
func exitCode(err error) int {
	var exit exitError
	var unr unreachableError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &exit):
		return int(exit)
	case errors.Is(err, errUsage):
		return exitUsage
	case errors.As(err, &unr):
		return exitUnreachable
	}
	return exitFailed
}

// connectTimeout bounds how long connect waits for the server (a variable
// so tests of a hanging server finish sooner).
var connectTimeout = 10 * time.Second

// connect opens a pool and checks that the server answers, explaining a
// failure in operator terms: refused (role, password, database: fix the
// URL), timed out or unreachable (exit 3: is the server up?).
func connect(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("%w: --database-url: %v", errUsage, err)
	}
	addr := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > connectTimeout {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, connectError(addr, cfg.ConnConfig.User, cfg.ConnConfig.Database, err)
	}
	return pool, nil
}

// connectError explains why the database at addr did not accept us.
func connectError(addr, user, database string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "28P01", "28000":
			return fmt.Errorf("database at %s refused role %q: %s (SQLSTATE %s): check the user and password in --database-url and pg_hba.conf", addr, user, pgErr.Message, pgErr.Code)
		case "3D000":
			return fmt.Errorf("database at %s: database %q does not exist (SQLSTATE 3D000): check the database name in --database-url", addr, database)
		case "53300":
			return unreachableError{fmt.Errorf("database at %s: too many connections (SQLSTATE 53300): try again, or raise max_connections", addr)}
		case "57P03":
			return unreachableError{fmt.Errorf("database at %s is starting up or shutting down (SQLSTATE 57P03): try again shortly", addr)}
		}
		return fmt.Errorf("database at %s refused the connection: %w", addr, err)
	}
	if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return unreachableError{fmt.Errorf("database: timed out after %s connecting to %s: is Postgres up and reachable from here? (check --database-url): %w", connectTimeout, addr, err)}
	}
	if isNetworkFailure(err) {
		return unreachableError{fmt.Errorf("database: cannot reach %s: is Postgres running there? (check --database-url): %w", addr, err)}
	}
	return fmt.Errorf("database at %s: %w", addr, err)
}

func isTimeout(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) && netErr.Timeout()
}

// migrateHint explains Postgres' "relation does not exist" (SQLSTATE
// 42P01) on what as a database that was not migrated.
func migrateHint(err error, what string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return fmt.Errorf("%s does not exist (%s): run `eventsctl migrate` first, or check the table flag", what, pgErr.Message)
	}
	return unreachable(err)
}
