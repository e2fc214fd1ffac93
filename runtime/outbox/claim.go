package outbox

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/protoevents/protoevents/runtime/internal/faults"
)

// rowMeta is what the relay knows of a claimed row beside its message: the
// fault points' description of it, which they get as is.
type rowMeta = faults.Row

// claimed is one claimed row with what publishing needs.
type claimed struct {
	rowMeta
	value   []byte
	headers string
}

// claim reads the next batch of the owned lanes: the first pending rows of
// each lane, as many as its quota (quotas), without those in flight and
// those of keys and topics parked now; it returns them in id order and
// adapts the batch size and the quotas.
func (l *loop) claim(ctx context.Context, inFlight []claimed) ([]claimed, error) {
	exclude := make([]int64, len(inFlight))
	for i := range inFlight {
		exclude[i] = inFlight[i].ID
	}
	// The next look is timed from the end of this one: a claim slower
	// than the poll delay must not be followed by another at once.
	defer func() { l.lastLook = time.Now() }()
	lanes, quotas := l.quotas()
	var rows pgx.Rows
	var err error
	if keyTopics, keys, topics := l.parkedNow(); len(keys) > 0 || len(topics) > 0 {
		rows, err = l.s.conn.Query(ctx, l.q.claimUnparked, lanes, quotas, exclude, keyTopics, keys, topics)
	} else {
		rows, err = l.s.conn.Query(ctx, l.q.claim, lanes, quotas, exclude)
	}
	if err != nil {
		return nil, dbErr(fmt.Errorf("outbox: relay: claim: %w", err))
	}
	var batch []claimed
	var c claimed
	_, err = pgx.ForEachRow(rows, []any{&c.ID, &c.EventID, &c.EventType, &c.Topic, &c.Key, &c.Lane, &c.value, &c.headers, &c.Attempts}, func() error {
		batch = append(batch, c)
		return nil
	})
	if err != nil {
		return nil, dbErr(fmt.Errorf("outbox: relay: claim: %w", err))
	}
	l.r.dep(depDatabase, nil)
	// The rows come lane after lane, every lane's in id order. Cut to the
	// batch size in id order, the batch still holds a first part of every
	// lane's rows.
	slices.SortFunc(batch, func(a, b claimed) int { return cmp.Compare(a.ID, b.ID) })
	more := l.noteDemand(batch, lanes, quotas)
	// More rows than the batch size: every lane was asked for more than
	// its even share, and together they hold more (a backlog). The pacer
	// then grows the batch to what it may hold at once; the rest waits.
	l.backlog = more || len(batch) > l.pace.batch()
	batch = batch[:l.pace.observe(len(batch), more, time.Now())]
	if f := l.faults.AfterClaim; f != nil && len(batch) > 0 {
		f(ctx, faultRows(batch))
	}
	return batch, nil
}

// quotas splits the batch size among the owned lanes: how many rows the
// claim reads from each (lanes with none are left out). Every set of
// per-lane quotas keeps per-key order, since the claim takes each lane's
// first rows; so the quotas follow the demand the last claim saw
// (noteDemand), in three parts that add up to the batch size:
//
//   - one row a lane, so that rows arriving in an idle lane go out at the
//     next claim (with more lanes than the batch holds, half the batch,
//     one row a lane to lanes taken in turn);
//   - to each lane that gave fewer rows than its quota, as many as it gave
//     (what arrives there between claims);
//   - the rest evenly to the lanes that gave their whole quota (they hold
//     more), or to every lane if none did.
//
// So a claim reads its batch and nothing more, a lane that turns busy
// shares the batch with the others at the next claim, and a backlog in
// one lane fills the batch but for one row per other lane. With no demand
// seen (the first claim, or one after an empty claim) every lane gets
// twice its even share (at least minLaneQuota, at most the batch size),
// and claim cuts the rows to the batch size in id order.
func (l *loop) quotas() (lanes, quotas []int) {
	owned := l.s.owned
	limit := l.pace.batch()
	n := len(owned)
	if n == 0 {
		return nil, nil
	}
	if len(l.demand) == 0 {
		q := min(limit, max(minLaneQuota, (2*limit+n-1)/n))
		quotas = make([]int, n)
		for i := range quotas {
			quotas[i] = q
		}
		return owned, quotas
	}
	q := make([]int, n)
	left := limit
	reserve := n
	if left < n {
		reserve = left / 2
	}
	for k := range reserve {
		q[(l.turn+k)%n]++
	}
	left -= reserve
	var full []int
	for i, lane := range owned {
		switch d, ok := l.demand[lane]; {
		case ok && d.full:
			full = append(full, i)
		case ok && left > 0:
			give := min(d.got, left)
			q[i] += give
			left -= give
		}
	}
	if len(full) == 0 {
		full = make([]int, n)
		for i := range full {
			full[i] = i
		}
	}
	share, extra := left/len(full), left%len(full)
	for k, i := range full {
		q[i] += share
		if (k+l.turn)%len(full) < extra {
			q[i]++
		}
	}
	l.turn = (l.turn + max(reserve, 1)) % n
	lanes, quotas = make([]int, 0, n), make([]int, 0, n)
	for i, lane := range owned {
		if q[i] > 0 {
			lanes = append(lanes, lane)
			quotas = append(quotas, q[i])
		}
	}
	return lanes, quotas
}

// minLaneQuota is the least a lane is asked for when no demand is known:
// reading a few more rows of each lane costs less than the round trip of
// a claim that a tiny quota would leave short.
const minLaneQuota = 32

// laneDemand is what one lane gave the last claim.
type laneDemand struct {
	got  int
	full bool // it gave its whole quota: it may hold more
}

// noteDemand records what each lane gave the batch, for the next quotas
// (an empty claim forgets the demand); it reports whether any lane gave
// its whole quota, that is whether rows may be waiting beyond the batch.
func (l *loop) noteDemand(batch []claimed, lanes, quotas []int) bool {
	got := make(map[int]int, len(lanes))
	for i := range batch {
		got[batch[i].Lane]++
	}
	clear(l.demand)
	if len(batch) == 0 {
		return false
	}
	if l.demand == nil {
		l.demand = make(map[int]laneDemand, len(lanes))
	}
	more := false
	for i, lane := range lanes {
		d := laneDemand{got: got[lane], full: got[lane] >= quotas[i]}
		more = more || d.full
		l.demand[lane] = d
	}
	return more
}

// faultRows describes a batch to a fault point.
func faultRows(batch []claimed) []faults.Row {
	rows := make([]faults.Row, len(batch))
	for i := range batch {
		rows[i] = batch[i].rowMeta
	}
	return rows
}
