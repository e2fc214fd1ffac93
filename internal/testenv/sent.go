package testenv

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Sent records what a pool's connections send, statements alone and
// batches, as a pgx tracer: tests of round trips assert on what went to
// the database, not on timings.
type Sent struct {
	mu      sync.Mutex
	queries []string
	batches [][]string
}

// TracedPool opens a second pool on base's database whose connections
// record into the returned Sent; configure, if given, adjusts the pool's
// settings first (an exec mode, say). The pool closes with the test.
func TracedPool(t testing.TB, base *pgxpool.Pool, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, *Sent) {
	t.Helper()
	cfg := base.Config()
	for _, fn := range configure {
		fn(cfg)
	}
	sent := &Sent{}
	cfg.ConnConfig.Tracer = sent
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, sent
}

// Take returns what was sent since the last Take, alone and in batches
// (each batch as its queries' SQL), and forgets it.
func (s *Sent) Take() (queries []string, batches [][]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	queries, batches = s.queries, s.batches
	s.queries, s.batches = nil, nil
	return queries, batches
}

// Alone reports whether a statement starting with prefix (leading white
// space ignored) was sent on its own.
func (s *Sent) Alone(prefix string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range s.queries {
		if strings.HasPrefix(strings.TrimSpace(q), prefix) {
			return true
		}
	}
	return false
}

// Batch reports whether a batch was sent holding consecutive queries that
// start with the given prefixes, in order (leading white space ignored).
func (s *Sent) Batch(prefixes ...string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.batches {
		for i := 0; i+len(prefixes) <= len(b); i++ {
			ok := true
			for j, p := range prefixes {
				if !strings.HasPrefix(strings.TrimSpace(b[i+j]), p) {
					ok = false
					break
				}
			}
			if ok {
				return true
			}
		}
	}
	return false
}

// TraceQueryStart records a statement sent on its own.
func (s *Sent) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queries = append(s.queries, d.SQL)
	return ctx
}

// TraceQueryEnd does nothing.
func (s *Sent) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart records a batch.
func (s *Sent) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	sqls := make([]string, len(d.Batch.QueuedQueries))
	for i, q := range d.Batch.QueuedQueries {
		sqls[i] = q.SQL
	}
	s.batches = append(s.batches, sqls)
	return ctx
}

// TraceBatchQuery does nothing.
func (s *Sent) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd does nothing.
func (s *Sent) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
