package compat

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestMisplacedLockIsAnError: a buf.gen.yaml whose lock would be written
// somewhere else than it is read, or that splits the request, fails
// generation with the fix; the consistent layouts pass.
func TestMisplacedLockIsAnError(t *testing.T) {
	cases := []struct {
		name, tmpl, param, wantErr string
	}{
		{"out dot", "plugins:\n  - local: protoc-gen-events\n    out: .\n    opt: [module=github.com/protoevents/protoevents, lock=events.lock]\n    strategy: all\n",
			"lock=events.lock", ""},
		{"out gen with lock_out", "plugins:\n  - local: protoc-gen-events\n    out: gen\n    opt: lock=gen/events.lock,lock_out=events.lock\n    strategy: all\n",
			"lock=gen/events.lock", ""},
		{"out gen without lock_out", "plugins:\n  - local: protoc-gen-events\n    out: gen\n    opt: [lock=events.lock]\n    strategy: all\n",
			"lock=events.lock", "misplaced lock: buf.gen.yaml runs protoc-gen-events with out: gen and lock=events.lock, so the lock is read from events.lock but written to gen/events.lock"},
		{"strategy directory", "plugins:\n  - local: protoc-gen-events\n    out: .\n    opt: lock=events.lock\n",
			"lock=events.lock", "strategy: all"},
		{"another plugin entry", "plugins:\n  - local: protoc-gen-go\n    out: gen\n",
			"lock=events.lock", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			work := t.TempDir()
			t.Chdir(work)
			writeFile(t, filepath.Join(work, "buf.gen.yaml"), "version: v2\n"+c.tmpl)
			resp := runPlugin(t, exampleSchema, c.param)
			if c.wantErr == "" {
				if resp.Error != nil {
					t.Fatalf("error %q, want none", resp.GetError())
				}
				return
			}
			if !strings.Contains(resp.GetError(), c.wantErr) || !strings.Contains(resp.GetError(), "fix:") {
				t.Fatalf("error %q, want %q with a fix", resp.GetError(), c.wantErr)
			}
			if len(resp.File) != 0 {
				t.Errorf("a failed check wrote %d files", len(resp.File))
			}
		})
	}
}
