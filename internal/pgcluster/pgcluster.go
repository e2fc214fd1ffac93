// Package pgcluster forwards to the public eventstest/pgcluster, where the
// throwaway Postgres cluster now lives; it remains so that code written
// against the internal path keeps compiling. New code imports
// github.com/protoevents/protoevents/eventstest/pgcluster.
package pgcluster

import (
	"context"

	"github.com/protoevents/protoevents/eventstest/pgcluster"
)

// Cluster is pgcluster.Cluster.
type Cluster = pgcluster.Cluster

// Start is pgcluster.Start.
func Start(ctx context.Context) (*Cluster, error) { return pgcluster.Start(ctx) }
