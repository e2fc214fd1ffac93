package servers

import (
	"context"
	"testing"
)

func TestMain(m *testing.M) { Main(m) }

// TestSchemasAreIsolated checks that two tests' tables do not collide: the
// same table name is created in two schemas and each sees only its rows.
func TestSchemasAreIsolated(t *testing.T) {
	ctx := context.Background()
	a, sa := DB(t)
	b, sb := DB(t)
	if sa == sb {
		t.Fatalf("two DB calls gave the same schema %s", sa)
	}
	if _, err := a.Exec(ctx, "CREATE TABLE things (n int); INSERT INTO things VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Exec(ctx, "CREATE TABLE things (n int); INSERT INTO things VALUES (2), (3)"); err != nil {
		t.Fatal(err)
	}
	var na, nb int
	if err := a.QueryRow(ctx, "SELECT count(*) FROM things").Scan(&na); err != nil {
		t.Fatal(err)
	}
	if err := b.QueryRow(ctx, "SELECT count(*) FROM things").Scan(&nb); err != nil {
		t.Fatal(err)
	}
	if na != 1 || nb != 2 {
		t.Fatalf("rows seen: %d and %d, want 1 and 2", na, nb)
	}
}
