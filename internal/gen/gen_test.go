package gen

import (
	"flag"
	"fmt"
	"go/build"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

var update = flag.Bool("update", false, "rewrite testdata/golden and testdata/invalid/*/stderr.txt from the generator's output")

// modulePath is the Go module the golden output belongs to; buf.gen.yaml
// passes the same module= option.
const modulePath = "github.com/protoevents/protoevents"

// TestGolden regenerates the events layer for testdata/proto in-process and
// compares it with the committed testdata/golden, which `buf generate`
// writes. Run with -update to rewrite the golden files.
func TestGolden(t *testing.T) {
	root := repoRoot(t)
	fds := bufBuild(t, root, "testdata/proto")
	got := generate(t, request(fds))
	if got.GetError() != "" {
		t.Fatalf("generation failed:\n%s", got.GetError())
	}

	want := goldenFiles(t, root)
	var names []string
	for _, f := range got.File {
		if !strings.HasPrefix(f.GetName(), "testdata/golden/") {
			t.Errorf("generated %s outside testdata/golden", f.GetName())
			continue
		}
		names = append(names, f.GetName())
		path := filepath.Join(root, filepath.FromSlash(f.GetName()))
		if *update {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(f.GetContent()), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		old, ok := want[f.GetName()]
		if !ok {
			t.Errorf("%s is generated but not committed (run go test ./internal/gen -update, or buf generate)", f.GetName())
			continue
		}
		if old != f.GetContent() {
			t.Errorf("%s differs from the generator's output (run go test ./internal/gen -update and review the diff):\n%s",
				f.GetName(), firstDiff(old, f.GetContent()))
		}
	}
	for name := range want {
		if !slices.Contains(names, name) {
			if *update {
				if err := os.Remove(filepath.Join(root, filepath.FromSlash(name))); err != nil {
					t.Fatal(err)
				}
				continue
			}
			t.Errorf("%s is committed but no longer generated", name)
		}
	}

	// Every test schema with events has output; the one without has none.
	for _, name := range []string{
		"testdata/golden/orders/v1/orders.events.go",
		"testdata/golden/orders/v2/orders.events.go",
		"testdata/golden/payments/v1/payments.events.go",
		"testdata/golden/inventory/v1/inventory.events.go",
		"testdata/golden/shipping/v1/shipping.events.go",
	} {
		if !slices.Contains(names, name) {
			t.Errorf("no %s generated", name)
		}
	}
	if slices.Contains(names, "testdata/golden/common/v1/money.events.go") {
		t.Errorf("generated output for common/v1/money.proto, which declares no events")
	}
}

// TestDeterministic generates twice from the same request and wants the same
// bytes: nothing may depend on map order.
func TestDeterministic(t *testing.T) {
	fds := bufBuild(t, repoRoot(t), "testdata/proto")
	req := request(fds)
	a := generate(t, proto.Clone(req).(*pluginpb.CodeGeneratorRequest))
	b := generate(t, proto.Clone(req).(*pluginpb.CodeGeneratorRequest))
	if len(a.File) == 0 {
		t.Fatalf("no files generated: %s", a.GetError())
	}
	if !proto.Equal(a, b) {
		t.Fatal("two runs on the same request produced different output")
	}
}

// TestGoldenCompiles builds and vets the golden output (protoc-gen-go's and
// ours) against the runtime in this module. The go tool skips testdata in
// ./... patterns, so the packages are listed explicitly.
func TestGoldenCompiles(t *testing.T) {
	root := repoRoot(t)
	var pkgs []string
	err := filepath.WalkDir(filepath.Join(root, "testdata", "golden"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		if pkg := "./" + filepath.ToSlash(rel); !slices.Contains(pkgs, pkg) {
			pkgs = append(pkgs, pkg)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 5 {
		t.Fatalf("found only %d golden packages: %v", len(pkgs), pkgs)
	}
	for _, args := range [][]string{append([]string{"build"}, pkgs...), append([]string{"vet"}, pkgs...)} {
		cmd := exec.Command(goTool(t), args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("go %s: %v\n%s", args[0], err, out)
		}
	}
}

// TestInvalid runs each case under testdata/invalid: its .proto files, with
// the options schema, must fail generation with exactly the text of its
// stderr.txt and produce no files.
func TestInvalid(t *testing.T) {
	root := repoRoot(t)
	buf := bufPath(t, root)
	cases, err := filepath.Glob(filepath.Join(root, "testdata", "invalid", "*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) == 0 {
		t.Fatal("no cases under testdata/invalid")
	}
	options, err := os.ReadFile(filepath.Join(root, "schemas", "events", "v1", "options.proto"))
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range cases {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			t.Parallel()
			// A throwaway workspace: the options schema as one module, the
			// case as the other.
			ws := t.TempDir()
			writeFile(t, filepath.Join(ws, "buf.yaml"), "version: v2\nmodules:\n  - path: schemas\n  - path: case\n")
			writeFile(t, filepath.Join(ws, "schemas", "events", "v1", "options.proto"), string(options))
			protos, err := filepath.Glob(filepath.Join(dir, "*.proto"))
			if err != nil || len(protos) == 0 {
				t.Fatalf("no .proto files in %s (%v)", dir, err)
			}
			for _, p := range protos {
				src, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(ws, "case", filepath.Base(p)), string(src))
			}
			fds := runBuf(t, buf, ws, "case")
			resp := generate(t, request(fds))
			if len(resp.File) != 0 {
				t.Errorf("invalid input generated %d files; want none", len(resp.File))
			}
			got := resp.GetError()
			if got == "" {
				t.Fatal("generation succeeded; want an error")
			}
			stderr := filepath.Join(dir, "stderr.txt")
			if *update {
				writeFile(t, stderr, got+"\n")
				return
			}
			want, err := os.ReadFile(stderr)
			if err != nil {
				t.Fatalf("%v (run go test ./internal/gen -update to create it, then review it)", err)
			}
			if got != strings.TrimSuffix(string(want), "\n") {
				t.Errorf("error text differs from %s (run go test ./internal/gen -update and review the diff):\n%s",
					stderr, firstDiff(strings.TrimSuffix(string(want), "\n"), got))
			}
		})
	}
}

// generate runs the generator in-process, as the plugin binary would.
func generate(t *testing.T, req *pluginpb.CodeGeneratorRequest) *pluginpb.CodeGeneratorResponse {
	t.Helper()
	p, err := protogen.Options{}.New(req)
	if err != nil {
		t.Fatalf("protogen: %v", err)
	}
	if err := Generate(p); err != nil {
		p.Error(err)
	}
	return p.Response()
}

// request builds the CodeGeneratorRequest buf generate sends for fds: every
// file but the well-known types is to be generated, with the module= option
// of buf.gen.yaml and no compiler version.
func request(fds *descriptorpb.FileDescriptorSet) *pluginpb.CodeGeneratorRequest {
	req := &pluginpb.CodeGeneratorRequest{
		Parameter: proto.String("module=" + modulePath),
		ProtoFile: fds.GetFile(),
	}
	for _, f := range fds.GetFile() {
		if !strings.HasPrefix(f.GetName(), "google/protobuf/") {
			req.FileToGenerate = append(req.FileToGenerate, f.GetName())
		}
	}
	return req
}

// bufBuild compiles the module input of the workspace at root with buf.
func bufBuild(t *testing.T, root, input string) *descriptorpb.FileDescriptorSet {
	t.Helper()
	return runBuf(t, bufPath(t, root), root, input)
}

// runBuf runs `buf build input` in the workspace dir and decodes the image
// it writes. A buf image is wire-compatible with a FileDescriptorSet: its
// files come in topological order, imports included, with source info.
func runBuf(t *testing.T, buf, dir, input string) *descriptorpb.FileDescriptorSet {
	t.Helper()
	out := filepath.Join(t.TempDir(), "image.binpb")
	cmd := exec.Command(buf, "build", input, "-o", out)
	cmd.Dir = dir
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("buf build %s in %s: %v\n%s", input, dir, err, msg)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	fds := &descriptorpb.FileDescriptorSet{}
	if err := proto.Unmarshal(b, fds); err != nil {
		t.Fatalf("decode buf image: %v", err)
	}
	return fds
}

// bufPath finds the buf binary the way `make` installs it: $BUF, PATH,
// ./bin, then $GOPATH/bin. The tests need it to compile the schemas and fail
// rather than skip without it.
func bufPath(t *testing.T, root string) string {
	t.Helper()
	if p := os.Getenv("BUF"); p != "" {
		return p
	}
	if p, err := exec.LookPath("buf"); err == nil {
		return p
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		gopath = build.Default.GOPATH
	}
	for _, p := range []string{filepath.Join(root, "bin", "buf"), filepath.Join(gopath, "bin", "buf")} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Fatalf("buf not found in $BUF, PATH, %s/bin or %s/bin: the generator tests compile their schemas with it; "+
		"install it with `go install github.com/bufbuild/buf/cmd/buf@v1.75.0` (make does this)", root, gopath)
	return ""
}

// goTool returns the go command running this test.
func goTool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// repoRoot is the directory holding go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test's directory")
		}
		dir = parent
	}
}

// goldenFiles reads the committed *.events.go files under testdata/golden,
// keyed by their slash path from the repository root.
func goldenFiles(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(filepath.Join(root, "testdata", "golden"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, fileSuffix) {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		out[filepath.ToSlash(rel)] = string(b)
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return out
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// firstDiff shows the first line where want and got differ.
func firstDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d:\n  committed: %s\n  generated: %s", i+1, wl, gl)
		}
	}
	return "(no line differs)"
}
