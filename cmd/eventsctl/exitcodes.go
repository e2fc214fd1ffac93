package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"
)

// Exit codes, the same for every command (listed in docs/runbook.md,
// "Exit codes and output"):
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

// migrateHint explains Postgres' "relation does not exist" (SQLSTATE
// 42P01) on what as a database that was not migrated.
func migrateHint(err error, what string) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return fmt.Errorf("%s does not exist (%s): run `eventsctl migrate` first, or check the table flag", what, pgErr.Message)
	}
	return unreachable(err)
}
