\set n random(1, 1000000000)
BEGIN;
INSERT INTO orders (order_id, customer, amount_cents) VALUES ('o-' || :n, 'customer-1', :n);
\startpipeline
INSERT INTO outbox (event_id, event_type, topic, key, value, headers) VALUES ('01JOLDROW0000000000000000' || :n, 'shop.orders.v1.OrderPlaced', 'scratch', convert_to('o-' || :n, 'UTF8'), repeat('a',400)::bytea, '[["ce_type","shop.orders.v1.OrderPlaced"],["content-type","application/json"],["traceparent",""]]'::jsonb);
COMMIT;
\endpipeline
