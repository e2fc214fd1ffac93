{{- /*
The outbox table of runtime/outbox, rendered by outbox.Migrate inside one
transaction that holds an advisory lock, so it is safe to run concurrently and
repeatedly. Every name below is already a quoted identifier or literal.

  .Table          schema-qualified table, e.g. "public"."outbox"
  .Schema         its schema
  .PendingIndex   partial index on pending rows by lane (the relay's scan)
  .OldPendingIndex the pending index of earlier versions (id only), dropped
  .PublishedIndex partial index on published rows (the cleanup's scan)
  .FixedIDIndex   partial unique index on the event IDs the producer fixed
  .TableLiteral   .Table as a string literal (for regclass inside DO blocks)
  .Trigger        the NOTIFY trigger of earlier versions, dropped here
  .Lanes          number of key-hash lanes (fixed when the table is created)
  .Comment        table comment as a string literal; records the lane count
*/ -}}
CREATE TABLE IF NOT EXISTS {{.Table}} (
    -- id is the publish order: the relay sends each lane's rows in id order.
    id           bigserial   PRIMARY KEY,
    -- event_id is the envelope's ULID, what consumers deduplicate on.
    event_id     text        NOT NULL,
    event_type   text        NOT NULL,
    topic        text        NOT NULL,
    key          bytea       NOT NULL,
    -- lane partitions the rows by key hash; one relay at a time owns a lane
    -- (session advisory lock), which keeps per-key order across relays. The
    -- writer's INSERT computes it, (hashtext(encode(key, 'hex')) & 2147483647)
    -- % {{.Lanes}}, in the statement Postgres plans once; tables of earlier
    -- versions generate the same value in a column that re-plans its
    -- expression on every insert, and keep doing so (docs/design.md, "The
    -- lane comes with the INSERT").
    lane         integer     NOT NULL,
    -- value and headers are the encoded envelope. For the envelope formats
    -- (JSON, Protobuf) headers leave out ce_specversion, ce_id and ce_type,
    -- which the relay puts back from event_id and event_type.
    value        bytea       NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '[]',
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    attempts     integer     NOT NULL DEFAULT 0,
    last_error   text,
    -- fixed_event_id marks an event ID the producer chose
    -- (events.WithEventID) rather than a fresh ULID; only those are
    -- checked for duplicates (see the index below).
    fixed_event_id boolean   NOT NULL DEFAULT false
);

-- Tables of earlier versions: the column is added without a rewrite.
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS fixed_event_id boolean NOT NULL DEFAULT false;

COMMENT ON TABLE {{.Table}} IS {{.Comment}};

-- The relay's scan: each lane's pending rows in id order, so a claim reads
-- the heads of its own lanes and stops, whatever the planner's statistics
-- say about the backlog. Partial, so it stays small however many published
-- rows are kept for the retention period.
CREATE INDEX IF NOT EXISTS {{.PendingIndex}} ON {{.Table}} (lane, id) WHERE published_at IS NULL;

-- Earlier versions indexed pending rows by id alone: a claim filtered the
-- other lanes' rows out of the heap, and with stale statistics (a backlog
-- that grew since the last ANALYZE) the planner read and sorted every
-- pending row for each batch.
DROP INDEX IF EXISTS {{.Schema}}.{{.OldPendingIndex}};

-- The cleanup's scan: published rows by age.
CREATE INDEX IF NOT EXISTS {{.PublishedIndex}} ON {{.Table}} (published_at) WHERE published_at IS NOT NULL;

-- A producer that fixes an event ID (to publish idempotently) is refused a
-- duplicate by this index. Fresh ULIDs (80 random bits per millisecond)
-- do not collide and are not indexed: a unique index on every row cost the
-- write path and every relay mark an index entry (docs/design.md, "Unique
-- event IDs: only the fixed ones are indexed"). Consumers deduplicate on
-- event_id whatever the outbox does.
CREATE UNIQUE INDEX IF NOT EXISTS {{.FixedIDIndex}} ON {{.Table}} (event_id) WHERE fixed_event_id;

-- Earlier versions made every event_id unique; drop that constraint,
-- whatever Postgres named it.
DO $$
DECLARE
    c name;
BEGIN
    FOR c IN
        SELECT con.conname FROM pg_constraint con
        JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attname = 'event_id'
        WHERE con.conrelid = {{.TableLiteral}}::regclass AND con.contype = 'u' AND con.conkey = ARRAY[a.attnum]
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', {{.TableLiteral}}, c);
    END LOOP;
END
$$;

-- Earlier versions woke the relays with a statement-level NOTIFY trigger.
-- NOTIFY makes every committing writer take the database-wide notify-queue
-- lock from pre-commit through the commit's flush, which serialises the
-- commits of all outbox writers; the relays now poll the pending index
-- adaptively instead (docs/design.md, "Waking the relay"). Drop the
-- trigger, and its function once no other outbox table uses it.
DROP TRIGGER IF EXISTS {{.Trigger}} ON {{.Table}};
DO $$
BEGIN
    DROP FUNCTION IF EXISTS {{.Schema}}.protoevents_outbox_notify();
EXCEPTION WHEN dependent_objects_still_exist THEN
    NULL; -- another outbox table in this schema still has its trigger
END
$$;
