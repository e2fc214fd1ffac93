package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/protoevents/protoevents/examples/demo"
)

// runSagaDemo runs the order saga across the stock, payments and shipping
// services (see demo.RunSaga) and prints its report.
func runSagaDemo(ctx context.Context, pool *pgxpool.Pool, brokers []string, log *slog.Logger) error {
	fmt.Println("\nprotoevents saga demo: order saga = reserve stock → charge card → schedule shipping, compensated in reverse")
	if err := demo.SetupSaga(ctx, pool, brokers); err != nil {
		return err
	}
	rep, err := demo.RunSaga(ctx, demo.SagaConfig{DB: pool, Brokers: brokers, Orders: 40, Progress: os.Stdout, Log: log})
	if err != nil {
		return err
	}
	rep.Print(os.Stdout)
	if !rep.OK() {
		return errors.New("saga invariants violated")
	}
	return nil
}
