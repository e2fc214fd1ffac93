{{- /*
consumer.sql: the idempotent consumer's dedup table, rendered by
consumer.Migrate. Data: .Table (quoted, possibly schema-qualified table),
.Index (quoted index name, unqualified: it lives in the table's schema).

event_id holds the event's ULID as uuid: the same 128 bits, 16 bytes on
disk instead of 26 characters of text, which keeps the hot primary-key
index small. consumed_at drives pruning (consumer.Prune).
*/ -}}
CREATE TABLE IF NOT EXISTS {{.Table}} (
    consumer    text        NOT NULL,
    event_id    uuid        NOT NULL,
    consumed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX IF NOT EXISTS {{.Index}} ON {{.Table}} (consumed_at);
{{- define "consumer_migrate_lock"}}
SELECT pg_advisory_xact_lock(hashtextextended('protoevents.consumer.migrate:' || $1, 0))
{{- end}}
{{- define "consumer_dedup"}}
INSERT INTO {{.Table}} (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING
{{- end}}
{{- define "consumer_dedup_batch"}}
INSERT INTO {{.Table}} (consumer, event_id) SELECT $1, id FROM unnest($2::uuid[]) AS t(id) ON CONFLICT DO NOTHING RETURNING event_id
{{- end}}
{{- define "consumer_undo_batch"}}
DELETE FROM {{.Table}} WHERE consumer = $1 AND event_id = ANY($2::uuid[])
{{- end}}
{{- define "consumer_applied"}}
SELECT EXISTS (SELECT 1 FROM {{.Table}} WHERE consumer = $1 AND event_id = $2)
{{- end}}
{{- define "consumer_prune"}}
DELETE FROM {{.Table}} WHERE ctid IN (
    SELECT ctid FROM {{.Table}} WHERE consumed_at < now() - $1::interval LIMIT $2
)
{{- end}}
