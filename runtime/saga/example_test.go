package saga_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
	"github.com/protoevents/protoevents/runtime/saga"
)

// cmd stands in for generated command and reply types (e.g.
// *stockv1.ReserveStock); real code uses those and their descriptors.
type cmd struct {
	*structpb.Struct
	d *events.Descriptor
}

func (c cmd) EventKey() []byte                    { return []byte(c.Fields["order_id"].GetStringValue()) }
func (c cmd) EventDescriptor() *events.Descriptor { return c.d }

func descriptor(name string) *events.Descriptor {
	d := &events.Descriptor{Type: "shop.v1." + name, Topic: "shop." + name, Version: 1}
	d.New = func() events.Event { return cmd{Struct: &structpb.Struct{}, d: d} }
	return d
}

var (
	reserveStock, stockReserved, stockUnavailable = descriptor("ReserveStock"), descriptor("StockReserved"), descriptor("StockUnavailable")
	releaseStock, stockReleased                   = descriptor("ReleaseStock"), descriptor("StockReleased")
	chargeCard, cardCharged, cardDeclined         = descriptor("ChargeCard"), descriptor("CardCharged"), descriptor("CardDeclined")
)

func command(d *events.Descriptor, orderID string) events.Event {
	s, _ := structpb.NewStruct(map[string]any{"order_id": orderID})
	return cmd{Struct: s, d: d}
}

// order is the saga's data.
type order struct {
	ID    string
	Cents int64
}

// An orchestrator: define the saga over the event types, migrate, start
// sagas in the business transaction, and run the reply consumers and the
// timeout runner until SIGTERM.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://localhost/orders")
	if err != nil {
		log.Fatal(err)
	}
	if err := saga.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	w, err := outbox.NewWriter()
	if err != nil {
		log.Fatal(err)
	}
	sg, err := saga.New(saga.Definition[order]{
		Name: "order",
		Steps: []saga.Step[order]{{
			Name:                "reserve-stock",
			Command:             func(o *order) events.Event { return command(reserveStock, o.ID) },
			OnReply:             []saga.Reply[order]{saga.Succeeds[order, cmd](stockReserved, nil), saga.Fails[order, cmd](stockUnavailable, nil)},
			Compensation:        func(o *order) events.Event { return command(releaseStock, o.ID) },
			OnCompensationReply: []saga.Reply[order]{saga.Succeeds[order, cmd](stockReleased, nil)},
		}, {
			Name:    "charge-card",
			Command: func(o *order) events.Event { return command(chargeCard, o.ID) },
			OnReply: []saga.Reply[order]{saga.Succeeds[order, cmd](cardCharged, nil), saga.Fails[order, cmd](cardDeclined, nil)},
			Timeout: 30 * time.Second,
		}},
	}, w)
	if err != nil {
		log.Fatal(err)
	}
	// Start a saga with the order, in the order's own transaction.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, cents) VALUES ($1, $2)`, "ord-1", 4200); err != nil {
			return err
		}
		return sg.Start(ctx, tx, "ord-1", order{ID: "ord-1", Cents: 4200})
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := sg.Run(ctx, pool, []string{"localhost:9092"}); err != nil {
		log.Fatal(err)
	}
}

// Operators look at sagas without the definition, and retry parked ones.
func ExampleRetry() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/orders")
	if err != nil {
		log.Fatal(err)
	}
	parked, err := saga.List(ctx, pool, saga.Filter{Status: saga.StatusParked})
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range parked {
		path, err := saga.Path(ctx, pool, s.ID)
		if err != nil {
			log.Fatal(err)
		}
		log.Printf("%s parked at %s after %d transitions: %s", s.ID, s.StepName, len(path), s.Failure)
		if err := saga.Retry(ctx, pool, s.ID); err != nil {
			log.Fatal(err)
		}
	}
}
