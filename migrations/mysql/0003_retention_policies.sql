-- Retention horizons set through the API (Admin.SetRetention): per
-- namespace (handler '') or per handler within it, per terminal state.
-- What has no row inherits: handler, then namespace, then the server's
-- --retention-* flags. Retention's delete reads them with two key lookups
-- per candidate task.

CREATE TABLE retention_policies (
    namespace   VARCHAR(64)  NOT NULL,
    handler     VARCHAR(128) NOT NULL,   -- '' for the namespace's own
    state       VARCHAR(16)  NOT NULL CHECK (state IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED')),
    horizon_ms  BIGINT       NOT NULL CHECK (horizon_ms > 0),
    PRIMARY KEY (namespace, handler, state)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
