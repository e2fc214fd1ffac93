package consumer

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/protoevents/protoevents/runtime/internal/health"
)

// Health is a consumer's liveness and readiness, as Consumer.Health reports
// it, for an orchestrator's probes.
type Health struct {
	// Live is true from Run's start until it returns: a consumer that is
	// not live has stopped (restart the process).
	Live bool
	// Ready is true when the consumer is live, has joined its group (its
	// partitions started, the first generation handed out), its topics
	// exist, the brokers and the database answered their last checks and
	// no partition is retrying a transient database failure. Problems says
	// why not.
	Ready bool
	// Problems are the reasons for not being live or ready, for people.
	Problems []string
	// Partitions is the number of partitions this member consumes now.
	Partitions int
	// Database is the outcome of the last database check ("" before the
	// first one), and DatabaseChecked when it was.
	Database        string
	DatabaseChecked time.Time
}

// String renders the health as the lines LiveHandler and ReadyHandler
// serve.
func (h Health) String() string {
	var b strings.Builder
	switch {
	case !h.Live:
		b.WriteString("not live\n")
	case h.Ready:
		b.WriteString("ready\n")
	default:
		b.WriteString("live, not ready\n")
	}
	for _, p := range h.Problems {
		fmt.Fprintf(&b, "problem: %s\n", p)
	}
	fmt.Fprintf(&b, "partitions: %d consumed\n", h.Partitions)
	if !h.DatabaseChecked.IsZero() {
		fmt.Fprintf(&b, "database: %s (checked %s ago)\n", h.Database, time.Since(h.DatabaseChecked).Round(time.Millisecond))
	}
	return b.String()
}

// healthState is what Health reads; Run and the partitions write it.
type healthState struct {
	live       atomic.Bool
	waiting    atomic.Bool  // waiting for missing topics
	joinErr    atomic.Value // string: the last group join failure, "" once joined
	partitions atomic.Int64 // partitions running now
	failing    atomic.Int64 // partitions in a streak of transient database failures

	mu        sync.Mutex
	dbErr     string
	dbChecked time.Time

	// db is the database as the background check sees it: a partition
	// sleeping after a transient database failure wakes when the check
	// sees the database back (docs/design.md, "Recovery at the speed of
	// the dependency").
	db health.Watch

	kafkaErr string // the last broker check's error, "" when it answered
	// kafka is the brokers as the background check sees them, for
	// readiness: kafka-go's group loop only logs a failed join and keeps
	// the last generation, so without it /readyz said ready for the whole
	// of a broker outage.
	kafka health.Watch
}

// healthCheckInterval is how often Run checks the database for Health
// (every health.RecheckInterval while it is down, and at once when a
// partition meets a transient failure), and healthCheckTimeout how long
// one check may take.
const (
	healthCheckInterval = 5 * time.Second
	healthCheckTimeout  = 2 * time.Second
)

// checkDatabase checks the database until ctx ends (health.Watch.Run).
func (c *Consumer) checkDatabase(ctx context.Context) {
	c.health.db.Run(ctx, healthCheckInterval, c.pingDatabase)
}

// pingDatabase is one database check: a ping, its outcome recorded for
// Health.
func (c *Consumer) pingDatabase(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, healthCheckTimeout)
	err := c.db.Ping(pctx)
	cancel()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	c.health.mu.Lock()
	c.health.dbChecked = time.Now()
	c.health.dbErr = ""
	if err != nil {
		c.health.dbErr = err.Error()
	}
	c.health.mu.Unlock()
	if err != nil {
		return fmt.Errorf("consumer: database check: %w", err)
	}
	return nil
}

// checkKafka checks the brokers until ctx ends: a metadata request for the
// consumed topics (which never creates them), every healthCheckInterval and
// every health.RecheckInterval while they do not answer.
func (c *Consumer) checkKafka(ctx context.Context) {
	c.health.kafka.Run(ctx, healthCheckInterval, func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, healthCheckTimeout)
		_, err := partitionCounts(cctx, c.s.dialer, c.brokers, c.topics)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c.health.mu.Lock()
		c.health.kafkaErr = ""
		if err != nil {
			c.health.kafkaErr = err.Error()
		}
		c.health.mu.Unlock()
		if err != nil {
			return fmt.Errorf("consumer: kafka check: %w", err)
		}
		return nil
	})
}

// Health reports the consumer's liveness and readiness. It does no I/O:
// Run checks the database in the background and records its own progress.
func (c *Consumer) Health() Health {
	h := Health{
		Live:       c.health.live.Load(),
		Partitions: int(c.health.partitions.Load()),
	}
	c.health.mu.Lock()
	h.DatabaseChecked = c.health.dbChecked
	dbErr, kafkaErr := c.health.dbErr, c.health.kafkaErr
	c.health.mu.Unlock()
	h.Database = "reachable"
	if dbErr != "" {
		h.Database = "unreachable: " + dbErr
	}
	if !h.Live {
		h.Problems = append(h.Problems, "Run is not running")
		return h
	}
	if c.health.waiting.Load() {
		h.Problems = append(h.Problems, "waiting for missing topics to be created (see the WARN log for which)")
	}
	select {
	case <-c.ready:
	default:
		msg := "not yet joined the consumer group " + c.groupID
		if e, _ := c.health.joinErr.Load().(string); e != "" {
			msg += ": " + e
		}
		h.Problems = append(h.Problems, msg)
	}
	if dbErr != "" {
		h.Problems = append(h.Problems, "database unreachable: "+dbErr)
	}
	if kafkaErr != "" {
		h.Problems = append(h.Problems, "kafka unreachable: "+kafkaErr)
	}
	if n := c.health.failing.Load(); n > 0 {
		h.Problems = append(h.Problems, fmt.Sprintf("%d partition(s) retrying a transient database failure", n))
	}
	h.Ready = len(h.Problems) == 0
	return h
}

// LiveHandler serves the consumer's liveness: 200 and the health text
// while Run runs, 503 otherwise. Mount it at /livez.
func (c *Consumer) LiveHandler() http.Handler { return health.Live(c.check) }

// ReadyHandler serves the consumer's readiness: 200 and the health text
// when ready, 503 otherwise. Mount it at /readyz.
func (c *Consumer) ReadyHandler() http.Handler { return health.Ready(c.check) }

// check is the consumer's health in the shape of the runtime's probes.
func (c *Consumer) check() (text string, live, ready bool) {
	h := c.Health()
	return h.String(), h.Live, h.Ready
}
