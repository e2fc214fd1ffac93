package outbox

import (
	"context"
)

// cleanup deletes published rows older than the retention, a batch at a
// time, until none is left or ctx ends. Errors are only logged: cleanup can
// wait for the next round.
func (l *loop) cleanup(ctx context.Context) {
	secs := l.r.cfg.retention.Seconds()
	total := int64(0)
	for ctx.Err() == nil {
		l.r.health.alive()
		tag, err := l.s.conn.Exec(ctx, l.q.cleanup, secs, l.r.cfg.cleanupBatch)
		if err != nil {
			if ctx.Err() == nil {
				l.r.log.Warn("outbox relay: cleanup", "err", err)
			}
			return
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(l.r.cfg.cleanupBatch) {
			break
		}
	}
	if total > 0 {
		l.r.log.Debug("outbox relay: cleaned up published rows", "rows", total)
	}
}
