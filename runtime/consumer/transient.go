package consumer

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// isInfra reports whether err is a failure that is not the message's fault
// and so must not count towards MaxAttempts: the consumer's own database
// steps failing (infraError), or a transient database fault surfacing from
// the handler or the commit (see isTransient). Errors marked Permanent are
// never infrastructure failures.
func isInfra(err error) bool {
	if err == nil || IsPermanent(err) {
		return false
	}
	var ie *infraError
	return errors.As(err, &ie) || isTransient(err)
}

// isTransient classifies database errors that retrying fixes: the
// connection was lost or refused, the server is shutting down or
// restarting, or the transaction lost a serialization or deadlock race.
//
//   - SQLSTATE class 08 (connection exception), 57P01 admin_shutdown,
//     57P02 crash_shutdown, 57P03 cannot_connect_now, 40001
//     serialization_failure, 40P01 deadlock_detected;
//   - pgconn.SafeToRetry (the statement never reached the server) and
//     *pgconn.ConnectError;
//   - io.EOF, io.ErrUnexpectedEOF, connection refused, reset or aborted, a
//     broken pipe, and "conn closed" from a connection the server dropped.
//
// Timeouts are not transient: an attempt that outlives WithAttemptTimeout
// counts, or a handler stuck on a lock would retry forever.
func isTransient(err error) bool {
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		code := pgErr.Code
		switch {
		case strings.HasPrefix(code, "08"),
			code == "57P01", code == "57P02", code == "57P03",
			code == "40001", code == "40P01":
			return true
		}
		return false
	}
	if pgconn.SafeToRetry(err) {
		return true
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return true
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed) {
		return true
	}
	// pgx reports a use of a connection that died earlier in the
	// transaction as "conn closed" without a wrapped cause.
	return strings.Contains(err.Error(), "conn closed")
}
