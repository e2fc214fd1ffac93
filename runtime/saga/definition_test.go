package saga

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/protoevents/protoevents/internal/testenv"
	"github.com/protoevents/protoevents/runtime/events"
	"github.com/protoevents/protoevents/runtime/outbox"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func writer(t *testing.T) *outbox.Writer {
	t.Helper()
	w, err := outbox.NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestMermaidGolden draws the test saga and compares it with
// testdata/test-saga.mmd (go test -update rewrites it).
func TestMermaidGolden(t *testing.T) {
	ds := newDescriptors("golden")
	def := ds.definition("golden", 5*time.Second)
	def.Steps[2].CompensationTimeout = time.Second
	sg, err := New(def, writer(t))
	if err != nil {
		t.Fatal(err)
	}
	got := sg.Mermaid()
	path := filepath.Join("testdata", "test-saga.mmd")
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
		t.Fatalf("Mermaid diagram differs from %s (run go test -update):\n%s", path, got)
	}
	for _, s := range []string{"[*] --> s0", "s3 --> Completed: reply-C (success)", "s3 --> u2: reply-C (failure)", "u2 --> u1: undo-reply-B (success)", "u2 --> Parked", "u1 --> u0", "s2 --> u2: timeout 5s"} {
		if !strings.Contains(got, s) {
			t.Errorf("diagram lacks %q", s)
		}
	}
}

// TestNewRefusesBadDefinitions lists the definition mistakes New reports.
func TestNewRefusesBadDefinitions(t *testing.T) {
	ds := newDescriptors("bad")
	ok := ds.definition("ok", 0)
	cmd := ok.Steps[0].Command
	reply := ok.Steps[0].OnReply
	tests := []struct {
		name string
		edit func(*Definition[testData])
		want string
	}{
		{"bad name", func(d *Definition[testData]) { d.Name = "no spaces please" }, "name must be"},
		{"no steps", func(d *Definition[testData]) { d.Steps = nil }, "no steps"},
		{"unnamed step", func(d *Definition[testData]) { d.Steps[1].Name = "" }, "has no name"},
		{"duplicate step", func(d *Definition[testData]) { d.Steps[1].Name = "A" }, `step name "A" used twice`},
		{"remote and local", func(d *Definition[testData]) { d.Steps[1].Command, d.Steps[1].OnReply = cmd, reply }, "both Command and Local"},
		{"no replies", func(d *Definition[testData]) { d.Steps[0].OnReply = nil }, "Command without OnReply"},
		{"compensation without replies", func(d *Definition[testData]) { d.Steps[0].OnCompensationReply = nil }, "Compensation without OnCompensationReply"},
		{"negative timeout", func(d *Definition[testData]) { d.Steps[2].Timeout = -time.Second }, "negative timeout"},
		{"reply twice", func(d *Definition[testData]) { d.Steps[0].OnReply = append(d.Steps[0].OnReply, d.Steps[0].OnReply[0]) }, "listed twice"},
		{"two descriptors for one type", func(d *Definition[testData]) {
			other := *ds["reply-B"]
			d.Steps[3].OnReply = append(d.Steps[3].OnReply, Succeeds[testData, testenv.Event](&other, nil))
		}, "has two descriptors"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			def := ds.definition("ok", 0)
			tt.edit(&def)
			_, err := New(def, writer(t))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New: %v; want an error containing %q", err, tt.want)
			}
		})
	}
	if _, err := New(ok, writer(t), WithTable("bad-name")); err == nil {
		t.Error("New accepted the table name bad-name")
	}
	if _, err := New(ok, nil); err == nil {
		t.Error("New accepted a nil writer")
	}
	if _, err := New(ok, writer(t)); err != nil {
		t.Fatalf("New refused a good definition: %v", err)
	}
}

// TestReplyTypes lists every reply of the saga once, in definition order.
func TestReplyTypes(t *testing.T) {
	ds := newDescriptors("types")
	sg, err := New(ds.definition("types", 0), writer(t))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range sg.ReplyTypes() {
		got = append(got, d.Type)
	}
	want := "test.saga.reply-A test.saga.undo-reply-A test.saga.reply-B test.saga.undo-reply-B test.saga.reply-C"
	if strings.Join(got, " ") != want {
		t.Fatalf("reply types %v, want %s", got, want)
	}
	var _ events.Event = testenv.Event{}
}
