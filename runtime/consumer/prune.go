package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultPruneBatch is how many dedup rows one pruning statement deletes.
const DefaultPruneBatch = 5000

// Prune deletes dedup rows older than olderThan, in batches of
// WithPruneBatch rows (default 5000), each its own short statement, so it
// is safe to run while consumers insert: it touches only old rows, and
// holds their locks for one batch. It returns how many rows it deleted.
//
// olderThan must be at least the retention floor (WithRetentionFloor,
// default 7 days), and should be at least the Kafka retention of the
// consumed topics: once a row is gone, a redelivered copy of its event
// would be applied again, so rows must outlive every copy on the broker.
func Prune(ctx context.Context, pool *pgxpool.Pool, olderThan time.Duration, opts ...Option) (int64, error) {
	s, err := settingsFrom(opts)
	if err != nil {
		return 0, err
	}
	if olderThan < s.retentionFloor {
		return 0, fmt.Errorf("consumer: prune: retention %v is below the floor %v (dedup rows must outlive the broker's retention; lower the floor with WithRetentionFloor only if the topics keep messages for less)", olderThan, s.retentionFloor)
	}
	sql, err := renderSQL(s.table)
	if err != nil {
		return 0, err
	}
	return prune(ctx, pool, sql, olderThan, s.pruneBatch)
}

// prune runs batches until one deletes fewer rows than the batch size.
func prune(ctx context.Context, pool *pgxpool.Pool, sql *sqlSet, olderThan time.Duration, batch int) (int64, error) {
	var total int64
	for {
		tag, err := pool.Exec(ctx, sql.prune, olderThan, batch)
		if err != nil {
			return total, fmt.Errorf("consumer: prune %s: %w", sql.table, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
	}
}
