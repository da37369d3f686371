#!/usr/bin/env python3
"""What removing ended tasks costs, per row: a measurement, not a test.

Builds a database from the project's own SQLite migrations in a temporary
directory, writes ROWS ended tasks shaped like the retention bench's (CANCELLED,
one handler, time-ordered ids, ended in id order), then removes the oldest
REMOVE of them in two ways and prints, for each, the WAL bytes written per row
removed and the time per row:

- `DELETE FROM tasks WHERE id IN (...)`, one transaction per batch of each
  size given (what retention does today, `sql/retention.rs`);
- `DROP TABLE` of a table holding the same rows with the same indexes (what
  removal by partition would cost).

The automatic checkpoint is off, so the WAL's growth is what the removal
wrote. `secure_delete` is set OFF, as the project's bundled SQLite has it
(Debian's Python links an SQLite built with SQLITE_SECURE_DELETE, which would
also zero every freed page). Python's SQLite is not the bundled one: the
figures are of the B-tree's behaviour, not of the server.

With `--postgres`, the same on Postgres through `psql` (libpq's own
environment says where: PGHOST, PGUSER, PGDATABASE, PGPASSWORD..., by default
127.0.0.1, postgres, test), in a schema of its own that it drops at the end:
a checkpoint first, then WAL bytes from `pg_current_wal_lsn()`, for the
deletes (one procedure committing every batch) and the `VACUUM` that must
follow them (a deleted row's heap tuple and index entries go only then),
and for `DROP TABLE`. Its times include starting `psql` for each step.

    python3 scripts/removal-cost.py [--rows 200000] [--remove 40000] \
        [--batches 16,256,1024,4096] [--postgres]
"""

import argparse
import glob
import os
import re
import sqlite3
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The columns every ended task of both halves shares (the retention bench's
# ended tasks: CANCELLED, of a handler no worker serves); ids, digests and
# times are each half's own.
SHAPE = {
    "namespace": "default", "handler": "bench-ended", "state": "CANCELLED",
    "content_type": "application/octet-stream", "labels": "{}",
    "error_message": "bench: ended long ago", "version": 2, "max_attempts": 3,
}
TIMES = ("created_at", "updated_at", "run_at", "ready_at", "ended_at")


def open_db(path):
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("PRAGMA foreign_keys = ON")
    db.execute("PRAGMA secure_delete = OFF")
    for migration in sorted(glob.glob(os.path.join(ROOT, "migrations/sqlite/*.sql"))):
        with open(migration) as f:
            db.executescript(f.read())
    db.execute("PRAGMA wal_autocheckpoint = 0")
    return db


def fill(db, rows):
    """`rows` CANCELLED tasks, 30 days old, one a millisecond, ids UUIDv7-like."""
    columns = list(db.execute("PRAGMA table_info(tasks)"))
    names = [c[1] for c in columns]
    start = int(time.time() * 1000) - 30 * 86_400_000

    def row(i):
        t = start + i
        ms = "%012x" % t
        task_id = f"{ms[:8]}-{ms[8:]}-7{os.urandom(2).hex()[1:]}-{os.urandom(2).hex()}-{os.urandom(6).hex()}"
        values = {}
        for _, name, kind, not_null, _, _ in columns:
            if not not_null:
                values[name] = None
            else:
                values[name] = {"INTEGER": 0, "REAL": 2.0, "BLOB": b""}.get(kind, "")
        values.update(SHAPE)
        values.update(dict.fromkeys(TIMES, t))
        values.update(
            id=task_id, request_fingerprint=os.urandom(32).hex(),
            traceparent=f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01",
        )
        return [values[n] for n in names]

    insert = f"INSERT INTO tasks ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})"
    db.execute("BEGIN")
    db.executemany(insert, (row(i) for i in range(rows)))
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def filled(path, rows):
    """A new database at `path` holding `rows` ended tasks."""
    db = open_db(path)
    fill(db, rows)
    return db


def wal_bytes(path):
    try:
        return os.path.getsize(path + "-wal")
    except FileNotFoundError:
        return 0


def oldest(db, n):
    return [r[0] for r in db.execute(
        "SELECT id FROM tasks WHERE state = 'CANCELLED' AND ended_at IS NOT NULL "
        "ORDER BY ended_at LIMIT ?", (n,))]


def by_delete(path, rows, remove, batch):
    db = filled(path, rows)
    ids = oldest(db, remove)
    before, t0 = wal_bytes(path), time.perf_counter()
    for k in range(0, len(ids), batch):
        chunk = ids[k:k + batch]
        marks = ", ".join("?" * len(chunk))
        db.execute("BEGIN IMMEDIATE")
        db.execute(f"DELETE FROM task_logs WHERE task_id IN ({marks})", chunk)
        db.execute(f"DELETE FROM tasks WHERE id IN ({marks})", chunk)
        db.execute("COMMIT")
    took = time.perf_counter() - t0
    return (wal_bytes(path) - before) / len(ids), took / len(ids) * 1e6, db


def by_drop(path, rows, remove):
    db = filled(path, rows)
    db.execute("CREATE TABLE part AS SELECT * FROM tasks WHERE 0")
    indexes = db.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'tasks' "
        "AND sql IS NOT NULL").fetchall()
    for (sql,) in indexes:
        db.execute(re.sub(r"INDEX (\w+) ON tasks", r"INDEX part_\1 ON part", sql))
    db.execute("INSERT INTO part SELECT * FROM tasks ORDER BY ended_at LIMIT ?", (remove,))
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before, t0 = wal_bytes(path), time.perf_counter()
    db.execute("BEGIN IMMEDIATE")
    db.execute("DROP TABLE part")
    db.execute("COMMIT")
    took = time.perf_counter() - t0
    return (wal_bytes(path) - before) / remove, took / remove * 1e6, took * 1000, db


