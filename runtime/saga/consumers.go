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

// Service returns the saga's reply consumer: one service consumer (one
// Kafka group, one dedup scope) with a handler per reply event type, each
// reply topic keeping its own DLQ. cfg.Name defaults to ConsumerName, and
// the group to the name.
func (sg *Saga[D]) Service(cfg consumer.Config, opts ...consumer.Option) (*consumer.Service, error) {
	if cfg.Name == "" {
		cfg.Name = sg.ConsumerName()
	}
	svc, err := consumer.NewService(cfg, opts...)
	if err != nil {
		return nil, fmt.Errorf("saga %s: reply consumer: %w", sg.def.Name, err)
	}
	for _, d := range sg.ReplyTypes() {
		if err := svc.Register(replyHandler{d: d, handle: sg.Handle}); err != nil {
			return nil, fmt.Errorf("saga %s: handler of %s: %w", sg.def.Name, d.Type, err)
		}
	}
	return svc, nil
}

// Run runs the saga's orchestrator until ctx is cancelled: the reply
// consumer (see Service) and the timeout runner on cfg.DB. It returns nil
// after a cancellation, or the first failure of either, having stopped the
// other.
func (sg *Saga[D]) Run(ctx context.Context, cfg consumer.Config, opts ...consumer.Option) error {
	svc, err := sg.Service(cfg, opts...)
	if err != nil {
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
	wg.Go(func() { fail(svc.Run(ctx)) })
	wg.Go(func() { fail(sg.RunTimeouts(ctx, cfg.DB)) })
	wg.Wait()
	return errors.Join(errs...)
}
