package compat

import (
	"context"
	"encoding/json"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/reflect/protoreflect"
)

var update = flag.Bool("update", false, "rewrite golden files (want.txt, *.lock, docs/compat-vs-buf.md)")

// corpusDir holds one folder per case: before/ and after/ .proto trees and
// case.json with the rule IDs the change must report. Paths are absolute so
// that tests may change directory.
var corpusDir = absPath("../../testdata/compat")

// schemasDir is where "events/v1/options.proto" is imported from.
var schemasDir = absPath("../../schemas")

func absPath(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		panic(err) // test setup only: the working directory is unreadable
	}
	return a
}

// corpusCase is one before/after pair of the corpus.
type corpusCase struct {
	Name string `json:"-"`
	Dir  string `json:"-"`
	// Rules are the rule IDs Compare must report, in any order, with
	// multiplicity. Written by hand, never by -update.
	Rules []string `json:"rules"`
	// BufNote explains why buf breaking (WIRE_JSON) reports something else
	// for this pair; required when the two differ.
	BufNote string `json:"buf_note"`
}

func loadCorpus(t *testing.T) []corpusCase {
	t.Helper()
	entries, err := os.ReadDir(corpusDir)
	if err != nil {
		t.Fatal(err)
	}
	var cases []corpusCase
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(corpusDir, e.Name())
		data, err := os.ReadFile(filepath.Join(dir, "case.json"))
		if err != nil {
			t.Fatalf("case %s: %v", e.Name(), err)
		}
		c := corpusCase{Name: e.Name(), Dir: dir}
		if err := json.Unmarshal(data, &c); err != nil {
			t.Fatalf("case %s: case.json: %v", e.Name(), err)
		}
		cases = append(cases, c)
	}
	if len(cases) == 0 {
		t.Fatal("empty corpus")
	}
	return cases
}

// protoFiles lists the .proto files under dir as slash-separated paths
// relative to it.
func protoFiles(t *testing.T, dir string) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".proto") {
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			names = append(names, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(names)
	return names
}

// compileDir compiles every .proto under dir with protocompile, importing
// events/v1/options.proto from the repository's schemas/ and the well-known
// types from protocompile's standard imports, with source positions.
func compileDir(t *testing.T, dir string) []protoreflect.FileDescriptor {
	t.Helper()
	comp := protocompile.Compiler{
		Resolver:       protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{dir, schemasDir}}),
		SourceInfoMode: protocompile.SourceInfoStandard,
	}
	linked, err := comp.Compile(context.Background(), protoFiles(t, dir)...)
	if err != nil {
		t.Fatalf("compile %s: %v", dir, err)
	}
	files := make([]protoreflect.FileDescriptor, len(linked))
	for i, f := range linked {
		files[i] = f
	}
	return files
}

func snapshotDir(t *testing.T, dir string) (*Lock, []protoreflect.FileDescriptor) {
	t.Helper()
	files := compileDir(t, dir)
	l, err := Snapshot(files)
	if err != nil {
		t.Fatalf("snapshot %s: %v", dir, err)
	}
	return l, files
}

// compareCase runs the check on a case: before's lock against after's
// schemas, with after's positions.
func compareCase(t *testing.T, c corpusCase) []Finding {
	t.Helper()
	old, _ := snapshotDir(t, filepath.Join(c.Dir, "before"))
	cur, files := snapshotDir(t, filepath.Join(c.Dir, "after"))
	return Compare(old, cur, files...)
}

func ruleIDs(fs []Finding) []string {
	ids := make([]string, len(fs))
	for i, f := range fs {
		ids[i] = f.Rule
	}
	return ids
}

func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if string(want) != string(got) {
		t.Errorf("%s is stale (go test -update rewrites it)\n--- want\n%s\n--- got\n%s", path, want, got)
	}
}

// TestCorpus checks every before/after pair reports exactly the rule IDs of
// its case.json, and its full output matches want.txt.
func TestCorpus(t *testing.T) {
	for _, c := range loadCorpus(t) {
		t.Run(c.Name, func(t *testing.T) {
			findings := compareCase(t, c)
			got := slices.Sorted(slices.Values(ruleIDs(findings)))
			want := slices.Sorted(slices.Values(c.Rules))
			if !slices.Equal(got, want) {
				t.Errorf("rules = %v, want %v\nfindings:\n%s", got, want, lines(findings))
			}
			checkGolden(t, filepath.Join(c.Dir, "want.txt"), []byte(lines(findings)))
			for _, f := range findings {
				checkPosition(t, filepath.Join(c.Dir, "after"), f)
			}
		})
	}
}

