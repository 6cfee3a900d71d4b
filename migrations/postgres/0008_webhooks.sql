-- Event webhooks (server/src/hooks/webhooks). Two durable queues:
-- webhook_outbox: one row per committed message while an endpoint wants message events,
-- written in the commit's own transaction; the dispatcher expands it into deliveries.
-- webhook_deliveries: one row per (endpoint, event), the signed body's JSON, its retry
-- state; deleted once the endpoint answered 2xx, parked after the retry age.
CREATE TABLE webhook_outbox (
    id BIGSERIAL PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    created_ms BIGINT NOT NULL,
    lease_owner TEXT NOT NULL DEFAULT '',
    lease_until BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE webhook_deliveries (
    id BIGSERIAL PRIMARY KEY,
    endpoint TEXT NOT NULL,
    event_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_ms BIGINT NOT NULL,
    parked INTEGER NOT NULL DEFAULT 0,
    last_error TEXT NOT NULL DEFAULT '',
    lease_owner TEXT NOT NULL DEFAULT '',
    lease_until BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (endpoint, parked, next_ms);
