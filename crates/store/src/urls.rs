//! Database URLs: shown without their password, and pointed at another
//! database (for the throw-away databases of tests and benchmarks).

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
