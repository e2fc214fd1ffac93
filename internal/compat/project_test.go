package compat

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// repoRoot is the protoevents checkout the test runs in.
var repoRoot = absPath("../..")

// TestProjectSchemasAgainstCommittedLock is the project's own CI guard over
// its real schemas: a copy of the buf workspace (schemas, examples and
// generator test schemas) is built with buf and checked against the
// committed events.lock. Unchanged, it passes (the lock is current); with a
// breaking edit to an example event, it fails naming the change; with an
// additive edit, it passes.
func TestProjectSchemasAgainstCommittedLock(t *testing.T) {
	bufBin := findBuf(t)
	work := t.TempDir()
	for _, p := range []string{"buf.yaml", "events.lock"} {
		copyFile(t, filepath.Join(repoRoot, p), filepath.Join(work, p))
	}
	for _, d := range []string{"schemas", "examples/proto", "testdata/proto"} {
		copyTree(t, filepath.Join(repoRoot, d), filepath.Join(work, d))
	}
	orders := filepath.Join(work, "examples/proto/shop/orders/v1/orders.proto")
	check := func(t *testing.T) (int, string, string) {
		t.Helper()
		image := filepath.Join(t.TempDir(), "image.binpb")
		build := exec.Command(bufBin, "build", "-o", image)
		build.Dir = work
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("buf build: %v\n%s", err, out)
		}
		return runCLI("--against", filepath.Join(work, "events.lock"), "--image", image)
	}

	t.Run("unchanged", func(t *testing.T) {
		if code, out, errOut := check(t); code != ExitOK {
			t.Fatalf("committed schemas against the committed events.lock: exit %d\n%s%s(run make generate and commit events.lock)", code, out, errOut)
		}
	})
	t.Run("breaking", func(t *testing.T) {
		original, err := os.ReadFile(orders)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.WriteFile(orders, original, 0o644) })
		edit(t, orders, "  int64 total_cents = 3;", "  int32 total_cents = 3;")
		edit(t, orders, `    key: "order_id"`, `    key: "customer_id"`)
		code, out, _ := check(t)
		if code != ExitBreaking {
			t.Fatalf("breaking edit: exit %d, want %d\n%s", code, ExitBreaking, out)
		}
		for _, want := range []string{
			"shop/orders/v1/orders.proto:", ": EVENT_KEY_CHANGED: ", ": FIELD_TYPE_CHANGED: ",
			`supersedes: "shop.orders.v1.OrderPlaced"`,
		} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
		if n := strings.Count(strings.TrimSpace(out), "\n") + 1; n != 2 {
			t.Errorf("%d findings, want 2 (one per change):\n%s", n, out)
		}
	})
	t.Run("additive", func(t *testing.T) {
		original, err := os.ReadFile(orders)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.WriteFile(orders, original, 0o644) })
		edit(t, orders, "  string country = 6;\n", "  string country = 6;\n  // coupon is new and optional.\n  string coupon = 7;\n")
		if code, out, errOut := check(t); code != ExitOK {
			t.Fatalf("additive edit: exit %d\n%s%s", code, out, errOut)
		}
	})
}
