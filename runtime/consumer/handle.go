package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/protoevents/protoevents/runtime/events"
)

// HandlerFunc is a handler of any event type, as middleware sees it: ev is
// the decoded event (a pointer to the generated message), tx the dedup
// transaction.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev events.Event) error

// Middleware wraps every handler of a consumer, for logging, metrics,
// tracing or a custom retry policy; see WithMiddleware. It may change the
// error (for instance wrap it with Permanent to skip the retries), run code
// before and after the handler, or not call it at all.
type Middleware func(next HandlerFunc) HandlerFunc

// HandlerOption changes how one handler of a Consumer is run.
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

// Handle registers fn as the handler of event type d on c: events from
// d.Topic are decoded into a T and passed to fn inside the dedup
// transaction tx; failures are retried and dead-lettered to d's DLQ topic.
// Each topic has at most one handler. Handle must be called before Run.
//
// fn must not commit or roll back tx. An error (or panic) rolls the
// transaction back and the message is retried; wrap the error with
// Permanent to send the message to the DLQ at once.
//
// Events fn writes with an outbox.Writer on tx commit or roll back with
// its other effects. When a message is applied in a transaction of its
// own (always with WithMaxBatch(1); otherwise for a retry or a message
// settled alone) tx is an outbox.CommitTx, begun with outbox.Begin, so
// they are held and sent with the transaction's next statement or its
// COMMIT, saving a round trip. In a batch, where each handler call runs in
// its own savepoint, tx wraps the batch's CommitTx and they are inserted
// at once (written in a nested transaction of tx, itself a CommitTx, they
// are held until its next statement or the COMMIT). HandleSQL is the
// variant for database/sql code.
func Handle[T events.Event](c *Consumer, d *events.Descriptor, fn func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev T) error, opts ...HandlerOption) error {
	if fn == nil {
		if d != nil {
			return fmt.Errorf("consumer: Handle %s: nil handler function", d.Type)
		}
		return errors.New("consumer: Handle: nil handler function")
	}
	return c.register(d, typed(d, fn), opts)
}

// typed adapts fn to a HandlerFunc that checks the event's type.
func typed[T events.Event](d *events.Descriptor, fn func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev T) error) HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev events.Event) error {
		t, ok := ev.(T)
		if !ok {
			return Permanent(fmt.Errorf("consumer: handler for %s got a %T", d.Type, ev))
		}
		return fn(ctx, tx, meta, t)
	}
}

// register adds fn as the handler of d's topic, wrapped in the consumer's
// middleware.
func (c *Consumer) register(d *events.Descriptor, fn HandlerFunc, opts []HandlerOption) error {
	if c == nil {
		return errors.New("consumer: Handle: nil consumer")
	}
	if c.running.Load() {
		return errors.New("consumer: handler registered after Run")
	}
	switch {
	case d == nil:
		return errors.New("consumer: Handle: nil descriptor")
	case d.Type == "" || d.Topic == "":
		return errors.New("consumer: descriptor: Type and Topic are required")
	case d.New == nil:
		return fmt.Errorf("consumer: descriptor of %s: New is nil", d.Type)
	case d.Version < 1:
		return fmt.Errorf("consumer: descriptor of %s: Version %d < 1", d.Type, d.Version)
	}
	if old, ok := c.routes[d.Topic]; ok {
		return fmt.Errorf("consumer: %s: topic %s already has a handler (for %s): one handler per event type and topic", c.name, d.Topic, old.d.Type)
	}
	r := &route{d: d, dlq: d.DLQTopic, maxAttempts: c.s.maxAttempts}
	if r.dlq == "" {
		r.dlq = d.Topic + ".dlq"
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(r); err != nil {
			return fmt.Errorf("consumer: handler of %s: %w", d.Type, err)
		}
	}
	for i := len(c.s.middleware) - 1; i >= 0; i-- {
		fn = c.s.middleware[i](fn)
	}
	r.fn = fn
	c.routes[d.Topic] = r
	c.topics = append(c.topics, d.Topic)
	return nil
}

// Topics returns the consumed topics, in registration order.
func (c *Consumer) Topics() []string { return append([]string(nil), c.topics...) }

// DLQTopic returns the dead-letter topic of the handler of topic (the
// descriptor's DLQTopic, or "<topic>.dlq"), or "" if no handler consumes
// it.
func (c *Consumer) DLQTopic(topic string) string {
	if r, ok := c.routes[topic]; ok {
		return r.dlq
	}
	return ""
}

// GroupID returns the Kafka consumer group: WithGroupID's, or the name.
func (c *Consumer) GroupID() string { return c.groupID }

// Name returns the consumer's name, the dedup scope.
func (c *Consumer) Name() string { return c.name }
