package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/internal/sqlident"
	"github.com/protoevents/protoevents/runtime/internal/walrecord"
)

// The WAL source (WithWALSource): each event is a transactional logical
// decoding message whose content is the Kafka record the WAL relay sends,
// headers complete (nothing is left out for the relay to put back, as the
// table's rows do).

// SQL of the WAL source. $1 is always walrecord.Prefix.
const (
	// emitOne writes one event's message in the caller's transaction.
	emitOne = `SELECT pg_logical_emit_message(true, $1, $2::bytea)`
	// emitMany writes several in one round trip, in array order (a
	// function scan returns its rows in order, and each row's call runs as
	// it is read).
	emitMany = `SELECT count(pg_logical_emit_message(true, $1, m)) FROM unnest($2::bytea[]) AS m`
)

// walRecord encodes an event as the WAL relay will publish it.
func walRecord(topic string, key []byte, hs []kafka.Header, value []byte) []byte {
	r := walrecord.Record{Topic: topic, Key: key, Value: value, Headers: hs}
	return walrecord.Append(make([]byte, 0, walrecord.Size(r)), r)
}

// walStatement is the statement and arguments that emit rows' messages.
func walStatement(rows []row) (string, []any) {
	if len(rows) == 1 {
		return emitOne, []any{walrecord.Prefix, rows[0].record}
	}
	ms := make([][]byte, len(rows))
	for i, r := range rows {
		ms[i] = r.record
	}
	return emitMany, []any{walrecord.Prefix, ms}
}

// walSlotCheck reads, in the writer's transaction, whether wal_level is
// logical and the slot exists in this database and is not invalidated.
const walSlotCheck = `SELECT current_setting('wal_level') = 'logical',
  EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()
          AND slot_type = 'logical' AND coalesce(wal_status, '') <> 'lost')`

// walRecheck is how long a WAL Writer trusts a successful check.
const walRecheck = time.Minute

// ErrWALNotReady matches (errors.Is) a WAL-source write refused because
// wal_level is not logical or the Writer's slot does not exist (or was
// invalidated): no relay would ever read the event.
var ErrWALNotReady = errors.New("WAL source not ready")

// walSource reports whether the Writer emits messages (WithWALSource)
// rather than rows.
func (w *Writer) walSource() bool { return w.walSlot != "" }

// checkWALSlot validates a slot name given to WithWALSource ("" means no
// WAL source).
func checkWALSlot(slot string) error {
	if slot == "" {
		return nil
	}
	if err := sqlident.CheckSlot(slot); err != nil {
		return fmt.Errorf("outbox: WithWALSource: slot name: %w", err)
	}
	return nil
}

// walReady checks, at most once per walRecheck, that a WAL Writer's
// messages will be read. A Writer of the table has nothing to check.
func (w *Writer) walReady(ctx context.Context, q querier) error {
	if !w.walSource() {
		return nil
	}
	if last := w.walChecked.Load(); last != 0 && time.Since(time.Unix(0, last)) < walRecheck {
		return nil
	}
	var logical, slot bool
	if err := q.QueryRow(ctx, walSlotCheck, w.walSlot).Scan(&logical, &slot); err != nil {
		return fmt.Errorf("outbox: WAL source: check slot %q: %w", w.walSlot, err)
	}
	switch {
	case !logical:
		return fmt.Errorf("outbox: WAL source: %w: wal_level is not logical, so no relay could read the event: "+
			"run ALTER SYSTEM SET wal_level = logical, restart Postgres, then create slot %q (eventsctl wal setup)", ErrWALNotReady, w.walSlot)
	case !slot:
		return fmt.Errorf("outbox: WAL source: %w: replication slot %q does not exist in this database or was invalidated, so no relay would read the event: "+
			"create it before the first write (eventsctl wal setup, or walrelay.Setup); see docs/runbook.md, \"WAL relay\"", ErrWALNotReady, w.walSlot)
	}
	w.walChecked.Store(time.Now().UnixNano())
	return nil
}
