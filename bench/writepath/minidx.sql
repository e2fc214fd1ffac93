\set n random(1, 1000000000)
BEGIN;
INSERT INTO orders (order_id, customer, amount_cents) VALUES ('o-' || :n, 'customer-1', :n);
\startpipeline
INSERT INTO minidx (lane, value) VALUES (:n % 16, repeat('a',400)::bytea);
COMMIT;
\endpipeline
