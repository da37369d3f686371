-- Sharding broadcast: a task marked broadcast (1) is spread, when due, into
-- one shard per live worker of its handler; each shard is a child task
-- carrying its index among shard_total (0 for a task that is not a shard).
ALTER TABLE tasks ADD COLUMN broadcast INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN shard_index INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN shard_total INTEGER NOT NULL DEFAULT 0;
