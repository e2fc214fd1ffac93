package walrelay

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/segmentio/kafka-go"

	"github.com/protoevents/protoevents/runtime/internal/walrecord"
)

// txn is one committed transaction's records, handed to the lanes in
// commit order.
type txn struct {
	msgs   []kafka.Message
	end    pglogrepl.LSN // the commit record's end: confirming it skips the transaction
	commit time.Time
	// parts counts the lanes' shares not yet acknowledged; the last lane
	// to publish its share acknowledges the transaction.
	parts atomic.Int32
	acked bool // in the watermark, under its mutex
}

// part is one lane's share of a transaction: the records of the keys the
// lane owns, in commit order.
type part struct {
	t    *txn
	msgs []kafka.Message
}

// laneOf is the lane of a key: one key, one lane, so the lane's order is
// the key's commit order.
func laneOf(key []byte, lanes int) int {
	h := fnv.New32a()
	_, _ = h.Write(key)
	return int(h.Sum32() % uint32(lanes))
}

// stream reads the slot over one replication connection, which it alone
// uses: it decodes pgoutput into transactions for the publisher and sends
// the standby status updates that confirm the watermark.
type stream struct {
	conn  *pgconn.PgConn
	cfg   *config
	wm    *watermark
	lanes []chan part
	// drain bounds the hand-over of a transaction already begun: once
	// its first share is queued, the rest follow even after the
	// stream's context ends (else the lanes would publish half of it),
	// until the shutdown grace ends.
	drain      context.Context
	cur        *txn // the transaction being read; nil between transactions
	nextStatus time.Time
}

// pluginArgs start pgoutput with logical decoding messages on: the
// publication lists no table, so the messages are all that comes.
func pluginArgs(publication string) []string {
	return []string{"proto_version '1'", fmt.Sprintf("publication_names '%s'", publication), "messages 'true'"}
}

// run reads until ctx is done or the connection fails.
func (s *stream) run(ctx context.Context) error {
	var rd readDeadline
	defer rd.stop()
	for {
		if !time.Now().Before(s.nextStatus) {
			if err := s.status(ctx); err != nil {
				return err
			}
		}
		raw, err := s.conn.ReceiveMessage(rd.until(ctx, s.nextStatus))
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("walrelay: read the slot: %w", err)
		}
		switch m := raw.(type) {
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("walrelay: read the slot: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyData:
			if err := s.copyData(ctx, m.Data); err != nil {
				return err
			}
		}
	}
}

// readDeadline is one read context per status deadline, not one per
// message: a context with a deadline is a timer and an allocation, and a
// busy slot sends tens of thousands of messages a second.
type readDeadline struct {
	ctx    context.Context
	cancel context.CancelFunc
	end    time.Time
}

// until returns a context of parent that ends at end, reusing the last one
// while end is the same.
func (r *readDeadline) until(parent context.Context, end time.Time) context.Context {
	if r.ctx == nil || !r.end.Equal(end) {
		r.stop()
		r.ctx, r.cancel = context.WithDeadline(parent, end)
		r.end = end
	}
	return r.ctx
}

func (r *readDeadline) stop() {
	if r.cancel != nil {
		r.cancel()
	}
}

func (s *stream) copyData(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("walrelay: keepalive: %w", err)
		}
		if s.cur == nil {
			s.wm.idle(k.ServerWALEnd)
		}
		if k.ReplyRequested {
			s.nextStatus = time.Time{}
		}
	case pglogrepl.XLogDataByteID:
		x, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("walrelay: WAL data: %w", err)
		}
		return s.logical(ctx, x.WALData)
	}
	return nil
}

