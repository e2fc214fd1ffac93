package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/protoevents/protoevents/runtime/events"
)

// Service is a service consumer: one consumer group and one dedup name for
// all the event types a service handles, each on its own topic with its own
// handler, DLQ, retries and redrive. Build it with NewService, add a handler
// per event type with Handle (or the generated Handle<Event> functions),
// then call Run once.
//
// One Service per service (per read model) is the intended shape: its
// members share one group, so a deploy rebalances once, and one missing
// topic is reported at Run instead of stalling a group shared by several
// consumers.
type Service struct {
	c *Consumer
}

// NewService returns a service consumer without handlers. It checks the
// configuration but does not connect; Run does.
//
// Naming: cfg.Name is the dedup scope (each event is applied once per
// name) and, unless cfg.GroupID is set, also the Kafka consumer group ID.
// Keep the name stable across deploys: a new name is a new read model,
// which applies every retained event again.
func NewService(cfg Config, opts ...Option) (*Service, error) {
	c, err := newConsumer(cfg, opts)
	if err != nil {
		return nil, err
	}
	return &Service{c: c}, nil
}

// HandlerFunc is a handler of any event type, as middleware sees it: ev is
// the decoded event (a pointer to the generated message), tx the dedup
// transaction.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev events.Event) error

// Middleware wraps every handler of a consumer, for logging, metrics,
// tracing or a custom retry policy; see WithMiddleware. It may change the
// error (for instance wrap it with Permanent to skip the retries), run code
// before and after the handler, or not call it at all.
type Middleware func(next HandlerFunc) HandlerFunc

// HandlerOption changes how one handler of a Service is run.
type HandlerOption func(*route) error

// WithHandlerMaxAttempts overrides WithMaxAttempts for one handler.
func WithHandlerMaxAttempts(n int) HandlerOption {
	return func(r *route) error {
		if n < 1 {
			return fmt.Errorf("max attempts %d < 1", n)
		}
		r.maxAttempts = n
		return nil
	}
}

// Handle registers fn as the handler of event type d on s: events from
// d.Topic are decoded into a T and passed to fn inside the dedup
// transaction; failures are retried and dead-lettered to d's DLQ topic.
// Each topic has at most one handler. Handle must be called before Run.
func Handle[T events.Event](s *Service, d *events.Descriptor, fn func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev T) error, opts ...HandlerOption) error {
	if s == nil {
		return errors.New("consumer: Handle: nil service")
	}
	if fn == nil {
		if d != nil {
			return fmt.Errorf("consumer: Handle %s: nil handler function", d.Type)
		}
		return errors.New("consumer: Handle: nil handler function")
	}
	return s.Register(Bind(d, fn), opts...)
}

// Register adds h as the handler of its event type; Handle is the typed
// way to call it.
func (s *Service) Register(h Handler, opts ...HandlerOption) error {
	return s.c.register(h, opts)
}

// Run consumes every registered topic until ctx is cancelled; see
// Consumer.Run.
func (s *Service) Run(ctx context.Context) error { return s.c.Run(ctx) }

// Ready returns a channel closed once Run has joined the group and started
// its assigned partitions.
func (s *Service) Ready() <-chan struct{} { return s.c.Ready() }

// Topics returns the consumed topics, in registration order.
func (s *Service) Topics() []string { return append([]string(nil), s.c.topics...) }

// DLQTopic returns the dead-letter topic of the handler of topic, or "" if
// no handler consumes it.
func (s *Service) DLQTopic(topic string) string {
	if r, ok := s.c.routes[topic]; ok {
		return r.dlq
	}
	return ""
}

// GroupID returns the Kafka consumer group: Config.GroupID, or Config.Name.
func (s *Service) GroupID() string { return s.c.cfg.GroupID }

// Name returns the consumer's name, the dedup scope.
func (s *Service) Name() string { return s.c.cfg.Name }
