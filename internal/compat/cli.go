package compat

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// Exit codes of RunCLI.
const (
	// ExitOK: no breaking change.
	ExitOK = 0
	// ExitBreaking: at least one breaking change; each is printed.
	ExitBreaking = 1
	// ExitError: bad usage or the inputs could not be read or built.
	ExitError = 2
)

const cliUsage = `usage: %s compat --against <baseline> [--lock <file> | --image <file>] [--buf <path>]

Checks the current event schemas against a baseline and prints one line per
breaking change: file:line:col: RULE_ID: message (fix: ...).

  --against  the baseline, one of:
               an events.lock file (JSON written by protoc-gen-events),
               a buf image or FileDescriptorSet file (buf build -o base.binpb),
               any other buf input, built with "buf build <input>" using the
               buf on PATH: a git ref ('.git#ref=main', '.git#branch=main'),
               a directory, a module.
  --lock     the current schemas as an events.lock file (no source positions)
  --image    the current schemas as a buf image or FileDescriptorSet file
             (default: "buf build" of the current directory's workspace)
  --buf      the buf binary (default: buf on PATH)

Exit status: 0 compatible, 1 breaking changes found, 2 usage or input error.
`

// RunCLI implements `protoc-gen-events compat`; args are the arguments after
// the word "compat". It prints findings to stdout, one per line, and
// diagnostics to stderr, and returns the exit status (ExitOK, ExitBreaking,
// ExitError). Baselines and current schemas that are buf inputs rather than
// files are built by running buf, so a git ref baseline needs buf on PATH (or
// --buf) and, in CI, a clone with that ref fetched.
func RunCLI(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	prog := filepath.Base(os.Args[0]) // protoc-gen-events or eventsctl
	flags := flag.NewFlagSet(prog+" compat", flag.ContinueOnError)
	flags.SetOutput(stderr)
	usageTo := func(w io.Writer) { fmt.Fprintf(w, cliUsage, prog) }
	flags.Usage = func() { usageTo(stderr) }
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			usageTo(stdout) // asked for: stdout
			return ExitOK
		}
	}
	against := flags.String("against", "", "baseline")
	lockFile := flags.String("lock", "", "current schemas as an events.lock file")
	imageFile := flags.String("image", "", "current schemas as a buf image file")
	bufBin := flags.String("buf", "buf", "buf binary")
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitError
	}
	switch {
	case flags.NArg() > 0:
		fmt.Fprintf(stderr, "compat: unexpected argument %q\n", flags.Arg(0))
		flags.Usage()
		return ExitError
	case *against == "":
		fmt.Fprintln(stderr, "compat: --against is required")
		flags.Usage()
		return ExitError
	case *lockFile != "" && *imageFile != "":
		fmt.Fprintln(stderr, "compat: give at most one of --lock and --image")
		return ExitError
	}
	b := &builder{buf: *bufBin}
	old, _, err := b.load(ctx, *against)
	if err != nil {
		fmt.Fprintf(stderr, "compat: baseline %s: %v\n", *against, err)
		return ExitError
	}
	var (
		cur   *Lock
		files []protoreflect.FileDescriptor
	)
	switch {
	case *lockFile != "":
		cur, err = readLockFile(*lockFile)
	case *imageFile != "":
		cur, files, err = readImageFile(*imageFile)
	default:
		if err = inBufWorkspace("."); err == nil {
			cur, files, err = b.build(ctx, ".")
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "compat: current schemas: %v\n", err)
		return ExitError
	}
	findings := Compare(old, cur, files...)
	for _, f := range findings {
		fmt.Fprintln(stdout, f.String())
	}
	if len(findings) > 0 {
		fmt.Fprintf(stderr, "compat: %d breaking event schema change(s) against %s\n", len(findings), *against)
		return ExitBreaking
	}
	fmt.Fprintf(stderr, "compat: %d event(s) checked against %s: no breaking change\n", len(old.Events), *against)
	return ExitOK
}

// builder turns CLI inputs into locks, running buf for non-file inputs.
type builder struct{ buf string }

// load reads a baseline: a lock file, an image file, or a buf input.
func (b *builder) load(ctx context.Context, input string) (*Lock, []protoreflect.FileDescriptor, error) {
	data, err := os.ReadFile(input)
	switch {
	case err == nil:
		if isLockData(data) {
			l, err := ParseLock(data)
			return l, nil, err
		}
		return lockFromImage(data)
	case errors.Is(err, fs.ErrNotExist) && fileLike(input):
		return nil, nil, fmt.Errorf("read: %w", err)
	case errors.Is(err, fs.ErrNotExist), isDirErr(input, err):
		return b.build(ctx, input)
	default:
		return nil, nil, fmt.Errorf("read: %w", err)
	}
}

// fileLike reports whether a missing input was meant as a lock or image
// file (by its extension) rather than a buf input, so that a typo reads as
// "no such file" instead of a buf error.
func fileLike(input string) bool {
	if strings.Contains(input, "#") {
		return false
	}
	switch filepath.Ext(input) {
	case ".lock", ".binpb", ".bin", ".pb", ".json":
		return true
	}
	return false
}

// isDirErr reports whether reading input failed because it is a directory,
// which buf builds as a workspace or module.
func isDirErr(input string, err error) bool {
	st, statErr := os.Stat(input)
	return err != nil && statErr == nil && st.IsDir()
}

// build runs `buf build <input> -o <tmp>.binpb` and reads the image.
func (b *builder) build(ctx context.Context, input string) (*Lock, []protoreflect.FileDescriptor, error) {
	dir, err := os.MkdirTemp("", "protoevents-compat-")
	if err != nil {
		return nil, nil, fmt.Errorf("buf build: %w", err)
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "image.binpb")
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, b.buf, "build", input, "-o", out)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return nil, nil, fmt.Errorf("buf build %s: %w (install buf or pass --buf)", input, err)
		}
		return nil, nil, fmt.Errorf("buf build %s: %w: %s", input, err, strings.TrimSpace(stderr.String()))
	}
	return readImageFile(out)
}

func readLockFile(path string) (*Lock, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read lock: %w", err)
	}
	return ParseLock(data)
}

func readImageFile(path string) (*Lock, []protoreflect.FileDescriptor, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read image: %w", err)
	}
	return lockFromImage(data)
}

func lockFromImage(data []byte) (*Lock, []protoreflect.FileDescriptor, error) {
	files, err := FilesFromImage(data)
	if err != nil {
		return nil, nil, err
	}
	l, err := Snapshot(files)
	if err != nil {
		return nil, nil, err
	}
	return l, files, nil
}

// isLockData reports whether data looks like a JSON lock rather than a
// binary image (whose first byte is a field tag, never '{').
func isLockData(data []byte) bool {
	t := bytes.TrimLeft(data, " \t\r\n")
	return len(t) > 0 && t[0] == '{'
}

// inBufWorkspace checks that dir is a buf module or workspace root, so the
// current schemas are built from it rather than from whatever .proto files
// lie below an unrelated directory.
func inBufWorkspace(dir string) error {
	for _, name := range []string{"buf.yaml", "buf.work.yaml"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return nil
		}
	}
	abs, _ := filepath.Abs(dir)
	return fmt.Errorf("%s has no buf.yaml: run compat from the buf workspace root, or pass the current schemas with --lock events.lock or --image", abs)
}
