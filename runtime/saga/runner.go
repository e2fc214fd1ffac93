package saga

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RunTimeouts fires due deadlines until ctx is cancelled, then returns nil:
// step timeouts (the step is compensated), compensation timeouts and
// backoffs (the compensation is sent again or the saga parked) and
// operator retries. Each firing is one transaction on pool that locks the
// due row with FOR UPDATE SKIP LOCKED, so several orchestrator instances
// may run it side by side and a deadline fires once. Deadlines are checked
// every poll interval (WithPollInterval).
func (sg *Saga[D]) RunTimeouts(ctx context.Context, pool *pgxpool.Pool) error {
	if pool == nil {
		return fmt.Errorf("saga %s: timeouts: nil pool", sg.def.Name)
	}
	tick := time.NewTicker(sg.s.pollInterval)
	defer tick.Stop()
	for {
		for {
			fired, err := sg.FireDue(ctx, pool)
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				sg.s.logger.Error("saga: fire deadline", "saga", sg.def.Name, "err", err)
				break
			}
			if !fired {
				break
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// FireDue fires at most one due deadline in its own transaction and
// reports whether it found one. RunTimeouts calls it in a loop; tests and
// tools may call it directly. A firing that fails is rolled back and the
// deadline postponed by the poll interval, so one broken saga cannot starve
// the others.
func (sg *Saga[D]) FireDue(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("saga %s: timeouts: begin: %w", sg.def.Name, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	t, err := sg.load(ctx, tx, tx.QueryRow(ctx, sg.s.sql.lockDue, sg.def.Name), "")
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("saga %s: timeouts: %w", sg.def.Name, err)
	}
	if err := t.fire(); err == nil {
		err = t.save()
	} else {
		_ = tx.Rollback(ctx)
		if _, perr := pool.Exec(ctx, sg.s.sql.postpone, t.st.id, sg.s.pollInterval.Seconds()); perr != nil {
			err = errors.Join(err, fmt.Errorf("postpone: %w", perr))
		}
		return true, err
	}
	if err := tx.Commit(ctx); err != nil {
		return true, fmt.Errorf("saga %s %s: timeouts: commit: %w", sg.def.Name, t.st.id, err)
	}
	if h := sg.s.hooks.TimerCommitted; h != nil {
		h(t.transition())
	}
	return true, nil
}
