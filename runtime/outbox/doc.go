// Package outbox writes events into a Postgres outbox table inside the
// caller's own transaction and relays them to Kafka.
//
// The writer and the relay give at-least-once delivery with per-key order:
// an event is a row in the same transaction as the business change (no
// phantom events, no lost ones), and the relay marks a row published only
// after the broker acknowledged it (acks=all), so a crash re-sends rather
// than loses. Rows are spread over key-hash lanes; each lane is owned by one
// relay at a time and sent strictly in id order, so several relay instances
// can run without re-ordering any key.
//
// # The relay
//
// A Relay publishes outbox rows to Kafka: at least once, in order per key,
// from any number of instances at the same time. How it does so follows.
//
// # Order across instances: key-hash lanes
//
// Every row has a lane, hash(key) mod the table's lane count, computed by
// Postgres when the row is inserted. A relay works only the lanes it owns,
// each strictly in id order; it owns a lane by holding a session-level
// advisory lock on (table OID, lane). Relays announce themselves with a
// shared lock on (table OID, 2^31-1) and every rebalance interval each one
// counts the announced relays and keeps at most ceil(lanes/relays) lanes,
// giving up extra ones when nothing is in flight and taking free ones. All
// of a relay's locks and its claims live on one connection, so a crashed or
// partitioned relay loses its lanes exactly when its session ends.
//
// # Finding rows: adaptive polling
//
// The relay polls its lanes' pending rows (a partial index on id): right
// after work a millisecond after its last look, doubling the delay on every
// empty poll up to the poll interval (WithPollInterval, default 100ms),
// except while rows arrive less than 20ms apart on average (the hot
// window), when it keeps polling every millisecond: a relay in a process of
// its own thus follows a steady flow closely without wake-ups. A
// Writer in the same process wakes it at once (Writer.Notify): a CommitTx
// right after its COMMIT, when one poll finds the rows; a Write on another
// transaction (or a CommitTx sending its held rows before its last
// statement) right after its insert, followed by quick polls that catch the
// caller's commit. There is no NOTIFY trigger: it would serialise the
// commits of all outbox writers (docs/design.md).
//
// # Pipelined batches
//
// A batch is claimed (the first rows of the owned lanes in id order,
// without a transaction: the lanes are exclusive), published with one
// kafka-go WriteMessages call (per-message topic, key = event key,
// acks=all, murmur2 partitioning like the Java client) and marked
// published in one UPDATE. While a batch is in flight the relay marks the
// previous one and claims the next (excluding the rows in flight), so the
// database work overlaps the produce round trip: at once when rows are
// known or likely to wait (the last claim left some, a wake-up came, or the
// poll delay passed), else as soon as a wake-up comes before the
// acknowledgement. At most one batch is in
// flight: the next is sent only once the previous one is acknowledged, and
// without the rows of keys that failed in it, so a key's events never
// overtake each other. The batch size adapts to the backlog: it starts at
// 64 rows, doubles while batches come back full, up to WithBatchSize
// (default 500), and halves when they come back mostly empty.
//
// With WithWorkers(n) one Run holds n such pipelines, each with its own
// session and its own share of the lanes, exactly as n relays would: the
// database work of n batches overlaps, and order holds as across relays.
//
// # Partial failures
//
// kafka-go splits a call by partition and writes each partition's share as
// a sequence of produce requests. The relay sizes those (BatchSize = batch
// size, BatchBytes above the batch byte cap WithMaxBatchBytes) so that each
// share is exactly one request, which the broker appends or refuses as a
// whole: a key's events in one batch are never half written. When some
// partitions fail (kafka.WriteErrors), the relay marks a row only if it was
// acknowledged and no earlier row of the same topic and key in the batch
// failed; the others stay pending with attempts/last_error recorded. Their
// keys are parked: the claim skips every row of a parked key until the
// key's own exponential, jittered backoff ends, so a key is never published
// past one of its own unpublished events, while the keys behind it in the
// lanes (on healthy partitions) keep flowing. A topic the broker refuses as
// a whole (unknown, invalid or not authorized: kafka-go fails the entire
// call for it, before sending anything) is parked the same way, with its
// own backoff: the claim skips all of its rows, so however many of them
// fill the head of the lanes, the other topics' rows behind them flow; a
// key lives on one topic, so this keeps every key's order. When a batch
// gets nothing through and parks no topic, the whole relay backs off. Rows
// re-sent after a failure or crash are duplicates with the same event_id,
// which consumers deduplicate.
//
// # Shutdown and takeover
//
// When ctx ends, the batch in flight gets the shutdown grace
// (WithShutdownGrace, default 5s) to be acknowledged and marked; only a
// batch still unacknowledged after it is abandoned (its rows stay pending
// and are re-sent). If a relay's database session dies while its publish is
// still in flight, the lanes' next owner re-sends from the same first
// pending row. Both batches are contiguous runs of each key's events, each
// appended atomically per partition, so after deduplication by event_id
// every key is still in order, although the raw log may then hold a stale
// duplicate after newer events.
//
// # Health
//
// Health, LiveHandler and ReadyHandler report whether the relay runs, can
// reach the database and the brokers (checked every WithHealthInterval and
// by its own work) and makes progress. Run waits for both at start, with
// backoff, and never returns on an outage; repeated identical errors are
// logged once and then summarised (WithLogInterval), recoveries are logged.
// A failure against either has it checked at once, then every half second
// while it is down; the check that sees it back ends the backoff the relay
// is sleeping out, so it resumes within about half a second of the return.
//
// # Hooks and fault injection
//
// WithHooks installs the relay's observability callbacks (Hooks: batch
// sizes, published rows, failures, pending rows, owned lanes), which
// runtime/prommetrics and runtime/otelmetrics adapt. Fault points for tests
// — a crash between the broker's acknowledgement and the mark, a look at
// every claimed batch — are not options: a test arms them in the context
// it gives Run, with runtime/faultinject.Relay.
//
// # Options
//
// Options follow one style: a constructor takes its required dependencies
// positionally (NewRelay(pool, brokers, opts...)) and everything else as
// functional options of one type per constructor family, each With...
// function documenting its default and range. An option out of range makes
// the constructor return an error prefixed "outbox: ". There are three
// option types: Option (Migrate, Status and the stuck-row operations,
// which all act on the table), WriterOption (NewWriter) and RelayOption
// (NewRelay); WithTable is all three, since they must agree on the table.
//
// The relay's producer is kafka-go's, configured by the relay itself: its
// settings for the relay's guarantees (acks=all, synchronous writes,
// per-message topics, murmur2 partitioning, batch limits) are fixed, and
// WithTLS, WithSASL, WithWriteTimeout and WithMaxAttempts are what a
// deployment adjusts; only WithSASL takes a kafka-go type.
//
// # Known limits
//
// Rows for a topic that does not exist (the relay never asks the brokers to
// create one) stay pending, the topic parked and retried with backoff
// (up to WithBackoff's maximum), until the topic is created; other topics
// flow meanwhile and the error is in TableStatus.LastError. The lane count
// is fixed per table.
package outbox

// The relay's code is split by job (docs/design.md, "The relay's code, by
// job"): relay.go (the type, NewRelay, Run and its lifecycle), scheduler.go
// (a lane worker's loop: its session, the periodic tasks, idle waits and
// wake-ups), pacer.go (the adaptive batch size and idle poll delay, owned by
// one type), claim.go (per-lane quota claims), publish.go (the pipeline:
// send, judge partial failures, mark), park.go (parked keys and topics),
// cleanup.go (deleting published rows past the retention), health.go,
// trace.go and wakeup.go.
