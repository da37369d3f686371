-- The leader fencing token: the newest token any leader has written with.
-- A leader's writes (scheduler rounds, schedule fires) first raise it to
-- their own token in the same transaction; a write carrying an older token
-- (a deposed leader that woke up) changes nothing and is refused.
CREATE TABLE fences (
    name   TEXT    NOT NULL PRIMARY KEY,
    token  INTEGER NOT NULL
) STRICT;

INSERT INTO fences (name, token) VALUES ('leader', 0);
