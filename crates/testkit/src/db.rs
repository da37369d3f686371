//! Reading a cluster's record straight from its database, on Postgres or
//! MySQL/MariaDB: a few rows, with separate small branches per backend
//! (production code goes through the `Store` trait and never does this).
//! Statements are written once with Postgres placeholders (`$1`, `$2`, …,
//! bound in order); the MySQL branch turns them into `?`.

use taskmesh_store::DatabaseKind;

/// A small pool on a test database.
#[derive(Clone)]
pub enum Db {
    Postgres(sqlx::PgPool),
    Mysql(sqlx::MySqlPool),
}

/// A value bound to a statement.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Int(i64),
    Text(&'a str),
}

/// Runs `$body` with `$pool` bound to the backend's pool, and `$sql` turned
/// into the backend's placeholders (the body is written once, compiled per
/// backend).
macro_rules! on_both {
    ($db:expr, $sql:expr, |$pool:ident, $q:ident| $body:expr) => {
        match $db {
            Db::Postgres($pool) => {
                let $q = sqlx::AssertSqlSafe($sql.to_string());
                $body
            }
            Db::Mysql($pool) => {
                let $q = sqlx::AssertSqlSafe(mysql_placeholders($sql));
                $body
            }
        }
    };
}

/// A row of `tasks`: id, state, schedule_id, client_request_id.
pub type TaskRow = (String, String, Option<String>, Option<String>);

/// A row of `attempts`: task_id, number, execution_id, worker_id,
/// started_at, ended_at, outcome, message.
pub type AttemptRow = (
    String,
    i64,
    String,
    String,
    i64,
    Option<i64>,
    Option<String>,
    String,
);

impl Db {
    /// Connects (two connections) to `url`, a `postgres://` or
    /// `mysql://`/`mariadb://` URL.
    pub async fn connect(url: &str) -> Self {
        match DatabaseKind::of_url(url) {
            Some(DatabaseKind::Postgres) => Db::Postgres(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(2)
                    .connect(url)
                    .await
                    .unwrap_or_else(|e| panic!("connect to the test Postgres: {e}")),
            ),
            Some(DatabaseKind::Mysql) => {
                let url = match url.strip_prefix("mariadb://") {
                    Some(rest) => format!("mysql://{rest}"),
                    None => url.to_string(),
                };
                Db::Mysql(
                    sqlx::mysql::MySqlPoolOptions::new()
                        .max_connections(2)
                        .connect(&url)
                        .await
                        .unwrap_or_else(|e| panic!("connect to the test MySQL/MariaDB: {e}")),
                )
            }
            None => panic!("not a Postgres or MySQL URL"),
        }
    }

    /// The Postgres pool, for a test that only runs on Postgres.
    pub fn pg(&self) -> &sqlx::PgPool {
        match self {
            Db::Postgres(pool) => pool,
            Db::Mysql(_) => panic!("this reading is written for Postgres only"),
        }
    }

    /// One integer (or NULL) read by `sql`.
    pub async fn int(&self, sql: &str, args: &[Arg<'_>]) -> Result<Option<i64>, sqlx::Error> {
        on_both!(self, sql, |pool, q| {
            let mut query = sqlx::query_scalar::<_, Option<i64>>(q);
            for a in args {
                query = match *a {
                    Arg::Int(v) => query.bind(v),
                    Arg::Text(v) => query.bind(v.to_string()),
                };
            }
            query.fetch_one(pool).await
        })
    }

    /// Three integers read by `sql` (e.g. counts).
    pub async fn ints3(&self, sql: &str, args: &[Arg<'_>]) -> Result<(i64, i64, i64), sqlx::Error> {
        on_both!(self, sql, |pool, q| {
            let mut query = sqlx::query_as::<_, (i64, i64, i64)>(q);
            for a in args {
                query = match *a {
                    Arg::Int(v) => query.bind(v),
                    Arg::Text(v) => query.bind(v.to_string()),
                };
            }
            query.fetch_one(pool).await
        })
    }

    /// Every task row.
    pub async fn tasks(&self) -> Result<Vec<TaskRow>, sqlx::Error> {
        let sql = "SELECT id, state, schedule_id, client_request_id FROM tasks";
        on_both!(self, sql, |pool, q| sqlx::query_as::<_, TaskRow>(q)
            .fetch_all(pool)
            .await)
    }

    /// The ids of sharding broadcasts (they run no attempt of their own).
    pub async fn broadcasts(&self) -> Result<std::collections::HashSet<String>, sqlx::Error> {
        let sql = "SELECT id FROM tasks WHERE broadcast = 1";
        let ids: Vec<(String,)> = on_both!(self, sql, |pool, q| sqlx::query_as::<_, (String,)>(q)
            .fetch_all(pool)
            .await)?;
        Ok(ids.into_iter().map(|(id,)| id).collect())
    }

    /// The children of task `parent`: (id, state, shard_index, shard_total).
    pub async fn children(
        &self,
        parent: &str,
    ) -> Result<Vec<(String, String, i64, i64)>, sqlx::Error> {
        match self {
            Db::Postgres(pool) => sqlx::query_as(
                "SELECT id, state, shard_index, shard_total FROM tasks WHERE parent_task_id = $1",
            )
            .bind(parent)
            .fetch_all(pool)
            .await,
            Db::Mysql(pool) => sqlx::query_as(
                "SELECT id, state, shard_index, shard_total FROM tasks WHERE parent_task_id = ?",
            )
            .bind(parent)
            .fetch_all(pool)
            .await,
        }
    }

    /// Every attempt row.
    pub async fn attempts(&self) -> Result<Vec<AttemptRow>, sqlx::Error> {
        let sql = "SELECT task_id, number, execution_id, worker_id, started_at, ended_at, \
                   outcome, message FROM attempts";
        on_both!(self, sql, |pool, q| sqlx::query_as::<_, AttemptRow>(q)
            .fetch_all(pool)
            .await)
    }

    /// How many tasks are not terminal.
    pub async fn open_tasks(&self) -> Result<i64, sqlx::Error> {
        let n = self
            .int(
                "SELECT COUNT(*) FROM tasks \
                 WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'TIMED_OUT', 'CANCELLED')",
                &[],
            )
            .await?;
        Ok(n.unwrap_or(0))
    }

    /// The leader fencing token the store holds.
    pub async fn fence(&self) -> u64 {
        let t = self
            .int("SELECT token FROM fences WHERE name = 'leader'", &[])
            .await
            .expect("read the fence")
            .expect("a fence token");
        t as u64
    }
}

/// `$1`, `$2`, … → `?` (MySQL binds by position).
fn mysql_placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
            out.push('?');
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn placeholders_become_question_marks() {
        assert_eq!(
            super::mysql_placeholders("a = $1 AND b > $2 AND c < $10 AND d = '$'"),
            "a = ? AND b > ? AND c < ? AND d = '$'"
        );
    }
}
