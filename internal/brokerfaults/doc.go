// Package brokerfaults holds the broker-fault tests: the whole pipeline
// (writers → outbox → relay → Apache Kafka → idempotent consumer → effects)
// on a real three-node cluster (replication factor 3,
// min.insync.replicas=2, unclean leader election off) while nodes are
// killed with SIGKILL, stopped, restarted, or the topic grows. Each test
// ends with the same invariant check: nothing lost, nothing applied twice,
// per-key order after dedup, nothing dead-lettered for an infrastructure
// fault, and recovery without an operator.
//
// They run in the real tier only (PROTOEVENTS_TEST_KAFKA=apache, make
// test-kafka): the package has no code of its own.
package brokerfaults