// logical handles one pgoutput message.
func (s *stream) logical(ctx context.Context, data []byte) error {
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("walrelay: decode pgoutput: %w", err)
	}
	switch m := msg.(type) {
	case *pglogrepl.BeginMessage:
		s.cur = &txn{commit: m.CommitTime}
	case *pglogrepl.LogicalDecodingMessage:
		if m.Prefix != walrecord.Prefix {
			if !m.Transactional && s.cur == nil {
				s.wm.idle(m.LSN) // a heartbeat, or someone else's message
			}
			return nil
		}
		// The content is the connection's read buffer, reused by the next
		// receive: the record keeps slices of its own copy.
		rec, err := walrecord.Decode(bytes.Clone(m.Content))
		if err != nil {
			// Only outbox Writers write this prefix: a record this relay
			// cannot read is from a newer version. Stop here rather than
			// skip it; /readyz and the log say why.
			return fmt.Errorf("walrelay: the message at %v: %w", m.LSN, err)
		}
		km := kafkaMessage(rec)
		if !m.Transactional || s.cur == nil {
			// Not written by an outbox Writer (they are transactional):
			// published on its own, confirmed at its position (a restart
			// sends it again rather than skip it).
			return s.hand(ctx, &txn{msgs: []kafka.Message{km}, end: m.LSN, commit: time.Now()})
		}
		s.cur.msgs = append(s.cur.msgs, km)
	case *pglogrepl.CommitMessage:
		t := s.cur
		s.cur = nil
		if t == nil {
			return nil
		}
		t.end = m.TransactionEndLSN
		if len(t.msgs) == 0 {
			s.wm.idle(t.end)
			return nil
		}
		return s.hand(ctx, t)
	}
	return nil
}

// kafkaMessage is the record as the relay sends it.
func kafkaMessage(r walrecord.Record) kafka.Message {
	return kafka.Message{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers}
}

// hand gives t's shares to their lanes, still confirming on time while a
// lane is busy (a connection without status updates for
// wal_sender_timeout is closed by the server).
func (s *stream) hand(ctx context.Context, t *txn) error {
	s.wm.hand(t)
	n := len(s.lanes)
	if n == 1 {
		t.parts.Store(1)
		return s.send(ctx, 0, part{t: t, msgs: t.msgs})
	}
	shares := make([][]kafka.Message, n)
	parts := int32(0)
	for _, m := range t.msgs {
		l := laneOf(m.Key, n)
		if shares[l] == nil {
			parts++
		}
		shares[l] = append(shares[l], m)
	}
	t.parts.Store(parts)
	first := true
	for l, msgs := range shares {
		if msgs == nil {
			continue
		}
		c := s.drain
		if first {
			c, first = ctx, false
		}
		if err := s.send(c, l, part{t: t, msgs: msgs}); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// send queues p on lane l.
func (s *stream) send(ctx context.Context, l int, p part) error {
	select {
	case s.lanes[l] <- p: // the lane has room: no timer needed
		return nil
	default:
	}
	for {
		wait := time.NewTimer(time.Until(s.nextStatus))
		select {
		case s.lanes[l] <- p:
			wait.Stop()
			return nil
		case <-ctx.Done():
			wait.Stop()
			return ctx.Err()
		case <-wait.C:
			if err := s.status(ctx); err != nil {
				return err
			}
		}
	}
}

// end closes the stream the way the protocol does (CopyDone, then the
// server's own), which makes the server read the last status update
// before the connection closes. Closing at once would lose it when the
// server is still sending: a socket closed with unread data is reset, and
// the reset discards what the server had received but not yet read, so a
// graceful stop would re-send everything since the last periodic update.
// What arrives meanwhile is discarded: it is past the confirmed position.
func (s *stream) end(ctx context.Context) {
	if dl, ok := ctx.Deadline(); ok {
		// SendStandbyCopyDone reads without a context.
		_ = s.conn.Conn().SetDeadline(dl)
		defer func() { _ = s.conn.Conn().SetDeadline(time.Time{}) }()
	}
	if _, err := pglogrepl.SendStandbyCopyDone(ctx, s.conn); err != nil {
		s.cfg.log.Debug("walrelay: end the stream", "err", err)
	}
}

// status confirms the watermark to the server.
func (s *stream) status(ctx context.Context) error {
	pos := s.wm.confirm()
	if err := pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pos, WALFlushPosition: pos, WALApplyPosition: pos, ClientTime: time.Now(),
	}); err != nil {
		return fmt.Errorf("walrelay: confirm %v: %w", pos, err)
	}
	s.nextStatus = time.Now().Add(s.cfg.statusInterval)
	return nil
}
