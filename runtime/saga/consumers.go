package saga

// This file is the one place the saga package meets runtime/consumer: the
// saga's reply handlers are plain functions of (ctx, tx, meta, event), and
// only the wiring below knows how today's consumer API takes them.

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
)

// HandlerFor returns sg's reply handler typed for reply events R, to plug
// into any consumer whose handler runs in its dedup transaction, e.g. a
// generated NewXConsumer(cfg, saga.HandlerFor[*stockv1.StockReserved](sg)).
func HandlerFor[R events.Event, D any](sg *Saga[D]) func(ctx context.Context, tx pgx.Tx, meta events.Meta, r R) error {
	return func(ctx context.Context, tx pgx.Tx, meta events.Meta, r R) error {
		return sg.Handle(ctx, tx, meta, r)
	}
}

// replyHandler adapts Handle to consumer.Handler for one reply type.
type replyHandler struct {
	d      *events.Descriptor
	handle func(ctx context.Context, tx pgx.Tx, meta events.Meta, ev events.Event) error
}

func (h replyHandler) Descriptor() *events.Descriptor { return h.d }

func (h replyHandler) Handle(ctx context.Context, tx pgx.Tx, meta events.Meta, ev events.Event) error {
	return h.handle(ctx, tx, meta, ev)
}

// Consumers returns one idempotent consumer per reply event type of the
// saga. They share one dedup scope, cfg.Name (default ConsumerName), and
// each joins its own group, cfg.GroupID (default the name) plus "." and the
// reply topic.
func (sg *Saga[D]) Consumers(cfg consumer.Config, opts ...consumer.Option) ([]*consumer.Consumer, error) {
	if cfg.Name == "" {
		cfg.Name = sg.ConsumerName()
	}
	group := cfg.GroupID
	if group == "" {
		group = cfg.Name
	}
	var out []*consumer.Consumer
	for _, d := range sg.ReplyTypes() {
		c := cfg
		c.GroupID = group + "." + d.Topic
		cons, err := consumer.New(c, replyHandler{d: d, handle: sg.Handle}, opts...)
		if err != nil {
			return nil, fmt.Errorf("saga %s: consumer of %s: %w", sg.def.Name, d.Type, err)
		}
		out = append(out, cons)
	}
	return out, nil
}

// Run runs the saga's orchestrator until ctx is cancelled: the reply
// consumers (see Consumers) and the timeout runner on cfg.DB. It returns
// nil after a cancellation, or the first failure of a consumer, having
// stopped the others.
func (sg *Saga[D]) Run(ctx context.Context, cfg consumer.Config, opts ...consumer.Option) error {
	cs, err := sg.Consumers(cfg, opts...)
	if err != nil {
		return err
	}
	return sg.run(ctx, cfg.DB, cs)
}

func (sg *Saga[D]) run(ctx context.Context, pool *pgxpool.Pool, cs []*consumer.Consumer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	fail := func(err error) {
		if err == nil {
			return
		}
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
		cancel()
	}
	for _, c := range cs {
		wg.Go(func() { fail(c.Run(ctx)) })
	}
	wg.Go(func() { fail(sg.RunTimeouts(ctx, pool)) })
	wg.Wait()
	return errors.Join(errs...)
}
