package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInitEndToEnd is the README's "Using it in your project" in a
// throwaway module: eventsctl init, go mod tidy, buf generate, go build; a
// second init refuses to overwrite; a breaking edit fails buf generate; and
// a buf.gen.yaml whose lock would be written where it is not read fails too.
// The module requires protoevents through a replace directive to this
// checkout (what go get does against a release).
func TestInitEndToEnd(t *testing.T) {
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	buf := filepath.Join(repo, "bin", "buf")
	if _, err := os.Stat(buf); err != nil {
		if buf, err = exec.LookPath("buf"); err != nil {
			t.Skip("buf not found in bin/ or PATH (make tools builds it)")
		}
	}
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/shop\n\ngo 1.26.0\n\nrequire github.com/protoevents/protoevents v0.0.0\n\nreplace github.com/protoevents/protoevents => "+repo+"\n")
	sum, err := os.ReadFile(filepath.Join(repo, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write("go.sum", string(sum))

	code, stdout, stderr := cli(t, nil, "init", "--dir", dir)
	if code != 0 {
		t.Fatalf("init: exit %d: %s", code, stderr)
	}
	for _, f := range []string{"buf.yaml", "buf.gen.yaml", "third_party/events/v1/options.proto", "proto/shop/v1/shop.proto", ".github/workflows/protoevents.yml"} {
		if !strings.Contains(stdout, "created "+f) {
			t.Errorf("init did not report creating %s:\n%s", f, stdout)
		}
	}
	gomod, _ := os.ReadFile(filepath.Join(dir, "go.mod"))
	if !strings.Contains(string(gomod), "\tgithub.com/protoevents/protoevents/cmd/protoc-gen-events\n") {
		t.Errorf("go.mod lacks the tool directives:\n%s", gomod)
	}
	sample := filepath.Join(dir, "proto/shop/v1/shop.proto")
	before, _ := os.ReadFile(sample)
	os.WriteFile(sample, append(before, []byte("// edited\n")...), 0o644)
	if code, _, stderr := cli(t, nil, "init", "--dir", dir); code != exitFailed || !strings.Contains(stderr, "refusing to overwrite buf.yaml, buf.gen.yaml") {
		t.Errorf("second init: exit %d, %s; want a refusal naming the files", code, stderr)
	}
	if after, _ := os.ReadFile(sample); !bytes.HasSuffix(after, []byte("// edited\n")) {
		t.Error("second init overwrote the edited sample")
	}

	env := append(os.Environ(), "GOFLAGS=-mod=mod", "PATH="+filepath.Dir(buf)+string(os.PathListSeparator)+os.Getenv("PATH"))
	run := func(name string, args ...string) (string, error) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// The user's code, written once the generated package exists.
	for _, step := range [][]string{{"go", "mod", "tidy"}, {buf, "lint"}, {buf, "generate"}, {"write main.go"}, {"go", "build", "./..."}, {"go", "vet", "./..."}} {
		if step[0] == "write main.go" {
			write("main.go", `package main
		
		import (
			"context"
			"fmt"
		
			"github.com/jackc/pgx/v5"
		
			shopv1 "example.com/shop/gen/shop/v1"
			"github.com/protoevents/protoevents/runtime/events"
			"github.com/protoevents/protoevents/runtime/outbox"
		)
		
		func publish(ctx context.Context, tx pgx.Tx, w *outbox.Writer) (events.EventID, error) {
			return shopv1.NewExampleCreatedProducer(w).Publish(ctx, tx, &shopv1.ExampleCreated{ExampleId: "e-1"})
		}
		
		var _ = publish

		func main() { fmt.Println(shopv1.ExampleCreatedTopic) }
		`)
			continue
		}
		if out, err := run(step[0], step[1:]...); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(step, " "), err, out)
		}
	}
	for _, f := range []string{"gen/shop/v1/shop.pb.go", "gen/shop/v1/shop.events.go", "events.lock", "docs/events.asyncapi.yaml", "docs/events.md"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("buf generate did not write %s: %v", f, err)
		}
	}
	if out, err := run("go", "run", "."); err != nil || strings.TrimSpace(out) != "shop.example-created.v1" {
		t.Errorf("go run: %v: %q", err, out)
	}

	// The CI recipe's baseline: the generated state, committed.
	for _, step := range [][]string{{"git", "init", "-q", "-b", "main"}, {"git", "add", "-A"},
		{"git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "init"}} {
		if out, err := run(step[0], step[1:]...); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(step, " "), err, out)
		}
	}

	// A breaking edit: the compat check fails generation, and the CI
	// recipe's check against the main branch fails too.
	proto, _ := os.ReadFile(sample)
	os.WriteFile(sample, bytes.Replace(proto, []byte("string name = 2;"), []byte("int64 name = 2;"), 1), 0o644)
	if out, err := run(buf, "generate"); err == nil || !strings.Contains(out, "FIELD_TYPE_CHANGED") || !strings.Contains(out, "shop.v1.ExampleCreated.name") {
		t.Errorf("buf generate after a breaking edit: %v\n%s\nwant a FIELD_TYPE_CHANGED failure", err, out)
	}
	if out, err := run("go", "tool", "eventsctl", "compat", "--against", ".git#branch=main"); err == nil || !strings.Contains(out, "FIELD_TYPE_CHANGED") {
		t.Errorf("eventsctl compat against main after a breaking edit: %v\n%s\nwant a FIELD_TYPE_CHANGED failure", err, out)
	}
	os.WriteFile(sample, proto, 0o644)
	if out, err := run("go", "tool", "eventsctl", "compat", "--against", ".git#branch=main"); err != nil {
		t.Errorf("eventsctl compat against main, schema unchanged: %v\n%s", err, out)
	}

	// A misplaced lock: out: gen without lock_out is an error, not a notice.
	tmpl, _ := os.ReadFile(filepath.Join(dir, "buf.gen.yaml"))
	bad := strings.Replace(string(tmpl), "out: .\n    opt:\n      - module=example.com/shop", "out: gen\n    opt:\n      - module=example.com/shop", 1)
	if bad == string(tmpl) {
		t.Fatalf("buf.gen.yaml has an unexpected shape:\n%s", tmpl)
	}
	os.WriteFile(filepath.Join(dir, "buf.gen.yaml"), []byte(bad), 0o644)
	if out, err := run(buf, "generate"); err == nil || !strings.Contains(out, "misplaced lock") {
		t.Errorf("buf generate with out: gen and lock=events.lock: %v\n%s\nwant a misplaced-lock error", err, out)
	}
}
