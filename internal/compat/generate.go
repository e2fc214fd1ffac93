package compat

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// CheckGeneration is the plugin side of the check, run by protoc-gen-events
// when its parameter lock=<path> is set. It snapshots the events of the
// request's files to generate, compares them with the lock at lockPath
// (a missing lock is a first run and passes), and:
//
//   - returns an error listing every breaking change, one per line, when
//     there is any, so buf generate fails and writes nothing;
//   - otherwise emits the updated lock through the plugin, as a generated
//     file named lockPath, when its content changed (buf writes it under the
//     plugin's out directory).
//
// lockPath is read relative to the working directory of buf generate and
// written relative to the plugin's out directory: with out: "." (as in this
// project's buf.gen.yaml) the two are the same file. It must be a relative,
// slash-separated path inside the out directory.
//
// The check needs every event in one request: configure the plugin with
// strategy: all in buf.gen.yaml, or events of other directories are reported
// as removed. When buf.gen.yaml sits in the working directory, a template
// that writes the lock elsewhere than it is read, or without strategy: all,
// is an error (a misplaced lock would silently disable the check).
func CheckGeneration(p *protogen.Plugin, lockPath string) error {
	return CheckGenerationTo(p, lockPath, lockPath)
}

// CheckGenerationTo is CheckGeneration for a plugin whose out directory is
// not the directory buf generate runs in: the lock is read at lockPath
// (relative to the working directory) and written as outName (relative to
// the out directory), e.g. lock=gen/events.lock with lock_out=events.lock
// for out: gen.
func CheckGenerationTo(p *protogen.Plugin, lockPath, outName string) error {
	clean := path.Clean(filepath.ToSlash(outName))
	if outName == "" || path.IsAbs(clean) || filepath.IsAbs(outName) || clean == ".." || strings.HasPrefix(clean, "../") {
		return fmt.Errorf("compat: lock file %q: want a relative path inside the plugin's out directory, e.g. lock=events.lock (set lock_out when out is not \".\")", outName)
	}
	if lockPath == "" {
		return errors.New("compat: no lock path")
	}
	if err := checkPlacement(lockPath); err != nil {
		return err
	}
	var files []protoreflect.FileDescriptor
	for _, f := range p.Files {
		if f.Generate {
			files = append(files, f.Desc)
		}
	}
	cur, err := Snapshot(files)
	if err != nil {
		return err
	}
	next, err := cur.Marshal()
	if err != nil {
		return err
	}
	prev, err := os.ReadFile(lockPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		prev = nil
		// Said on every run that finds no lock, so a misconfiguration (the
		// lock written under an out directory other than where it is read)
		// shows instead of silently disabling the check.
		abs, _ := filepath.Abs(lockPath)
		fmt.Fprintf(os.Stderr, "protoc-gen-events: no lock at %s: writing a new one (first run); if this repeats on every run, the lock is written elsewhere (under the plugin's out): use out: ., or lock=<out>/events.lock with lock_out=events.lock\n", abs)
	case err != nil:
		return fmt.Errorf("compat: read lock: %w", err)
	default:
		old, err := ParseLock(prev)
		if err != nil {
			return fmt.Errorf("compat: %s: %w", lockPath, err)
		}
		if findings := Compare(old, cur, files...); len(findings) > 0 {
			return breakingError(lockPath, findings)
		}
	}
	if bytes.Equal(prev, next) {
		return nil
	}
	name := clean
	if m := moduleParam(p); m != "" {
		name = m + "/" + clean
	}
	g := p.NewGeneratedFile(name, "")
	if _, err := g.Write(next); err != nil {
		return fmt.Errorf("compat: write lock: %w", err)
	}
	return nil
}

// breakingError lists findings one per line under a header naming the lock.
func breakingError(lockPath string, findings []Finding) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%d breaking event schema change(s) against %s:", len(findings), lockPath)
	for _, f := range findings {
		b.WriteString("\n")
		b.WriteString(f.String())
	}
	return errors.New(b.String())
}

// moduleParam returns the value of the request's module= parameter: with it,
// protogen requires every generated file name to start with the module path
// (and strips it), so the lock's name must carry it too.
func moduleParam(p *protogen.Plugin) string {
	if p.Request == nil {
		return ""
	}
	var module string
	for _, param := range strings.Split(p.Request.GetParameter(), ",") {
		if k, v, ok := strings.Cut(param, "="); ok && k == "module" {
			module = v
		}
	}
	return module
}
