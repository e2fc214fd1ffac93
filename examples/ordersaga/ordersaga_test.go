package ordersaga

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	stockv1 "github.com/protoevents/protoevents/examples/gen/shop/stock/v1"
	"github.com/protoevents/protoevents/runtime/consumer"
	"github.com/protoevents/protoevents/runtime/outbox"
	"github.com/protoevents/protoevents/runtime/saga"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestDiagramGolden keeps testdata/order-saga.mmd (the diagram in the
// README) what the definition draws; go test -update rewrites it.
func TestDiagramGolden(t *testing.T) {
	w, err := outbox.NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	sg, err := saga.New(Definition(5*time.Second), w)
	if err != nil {
		t.Fatal(err)
	}
	got := sg.Mermaid()
	path := filepath.Join("testdata", "order-saga.mmd")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("diagram differs from %s (go test -update, then paste it into docs/sagas.md):\n%s", path, got)
	}
}

// TestHandlerForFitsGeneratedConsumers: the saga's typed reply handlers
// are the generated handler types, so any consumer that takes those can
// feed the saga (e.g. stockv1.HandleStockReserved(c, h)).
func TestHandlerForFitsGeneratedConsumers(t *testing.T) {
	w, err := outbox.NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	sg, err := saga.New(Definition(0), w)
	if err != nil {
		t.Fatal(err)
	}
	var h stockv1.StockReservedHandler = saga.HandlerFor[*stockv1.StockReserved](sg)
	c, err := consumer.New(&pgxpool.Pool{}, []string{"127.0.0.1:1"}, sg.ConsumerName())
	if err != nil {
		t.Fatal(err)
	}
	if err := stockv1.HandleStockReserved(c, h); err != nil {
		t.Fatal(err)
	}
	if got := len(sg.ReplyTypes()); got != 9 {
		t.Errorf("%d reply types, want 9: stock 3, payments 4, shipping 2", got)
	}
}
