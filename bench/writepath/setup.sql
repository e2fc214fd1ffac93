-- The tables of bench/writepath/run.sh: the business table, the outbox as
-- runtime/outbox/outbox.sql creates it (16 lanes), and the variants that each
-- change one thing about it.
DROP SCHEMA IF EXISTS pgb CASCADE; CREATE SCHEMA pgb; SET search_path = pgb;
CREATE TABLE orders (id bigserial PRIMARY KEY, order_id text NOT NULL, customer text NOT NULL, amount_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE outbox (id bigserial PRIMARY KEY, event_id text NOT NULL, event_type text NOT NULL, topic text NOT NULL, key bytea NOT NULL,
  lane integer NOT NULL GENERATED ALWAYS AS ((hashtext(encode(key, 'hex')) & 2147483647) % 16) STORED,
  value bytea NOT NULL, headers jsonb NOT NULL DEFAULT '[]', created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz, attempts integer NOT NULL DEFAULT 0, last_error text, fixed_event_id boolean NOT NULL DEFAULT false);
CREATE INDEX ON outbox (lane, id) WHERE published_at IS NULL; CREATE INDEX ON outbox (published_at) WHERE published_at IS NOT NULL; CREATE UNIQUE INDEX ON outbox (event_id) WHERE fixed_event_id;
CREATE TABLE nolane (id bigserial PRIMARY KEY, event_id text NOT NULL, event_type text NOT NULL, topic text NOT NULL, key bytea NOT NULL,
  lane integer NOT NULL,
  value bytea NOT NULL, headers jsonb NOT NULL DEFAULT '[]', created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz, attempts integer NOT NULL DEFAULT 0, last_error text, fixed_event_id boolean NOT NULL DEFAULT false);
CREATE INDEX ON nolane (lane, id) WHERE published_at IS NULL; CREATE INDEX ON nolane (published_at) WHERE published_at IS NOT NULL; CREATE UNIQUE INDEX ON nolane (event_id) WHERE fixed_event_id;
CREATE TABLE bhead (id bigserial PRIMARY KEY, event_id text NOT NULL, event_type text NOT NULL, topic text NOT NULL, key bytea NOT NULL,
  lane integer NOT NULL GENERATED ALWAYS AS ((hashtext(encode(key, 'hex')) & 2147483647) % 16) STORED,
  value bytea NOT NULL, headers bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz, attempts integer NOT NULL DEFAULT 0, last_error text, fixed_event_id boolean NOT NULL DEFAULT false);
CREATE INDEX ON bhead (lane, id) WHERE published_at IS NULL; CREATE INDEX ON bhead (published_at) WHERE published_at IS NOT NULL; CREATE UNIQUE INDEX ON bhead (event_id) WHERE fixed_event_id;
CREATE TABLE minrow (id bigserial PRIMARY KEY, value bytea NOT NULL);
CREATE TABLE minidx (id bigserial PRIMARY KEY, lane int NOT NULL, value bytea NOT NULL, published_at timestamptz);
CREATE INDEX ON minidx (lane, id) WHERE published_at IS NULL;
