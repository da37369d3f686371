-- The leader fencing token: the newest token any leader has written with.
-- A leader's writes (scheduler rounds, schedule fires) first raise it to
-- their own token in the same transaction (`UPDATE … WHERE token <= $t`,
-- whose row lock also queues concurrent leader writes); a write carrying an
-- older token (a deposed leader that woke up) changes nothing and is refused.
CREATE TABLE fences (
    name   TEXT   NOT NULL PRIMARY KEY,
    token  BIGINT NOT NULL
);

INSERT INTO fences (name, token) VALUES ('leader', 0);
