package saga

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Defaults of the optional settings.
const (
	// DefaultCompensationAttempts is how often a compensation is tried
	// before the saga is parked for an operator.
	DefaultCompensationAttempts = 5
	// DefaultBackoff and DefaultMaxBackoff bound the wait before a failed
	// compensation is sent again: base·2^(attempt-1), capped.
	DefaultBackoff    = time.Second
	DefaultMaxBackoff = time.Minute
	// DefaultPollInterval is how often the timeout runner looks for due
	// deadlines.
	DefaultPollInterval = time.Second
)

// Option changes an optional setting of a saga. WithTable is also read by
// Migrate and the status functions (List, Get, Retry), which must agree
// with the saga on it.
type Option func(*settings)

type settings struct {
	table        string
	sql          *sqlSet
	attempts     int
	backoff      time.Duration
	maxBackoff   time.Duration
	pollInterval time.Duration
	logger       *slog.Logger
	hooks        Hooks
	errs         []error
}

func (s *settings) fail(format string, args ...any) {
	s.errs = append(s.errs, fmt.Errorf("saga: "+format, args...))
}

// settingsFrom applies opts to the defaults, renders the SQL and reports
// invalid values.
func settingsFrom(opts []Option) (settings, error) {
	s := settings{
		table:        DefaultTable,
		attempts:     DefaultCompensationAttempts,
		backoff:      DefaultBackoff,
		maxBackoff:   DefaultMaxBackoff,
		pollInterval: DefaultPollInterval,
		logger:       slog.Default(),
	}
	for _, o := range opts {
		if o != nil {
			o(&s)
		}
	}
	var err error
	if s.sql, err = renderSQL(s.table); err != nil {
		s.errs = append(s.errs, err)
	}
	return s, errors.Join(s.errs...)
}

// WithTable sets the state table, "table" or "schema.table"; default
// "sagas". The path table is its name plus "_history".
func WithTable(name string) Option {
	return func(s *settings) { s.table = name }
}

// WithCompensationRetries sets how often a compensation is tried (the
// first send included) before the saga is parked, and the backoff between
// tries: base·2^(n-1), capped at max. Defaults 5, 1s and 1m.
func WithCompensationRetries(attempts int, base, max time.Duration) Option {
	return func(s *settings) {
		if attempts < 1 || base <= 0 || max < base {
			s.fail("compensation retries: attempts %d, backoff %v..%v: want attempts >= 1 and 0 < base <= max", attempts, base, max)
			return
		}
		s.attempts, s.backoff, s.maxBackoff = attempts, base, max
	}
}

// WithPollInterval sets how often the timeout runner looks for due
// deadlines (step timeouts, compensation retries, operator retries);
// default 1s. A deadline fires at most this late.
func WithPollInterval(d time.Duration) Option {
	return func(s *settings) {
		if d <= 0 {
			s.fail("poll interval %v <= 0", d)
			return
		}
		s.pollInterval = d
	}
}

// WithLogger sets the logger; default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(s *settings) {
		if l != nil {
			s.logger = l
		}
	}
}

// WithHooks installs observability callbacks. Fault injection is not an
// option: tests arm it through Run's context (runtime/faultinject).
func WithHooks(h Hooks) Option {
	return func(s *settings) { s.hooks = h }
}

// Hooks are observability callbacks, for metrics, tests and demos; every
// field is optional and must be quick and safe for concurrent use.
type Hooks struct {
	// TimerCommitted is called after the timeout runner committed a
	// transition it fired (a timeout or a compensation retry). Transitions
	// driven by replies are committed by the consumer (see consumer.Hooks,
	// Processed); Start's by the caller.
	TimerCommitted func(Transition)
}

// backoffFor is the wait before compensation attempt n+1 after n failures.
func (s *settings) backoffFor(failures int) time.Duration {
	d := s.backoff
	for i := 1; i < failures && d < s.maxBackoff; i++ {
		d *= 2
	}
	return min(d, s.maxBackoff)
}
