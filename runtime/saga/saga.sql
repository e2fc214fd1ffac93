{{- /*
saga.sql: the orchestrated sagas' state and path tables, rendered by
saga.Migrate. Data: .Table and .History (quoted, possibly schema-qualified
tables), .DueIndex (quoted index name, unqualified).

One row per saga instance in .Table: its status, the step it is at, its
data (JSON), the command it waits for a reply to (awaiting: that command's
event ID, which the reply carries as its causation ID) and its deadline (a
step timeout or a compensation retry), which the timeout runner scans with
FOR UPDATE SKIP LOCKED. version counts transitions. .History is the path:
one row per transition with the event consumed and the command sent.
*/ -}}
CREATE TABLE IF NOT EXISTS {{.Table}} (
    saga_id       text        PRIMARY KEY,
    saga_type     text        NOT NULL,
    status        text        NOT NULL,
    step          int         NOT NULL,
    step_name     text        NOT NULL,
    data          jsonb       NOT NULL,
    awaiting      text        NOT NULL DEFAULT '',
    attempt       int         NOT NULL DEFAULT 0,
    deadline      timestamptz,
    deadline_kind text        NOT NULL DEFAULT '',
    failure       text        NOT NULL DEFAULT '',
    version       bigint      NOT NULL DEFAULT 1,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS {{.DueIndex}} ON {{.Table}} (saga_type, deadline) WHERE deadline IS NOT NULL;
CREATE TABLE IF NOT EXISTS {{.History}} (
    seq        bigserial   PRIMARY KEY,
    saga_id    text        NOT NULL,
    step       int         NOT NULL,
    step_name  text        NOT NULL,
    transition text        NOT NULL,
    status     text        NOT NULL,
    event_id   text        NOT NULL DEFAULT '',
    command_id text        NOT NULL DEFAULT '',
    detail     text        NOT NULL DEFAULT '',
    at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS {{.HistoryIndex}} ON {{.History}} (saga_id, seq);
{{- define "saga_migrate_lock"}}
SELECT pg_advisory_xact_lock(hashtextextended('protoevents.saga.migrate:' || $1, 0))
{{- end}}
{{- define "saga_insert"}}
INSERT INTO {{.Table}} (saga_id, saga_type, status, step, step_name, data)
VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING
{{- end}}
{{- define "saga_columns"}}saga_id, saga_type, status, step, step_name, data, awaiting, attempt, deadline, deadline_kind, failure, version, created_at, updated_at{{end}}
{{- define "saga_lock"}}
SELECT {{template "saga_columns"}} FROM {{.Table}} WHERE saga_id = $1 FOR UPDATE
{{- end}}
{{- define "saga_lock_due"}}
SELECT {{template "saga_columns"}} FROM {{.Table}}
WHERE saga_type = $1 AND deadline IS NOT NULL AND deadline <= now()
ORDER BY deadline LIMIT 1 FOR UPDATE SKIP LOCKED
{{- end}}
{{- define "saga_update"}}
UPDATE {{.Table}} SET status = $3, step = $4, step_name = $5, data = $6, awaiting = $7, attempt = $8,
    deadline = CASE WHEN $12::bool THEN deadline
                    WHEN $9::float8 IS NULL THEN NULL
                    ELSE clock_timestamp() + $9::float8 * interval '1 second' END,
    deadline_kind = $10, failure = $11, version = version + 1, updated_at = now()
WHERE saga_id = $1 AND version = $2
{{- end}}
{{- define "saga_history_insert"}}
INSERT INTO {{.History}} (saga_id, step, step_name, transition, status, event_id, command_id, detail)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
{{- end}}
{{- define "saga_get"}}
SELECT {{template "saga_columns"}} FROM {{.Table}} WHERE saga_id = $1
{{- end}}
{{- define "saga_list"}}
SELECT {{template "saga_columns"}} FROM {{.Table}}
WHERE ($1 = '' OR saga_type = $1) AND ($2 = '' OR status = $2)
ORDER BY created_at, saga_id LIMIT $3
{{- end}}
{{- define "saga_counts"}}
SELECT status, count(*) FROM {{.Table}} WHERE ($1 = '' OR saga_type = $1) GROUP BY status
{{- end}}
{{- define "saga_history"}}
SELECT seq, step, step_name, transition, status, event_id, command_id, detail, at
FROM {{.History}} WHERE saga_id = $1 ORDER BY seq
{{- end}}
{{- define "saga_postpone"}}
UPDATE {{.Table}} SET deadline = clock_timestamp() + $2::float8 * interval '1 second' WHERE saga_id = $1 AND deadline IS NOT NULL
{{- end}}
{{- define "saga_retry"}}
WITH r AS (
    UPDATE {{.Table}} SET status = 'compensating', attempt = 0, deadline = now(), deadline_kind = 'retry',
        awaiting = '', version = version + 1, updated_at = now()
    WHERE saga_id = $1 AND status = 'parked'
    RETURNING saga_id, step, step_name
)
INSERT INTO {{.History}} (saga_id, step, step_name, transition, status, detail)
SELECT saga_id, step, step_name, 'operator-retry', 'compensating', 'compensation budget reset by an operator' FROM r
RETURNING step, step_name
{{- end}}
