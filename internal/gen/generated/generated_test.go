package generated

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
	inventoryv1 "github.com/protoevents/protoevents/testdata/golden/inventory/v1"
	ordersv1 "github.com/protoevents/protoevents/testdata/golden/orders/v1"
	ordersv2 "github.com/protoevents/protoevents/testdata/golden/orders/v2"
	paymentsv1 "github.com/protoevents/protoevents/testdata/golden/payments/v1"
	shippingv1 "github.com/protoevents/protoevents/testdata/golden/shipping/v1"
)

func TestEventKeys(t *testing.T) {
	refund := "r-7"
	warehouse := int32(-3)
	shelf := uint32(math.MaxUint32)
	for _, tc := range []struct {
		name string
		ev   events.Event
		want []byte
	}{
		{"string", &ordersv1.OrderPlaced{OrderId: "o-1"}, []byte("o-1")},
		{"nested string", &ordersv1.OrderCancelled{Order: &ordersv1.OrderRef{Id: "o-2"}}, []byte("o-2")},
		{"nested, parent unset", &ordersv1.OrderCancelled{}, []byte{}},
		{"nested message type", &ordersv2.OrderPlaced{Order: &ordersv2.OrderPlaced_Order{Id: "o-3"}}, []byte("o-3")},
		{"int64", &paymentsv1.PaymentCaptured{PaymentId: -42}, []byte("-42")},
		{"uint64", &paymentsv1.LedgerEntryPosted{LedgerSeq: math.MaxUint64}, []byte("18446744073709551615")},
		{"bytes", &paymentsv1.CardFingerprinted{Fingerprint: []byte{0, 1, 0xff}}, []byte{0, 1, 0xff}},
		{"bytes unset", &paymentsv1.CardFingerprinted{}, nil},
		{"proto3 optional set", &paymentsv1.RefundRequested{RefundId: &refund}, []byte("r-7")},
		{"proto3 optional unset", &paymentsv1.RefundRequested{}, []byte{}},
		{"editions sfixed32", &inventoryv1.Stock_Adjusted{Warehouse: &warehouse}, []byte("-3")},
		{"editions sfixed32 unset", &inventoryv1.Stock_Adjusted{}, nil},
		{"int64 zero", &paymentsv1.PaymentCaptured{}, nil},
		{"uint64 zero", &paymentsv1.LedgerEntryPosted{LedgerSeq: 0}, nil},
		{"editions nested fixed32", &inventoryv1.ShelfScanned{Location: &inventoryv1.ShelfScanned_Location{Shelf: &shelf}}, []byte("4294967295")},
	} {
		if got := tc.ev.EventKey(); !bytes.Equal(got, tc.want) {
			t.Errorf("%s: EventKey() = %q, want %q", tc.name, got, tc.want)
		}
	}

	// A bytes key is a copy: changing it leaves the event alone.
	ev := &paymentsv1.CardFingerprinted{Fingerprint: []byte("abc")}
	ev.EventKey()[0] = 'X'
	if string(ev.GetFingerprint()) != "abc" {
		t.Errorf("EventKey aliases the message's bytes")
	}
	// A nil message has the zero key, like protobuf getters.
	if got := (*ordersv1.OrderPlaced)(nil).EventKey(); len(got) != 0 {
		t.Errorf("nil message key %q", got)
	}
}

func TestDescriptors(t *testing.T) {
	d := ordersv1.OrderCancelledEvent
	want := events.Descriptor{
		Type:     "orders.v1.OrderCancelled",
		Topic:    "orders.order-cancelled.v1",
		DLQTopic: "orders.dead-letters",
		Version:  1,
		KeyPath:  "order.id",
		Producer: "orders-service",
		File:     "orders/v1/orders.proto",
	}
	if d.Type != want.Type || d.Topic != want.Topic || d.DLQTopic != want.DLQTopic || d.Version != want.Version ||
		d.KeyPath != want.KeyPath || d.Producer != want.Producer || d.Supersedes != want.Supersedes || d.File != want.File {
		t.Errorf("descriptor %+v, want %+v", *d, want)
	}
	if _, ok := d.New().(*ordersv1.OrderCancelled); !ok {
		t.Errorf("New returns %T", d.New())
	}
	if (&ordersv1.OrderCancelled{}).EventDescriptor() != d {
		t.Error("EventDescriptor is not the generated descriptor")
	}

	// Defaults: DLQ topic from the topic, producer from the proto package.
	p := paymentsv1.CardFingerprintedEvent
	if p.DLQTopic != "payments.card-fingerprinted.v1.dlq" || p.Producer != "payments.v1" || p.Version != 3 {
		t.Errorf("defaults: %+v", *p)
	}
	if ordersv2.OrderPlacedEvent.Supersedes != "orders.v1.OrderPlaced" {
		t.Errorf("supersedes %q", ordersv2.OrderPlacedEvent.Supersedes)
	}
	if inventoryv1.Stock_AdjustedEvent.Type != "inventory.v1.Stock.Adjusted" {
		t.Errorf("nested event type %q", inventoryv1.Stock_AdjustedEvent.Type)
	}
}

