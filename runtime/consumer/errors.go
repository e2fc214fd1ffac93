package consumer

import (
	"errors"
	"fmt"
)

// permanentError marks an error that retrying cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent wraps err so the consumer sends the message to the DLQ at once
// instead of retrying it: for failures that depend only on the message,
// such as a payload the handler rejects as invalid. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or an error it wraps, was marked with
// Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// PanicError is the error a handler panic is turned into: the consumer
// recovers, rolls the transaction back and treats the panic like a returned
// error (retried, then dead-lettered).
type PanicError struct {
	// Value is what the handler panicked with.
	Value any
	// Stack is the panicking goroutine's stack, truncated to a few KiB.
	Stack []byte
}

// Error implements error; it includes the stack, so the DLQ's error header
// shows where the handler panicked.
func (e *PanicError) Error() string {
	return fmt.Sprintf("handler panicked: %v\n%s", e.Value, e.Stack)
}

// truncate shortens s to at most n bytes, marking the cut.
func truncate(s string, n int) string {
	const mark = "…[truncated]"
	if len(s) <= n {
		return s
	}
	if n <= len(mark) {
		return s[:n]
	}
	cut := n - len(mark)
	// Do not split a UTF-8 sequence.
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + mark
}
