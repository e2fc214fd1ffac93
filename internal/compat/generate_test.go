package compat

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

// exampleSchema is the corpus schema the generation tests copy and edit.
var exampleSchema = filepath.Join(corpusDir, "compatible_new_field", "before")

// fileProtos returns the descriptor protos of files and all their imports,
// dependencies first, as a CodeGeneratorRequest carries them.
func fileProtos(files []protoreflect.FileDescriptor) []*descriptorpb.FileDescriptorProto {
	var out []*descriptorpb.FileDescriptorProto
	seen := map[string]bool{}
	var visit func(f protoreflect.FileDescriptor)
	visit = func(f protoreflect.FileDescriptor) {
		if seen[f.Path()] {
			return
		}
		seen[f.Path()] = true
		imps := f.Imports()
		for i := 0; i < imps.Len(); i++ {
			visit(imps.Get(i).FileDescriptor)
		}
		out = append(out, protodesc.ToFileDescriptorProto(f))
	}
	for _, f := range files {
		visit(f)
	}
	return out
}

// runPlugin runs CheckGeneration the way protoc-gen-events does: a protogen
// plugin over a request for every file of dir, with the parameters
// module=github.com/protoevents/protoevents,lock=<lock>. It returns the
// plugin's response.
func runPlugin(t *testing.T, dir, param string) *pluginpb.CodeGeneratorResponse {
	t.Helper()
	files := compileDir(t, dir)
	req := &pluginpb.CodeGeneratorRequest{Parameter: proto.String(param), ProtoFile: fileProtos(files)}
	for _, f := range files {
		req.FileToGenerate = append(req.FileToGenerate, f.Path())
	}
	// Give every file a Go package so that protogen accepts the request.
	for _, fp := range req.ProtoFile {
		if fp.GetOptions().GetGoPackage() == "" {
			if fp.Options == nil {
				fp.Options = &descriptorpb.FileOptions{}
			}
			fp.Options.GoPackage = proto.String("github.com/protoevents/protoevents/gen/" + strings.ReplaceAll(filepath.Dir(fp.GetName()), "/", "") + ";pb")
		}
	}
	fs := flag.NewFlagSet("protoc-gen-events", flag.ContinueOnError)
	lock := fs.String("lock", "", "")
	plugin, err := protogen.Options{ParamFunc: fs.Set}.New(req)
	if err != nil {
		t.Fatalf("protogen: %v", err)
	}
	if err := CheckGeneration(plugin, *lock); err != nil {
		plugin.Error(err)
	}
	return plugin.Response()
}

// applyResponse writes the response's files under out, as buf does.
func applyResponse(t *testing.T, resp *pluginpb.CodeGeneratorResponse, out string) {
	t.Helper()
	for _, f := range resp.GetFile() {
		writeFile(t, filepath.Join(out, f.GetName()), f.GetContent())
	}
}

func edit(t *testing.T, path, old, new string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), old) {
		t.Fatalf("%s does not contain %q", path, old)
	}
	writeFile(t, path, strings.Replace(string(data), old, new, 1))
}

