package compat

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"
)

// writeImage compiles dir and writes it as a FileDescriptorSet with imports
// and source info, the form of `buf build -o x.binpb` / `protoc -o`.
func writeImage(t *testing.T, dir, out string) {
	t.Helper()
	set := &descriptorpb.FileDescriptorSet{File: fileProtos(compileDir(t, dir))}
	data, err := proto.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeLock compiles dir and writes its events.lock to out.
func writeLock(t *testing.T, dir, out string) {
	t.Helper()
	l, _ := snapshotDir(t, dir)
	data, err := l.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func runCLI(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := RunCLI(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// TestRunCLIFiles checks lock and image inputs on both sides: a breaking
// pair exits 1 and prints exactly the case's findings (with positions when
// the current schemas are an image), a compatible pair exits 0.
func TestRunCLIFiles(t *testing.T) {
	tmp := t.TempDir()
	breaking := filepath.Join(corpusDir, "several_changes_sorted")
	writeLock(t, filepath.Join(breaking, "before"), filepath.Join(tmp, "before.lock"))
	writeImage(t, filepath.Join(breaking, "before"), filepath.Join(tmp, "before.binpb"))
	writeImage(t, filepath.Join(breaking, "after"), filepath.Join(tmp, "after.binpb"))
	writeLock(t, filepath.Join(breaking, "after"), filepath.Join(tmp, "after.lock"))
	want, err := os.ReadFile(filepath.Join(breaking, "want.txt"))
	if err != nil {
		t.Fatal(err)
	}

	for _, against := range []string{"before.lock", "before.binpb"} {
		code, out, errOut := runCLI("--against", filepath.Join(tmp, against), "--image", filepath.Join(tmp, "after.binpb"))
		if code != ExitBreaking {
			t.Errorf("--against %s: exit %d, want %d (stderr %s)", against, code, ExitBreaking, errOut)
		}
		if out != string(want) {
			t.Errorf("--against %s: stdout\n%s\nwant\n%s", against, out, want)
		}
	}

	// Lock against lock: the same rules, positions unknown (1:1).
	code, out, _ := runCLI("--against", filepath.Join(tmp, "before.lock"), "--lock", filepath.Join(tmp, "after.lock"))
	if code != ExitBreaking {
		t.Fatalf("lock vs lock: exit %d", code)
	}
	gotLines := strings.Split(strings.TrimSpace(out), "\n")
	if len(gotLines) != 5 {
		t.Fatalf("lock vs lock: %d findings, want 5:\n%s", len(gotLines), out)
	}
	for _, l := range gotLines {
		if !strings.Contains(l, ".proto:1:1: ") {
			t.Errorf("lock vs lock finding without the 1:1 position: %s", l)
		}
	}

	compatible := filepath.Join(corpusDir, "compatible_new_event")
	writeImage(t, filepath.Join(compatible, "before"), filepath.Join(tmp, "c-before.binpb"))
	writeImage(t, filepath.Join(compatible, "after"), filepath.Join(tmp, "c-after.binpb"))
	code, out, errOut := runCLI("--against", filepath.Join(tmp, "c-before.binpb"), "--image", filepath.Join(tmp, "c-after.binpb"))
	if code != ExitOK || out != "" || !strings.Contains(errOut, "no breaking change") {
		t.Errorf("compatible: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestRunCLIUsage: bad usage and unreadable inputs exit 2 with a message.
func TestRunCLIUsage(t *testing.T) {
	tmp := t.TempDir()
	writeFile(t, filepath.Join(tmp, "bad.lock"), "{not json")
	writeFile(t, filepath.Join(tmp, "x.lock"), `{"format":1,"events":[],"messages":[],"enums":[]}`)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--against is required"},
		{[]string{"--against", "x", "extra"}, "unexpected argument"},
		{[]string{"--against", filepath.Join(tmp, "x.lock"), "--lock", "a", "--image", "b"}, "at most one"},
		{[]string{"--against", filepath.Join(tmp, "bad.lock"), "--lock", filepath.Join(tmp, "x.lock")}, "parse lock"},
		{[]string{"--against", filepath.Join(tmp, "x.lock"), "--lock", filepath.Join(tmp, "missing.lock")}, "no such file"},
		{[]string{"--against", filepath.Join(tmp, "x.lock"), "--image", filepath.Join(tmp, "x.lock")}, "decode image"},
		{[]string{"--against", "nonexistent-input", "--buf", filepath.Join(tmp, "no-buf"), "--lock", filepath.Join(tmp, "x.lock")}, "buf build nonexistent-input"},
		{[]string{"--bogus"}, "flag provided but not defined"},
		{[]string{"--against", filepath.Join(tmp, "typo.lock"), "--lock", filepath.Join(tmp, "x.lock")}, "read: open"},
	} {
		code, out, errOut := runCLI(tc.args...)
		if code != ExitError || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
}

// TestRunCLIGitRef runs the CI recipe end to end with the real buf: a git
// repository with a buf workspace, a commit, a breaking edit in the working
// tree, and `compat --against .git#ref=HEAD` building both sides with buf.
func TestRunCLIGitRef(t *testing.T) {
	bufBin := findBuf(t)
	gitBin, err := exec.LookPath("git")
	if err != nil {
		t.Fatalf("git not found: %v", err)
	}
	repo := t.TempDir()
	c := filepath.Join(corpusDir, "field_type_int32_to_int64")
	copyTree(t, filepath.Join(c, "before"), filepath.Join(repo, "proto"))
	copyFile(t, filepath.Join(schemasDir, "events/v1/options.proto"), filepath.Join(repo, "proto/events/v1/options.proto"))
	writeFile(t, filepath.Join(repo, "buf.yaml"), "version: v2\nmodules:\n  - path: proto\n")
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command(gitBin, append([]string{"-c", "user.email=ci@example.invalid", "-c", "user.name=ci"}, args...)...)
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q")
	git("add", "-A")
	git("commit", "-q", "-m", "baseline")
	t.Chdir(repo)

	code, out, errOut := runCLI("--against", ".git#ref=HEAD", "--buf", bufBin)
	if code != ExitOK || out != "" {
		t.Fatalf("unchanged tree: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	copyFile(t, filepath.Join(c, "after/orders/v1/orders.proto"), filepath.Join(repo, "proto/orders/v1/orders.proto"))
	want, err := os.ReadFile(filepath.Join(c, "want.txt"))
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runCLI("--against", ".git#ref=HEAD", "--buf", bufBin)
	if code != ExitBreaking || out != string(want) {
		t.Fatalf("breaking edit: exit %d, stdout\n%s\nwant\n%s\nstderr %s", code, out, want, errOut)
	}
}

// TestFilesFromImageSkipsImports: files buf marks as imports
// (ImageFileExtension.is_import) are not searched for events.
func TestFilesFromImageSkipsImports(t *testing.T) {
	files := fileProtos(compileDir(t, filepath.Join(corpusDir, "compatible_new_event", "after")))
	var ext []byte
	ext = protowire.AppendTag(ext, bufIsImportField, protowire.VarintType)
	ext = protowire.AppendVarint(ext, 1)
	var unknown []byte
	unknown = protowire.AppendTag(unknown, bufExtensionField, protowire.BytesType)
	unknown = protowire.AppendBytes(unknown, ext)
	for _, f := range files {
		if f.GetName() == "orders/v1/orders.proto" || strings.HasPrefix(f.GetName(), "google/") {
			f.ProtoReflect().SetUnknown(unknown)
		}
	}
	data, err := proto.Marshal(&descriptorpb.FileDescriptorSet{File: files})
	if err != nil {
		t.Fatal(err)
	}
	got, err := FilesFromImage(data)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range got {
		paths = append(paths, f.Path())
	}
	if want := "events/v1/options.proto orders/v1/types.proto"; strings.Join(paths, " ") != want {
		t.Errorf("files = %v, want %s", paths, want)
	}
	l, err := Snapshot(got)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Events) != 0 {
		t.Errorf("events from import files: %+v", l.Events)
	}
}
