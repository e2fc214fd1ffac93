package ordersaga

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

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
		t.Fatalf("diagram differs from %s (go test -update, then paste it into the README):\n%s", path, got)
	}
}
