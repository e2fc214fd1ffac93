package saga

// This file is the one place the saga package meets runtime/consumer: the
// saga's reply handlers are plain functions of (ctx, tx, meta, event), and
// only the wiring below knows how the consumer API takes them.

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
// generated stockv1.HandleStockReserved(c, saga.HandlerFor[*stockv1.StockReserved](sg)).
func HandlerFor[R events.Event, D any](sg *Saga[D]) func(ctx context.Context, tx pgx.Tx, meta events.Meta, r R) error {
	return func(ctx context.Context, tx pgx.Tx, meta events.Meta, r R) error {
		return sg.Handle(ctx, tx, meta, r)
	}
}

// HandleReplies registers sg's reply handler on c for every reply event
// type (ReplyTypes), each reply topic keeping its own DLQ. Call it before
// c.Run; c may consume other event types too.
func (sg *Saga[D]) HandleReplies(c *consumer.Consumer) error {
	for _, d := range sg.ReplyTypes() {
		if err := consumer.Handle(c, d, sg.Handle); err != nil {
			return fmt.Errorf("saga %s: handler of %s: %w", sg.def.Name, d.Type, err)
		}
	}
	return nil
}

// Run runs the saga's orchestrator until ctx is cancelled: a reply
// consumer named ConsumerName (its group too, unless opts set one) with
// the handlers of HandleReplies, and the timeout runner (RunTimeouts), both
// on pool. It returns nil after a cancellation, or the first failure of
// either, having stopped the other. To name the consumer otherwise, or to
// share it with other handlers, build it with consumer.New and
// HandleReplies and run it beside RunTimeouts.
func (sg *Saga[D]) Run(ctx context.Context, pool *pgxpool.Pool, brokers []string, opts ...consumer.Option) error {
	c, err := consumer.New(pool, brokers, sg.ConsumerName(), opts...)
	if err != nil {
		return fmt.Errorf("saga %s: reply consumer: %w", sg.def.Name, err)
	}
	if err := sg.HandleReplies(c); err != nil {
		return err
	}
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
	wg.Go(func() { fail(c.Run(ctx)) })
	wg.Go(func() { fail(sg.RunTimeouts(ctx, pool)) })
	wg.Wait()
	return errors.Join(errs...)
}
