\set n random(1, 1000000000)
BEGIN;
INSERT INTO orders (order_id, customer, amount_cents) VALUES ('o-' || :n, 'customer-1', :n);
\startpipeline
INSERT INTO minrow (value) VALUES (repeat('a',400)::bytea);
COMMIT;
\endpipeline