// TestRegistry checks the per-file lists and their registration at init.
func TestRegistry(t *testing.T) {
	lists := map[string][]*events.Descriptor{
		"orders/v1":    ordersv1.OrdersEvents,
		"orders/v2":    ordersv2.OrdersEvents,
		"payments/v1":  paymentsv1.PaymentsEvents,
		"inventory/v1": inventoryv1.InventoryEvents,
		// ShippingEvents is a message there, so the registry falls back.
		"shipping/v1": shippingv1.ShippingProtoEvents,
	}
	wantLen := map[string]int{"orders/v1": 2, "orders/v2": 1, "payments/v1": 4, "inventory/v1": 2, "shipping/v1": 1}
	for name, list := range lists {
		if len(list) != wantLen[name] {
			t.Errorf("%s: %d events, want %d", name, len(list), wantLen[name])
		}
		for _, d := range list {
			if got, ok := events.Lookup(d.Type); !ok || got != d {
				t.Errorf("%s: %s not registered at init", name, d.Type)
			}
		}
	}
	if ordersv1.OrdersEvents[0] != ordersv1.OrderPlacedEvent || ordersv1.OrdersEvents[1] != ordersv1.OrderCancelledEvent {
		t.Error("registry is not in declaration order")
	}
}

// TestProducerRefusesNil checks the generated guards, which run before the
// outbox writer is reached.
func TestProducerRefusesNil(t *testing.T) {
	ctx := context.Background()
	w, err := outbox.NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	p := ordersv2.NewOrderPlacedProducer(w)
	if _, err := p.Publish(ctx, nil, nil); err == nil || !strings.Contains(err.Error(), "nil event") {
		t.Errorf("Publish(nil) error %v", err)
	}
	if _, err := p.PublishBatch(ctx, nil, []*ordersv2.OrderPlaced{{}, nil}); err == nil || !strings.Contains(err.Error(), "event 1 is nil") {
		t.Errorf("PublishBatch with nil error %v", err)
	}
	ev := &ordersv2.OrderPlaced{Order: &ordersv2.OrderPlaced_Order{Id: "o-1"}}
	if _, err := p.PublishWithSuperseded(ctx, nil, ev, nil); err == nil || !strings.Contains(err.Error(), "nil down conversion") {
		t.Errorf("PublishWithSuperseded without down: %v", err)
	}
	boom := errors.New("boom")
	_, err = p.PublishWithSuperseded(ctx, nil, ev, func(*ordersv2.OrderPlaced) (*ordersv1.OrderPlaced, error) { return nil, boom })
	if !errors.Is(err, boom) {
		t.Errorf("PublishWithSuperseded does not wrap the conversion error: %v", err)
	}
	_, err = p.PublishWithSuperseded(ctx, nil, ev, func(*ordersv2.OrderPlaced) (*ordersv1.OrderPlaced, error) { return nil, nil })
	if err == nil || !strings.Contains(err.Error(), "nil event") {
		t.Errorf("PublishWithSuperseded with nil old event: %v", err)
	}
}

func TestHandleRegistersHandler(t *testing.T) {
	// pgxpool.New does not connect, so no server is needed to build one.
	pool, err := pgxpool.New(context.Background(), "postgres://127.0.0.1:1/unused")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c, err := consumer.New(pool, []string{"127.0.0.1:1"}, "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := ordersv1.HandleOrderPlaced(c, nil); err == nil || !strings.Contains(err.Error(), "nil handler") {
		t.Errorf("nil handler: %v", err)
	}
	h := func(context.Context, pgx.Tx, events.Meta, *ordersv1.OrderPlaced) error { return nil }
	if err := ordersv1.HandleOrderPlaced(nil, h); err == nil {
		t.Error("a nil consumer was accepted")
	}
	if err := ordersv1.HandleOrderPlaced(c, h); err != nil {
		t.Fatalf("HandleOrderPlaced: %v", err)
	}
	if err := ordersv1.HandleOrderPlaced(c, h); err == nil {
		t.Error("a second handler of the same topic was accepted")
	}
	if got := c.DLQTopic(ordersv1.OrderPlacedTopic); got != ordersv1.OrderPlacedDLQTopic {
		t.Errorf("consumer DLQ topic %q, want the descriptor's %q", got, ordersv1.OrderPlacedDLQTopic)
	}
	if got := c.Topics(); len(got) != 1 || got[0] != ordersv1.OrderPlacedTopic {
		t.Errorf("topics %v, want [%s]", got, ordersv1.OrderPlacedTopic)
	}
}

func TestMain(m *testing.M) { servers.Main(m) }

// TestZeroIntegerKeyRefused: an integer key of 0 cannot be told from an
// unset one, so publishing it is refused like an empty key; 1 goes in.
func TestZeroIntegerKeyRefused(t *testing.T) {
	ctx := context.Background()
	pool, _ := servers.DB(t)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	p := paymentsv1.NewPaymentCapturedProducer(w)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := p.Publish(ctx, tx, &paymentsv1.PaymentCaptured{PaymentId: 0})
		return err
	})
	if !errors.Is(err, outbox.ErrEmptyKey) {
		t.Fatalf("Publish with payment_id 0: %v, want outbox.ErrEmptyKey", err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := p.Publish(ctx, tx, &paymentsv1.PaymentCaptured{PaymentId: 1})
		return err
	})
	if err != nil {
		t.Fatalf("Publish with payment_id 1: %v", err)
	}
}