// TestCheckGeneration is the project's own guard: it applies a breaking and
// a compatible edit to a copy of a schema and checks that generation fails
// on the first (naming the change) and passes, updating the lock, on the
// second.
func TestCheckGeneration(t *testing.T) {
	work := t.TempDir()
	schema := filepath.Join(work, "proto")
	copyTree(t, exampleSchema, schema)
	t.Chdir(work)
	const param = "module=github.com/protoevents/protoevents,lock=events.lock"

	// First run: no lock yet, so it passes and writes one.
	resp := runPlugin(t, schema, param)
	if resp.Error != nil {
		t.Fatalf("first run: %s", resp.GetError())
	}
	if len(resp.File) != 1 || resp.File[0].GetName() != "events.lock" {
		t.Fatalf("first run files = %v, want events.lock", resp.File)
	}
	applyResponse(t, resp, work)
	lock, err := os.ReadFile("events.lock")
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := ParseLock(lock)
	if err != nil {
		t.Fatal(err)
	}
	if len(parsed.Events) != 1 || parsed.Events[0].Name != "orders.v1.OrderPlaced" {
		t.Fatalf("lock events = %+v", parsed.Events)
	}

	// Unchanged schemas: passes and leaves the lock alone.
	resp = runPlugin(t, schema, param)
	if resp.Error != nil || len(resp.File) != 0 {
		t.Fatalf("unchanged run: error %q, files %d; want none", resp.GetError(), len(resp.File))
	}

	// Breaking edit: fails, one line per finding, lock untouched.
	orders := filepath.Join(schema, "orders/v1/orders.proto")
	edit(t, orders, "  int32 quantity = 2;\n", "  int64 quantity = 2;\n")
	edit(t, orders, `    topic: "orders.order-placed.v1"`, `    topic: "orders.placed.v1"`)
	resp = runPlugin(t, schema, param)
	if resp.Error == nil {
		t.Fatal("breaking edit passed")
	}
	lines := strings.Split(resp.GetError(), "\n")
	want := []string{
		"2 breaking event schema change(s) against events.lock:",
		"orders/v1/orders.proto:10:3: EVENT_TOPIC_CHANGED: ",
		"orders/v1/orders.proto:20:3: FIELD_TYPE_CHANGED: field orders.v1.OrderPlaced.quantity (event orders.v1.OrderPlaced): type changed from int32 to int64 (fix: ",
	}
	if len(lines) != len(want) {
		t.Fatalf("error has %d lines, want %d:\n%s", len(lines), len(want), resp.GetError())
	}
	for i := range want {
		if !strings.HasPrefix(lines[i], want[i]) {
			t.Errorf("error line %d = %q, want prefix %q", i, lines[i], want[i])
		}
	}
	if len(resp.File) != 0 {
		t.Errorf("failed run emitted %d files", len(resp.File))
	}
	if now, _ := os.ReadFile("events.lock"); string(now) != string(lock) {
		t.Error("failed run changed events.lock")
	}

	// Compatible edit on a fresh copy: passes and updates the lock.
	if err := os.RemoveAll(schema); err != nil {
		t.Fatal(err)
	}
	copyTree(t, exampleSchema, schema)
	edit(t, orders, "  optional string note = 9;\n", "  optional string note = 9;\n  string coupon = 11;\n")
	resp = runPlugin(t, schema, param)
	if resp.Error != nil {
		t.Fatalf("compatible edit failed: %s", resp.GetError())
	}
	if len(resp.File) != 1 || resp.File[0].GetName() != "events.lock" {
		t.Fatalf("compatible edit files = %v, want an updated events.lock", resp.File)
	}
	updated, err := ParseLock([]byte(resp.File[0].GetContent()))
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, m := range updated.Messages {
		for _, f := range m.Fields {
			found = found || (m.Name == "orders.v1.OrderPlaced" && f.Name == "coupon" && f.Number == 11)
		}
	}
	if !found {
		t.Errorf("updated lock lacks the new field coupon = 11:\n%s", resp.File[0].GetContent())
	}
}

// TestCheckGenerationLockPath: the lock path must stay inside the out
// directory, and without module= the name is used as is.
func TestCheckGenerationLockPath(t *testing.T) {
	work := t.TempDir()
	t.Chdir(work)
	schema := exampleSchema
	for _, bad := range []string{"../events.lock", "/tmp/events.lock"} {
		resp := runPlugin(t, schema, "lock="+bad)
		if resp.Error == nil || !strings.Contains(resp.GetError(), "relative path") {
			t.Errorf("lock=%s: error %q, want a relative-path error", bad, resp.GetError())
		}
	}
	resp := runPlugin(t, schema, "lock=schemas/events.lock")
	if resp.Error != nil || len(resp.File) != 1 || resp.File[0].GetName() != "schemas/events.lock" {
		t.Fatalf("lock=schemas/events.lock: error %q, files %v", resp.GetError(), resp.File)
	}
}

// TestCheckGenerationBadLock: a corrupt lock fails generation instead of
// being overwritten.
func TestCheckGenerationBadLock(t *testing.T) {
	work := t.TempDir()
	t.Chdir(work)
	schema := exampleSchema
	writeFile(t, filepath.Join(work, "events.lock"), `{"format": 99}`)
	resp := runPlugin(t, schema, "lock=events.lock")
	if resp.Error == nil || !strings.Contains(resp.GetError(), "format 99") {
		t.Fatalf("error %q, want a format error", resp.GetError())
	}
}
