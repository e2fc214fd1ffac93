package outbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/protoevents/protoevents/eventstest/servers"
	"github.com/protoevents/protoevents/runtime/events"
)

// TestWriteBeforeMigrateSaysMigrate: publishing into a database that was
// never migrated names the fix instead of Postgres' bare 42P01.
func TestWriteBeforeMigrateSaysMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := servers.DB(t)
	w, err := NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	d := descriptorFor("never-migrated")
	for name, write := range map[string]func() error{
		"Write": func() error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			_, err = w.Write(ctx, tx, newEvent(d, "k", 0))
			return err
		},
		"WriteBatch": func() error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			_, err = w.WriteBatch(ctx, tx, []events.Event{newEvent(d, "k", 0), newEvent(d, "k", 1)})
			return err
		},
	} {
		err := write()
		if !errors.Is(err, ErrNoTable) || !strings.Contains(err.Error(), "run `eventsctl migrate`") {
			t.Errorf("%s before Migrate: %v, want ErrNoTable naming eventsctl migrate", name, err)
		}
	}
}
