//! The web console at `/ui/`: static files embedded in the binary at build
//! time (`build.rs` lists `crates/gateway/console/`), so there is nothing to
//! install and no Node at build or run time. The console talks only to the
//! public REST API under `/api` with the caller's bearer token; the files
//! themselves hold no secret and are served without authentication, like
//! `/openapi.json`.
//!
//! Every answer carries a content-security policy that allows scripts,
//! styles and connections to this origin only, and no framing.

use axum::Router;
use axum::extract::Path;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use http::{HeaderValue, StatusCode, header};

/// Every embedded file, by name.
static ASSETS: &[(&str, &[u8])] = include!(concat!(env!("OUT_DIR"), "/console_assets.rs"));

/// Scripts, styles and calls from this origin only; images may also be
/// made in the page (the download of a large payload is a blob URL).
const CSP: &str = "default-src 'self'; img-src 'self' blob: data:; object-src 'none'; \
                   base-uri 'none'; frame-ancestors 'none'; form-action 'self'";

/// The console's routes: `/ui` (redirects), `/ui/` (the page) and
/// `/ui/{file}`.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(|| async { asset("index.html") }))
        .route(
            "/ui/{*file}",
            get(|Path(file): Path<String>| async move { asset(&file) }),
        )
}

/// The names of the embedded files (for tests and the docs).
pub fn asset_names() -> impl Iterator<Item = &'static str> {
    ASSETS.iter().map(|(name, _)| *name)
}

fn asset(name: &str) -> Response {
    let Some((_, body)) = ASSETS.iter().find(|(n, _)| *n == name) else {
        let mut res = (StatusCode::NOT_FOUND, "no such console file\n").into_response();
        secure(&mut res);
        return res;
    };
    let mut res = (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(media_type(name)),
        )],
        *body,
    )
        .into_response();
    secure(&mut res);
    res
}

fn secure(res: &mut Response) {
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // Small files, changed with the binary: always revalidate, never serve a
    // stale console after an upgrade.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
}

fn media_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("json") => "application/json",
        Some("ico") => "image/x-icon",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_and_its_scripts_are_embedded_with_their_media_types() {
        let names: Vec<_> = asset_names().collect();
        assert!(names.contains(&"index.html"), "{names:?}");
        assert!(names.contains(&"app.js"), "{names:?}");
        assert_eq!(media_type("app.js"), "text/javascript; charset=utf-8");
        assert_eq!(media_type("index.html"), "text/html; charset=utf-8");
        assert_eq!(media_type("x.bin"), "application/octet-stream");
    }

    #[test]
    fn an_unknown_file_is_404_and_every_answer_carries_the_policy() {
        let res = asset("../Cargo.toml");
        assert_eq!(res.status(), StatusCode::NOT_FOUND);
        assert!(res.headers().contains_key(header::CONTENT_SECURITY_POLICY));
        let res = asset("index.html");
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(
            res.headers()[header::CONTENT_SECURITY_POLICY]
                .to_str()
                .unwrap(),
            CSP
        );
    }
}
