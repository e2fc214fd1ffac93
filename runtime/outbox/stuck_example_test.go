package outbox_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/runtime/outbox"
)

// An operator tool lists the rows holding their keys back and parks the
// ones the broker will never take, so the keys' later events flow; the
// parked rows stay in "<outbox>_dead" for a later Retry.
func ExampleListStuck() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	stuck, err := outbox.ListStuck(ctx, pool, outbox.StuckFilter{MinAttempts: 10})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range stuck {
		fmt.Printf("%d %s/%s: %d attempts, %d waiting: %s\n", r.ID, r.Topic, r.Key, r.Attempts, r.Waiting, r.LastError)
		_, err := outbox.Park(ctx, pool, r.ID, outbox.Operation{By: "cleanup-job", Reason: "refused 10 times: " + r.LastError})
		if err != nil {
			log.Fatal(err)
		}
	}
}
