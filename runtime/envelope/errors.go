package envelope

import "errors"

// ErrMalformed is matched (errors.Is) by every DecodeError: the message can
// never be decoded, however often it is retried.
var ErrMalformed = errors.New("malformed envelope")

// DecodeError reports why a Kafka message is not a valid envelope.
type DecodeError struct {
	// Reason says what is wrong, e.g. "event_id is not a ULID".
	Reason string
	// Err is the underlying error, if any.
	Err error
}

// Error implements error.
func (e *DecodeError) Error() string {
	if e.Err != nil {
		return "envelope: " + e.Reason + ": " + e.Err.Error()
	}
	return "envelope: " + e.Reason
}

// Unwrap returns the underlying error.
func (e *DecodeError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrMalformed) true for every DecodeError.
func (e *DecodeError) Is(target error) bool { return target == ErrMalformed }
