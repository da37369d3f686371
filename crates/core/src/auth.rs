//! Who may do what: roles, API tokens and the secrets that bind an
//! assignment to the worker it was given to. Pure: no I/O; the store keeps
//! token records, the dispatcher checks them.
//!
//! A token is `tmk_<id>_<secret>`: a short public id (for listing, revoking
//! and audit logs) and 256 random bits. Only the SHA-256 of the whole token
//! is stored; a presented token is looked up by its id and its digest
//! compared in constant time. SHA-256 rather than a password hash: the
//! secret is 256 random bits, so there is nothing to slow a guesser down
//! for.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::UnixMillis;

/// What a token may do, within its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Everything in its namespace, tokens included.
    Admin,
    /// Submit, get, list, cancel, watch; schedules; breakers.
    Submitter,
    /// Get, list, watch; breakers. Never sees execution ids, session ids or
    /// push addresses.
    Reader,
    /// The `Dispatcher` service (worker streams, push registrations) and
    /// results only for its own sessions.
    Worker,
}

impl Role {
    /// Every role, most powerful first.
    pub const ALL: [Role; 4] = [Role::Admin, Role::Submitter, Role::Reader, Role::Worker];

    /// The role's name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Submitter => "submitter",
            Role::Reader => "reader",
            Role::Worker => "worker",
        }
    }

    /// Parses a role name (case-insensitive).
    pub fn parse(text: &str) -> Option<Role> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str().eq_ignore_ascii_case(text))
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored token: everything but its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    /// Public id, `[0-9a-f]{12}`: shown in lists and logs.
    pub id: String,
    /// Free text to recognise it by.
    pub name: String,
    /// The namespace it acts in.
    pub namespace: String,
    /// What it may do there.
    pub role: Role,
    /// SHA-256 of the whole token text, hex.
    pub secret_hash: String,
    /// When it was made.
    pub created_at: UnixMillis,
    /// After this instant it is refused; `None` never expires.
    pub expires_at: Option<UnixMillis>,
    /// When it was revoked, if it was.
    pub revoked_at: Option<UnixMillis>,
}

impl TokenRecord {
    /// True when the token may be used at `now`: not revoked, not expired.
    pub fn is_live(&self, now: UnixMillis) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|e| now < e)
    }
}

/// Why a presented token is refused. Callers tell the client only that it
/// is missing or invalid (never which), and log the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No token was presented.
    Missing,
    /// Not in the token format.
    Malformed,
    /// No token with that id, or its secret does not match.
    Unknown,
    /// Past its expiry.
    Expired,
    /// Revoked.
    Revoked,
}

impl Refusal {
    /// The reason as a metric label and log field.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Malformed => "malformed",
            Refusal::Unknown => "unknown",
            Refusal::Expired => "expired",
            Refusal::Revoked => "revoked",
        }
    }
}

/// A new token's text (shown once) and its record.
pub fn new_token(
    name: &str,
    namespace: &str,
    role: Role,
    now: UnixMillis,
    expires_at: Option<UnixMillis>,
) -> (String, TokenRecord) {
    let mut bytes = [0u8; 38];
    rand::fill(&mut bytes[..]);
    let id = hex::encode(&bytes[..6]);
    let text = format!("tmk_{id}_{}", hex::encode(&bytes[6..]));
    let record = TokenRecord {
        id,
        name: name.to_string(),
        namespace: namespace.to_string(),
        role,
        secret_hash: digest(&text),
        created_at: now,
        expires_at,
        revoked_at: None,
    };
    (text, record)
}

/// The public id of a token text, if it has the token's shape.
pub fn token_id(text: &str) -> Option<&str> {
    let rest = text.strip_prefix("tmk_")?;
    let (id, secret) = rest.split_once('_')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id, 12) && hex(secret, 64)).then_some(id)
}

/// Checks a presented token text against the record its id names.
pub fn check_token(
    text: &str,
    record: Option<&TokenRecord>,
    now: UnixMillis,
) -> Result<(), Refusal> {
    let record = record.ok_or(Refusal::Unknown)?;
    if !same_secret(&digest(text), &record.secret_hash) {
        return Err(Refusal::Unknown);
    }
    if record.revoked_at.is_some() {
        return Err(Refusal::Revoked);
    }
    if record.expires_at.is_some_and(|e| now >= e) {
        return Err(Refusal::Expired);
    }
    Ok(())
}

/// Hex SHA-256 of `text`.
pub fn digest(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// Compares two secrets (or their digests) in time that depends only on
/// their lengths, so a guesser learns nothing from how long a refusal took.
pub fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The secret of assignment `execution_id`, derived from the cluster's key
/// (kept in the store, the same on every replica): what a worker presents
/// with a result or an out-of-band ACK, so an execution id alone (which
/// the public API shows) forges nothing. Never stored, never shown by the
/// public API.
pub fn assignment_secret(cluster_key: &[u8], execution_id: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(cluster_key).expect("HMAC takes any key length");
    mac.update(b"taskmesh assignment:");
    mac.update(execution_id.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// A new random cluster key (32 bytes), for a store that has none yet.
pub fn new_cluster_key() -> Vec<u8> {
    let mut key = vec![0u8; 32];
    rand::fill(&mut key[..]);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_found_by_its_id_and_matched_by_its_digest_only() {
        let (text, record) = new_token("ci", "team-a", Role::Submitter, 10, Some(100));
        assert_eq!(token_id(&text), Some(record.id.as_str()));
        assert_eq!(record.secret_hash.len(), 64);
        assert!(
            !record.secret_hash.contains(&text[17..]),
            "only a digest is kept"
        );
        assert_eq!(check_token(&text, Some(&record), 50), Ok(()));
        assert_eq!(
            check_token(&text, Some(&record), 100),
            Err(Refusal::Expired)
        );
        let mut forged = text.clone();
        forged.replace_range(
            text.len() - 1..,
            if text.ends_with('0') { "1" } else { "0" },
        );
        assert_eq!(token_id(&forged), Some(record.id.as_str()));
        assert_eq!(
            check_token(&forged, Some(&record), 50),
            Err(Refusal::Unknown)
        );
        let revoked = TokenRecord {
            revoked_at: Some(20),
            ..record.clone()
        };
        assert_eq!(
            check_token(&text, Some(&revoked), 50),
            Err(Refusal::Revoked)
        );
        assert_eq!(check_token(&text, None, 50), Err(Refusal::Unknown));
        for bad in [
            "",
            "tmk_",
            "Bearer x",
            "tmk_abc_def",
            &text[..text.len() - 1],
        ] {
            assert_eq!(token_id(bad), None, "{bad:?}");
        }
        let (other, _) = new_token("ci", "team-a", Role::Submitter, 10, None);
        assert_ne!(other, text, "every token is fresh");
    }

    #[test]
    fn roles_round_trip_and_secrets_compare_exactly() {
        for role in Role::ALL {
            assert_eq!(Role::parse(role.as_str()), Some(role));
            assert_eq!(Role::parse(&role.as_str().to_uppercase()), Some(role));
        }
        assert_eq!(Role::parse("root"), None);
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
    }

    #[test]
    fn assignment_secrets_depend_on_key_and_execution() {
        let key = new_cluster_key();
        let a = assignment_secret(&key, "exec-1");
        assert_eq!(a, assignment_secret(&key, "exec-1"));
        assert_ne!(a, assignment_secret(&key, "exec-2"));
        assert_ne!(a, assignment_secret(&new_cluster_key(), "exec-1"));
    }
}
