package prommetrics

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/events"
)

func TestHooksFeedCollectors(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(reg); err == nil {
		t.Fatal("registering twice on one registry must fail")
	}
	r := m.Relay()
	r.Batch(500)
	r.Published(500)
	r.Published(20)
	r.PublishFailed(errors.New("broker down"))
	r.Pending(42, 3*time.Second)
	r.Lanes(8)

	var alerted []consumer.DeadLetter
	c := m.Consumer("shipping", func(dl consumer.DeadLetter) { alerted = append(alerted, dl) })
	other := m.Consumer("billing")
	d := events.Delivery{Topic: "shop.orders.order-placed.v1", Partition: 2, Offset: 7, Attempt: 1}
	c.Processed(d, "shop.orders.v1.OrderPlaced", 3*time.Millisecond)
	c.Processed(d, "shop.orders.v1.OrderPlaced", 5*time.Millisecond)
	c.Duplicate(d, "shop.orders.v1.OrderPlaced")
	c.Retry(d, errors.New("boom"), time.Second)
	c.DeadLettered(consumer.DeadLetter{Consumer: "shipping", Original: d})
	c.Lag(d.Topic, 2, 17, 1500*time.Millisecond)
	other.Processed(d, "shop.orders.v1.OrderPlaced", time.Millisecond)
	other.Lag(d.Topic, 2, 3, 0)

	checks := []struct {
		name string
		got  float64
		want float64
	}{
		{"published", testutil.ToFloat64(m.relayPublished), 520},
		{"publish errors", testutil.ToFloat64(m.relayErrors), 1},
		{"pending", testutil.ToFloat64(m.outboxPending), 42},
		{"oldest", testutil.ToFloat64(m.outboxOldest), 3},
		{"lanes", testutil.ToFloat64(m.relayLanes), 8},
		{"processed", testutil.ToFloat64(m.consumed.WithLabelValues("shipping", d.Topic, "shop.orders.v1.OrderPlaced")), 2},
		{"processed by another consumer", testutil.ToFloat64(m.consumed.WithLabelValues("billing", d.Topic, "shop.orders.v1.OrderPlaced")), 1},
		{"duplicates", testutil.ToFloat64(m.duplicates.WithLabelValues("shipping", d.Topic, "shop.orders.v1.OrderPlaced")), 1},
		{"retries", testutil.ToFloat64(m.retries.WithLabelValues("shipping", d.Topic)), 1},
		{"dead lettered", testutil.ToFloat64(m.deadLettered.WithLabelValues(d.Topic, "shipping")), 1},
		{"lag", testutil.ToFloat64(m.consumerLag.WithLabelValues("shipping", d.Topic, "2")), 17},
		{"lag seconds", testutil.ToFloat64(m.consumerLagAge.WithLabelValues("shipping", d.Topic, "2")), 1.5},
		{"lag of another consumer", testutil.ToFloat64(m.consumerLag.WithLabelValues("billing", d.Topic, "2")), 3},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if len(alerted) != 1 || alerted[0].Consumer != "shipping" {
		t.Errorf("alert hook got %v", alerted)
	}
	if n := testutil.CollectAndCount(m.handlerLatency); n != 2 {
		t.Errorf("latency histogram series = %d, want 2 (one per consumer)", n)
	}
}
