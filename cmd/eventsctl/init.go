package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"

	"github.com/protoevents/protoevents/schemas"
)

// initTools are the tool directives eventsctl init adds to go.mod, so that
// buf.gen.yaml runs the plugins at the versions go.mod pins.
var initTools = []string{
	"github.com/protoevents/protoevents/cmd/eventsctl",
	"github.com/protoevents/protoevents/cmd/protoc-gen-events",
	"google.golang.org/protobuf/cmd/protoc-gen-go",
}

const initDesc = `
Scaffold protoevents in the Go module in --dir: the options schema in a buf
module of its own (third_party/events/v1/options.proto, copied from this
eventsctl's runtime), buf.yaml, buf.gen.yaml (both plugins run with go tool,
strategy: all, out: . so the lock is read where it is written), a sample event
under proto/, the tool directives in go.mod and a CI workflow that checks the
generated code and fails on breaking schema changes. Existing files are never
overwritten: if any of them exists, nothing is written. Then run:

  go mod tidy && buf generate && go build ./...`

// runInit implements "eventsctl init".
func runInit(_ context.Context, env *cliEnv, args []string) error {
	flags := newFlags(env, "init", "[--dir .] [--service name]", initDesc)
	dir := flags.String("dir", ".", "the module's root directory (where go.mod is)")
	service := flags.String("service", "", "name of the sample event's service: proto package <service>.v1 (default: the module path's last element)")
	if err := parse(flags, args); err != nil {
		return err
	}
	gomod := filepath.Join(*dir, "go.mod")
	modData, err := os.ReadFile(gomod)
	if err != nil {
		return fmt.Errorf("read %s: %w (run eventsctl init in a Go module's root, after go mod init)", gomod, err)
	}
	module := modulePath(modData)
	if module == "" {
		return fmt.Errorf("%s has no module line (fix: go mod init <module path>)", gomod)
	}
	svc := *service
	if svc == "" {
		svc = serviceName(module)
	}
	if !regexp.MustCompile(`^[a-z][a-z0-9_]*$`).MatchString(svc) {
		return fmt.Errorf("%w: --service %q: want a lower-case proto package element ([a-z][a-z0-9_]*)", errUsage, svc)
	}
	files, err := initFiles(module, svc)
	if err != nil {
		return err
	}
	var exist []string
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(*dir, f.path)); err == nil {
			exist = append(exist, f.path)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("check %s: %w", f.path, err)
		}
	}
	if len(exist) > 0 {
		return fmt.Errorf("refusing to overwrite %s: nothing was written (move them away to scaffold again)", strings.Join(exist, ", "))
	}
	for _, f := range files {
		p := filepath.Join(*dir, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("create %s: %w", filepath.Dir(p), err)
		}
		if err := os.WriteFile(p, f.data, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
		fmt.Fprintf(env.stdout, "created %s\n", f.path)
	}
	if added := addTools(modData, initTools); added != nil {
		if err := os.WriteFile(gomod, added, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", gomod, err)
		}
		fmt.Fprintln(env.stdout, "added tool directives to go.mod")
	}
	fmt.Fprintf(env.stdout, `
next:
  go mod tidy       # resolve the tools' requirements
  buf generate      # gen/%[1]s/v1/%[1]s.pb.go, %[1]s.events.go, events.lock, docs/events.* (commit them all)
  go build ./...
`, svc)
	return nil
}

// initFile is one file eventsctl init writes, relative to the module root.
type initFile struct {
	path string
	data []byte
}

// initFiles renders the scaffold for module with a sample event of svc.
func initFiles(module, svc string) ([]initFile, error) {
	data := map[string]string{"Module": module, "Service": svc, "Topic": strings.ReplaceAll(svc, "_", "-")}
	var out []initFile
	for _, t := range []struct{ path, text string }{
		{"buf.yaml", initBufYAML},
		{"buf.gen.yaml", initBufGenYAML},
		{"proto/" + svc + "/v1/" + svc + ".proto", initSampleProto},
		{".github/workflows/protoevents.yml", initCIWorkflow},
	} {
		var b bytes.Buffer
		if err := template.Must(template.New(t.path).Parse(t.text)).Execute(&b, data); err != nil {
			return nil, fmt.Errorf("render %s: %w", t.path, err)
		}
		out = append(out, initFile{t.path, b.Bytes()})
	}
	out = append(out, initFile{"third_party/" + schemas.OptionsPath, schemas.OptionsProto})
	return out, nil
}

