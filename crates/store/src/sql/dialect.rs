//! SQL dialects: every statement is written once, as a template, and
//! rendered for each backend by [`Dialect::render`].
//!
//! A template uses `?` for a placeholder, `?J` for one holding JSON text
//! (Postgres casts it to `jsonb`), and `{name}` for the few fragments that
//! differ: `{lock}` (row locks of a read-modify-write), `{skip_locked}`
//! (claims), `{labels}` / `{template}` (reading a JSON column as text),
//! `{false}` and `{due_state}` (a SQLite planner hint), `{ready_from}` and
//! `{ended_from}`, `{ended_workflows_from}` (SQLite and MySQL ones),
//! `{concurrency_from}` (a MySQL one), `{in_flight_from}` (SQLite and
//! MySQL ones), `{unheld}` (SQLite and Postgres ones).
//! Placeholders become `$1, $2, …` where the dialect numbers them.
//!
//! Statements with a row count in them (multi-row inserts, `IN` lists) come
//! in a few fixed sizes, the [`LADDER`], each rendered once on first use, so
//! every statement text is one of a few and stays in the driver's
//! prepared-statement cache.

use std::sync::OnceLock;

/// Rows per statement, largest first.
pub const LADDER: [usize; 5] = [256, 64, 16, 4, 1];

/// How a dialect writes many compare-and-set updates in one statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkForm {
    /// `UPDATE … FROM (VALUES …) AS v … RETURNING`, columns `v.column1…`
    /// (SQLite).
    ValuesNumbered,
    /// `UPDATE … FROM (VALUES …) AS v(a, b, …) … RETURNING` (Postgres).
    ValuesAliased,
    /// `UPDATE t JOIN (SELECT ? AS a, … UNION ALL SELECT …) v ON … SET …`,
    /// no `RETURNING` (MySQL, MariaDB): which rows were written is read back.
    JoinUnion,
}

/// What a backend's SQL looks like where it differs.
#[derive(Debug)]
pub struct Dialect {
    /// The backend's name, for messages.
    pub name: &'static str,
    /// `$1, $2, …` rather than `?`.
    pub numbered: bool,
    /// Appended to a JSON placeholder.
    pub json_cast: &'static str,
    /// How a JSON column is selected as text: `{c}` stands for its name.
    pub json_read: &'static str,
    /// Row locks for a read-modify-write (`" FOR UPDATE"`, or `""` where one
    /// writer holds the whole database).
    pub lock: &'static str,
    /// Row locks that skip rows another transaction holds.
    pub skip_locked: &'static str,
    /// The literal false.
    pub false_lit: &'static str,
    /// The state column in the due query (SQLite: `+state`, so the planner
    /// keeps to `tasks_next_at`).
    pub due_state: &'static str,
    /// The table of the READY counts (SQLite and MySQL name its index:
    /// by a namespace MariaDB would rather read every task of it).
    pub ready_from: &'static str,
    /// The tasks table of the scans of ended tasks by when they ended
    /// (retention, GetStats), as `t`. SQLite and MySQL name `tasks_ended`:
    /// without statistics SQLite prefers the namespace and state index
    /// (every ended task of the namespace), and on few rows MariaDB sorts
    /// by hand instead.
    pub ended_from: &'static str,
    /// The tasks table of a concurrency key's in-flight count (MySQL names
    /// `tasks_concurrency`: the count reads a column beyond the index, and
    /// on few rows MariaDB then prefers the state index).
    pub concurrency_from: &'static str,
    /// The workflows table of retention's scan of ended workflows, as `w`
    /// (SQLite and MySQL name `workflows_ended`, as for `ended_from`).
    pub ended_workflows_from: &'static str,
    /// The tasks table of the in-flight scans. SQLite names
    /// `tasks_in_flight` (without statistics its choice of that partial
    /// index over reading the table is by a hair); MySQL, which has no
    /// partial index, `tasks_ready_claim`, whose leading state column
    /// ranges over the two in-flight states.
    pub in_flight_from: &'static str,
    /// What follows `state = ?` in a read by the index of the states out
    /// of flight: SQLite and Postgres repeat the condition of their partial
    /// `tasks_namespace_state_id_unheld`, as they use a partial index only
    /// for a query that states (or, Postgres, implies) it. MySQL, whose
    /// `tasks_namespace_state_id` is a full index, nothing: the condition
    /// would lead MariaDB to a range of its claim index and a sort.
    pub unheld: &'static str,
    /// Bulk compare-and-set form.
    pub bulk: BulkForm,
    /// What follows an insert that must ignore a duplicate of the key
    /// columns named by `{k}` (first column `{k0}`).
    pub ignore_duplicate: &'static str,
}

/// `unheld` of the dialects with partial indexes: the condition of
/// `tasks_namespace_state_id_unheld` (migrations 0015).
pub const PARTIAL_UNHELD: &str = " AND state NOT IN ('DISPATCHING', 'RUNNING')";