// declStart matches what a finding may point at: a message, enum, event
// option, package statement, field or enum value declaration.
var declStart = regexp.MustCompile(`^(message \w+ \{|enum \w+ \{|option \(events\.v1\.event\) =|package [\w.]+;|((optional|repeated|required) )?[\w.]+(<\w+, [\w.]+>)? \w+ = \d+|\w+ = -?\d+)`)

// checkPosition asserts that a finding points at a real declaration of the
// new schema.
func checkPosition(t *testing.T, dir string, f Finding) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, f.File))
	if err != nil {
		t.Errorf("finding in unknown file: %s", f)
		return
	}
	src := strings.Split(string(data), "\n")
	if f.Line < 1 || f.Line > len(src) || f.Col < 1 || f.Col > len(src[f.Line-1]) {
		t.Errorf("position out of range: %s", f)
		return
	}
	if text := src[f.Line-1][f.Col-1:]; !declStart.MatchString(text) {
		t.Errorf("position %d:%d points at %q, not a declaration: %s", f.Line, f.Col, text, f)
	}
}

func lines(fs []Finding) string {
	var b strings.Builder
	for _, f := range fs {
		b.WriteString(f.String())
		b.WriteString("\n")
	}
	return b.String()
}

// TestCorpusCoversEveryRule keeps the corpus honest: each rule has a case.
func TestCorpusCoversEveryRule(t *testing.T) {
	seen := map[string]bool{}
	compatible := 0
	for _, c := range loadCorpus(t) {
		for _, r := range c.Rules {
			if !slices.Contains(Rules, r) {
				t.Errorf("case %s expects unknown rule %s", c.Name, r)
			}
			seen[r] = true
		}
		if len(c.Rules) == 0 {
			compatible++
		}
	}
	for _, r := range Rules {
		if !seen[r] {
			t.Errorf("no corpus case for rule %s", r)
		}
	}
	if compatible < 5 {
		t.Errorf("only %d compatible cases, want several", compatible)
	}
}

// TestUnchangedSchemasPass: every schema of the corpus is compatible with
// itself, both from descriptors and through a lock round trip.
func TestUnchangedSchemasPass(t *testing.T) {
	for _, c := range loadCorpus(t) {
		for _, side := range []string{"before", "after"} {
			l, files := snapshotDir(t, filepath.Join(c.Dir, side))
			data, err := l.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			parsed, err := ParseLock(data)
			if err != nil {
				t.Fatalf("%s/%s: %v", c.Name, side, err)
			}
			if fs := Compare(parsed, l, files...); len(fs) > 0 {
				t.Errorf("%s/%s against itself:\n%s", c.Name, side, lines(fs))
			}
			again, err := parsed.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			if string(again) != string(data) {
				t.Errorf("%s/%s: lock changes on a parse/marshal round trip", c.Name, side)
			}
		}
	}
}

// TestSnapshotGolden pins the lock format on schemas that use every recorded
// feature: two events with supersedes and a default DLQ, maps, oneofs,
// proto3 optional, reserved ranges and names, enums (proto3), required
// fields and defaults (proto2), editions presence.
func TestSnapshotGolden(t *testing.T) {
	for _, name := range []string{"compatible_new_version_supersedes", "proto2_default_changed", "editions_presence_implicit"} {
		t.Run(name, func(t *testing.T) {
			l, _ := snapshotDir(t, filepath.Join(corpusDir, name, "after"))
			data, err := l.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			checkGolden(t, filepath.Join(corpusDir, name, "after.lock"), data)
		})
	}
}

// TestSnapshotDeterministic: the lock does not depend on the order files are
// given in, and ends in exactly one newline.
func TestSnapshotDeterministic(t *testing.T) {
	files := compileDir(t, filepath.Join(corpusDir, "shared_type_changed_reported_once", "before"))
	a, err := Snapshot(files)
	if err != nil {
		t.Fatal(err)
	}
	rev := slices.Clone(files)
	slices.Reverse(rev)
	b, err := Snapshot(rev)
	if err != nil {
		t.Fatal(err)
	}
	da, _ := a.Marshal()
	db, _ := b.Marshal()
	if string(da) != string(db) {
		t.Errorf("lock depends on file order:\n%s\n---\n%s", da, db)
	}
	if !strings.HasSuffix(string(da), "}\n") || strings.HasSuffix(string(da), "\n\n") {
		t.Errorf("lock does not end in one newline: %q", da[len(da)-5:])
	}
	if len(a.Events) != 2 {
		t.Errorf("events = %d, want 2", len(a.Events))
	}
}
