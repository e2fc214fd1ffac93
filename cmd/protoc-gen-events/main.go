// Command protoc-gen-events is the protoevents plugin for the Protobuf
// compiler. For every message carrying the (events.v1.event) option it
// generates, beside protoc-gen-go's output and in the same Go package, a
// <file>.events.go with the event's topic constants and descriptor, its Kafka
// key, a typed transactional-outbox producer, a typed idempotent consumer and
// the file's event registry.
//
// With buf, list it as a local plugin in buf.gen.yaml, beside
// protoc-gen-go and with the same out and module:
//
//	plugins:
//	  - local: ["go", "run", "google.golang.org/protobuf/cmd/protoc-gen-go"]
//	    out: .
//	    opt: module=example.com/shop
//	    strategy: all
//	  - local: ["go", "run", "github.com/protoevents/protoevents/cmd/protoc-gen-events"]
//	    out: .
//	    opt:
//	      - module=example.com/shop
//	      - lock=events.lock
//	    strategy: all
//
// lock=events.lock turns on the compatibility check: every run compares
// the event schemas with the committed events.lock, fails on a breaking
// change and rewrites the lock when the change is compatible. Without it
// nothing is checked. The lock is read relative to where buf runs and
// written relative to out; with another out than ".", say where to write
// it as well:
//
//	out: gen
//	opt: [lock=gen/events.lock, lock_out=events.lock]
//
// strategy: all lets the generator see every file at once, so it can check
// topics and supersedes across packages (and is required with lock=). With
// protoc, put the binary on PATH and run
//
//	protoc --go_out=. --events_out=. --events_opt=lock=events.lock path/to/file.proto
//
// Invalid event options fail the run, naming the file, line, message and
// fix for each, and nothing is written.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/pluginpb"

	"github.com/protoevents/protoevents/internal/catalog"
	"github.com/protoevents/protoevents/internal/compat"
	"github.com/protoevents/protoevents/internal/gen"
)

const usage = `protoc-gen-events is a plugin for protoc and buf: run without arguments, it reads a
CodeGeneratorRequest on stdin and writes a CodeGeneratorResponse on stdout.
See https://github.com/protoevents/protoevents for how to use it.

Usage:
  protoc-gen-events                    run as a plugin (protoc, buf generate)
  protoc-gen-events compat [flags]     check event schemas for breaking changes
                                       ("protoc-gen-events compat -h" for its flags)
  protoc-gen-events --version          print the version
  protoc-gen-events -h | --help        print this help

Plugin parameters (buf.gen.yaml opt, or protoc --events_opt):
  lock=<path>   compare the schemas with the committed snapshot at <path>
                (e.g. events.lock), fail on breaking changes, and rewrite the
                snapshot when the change is compatible. Needs strategy: all.
                The lock is read relative to where buf runs and written
                relative to out: with out: . they agree.
  lock_out=<path> where to write the lock, relative to out, when out is not
                "." (e.g. out: gen, lock=gen/events.lock, lock_out=events.lock).
  catalog=<path> write an AsyncAPI 3.0 document of the events at <path>
                (relative to out, e.g. docs/events.asyncapi.yaml) and a
                Markdown catalog beside it (docs/events.md).
  catalog_title=<text>, catalog_version=<v>  the catalog's title and version.`

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
	case len(args) > 0 && args[0] == "compat":
		return compat.RunCLI(context.Background(), args[1:], stdout, stderr)
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
	lock := flags.String("lock", "", "path of the events.lock snapshot to check against and update")
	lockOut := flags.String("lock_out", "", "where to write the lock, relative to out (default: the lock path)")
	catalogPath := flags.String("catalog", "", "write an AsyncAPI 3.0 document of the events there, and a Markdown catalog beside it")
	catalogTitle := flags.String("catalog_title", "", "the catalog's title")
	catalogVersion := flags.String("catalog_version", "", "the catalog's version (AsyncAPI info.version)")
	p, err := protogen.Options{ParamFunc: flags.Set}.New(req)
	if err != nil {
		return err
	}
	if err := gen.Generate(p); err != nil {
		p.Error(err)
	} else if *lock != "" {
		// Only valid schemas are compared: the compat rules assume the
		// event options themselves are sound.
		out := *lockOut
		if out == "" {
			out = *lock
		}
		if err := compat.CheckGenerationTo(p, *lock, out); err != nil {
			p.Error(err)
		}
	}
	if *catalogPath != "" {
		if err := catalog.Generate(p, *catalogPath, catalog.Info{Title: *catalogTitle, Version: *catalogVersion}); err != nil {
			p.Error(err)
		}
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
