DROP SCHEMA IF EXISTS pgb CASCADE; CREATE SCHEMA pgb; SET search_path = pgb;
CREATE TABLE orders (id bigserial PRIMARY KEY, order_id text NOT NULL, customer text NOT NULL, amount_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE outbox (id bigserial PRIMARY KEY, event_id text NOT NULL UNIQUE, event_type text NOT NULL, topic text NOT NULL, key bytea NOT NULL,
  lane integer NOT NULL GENERATED ALWAYS AS ((hashtext(encode(key, 'hex')) & 2147483647) % 16) STORED,
  value bytea NOT NULL, headers jsonb NOT NULL DEFAULT '[]', created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz, attempts integer NOT NULL DEFAULT 0, last_error text);
CREATE INDEX ON outbox (id) WHERE published_at IS NULL; CREATE INDEX ON outbox (published_at) WHERE published_at IS NOT NULL;
CREATE TABLE nouniq (id bigserial PRIMARY KEY, event_id text NOT NULL, event_type text NOT NULL, topic text NOT NULL, key bytea NOT NULL,
  lane integer NOT NULL GENERATED ALWAYS AS ((hashtext(encode(key, 'hex')) & 2147483647) % 16) STORED,
  value bytea NOT NULL, headers jsonb NOT NULL DEFAULT '[]', created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz, attempts integer NOT NULL DEFAULT 0, last_error text);
CREATE INDEX ON nouniq (id) WHERE published_at IS NULL; CREATE INDEX ON nouniq (published_at) WHERE published_at IS NOT NULL;
CREATE TABLE slim (id bigserial PRIMARY KEY, event_id text NOT NULL, event_type text NOT NULL, topic text NOT NULL, key bytea NOT NULL,
  lane integer NOT NULL, value bytea NOT NULL, headers bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz, attempts integer NOT NULL DEFAULT 0, last_error text);
CREATE INDEX ON slim (id) WHERE published_at IS NULL; CREATE INDEX ON slim (published_at) WHERE published_at IS NOT NULL;
CREATE TABLE two (id bigserial PRIMARY KEY, event_id text NOT NULL, event_type text NOT NULL, topic text NOT NULL, key bytea NOT NULL,
  lane integer NOT NULL, value bytea NOT NULL, headers bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz, attempts integer NOT NULL DEFAULT 0, last_error text);
CREATE INDEX ON two (id) WHERE published_at IS NULL;
CREATE TABLE uslim (id bigserial PRIMARY KEY, event_id text NOT NULL UNIQUE, event_type text NOT NULL, topic text NOT NULL, key bytea NOT NULL,
  lane integer NOT NULL, value bytea NOT NULL, headers bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz, attempts integer NOT NULL DEFAULT 0, last_error text);
CREATE INDEX ON uslim (id) WHERE published_at IS NULL; CREATE INDEX ON uslim (published_at) WHERE published_at IS NOT NULL;