def literal(value):
    """`value` (text or a whole number) as an SQL literal."""
    if isinstance(value, int):
        return str(value)
    return "'" + value.replace("'", "''") + "'"


def postgres(rows, remove, batch):
    """The Postgres half: DELETE in batches then VACUUM, against DROP TABLE."""
    env = dict(os.environ)
    for name, value in (("PGHOST", "127.0.0.1"), ("PGUSER", "postgres"), ("PGDATABASE", "test")):
        env.setdefault(name, value)
    schema = f"removal_cost_{os.getpid()}"

    def psql(sql, in_schema=True):
        if in_schema:
            sql = f"SET search_path = {schema};\n{sql}"
        done = subprocess.run(["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-f", "-"],
                              input=sql, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise SystemExit(f"psql failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def lsn():
        return psql("SELECT pg_current_wal_lsn()", in_schema=False)

    def wal(start, end):
        return int(psql(f"SELECT pg_wal_lsn_diff('{end}', '{start}')", in_schema=False))

    psql(f"CREATE SCHEMA {schema}", in_schema=False)
    try:
        for migration in sorted(glob.glob(os.path.join(ROOT, "migrations/postgres/*.sql"))):
            with open(migration) as f:
                psql(f.read())
        columns = [line.split("|") for line in psql(
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
            f"WHERE table_schema = '{schema}' AND table_name = 'tasks' ORDER BY ordinal_position"
        ).splitlines()]
        # The same shape as the SQLite half, one task a millisecond.
        given = {name: literal(v) for name, v in SHAPE.items()}
        given.update(dict.fromkeys(TIMES, "(1700000000000 + g)"))
        given.update({
            "id": "lpad(to_hex(g), 12, '0') || '-' || md5(g::text)",
            "request_fingerprint": "md5(g::text) || md5((g + 1)::text)",
            "traceparent": "'00-' || md5(g::text) || '-0123456789abcdef-01'",
        })
        blank = {"bigint": "0", "integer": "0", "smallint": "0", "double precision": "2.0",
                 "real": "2.0", "bytea": "''::bytea", "boolean": "false"}
        values = [given.get(name) or ("NULL" if nullable == "YES" else blank.get(kind, "''"))
                  for name, kind, nullable in columns]
        names = ", ".join(c[0] for c in columns)
        psql(f"INSERT INTO tasks ({names}) SELECT {', '.join(values)} "
             f"FROM generate_series(1, {rows}) g; VACUUM ANALYZE tasks;")
        size = int(psql(f"SELECT pg_total_relation_size('{schema}.tasks')")) / rows
        psql(f"""CREATE PROCEDURE remove_oldest(batch int, total int) LANGUAGE plpgsql AS $$
            DECLARE done int := 0; n int;
            BEGIN
              WHILE done < total LOOP
                DELETE FROM tasks WHERE id IN (
                  SELECT id FROM tasks WHERE state = 'CANCELLED' AND ended_at IS NOT NULL
                  ORDER BY ended_at LIMIT least(batch, total - done));
                GET DIAGNOSTICS n = ROW_COUNT;
                done := done + n;
                COMMIT;
                EXIT WHEN n = 0;
              END LOOP;
            END $$""")
        print(f"Postgres, {rows} ended tasks: {size:.0f} bytes a row (the table and its indexes); "
              f"removing the oldest {remove}:")
        psql("CHECKPOINT")
        start, t0 = lsn(), time.perf_counter()
        psql(f"CALL remove_oldest({batch}, {remove})")
        deleted, t1 = lsn(), time.perf_counter()
        psql("VACUUM tasks")
        vacuumed, t2 = lsn(), time.perf_counter()
        print(f"  DELETE, {batch:>5} a transaction: {wal(start, deleted) / remove:7.0f} WAL bytes a row, "
              f"{(t1 - t0) / remove * 1e6:6.2f} us a row")
        print(f"  then VACUUM:                    {wal(deleted, vacuumed) / remove:7.0f} WAL bytes a row, "
              f"{(t2 - t1) / remove * 1e6:6.2f} us a row")
        psql(f"CREATE TABLE part (LIKE tasks INCLUDING ALL); "
             f"INSERT INTO part SELECT * FROM tasks ORDER BY ended_at LIMIT {remove}; CHECKPOINT;")
        start, t0 = lsn(), time.perf_counter()
        psql("DROP TABLE part")
        dropped, t1 = lsn(), time.perf_counter()
        print(f"  DROP TABLE of as many:          {wal(start, dropped) / remove:7.1f} WAL bytes a row, "
              f"{(t1 - t0) / remove * 1e6:6.2f} us a row ({(t1 - t0) * 1000:.1f} ms with psql's start)")
    finally:
        psql(f"DROP SCHEMA {schema} CASCADE", in_schema=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="ended tasks written first")
    parser.add_argument("--remove", type=int, default=40_000, help="the oldest this many are removed")
    parser.add_argument("--batches", default="16,256,1024,4096",
                        help="rows a DELETE transaction, comma-separated")
    parser.add_argument("--postgres", action="store_true",
                        help="also measure Postgres through psql (libpq's environment, "
                             "by default 127.0.0.1, user postgres, database test), "
                             "at the --pg-batch size")
    parser.add_argument("--pg-batch", type=int, default=256, help="rows a DELETE transaction on Postgres")
    args = parser.parse_args()
    if not 0 < args.remove <= args.rows:
        parser.error("--remove must be between 1 and --rows")
    if args.pg_batch < 1:
        parser.error("--pg-batch must be at least 1")
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        parser.error(f"--batches takes whole numbers separated by commas, not {args.batches!r}")
    if not batches or min(batches) < 1:
        parser.error("--batches: each size must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        for i, batch in enumerate(batches):
            path = os.path.join(tmp, f"delete-{i}.db")
            per_row, us, db = by_delete(path, args.rows, args.remove, batch)
            if i == 0:
                print(f"SQLite, {args.rows} ended tasks: {os.path.getsize(path) / args.rows:.0f} bytes a row "
                      f"in the file (the table and its indexes); removing the oldest {args.remove}:")
            db.close()
            print(f"  DELETE, {batch:>5} a transaction: {per_row:7.0f} WAL bytes a row, {us:6.2f} us a row")
        per_row, us, ms, db = by_drop(os.path.join(tmp, "drop.db"), args.rows, args.remove)
        db.close()
        print(f"  DROP TABLE of them:             {per_row:7.1f} WAL bytes a row, {us:6.2f} us a row "
              f"({ms:.1f} ms in one transaction)")
    if args.postgres:
        postgres(args.rows, args.remove, args.pg_batch)


if __name__ == "__main__":
    main()
