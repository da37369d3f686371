//! Database URLs: shown without their password, and pointed at another
//! database; and the clean-up of the throw-away databases and schemas of
//! tests and benchmarks (`postgres::scratch`, `mysql::scratch`).

/// `url` without its password.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}@{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

/// `url` with its database (the path) replaced by `name`, query kept.
pub fn with_database(url: &str, name: &str) -> Option<String> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let host_start = base.find("://")? + 3;
    let slash = base[host_start..].find('/').map(|i| i + host_start)?;
    let mut out = format!("{}/{name}", &base[..slash]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    Some(out)
}

/// Runs `cleanup` to the end from a `Drop`, which runs inside the test's
/// runtime, where blocking on a future is not allowed: a thread with a
/// runtime of its own does it. A failure is printed, naming `what`.
pub(crate) fn clean_up_on_drop<F>(what: String, cleanup: impl FnOnce() -> F + Send + 'static)
where
    F: std::future::Future<Output = crate::Result<()>>,
{
    let done = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| crate::Error::Internal(e.to_string()))?;
        runtime.block_on(cleanup())
    })
    .join();
    if let Ok(Err(err)) = done {
        eprintln!("could not drop {what}: {err}");
    }
}

#[cfg(test)]
mod tests {
    use super::{redact, with_database};

    #[test]
    fn urls_lose_their_password() {
        assert_eq!(redact("postgres://u:secret@h:5/db"), "postgres://u@h:5/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("postgres://h/db"), "postgres://h/db");
    }

    #[test]
    fn the_database_is_swapped_and_the_rest_kept() {
        assert_eq!(
            with_database("postgres://u:p@h:5432/test?sslmode=disable", "x").as_deref(),
            Some("postgres://u:p@h:5432/x?sslmode=disable")
        );
        assert_eq!(with_database("postgres://h", "x"), None);
    }
}