impl Dialect {
    /// Renders `template` for this dialect (see the module comment).
    pub fn render(&self, template: &str) -> String {
        let json = self.json_read;
        let text = template
            .replace("{labels}", &json.replace("{c}", "labels"))
            .replace("{template}", &json.replace("{c}", "template"))
            .replace("{lock}", self.lock)
            .replace("{skip_locked}", self.skip_locked)
            .replace("{false}", self.false_lit)
            .replace("{due_state}", self.due_state)
            .replace("{ready_from}", self.ready_from)
            .replace("{ended_from}", self.ended_from)
            .replace("{concurrency_from}", self.concurrency_from)
            .replace("{in_flight_from}", self.in_flight_from)
            .replace("{unheld}", self.unheld)
            .replace("{ended_workflows_from}", self.ended_workflows_from);
        let mut out = String::with_capacity(text.len() + 64);
        let mut n = 0;
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '?' {
                out.push(c);
                continue;
            }
            n += 1;
            let json = chars.peek() == Some(&'J');
            if json {
                chars.next();
            }
            if self.numbered {
                out.push('$');
                out.push_str(&n.to_string());
            } else {
                out.push('?');
            }
            if json {
                out.push_str(self.json_cast);
            }
        }
        out
    }

    /// The clause after an insert that ignores a duplicate of `keys`.
    pub fn ignoring_duplicates(&self, keys: &[&str]) -> String {
        self.ignore_duplicate
            .replace("{k}", &keys.join(", "))
            .replace("{k0}", keys.first().copied().unwrap_or_default())
    }
}

/// `n` rows in ladder-sized pieces, largest first (for statements whose
/// rows cannot be padded: inserts, updates).
pub fn chunks(mut n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    for size in LADDER {
        while n >= size {
            out.push(size);
            n -= size;
        }
    }
    out
}

/// `items` split for `IN (…)` lists of ladder sizes: a remainder is padded
/// with its last item up to the next size (a repeated value in an `IN` list
/// changes nothing), so `n` items take at most `⌈n / 256⌉ + 1` statements.
pub fn in_lists<T: Clone>(items: &[T]) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    let mut rest = items;
    while !rest.is_empty() {
        let take = rest.len().min(LADDER[0]);
        let size = LADDER
            .iter()
            .rev()
            .copied()
            .find(|&s| s >= take)
            .unwrap_or(LADDER[0]);
        let mut list: Vec<T> = rest[..take].to_vec();
        let last = list[take - 1].clone();
        list.resize(size, last);
        out.push(list);
        rest = &rest[take..];
    }
    out
}

/// A statement in every ladder size, each rendered on first use.
pub struct Ladder {
    dialect: &'static Dialect,
    build: fn(&Dialect, usize) -> String,
    texts: [OnceLock<String>; LADDER.len()],
}

impl Ladder {
    /// The statement family `build` makes for `dialect`.
    pub fn new(dialect: &'static Dialect, build: fn(&Dialect, usize) -> String) -> Self {
        Self {
            dialect,
            build,
            texts: Default::default(),
        }
    }

    /// The statement for `n` rows; `n` must be a [`LADDER`] size.
    pub fn get(&self, n: usize) -> &str {
        let i = LADDER
            .iter()
            .position(|&k| k == n)
            .unwrap_or(LADDER.len() - 1);
        debug_assert_eq!(LADDER[i], n, "not a ladder size");
        self.texts[i].get_or_init(|| (self.build)(self.dialect, LADDER[i]))
    }
}

impl std::fmt::Debug for Ladder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ladder")
            .field("dialect", &self.dialect.name)
            .finish()
    }
}

/// `n` comma-separated groups of `cols` placeholders, `(?, ?), (?, ?)`.
pub fn value_rows(n: usize, cols: usize) -> String {
    let row = format!("({})", vec!["?"; cols].join(", "));
    vec![row; n].join(", ")
}

/// `n` comma-separated placeholders.
pub fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::postgres::DIALECT as PG;

    #[test]
    fn placeholders_are_numbered_and_json_cast() {
        assert_eq!(
            PG.render("SELECT {labels} FROM t WHERE a = ? AND b = ?J{lock}"),
            "SELECT labels::text AS labels FROM t WHERE a = $1 AND b = $2::jsonb FOR UPDATE"
        );
        let plain = &crate::sqlite::DIALECT;
        assert_eq!(plain.render("a = ? AND b = ?J{lock}"), "a = ? AND b = ?");
        assert_eq!(
            PG.ignoring_duplicates(&["x", "y"]),
            " ON CONFLICT (x, y) DO NOTHING"
        );
    }

    #[test]
    fn chunks_follow_the_ladder_and_in_lists_pad() {
        assert_eq!(chunks(300), vec![256, 16, 16, 4, 4, 4]);
        for n in 0..700 {
            assert_eq!(chunks(n).iter().sum::<usize>(), n);
            let lists = in_lists(&(0..n).collect::<Vec<_>>());
            assert!(lists.iter().all(|l| LADDER.contains(&l.len())));
            let mut seen: Vec<usize> = lists.concat();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen, (0..n).collect::<Vec<_>>());
            assert!(lists.len() <= n.div_ceil(256) + 1);
        }
    }
}
