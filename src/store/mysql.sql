CREATE TABLE IF NOT EXISTS webhook_guard_records (
    namespace   VARBINARY(64)  NOT NULL,
    id          VARBINARY(255) NOT NULL,
    state       VARCHAR(17) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    fingerprint BINARY(32)     NOT NULL,
    token       BIGINT         NOT NULL,
    attempts    INT UNSIGNED   NOT NULL,
    failures    INT UNSIGNED   NOT NULL,
    lease_until BIGINT         NOT NULL,
    expires_at  BIGINT         NOT NULL,
    created_at  BIGINT         NOT NULL,
    updated_at  BIGINT         NOT NULL,
    history     MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    PRIMARY KEY (namespace, id),
    KEY by_expiry (expires_at),
    KEY by_lease (state, lease_until)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin
