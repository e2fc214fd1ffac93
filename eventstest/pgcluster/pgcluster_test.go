package pgcluster

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestStartStop always starts a real throwaway cluster, whatever database
// URL the environment gives, because that is what a fresh machine relies on.
func TestStartStop(t *testing.T) {
	if _, err := binDir(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT 40 + 2").Scan(&n); err != nil || n != 42 {
		t.Fatalf("query: %d, %v", n, err)
	}
	conn.Close(ctx)
	if err := c.Down(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pgx.Connect(ctx, c.URL); err == nil {
		t.Fatal("server still answers after Down")
	}
	if err := c.Up(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err = pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatalf("after Up: %v", err)
	}
	conn.Close(ctx)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.dir); !os.IsNotExist(err) {
		t.Fatalf("data directory left behind: %v", err)
	}
	if _, err := pgx.Connect(ctx, c.URL); err == nil {
		t.Fatal("server still answers after Stop")
	}
}
