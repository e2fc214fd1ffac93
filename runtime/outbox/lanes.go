package outbox

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// session is a relay's dedicated connection to Postgres. It holds the
// relay's presence lock and its lane locks (session-level advisory locks),
// and it runs the claim–publish–mark transactions of those lanes. Doing the
// work on the very connection that holds the locks is what makes lane
// ownership airtight: if the connection dies, its locks and its
// uncommitted claim die together, and no other relay can take a lane while
// this one still has a batch of it in flight.
type session struct {
	conn  *pgx.Conn
	table resolvedTable
	owned []int // sorted
}

// connectSession opens the connection and announces the relay.
func connectSession(ctx context.Context, cfg *pgx.ConnConfig, t resolvedTable) (*session, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("outbox: relay: connect: %w", err)
	}
	if _, err := conn.Exec(ctx, sqlSessionSettings); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("outbox: relay: session settings: %w", err)
	}
	if _, err := conn.Exec(ctx, sqlPresenceLock, t.lockKey(), presenceLane); err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("outbox: relay: announce: %w", err)
	}
	return &session{conn: conn, table: t}, nil
}

// close releases the locks and ends the connection. Unlocking first makes
// the lanes free when close returns; closing alone would free them only
// once the server notices, a moment later (or, if the connection is
// already broken, whenever it does).
func (s *session) close(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if !s.conn.IsClosed() {
		_, _ = s.conn.Exec(ctx, sqlUnlockAll)
	}
	_ = s.conn.Close(ctx)
	s.owned = nil
}

// rebalance counts the live relays and takes or gives up lanes so that this
// relay owns at most ceil(lanes/relays). Every relay doing this converges to
// a spread in which every lane is owned (the targets add up to at least the
// lane count) and no lane has two owners (the locks are exclusive). It
// returns whether the owned set changed.
func (s *session) rebalance(ctx context.Context) (bool, error) {
	var live int
	if err := s.conn.QueryRow(ctx, sqlLiveRelays, s.table.oid, uint32(presenceLane)).Scan(&live); err != nil {
		return false, fmt.Errorf("outbox: relay: count relays: %w", err)
	}
	n := s.table.lanes
	target := (n + max(live, 1) - 1) / max(live, 1)
	switch {
	case len(s.owned) > target:
		// Give up the highest lanes. Between batches, so nothing of them is
		// in flight: the next owner starts at the lane's first pending row.
		drop := s.owned[target:]
		var ok bool
		if err := s.conn.QueryRow(ctx, sqlUnlockLanes, s.table.lockKey(), drop).Scan(&ok); err != nil {
			return false, fmt.Errorf("outbox: relay: release lanes: %w", err)
		}
		s.owned = slices.Clone(s.owned[:target])
		return true, nil
	case len(s.owned) < target:
		free := make([]int32, 0, n-len(s.owned))
		for l := range n {
			if !slices.Contains(s.owned, l) {
				free = append(free, int32(l))
			}
		}
		// A random order spreads relays that start together over the lanes.
		rand.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
		rows, err := s.conn.Query(ctx, sqlTryLanes, s.table.lockKey(), free, target-len(s.owned))
		if err != nil {
			return false, fmt.Errorf("outbox: relay: take lanes: %w", err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return false, fmt.Errorf("outbox: relay: take lanes: %w", err)
		}
		for _, l := range got {
			s.owned = append(s.owned, int(l))
		}
		slices.Sort(s.owned)
		return len(got) > 0, nil
	}
	return false, nil
}