// modulePath returns the module path of a go.mod file.
func modulePath(gomod []byte) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// serviceName derives a proto package element from the module path's last
// element: "example.com/my-shop" gives "my_shop".
func serviceName(module string) string {
	last := module[strings.LastIndex(module, "/")+1:]
	var b strings.Builder
	for _, r := range strings.ToLower(last) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9' && b.Len() > 0:
			b.WriteRune(r)
		case b.Len() > 0:
			b.WriteByte('_')
		}
	}
	if s := strings.Trim(b.String(), "_"); s != "" {
		return s
	}
	return "app"
}

// addTools returns go.mod with a tool block for the tools it lacks, or nil
// when it has them all.
func addTools(gomod []byte, tools []string) []byte {
	have := map[string]bool{}
	inBlock := false
	for _, line := range strings.Split(string(gomod), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "tool" && f[1] == "(":
			inBlock = true
		case inBlock && len(f) == 1 && f[0] == ")":
			inBlock = false
		case inBlock && len(f) >= 1:
			have[f[0]] = true
		case len(f) >= 2 && f[0] == "tool":
			have[f[1]] = true
		}
	}
	var b bytes.Buffer
	for _, t := range tools {
		if !have[t] {
			fmt.Fprintf(&b, "\t%s\n", t)
		}
	}
	if b.Len() == 0 {
		return nil
	}
	out := bytes.TrimRight(gomod, "\n")
	return append(out, []byte("\n\ntool (\n"+b.String()+")\n")...)
}

const initBufYAML = `# buf configuration: your event schemas (proto/) and the protoevents options
# they import (third_party/, written by eventsctl init; do not edit it).
version: v2
modules:
  - path: proto
  - path: third_party
lint:
  use:
    - STANDARD
`

const initBufGenYAML = `# buf generate: Go types (protoc-gen-go) and the events layer
# (protoc-gen-events) for the schemas under proto/. Both plugins run with
# go tool, at the versions go.mod pins. The options' Go code ships with the
# protoevents runtime, so third_party/ is not generated.
#
# out: . with module= puts the code at its Go package's path and the lock
# beside go.mod, where lock= reads it: protoc-gen-events fails if the lock
# would be written anywhere else. strategy: all gives the plugin every file
# at once, so topics, supersedes and the lock are checked across packages.
version: v2
clean: false
plugins:
  - local: ["go", "tool", "protoc-gen-go"]
    out: .
    opt: module={{.Module}}
    strategy: all
  - local: ["go", "tool", "protoc-gen-events"]
    out: .
    opt:
      - module={{.Module}}
      # Fail on breaking event-schema changes; keep events.lock current.
      - lock=events.lock
      # The event catalog: AsyncAPI 3.0 for tools, Markdown for people.
      - catalog=docs/events.asyncapi.yaml
    strategy: all
inputs:
  - directory: proto
`

const initSampleProto = `// A sample event, written by eventsctl init: edit it, or add your own
// messages with the (events.v1.event) option, then run buf generate.
syntax = "proto3";

package {{.Service}}.v1;

import "events/v1/options.proto";

option go_package = "{{.Module}}/gen/{{.Service}}/v1;{{.Service}}v1";
option (events.v1.file) = {producer: "{{.Service}}"};

// ExampleCreated is published when an example is created.
message ExampleCreated {
  option (events.v1.event) = {
    topic: "{{.Topic}}.example-created.v1"
    key: "example_id"
    version: 1
  };
  // The example's ID: the Kafka key, so one example's events stay in order.
  string example_id = 1;
  // A human-readable name.
  string name = 2;
}
`

const initCIWorkflow = `# Event schemas in CI (written by eventsctl init): the generated code and
# events.lock must be current, and no change may break a consumer, judged
# against the main branch.
name: protoevents
on:
  push:
  pull_request:
jobs:
  events:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-go@v5
        with:
          go-version-file: go.mod
      - uses: bufbuild/buf-action@v1
        with:
          setup_only: true
      - name: generated code and events.lock are current (fails on a breaking change)
        run: buf generate && git diff --exit-code
      - name: no breaking event-schema change against main
        run: |
          git fetch --no-tags --depth=1 origin main
          go tool eventsctl compat --against '.git#ref=origin/main'
`
