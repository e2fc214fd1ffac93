{{- /*
The stuck-row bookkeeping of an outbox table (runtime/outbox/stuck.go),
rendered by outbox.Migrate after outbox.sql in the same transaction. Purely
additive: re-running Migrate on an outbox created before these tables
existed adds them and changes nothing else. Every name below is already a
quoted identifier.

  .Table  the outbox table, schema-qualified
  .Dead   rows an operator moved out of the outbox (parked or dropped)
  .Ops    the log of operator actions on stuck rows (who, when, why)
*/ -}}
-- Rows moved out of the outbox by "eventsctl outbox park|drop": never
-- deleted, so a parked or dropped event can be inspected and retried.
CREATE TABLE IF NOT EXISTS {{.Dead}} (
    -- outbox_id is the row's id in the outbox when it was moved.
    outbox_id    bigint      PRIMARY KEY,
    event_id     text        NOT NULL,
    event_type   text        NOT NULL,
    topic        text        NOT NULL,
    key          bytea       NOT NULL,
    value        bytea       NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '[]',
    created_at   timestamptz NOT NULL,
    attempts     integer     NOT NULL,
    last_error   text,
    -- state: parked (set aside to retry later), dropped (not to be
    -- delivered; kept for the record) or retried (copied back into the
    -- outbox as retried_as).
    state        text        NOT NULL CHECK (state IN ('parked', 'dropped', 'retried')),
    moved_at     timestamptz NOT NULL DEFAULT now(),
    moved_by     text        NOT NULL,
    reason       text        NOT NULL DEFAULT '',
    retried_as   bigint
);

-- Every operator action on a stuck row, in order.
CREATE TABLE IF NOT EXISTS {{.Ops}} (
    id         bigserial   PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    actor      text        NOT NULL,
    db_user    text        NOT NULL DEFAULT current_user,
    action     text        NOT NULL,
    outbox_id  bigint      NOT NULL,
    event_id   text        NOT NULL,
    topic      text        NOT NULL,
    key        bytea       NOT NULL,
    reason     text        NOT NULL DEFAULT '',
    detail     text        NOT NULL DEFAULT ''
);
