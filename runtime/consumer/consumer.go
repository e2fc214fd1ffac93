// Package consumer runs idempotent Kafka consumers: each message is
// deduplicated and handled in one Postgres transaction, and its offset is
// committed only after that transaction commits.
package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	events "github.com/protoevents/protoevents/runtime"
)

// errNotImplemented marks the API skeleton; the implementation replaces it.
var errNotImplemented = errors.New("consumer: not implemented")

// Config is what every consumer needs: who it is, where the events come
// from, and the database its handler writes to.
type Config struct {
	// Name identifies the consumer: it scopes deduplication (one event is
	// applied once per consumer name) and is the default group ID.
	Name string
	// GroupID is the Kafka consumer group; defaults to Name.
	GroupID string
	// Brokers lists the Kafka bootstrap brokers.
	Brokers []string
	// DB is the pool the dedup transactions run on.
	DB *pgxpool.Pool
}

// Option changes an optional setting of a Consumer.
type Option func(*Consumer)

// Handler handles decoded events of one type inside the dedup transaction.
// Generated code builds one with Bind; few programs implement it by hand.
type Handler interface {
	// Descriptor describes the event type the handler consumes.
	Descriptor() *events.Descriptor
	// Handle applies one event; tx is the dedup transaction.
	Handle(ctx context.Context, tx pgx.Tx, meta events.Meta, ev events.Event) error
}

// Bind adapts a typed handler function to a Handler for the event type d.
func Bind[T events.Event](d *events.Descriptor, fn func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev T) error) Handler {
	return boundHandler[T]{d: d, fn: fn}
}

type boundHandler[T events.Event] struct {
	d  *events.Descriptor
	fn func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev T) error
}

func (b boundHandler[T]) Descriptor() *events.Descriptor { return b.d }

func (b boundHandler[T]) Handle(ctx context.Context, tx pgx.Tx, meta events.Meta, ev events.Event) error {
	t, ok := ev.(T)
	if !ok {
		return fmt.Errorf("consumer: handler for %s got a %T", b.d.Type, ev)
	}
	return b.fn(ctx, tx, meta, t)
}

// Consumer consumes one event type from its topic.
type Consumer struct {
	cfg Config
	h   Handler
}

// New returns a Consumer that feeds the events of h's type to h.
func New(cfg Config, h Handler, opts ...Option) (*Consumer, error) {
	c := &Consumer{cfg: cfg, h: h}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Run consumes until ctx is cancelled or a fatal error occurs.
func (c *Consumer) Run(ctx context.Context) error {
	return errNotImplemented
}
