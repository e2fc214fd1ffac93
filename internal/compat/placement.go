package compat

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
)

// bufGenFile is the buf generate template the placement check reads: buf
// runs local plugins in the directory it was started in, which is where the
// template usually is.
const bufGenFile = "buf.gen.yaml"

// bufGenTemplate is the part of buf.gen.yaml (v1 or v2) the check reads.
type bufGenTemplate struct {
	Plugins []struct {
		Out      string    `yaml:"out"`
		Opt      yaml.Node `yaml:"opt"`
		Strategy string    `yaml:"strategy"`
	} `yaml:"plugins"`
}

// checkPlacement fails when buf.gen.yaml in the working directory runs the
// plugin with lock=lockPath in a way that disables the check: the lock
// written under the plugin's out directory (out/outName) is not the file
// read (lockPath), so every run would compare against a stale or missing
// lock and pass; or the strategy is not "all", so each request sees only
// some events and the others look removed. Without a template, or with no
// plugin entry passing lock=lockPath (protoc, or buf generate --template),
// there is nothing to check.
func checkPlacement(lockPath string) error {
	data, err := os.ReadFile(bufGenFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("compat: read %s to check the lock's placement: %w", bufGenFile, err)
	}
	var tmpl bufGenTemplate
	if err := yaml.Unmarshal(data, &tmpl); err != nil {
		// buf itself reports a broken template; the check has nothing to add.
		return nil
	}
	for _, p := range tmpl.Plugins {
		if _, ok := optValue(&p.Opt, "lock", lockPath); !ok {
			continue
		}
		outName, ok := optValue(&p.Opt, "lock_out", "")
		if !ok {
			outName = lockPath
		}
		out := p.Out
		if out == "" {
			out = "."
		}
		written := path.Clean(path.Join(filepath.ToSlash(out), outName))
		read := path.Clean(filepath.ToSlash(lockPath))
		if written != read {
			fix := fmt.Sprintf("use out: . with lock=%s, or keep out: %s and set lock=%s with lock_out=%s", read, out, path.Join(filepath.ToSlash(out), "events.lock"), "events.lock")
			return fmt.Errorf("compat: misplaced lock: %s runs protoc-gen-events with out: %s and lock=%s, so the lock is read from %s but written to %s, and the breaking-change check would never see the lock it writes (fix: %s)",
				bufGenFile, out, lockPath, read, written, fix)
		}
		if p.Strategy != "all" {
			return fmt.Errorf("compat: %s runs protoc-gen-events with lock=%s and strategy: %q; the check needs every event in one request, or the events of other directories look removed (fix: set strategy: all on that plugin)", bufGenFile, lockPath, p.Strategy)
		}
	}
	return nil
}

// optValue returns the value of the option key=value in a plugin's opt (a
// string of comma-separated options, or a list of them), and whether it is
// there; a non-empty want must also match the value.
func optValue(n *yaml.Node, key, want string) (string, bool) {
	var opts []string
	switch n.Kind {
	case yaml.ScalarNode:
		opts = strings.Split(n.Value, ",")
	case yaml.SequenceNode:
		for _, c := range n.Content {
			opts = append(opts, strings.Split(c.Value, ",")...)
		}
	}
	for _, o := range opts {
		k, v, ok := strings.Cut(strings.TrimSpace(o), "=")
		if ok && k == key && (want == "" || v == want) {
			return v, true
		}
	}
	return "", false
}
