// Command protoc-gen-events is the protoevents plugin for the Protobuf
// compiler. For every message carrying the (events.v1.event) option it
// generates, beside protoc-gen-go's output and in the same Go package, a
// <file>.events.go with the event's topic constants and descriptor, its Kafka
// key, a typed transactional-outbox producer, a typed idempotent consumer and
// the file's event registry.
//
// With buf, list it as a local plugin in buf.gen.yaml:
//
//	plugins:
//	  - local: ["go", "run", "github.com/protoevents/protoevents/cmd/protoc-gen-events"]
//	    out: gen
//	    strategy: all
//
// (strategy: all lets the generator see every file at once, so it can check
// topics and supersedes across packages). With protoc, put the binary on
// PATH and run
//
//	protoc --go_out=gen --events_out=gen path/to/file.proto
//
// Invalid event options fail the run, naming the file, line, message and
// fix for each, and nothing is written.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/pluginpb"

	"github.com/protoevents/protoevents/internal/gen"
)

const usage = `protoc-gen-events is a plugin for protoc and buf, not a command to run by hand:
it reads a CodeGeneratorRequest on stdin and writes a CodeGeneratorResponse on stdout.
See https://github.com/protoevents/protoevents for how to use it.

Flags:
  -h, --help     Print this help and exit.
      --version  Print the version and exit.`

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run dispatches on the command line and returns the exit code. With no
// arguments it is the plugin.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 1 && args[0] == "--version":
		fmt.Fprintln(stdout, "protoc-gen-events v"+gen.Version)
		return 0
	case len(args) == 1 && (args[0] == "-h" || args[0] == "--help"):
		fmt.Fprintln(stdout, usage)
		return 0
	case len(args) != 0:
		fmt.Fprintln(stderr, usage)
		return 2
	}
	if err := plugin(stdin, stdout); err != nil {
		fmt.Fprintln(stderr, "protoc-gen-events:", err)
		return 1
	}
	return 0
}

// plugin answers one CodeGeneratorRequest. Problems with the schemas go into
// the response's error field, which protoc and buf print before failing;
// only I/O and malformed requests are returned.
func plugin(stdin io.Reader, stdout io.Writer) error {
	in, err := io.ReadAll(stdin)
	if err != nil {
		return fmt.Errorf("read request: %w", err)
	}
	req := &pluginpb.CodeGeneratorRequest{}
	if err := proto.Unmarshal(in, req); err != nil {
		return fmt.Errorf("decode request: %w", err)
	}
	// Plugin parameters other than protogen's own (module=, paths=, M...).
	var flags flag.FlagSet
	p, err := protogen.Options{ParamFunc: flags.Set}.New(req)
	if err != nil {
		return err
	}
	if err := gen.Generate(p); err != nil {
		p.Error(err)
	}
	out, err := proto.Marshal(p.Response())
	if err != nil {
		return fmt.Errorf("encode response: %w", err)
	}
	if _, err := stdout.Write(out); err != nil {
		return fmt.Errorf("write response: %w", err)
	}
	return nil
}
