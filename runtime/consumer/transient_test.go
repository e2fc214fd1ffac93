package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestTransientClassification: connection, shutdown, serialization and
// deadlock errors are transient (retried without counting), wrapped or
// not; constraint violations, timeouts and Permanent errors are not.
func TestTransientClassification(t *testing.T) {
	pg := func(code string) error { return &pgconn.PgError{Code: code, Message: "x"} }
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{pg("08006"), true}, // connection_failure
		{pg("08003"), true}, // connection_does_not_exist
		{pg("57P01"), true}, // admin_shutdown
		{pg("57P02"), true}, // crash_shutdown
		{pg("57P03"), true}, // cannot_connect_now
		{pg("40001"), true}, // serialization_failure
		{pg("40P01"), true}, // deadlock_detected
		{fmt.Errorf("handler: %w", pg("40P01")), true},
		{io.EOF, true},
		{io.ErrUnexpectedEOF, true},
		{fmt.Errorf("dial: %w", syscall.ECONNREFUSED), true},
		{fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{errors.New("conn closed"), true},
		{&infraError{errors.New("begin")}, true},
		{pg("23505"), false}, // unique_violation: the event's fault
		{pg("57014"), false}, // query_canceled (a timeout)
		{context.DeadlineExceeded, false},
		{fmt.Errorf("attempt: %w", context.DeadlineExceeded), false},
		{Permanent(pg("40001")), false},
		{errors.New("handler said no"), false},
		{nil, false},
	} {
		if got := isInfra(tc.err); got != tc.want {
			t.Errorf("isInfra(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
