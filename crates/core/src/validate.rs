//! Input rules shared by every front door, so gRPC and REST refuse the same
//! requests with the same words.

use crate::egress::{EgressError, EgressPolicy};

/// Longest handler name.
pub const MAX_HANDLER_LEN: usize = 128;
/// Longest label key or value, routing key, client request id or worker id.
pub const MAX_NAME_LEN: usize = 256;
/// Most labels on a task or worker.
pub const MAX_LABELS: usize = 64;
/// Longest callback URL.
pub const MAX_URL_LEN: usize = 2048;

/// Checks a handler name: 1-128 characters of `[A-Za-z0-9_.:-]`, starting
/// with a letter or digit.
pub fn handler_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("handler must not be empty".into());
    }
    if name.len() > MAX_HANDLER_LEN {
        return Err(format!(
            "handler is {} characters long; the limit is {MAX_HANDLER_LEN}",
            name.len()
        ));
    }
    let first_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'));
    if !first_ok || !rest_ok {
        return Err(format!(
            "handler {name:?} is invalid: use letters, digits and _ . : - and start with a letter or digit"
        ));
    }
    Ok(())
}

/// The namespace of everything a request names when it names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Longest namespace name.
pub const MAX_NAMESPACE_LEN: usize = 64;

/// Checks a namespace name: 1-64 characters of `[A-Za-z0-9_.:-]`, starting
/// with a letter or digit (the handler-name alphabet).
pub fn namespace(name: &str) -> Result<(), String> {
    if name.len() > MAX_NAMESPACE_LEN {
        return Err(format!(
            "namespace is {} characters long; the limit is {MAX_NAMESPACE_LEN}",
            name.len()
        ));
    }
    handler_name(name).map_err(|e| e.replacen("handler", "namespace", 1))
}

/// Checks a free-form identifier such as a worker id or client request id.
pub fn short_text(field: &str, value: &str) -> Result<(), String> {
    // Characters, as the contract's `max_len` counts them.
    let len = value.chars().count();
    if len > MAX_NAME_LEN {
        return Err(format!(
            "{field} is {len} characters long; the limit is {MAX_NAME_LEN}"
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("{field} must not contain control characters"));
    }
    Ok(())
}

/// Checks a label map.
pub fn labels<'a>(
    field: &str,
    labels: impl ExactSizeIterator<Item = (&'a String, &'a String)>,
) -> Result<(), String> {
    if labels.len() > MAX_LABELS {
        return Err(format!(
            "{field} has {} entries; the limit is {MAX_LABELS}",
            labels.len()
        ));
    }
    // Keys: any text within the length (the contract's map rules; OpenAPI
    // 3.0 cannot state rules for keys, so the document could not tell a
    // client a stricter one). Values: short text.
    for (k, v) in labels {
        if k.chars().count() > MAX_NAME_LEN {
            return Err(format!(
                "{field} has a key longer than {MAX_NAME_LEN} characters"
            ));
        }
        short_text(&format!("{field}[{k:?}]"), v)?;
    }
    Ok(())
}

/// Why [`callback_url`] refuses a URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallbackUrlError {
    /// Not a URL the server could post to: its shape is wrong.
    #[error("{0}")]
    Invalid(String),
    /// Well formed, but the egress policy refuses its address.
    #[error("{0}")]
    Refused(String),
}

/// Checks a callback URL: empty, or an absolute http(s) URL without
/// credentials whose literal host `egress` allows (names are checked again
/// when the callback is delivered, after resolution).
pub fn callback_url(url: &str, egress: &EgressPolicy) -> Result<(), CallbackUrlError> {
    if url.is_empty() {
        return Ok(());
    }
    if url.len() > MAX_URL_LEN {
        return Err(CallbackUrlError::Invalid(format!(
            "callback_url is longer than {MAX_URL_LEN} bytes"
        )));
    }
    // The contract's pattern admits printable ASCII only: a character class
    // every regex engine reads alike (what counts as `\s` differs between
    // Rust's, Python's and JavaScript's), and what RFC 3986 allows unescaped.
    if !url.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(CallbackUrlError::Invalid(format!(
            "callback_url {url:?} must be printable ASCII without white space (percent-encode other characters)"
        )));
    }
    egress.check_url(url).map_err(|e| match e {
        // The URL is not echoed: it holds a secret.
        EgressError::Credentials => CallbackUrlError::Invalid(format!("callback_url {e}")),
        EgressError::Refused(_) => CallbackUrlError::Refused(format!("callback_url {url:?} {e}")),
        e => CallbackUrlError::Invalid(format!("callback_url {url:?} {e}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handler_names() {
        for ok in ["echo", "email.send", "a", "A1:b-c_d", &"x".repeat(128)] {
            assert_eq!(handler_name(ok), Ok(()), "{ok:?}");
        }
        for bad in ["", " echo", "-x", "a b", "é", "a/b", &"x".repeat(129)] {
            assert!(handler_name(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn callback_urls() {
        let open = EgressPolicy::allowing_loopback();
        let strict = EgressPolicy::public_only();
        assert!(callback_url("", &strict).is_ok());
        assert!(callback_url("http://127.0.0.1:9/cb", &open).is_ok());
        assert!(callback_url("http://127.0.0.1:9/cb", &strict).is_err());
        assert!(callback_url("https://example.com/x", &strict).is_ok());
        for bad in [
            "ftp://x",
            "http://",
            "http:///x",
            "example.com",
            "http://a b",
            "http://a/b c",
            "http://a/\u{85}",
            "http://a/\u{1c}",
            "http://a/caf\u{e9}",
            "http://u:p@example.com/",
        ] {
            assert!(
                callback_url(bad, &open).is_err(),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn label_limits() {
        let mut m = std::collections::BTreeMap::new();
        // Keys are any text within the length (the contract's map rule).
        m.insert(String::new(), "v".to_string());
        assert!(labels("labels", m.iter()).is_ok());
        m.insert("k".repeat(257), "v".to_string());
        assert!(labels("labels", m.iter()).is_err());
        m.clear();
        m.insert("zone".to_string(), "eu\n".to_string());
        assert!(labels("labels", m.iter()).is_err());
        m.insert("zone".to_string(), "eu".to_string());
        assert!(labels("labels", m.iter()).is_ok());
    }
}
