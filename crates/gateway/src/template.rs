//! `google.api.http` path templates: parsing at start-up and matching at
//! request time.
//!
//! Supported grammar (what grpc-gateway supports for these services):
//! literal segments, single-segment variables `{field.path}` /
//! `{field.path=*}`, and a trailing `:verb` (as in `/api/tasks:batch`).
//! Anything else (`**`, literal patterns inside a variable) is refused at
//! start-up with a message naming the template, never mis-matched at run time.

use percent_encoding::percent_decode_str;

/// One segment of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Must equal this text.
    Literal(String),
    /// Binds one non-empty segment to the field at this dotted path.
    Variable(String),
}

/// A parsed path template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The template as written in the proto.
    pub text: String,
    /// Its segments, without the leading empty one.
    pub segments: Vec<Segment>,
    /// The custom verb after the last `:`, if any.
    pub verb: Option<String>,
}

impl Template {
    /// Parses a template such as `/api/tasks/{task_id}/cancel`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("path template {text:?}: {why}");
        let rest = text
            .strip_prefix('/')
            .ok_or_else(|| bad("must start with '/'"))?;
        // The verb follows the last ':' that is outside any `{...}`.
        let mut depth = 0usize;
        let mut verb_at = None;
        for (i, c) in rest.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth = depth.saturating_sub(1),
                ':' if depth == 0 => verb_at = Some(i),
                _ => {}
            }
        }
        let (path, verb) = match verb_at {
            Some(i) => (&rest[..i], Some(rest[i + 1..].to_string())),
            None => (rest, None),
        };
        if verb
            .as_deref()
            .is_some_and(|v| v.is_empty() || v.contains('/'))
        {
            return Err(bad("empty or malformed verb"));
        }
        let mut segments = Vec::new();
        for part in path.split('/') {
            if part.is_empty() {
                return Err(bad("empty segment"));
            }
            if let Some(inner) = part.strip_prefix('{') {
                let inner = inner
                    .strip_suffix('}')
                    .ok_or_else(|| bad("a variable must fill its whole segment"))?;
                let (field, pattern) = inner.split_once('=').unwrap_or((inner, "*"));
                if pattern != "*" {
                    return Err(bad(
                        "only single-segment variables ({x} or {x=*}) are supported",
                    ));
                }
                let valid = !field.is_empty()
                    && field.split('.').all(|p| {
                        !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    });
                if !valid {
                    return Err(bad("malformed variable name"));
                }
                segments.push(Segment::Variable(field.to_string()));
            } else if part.contains(['{', '}', '*']) {
                return Err(bad("wildcards outside a variable are not supported"));
            } else {
                segments.push(Segment::Literal(part.to_string()));
            }
        }
        Ok(Self {
            text: text.to_string(),
            segments,
            verb,
        })
    }

    /// The field paths of the template's variables, in order.
    pub fn variables(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Variable(v) => Some(v.as_str()),
            Segment::Literal(_) => None,
        })
    }

    /// Literal segments: a tie-breaker so the most specific template wins.
    pub fn literal_count(&self) -> usize {
        self.segments.len() - self.variables().count()
    }

    /// Matches a request path (still percent-encoded), returning the
    /// decoded variable values in template order. A variable never matches
    /// an empty segment, and a value that does not decode as UTF-8 does not
    /// match.
    pub fn matches(&self, path: &str) -> Option<Vec<(String, String)>> {
        let rest = path.strip_prefix('/')?;
        let rest = match &self.verb {
            Some(verb) => rest.strip_suffix(verb.as_str())?.strip_suffix(':')?,
            None => rest,
        };
        let parts: Vec<&str> = rest.split('/').collect();
        if parts.len() != self.segments.len() {
            return None;
        }
        let mut vars = Vec::new();
        for (segment, part) in self.segments.iter().zip(parts) {
            let decoded = percent_decode_str(part).decode_utf8().ok()?;
            match segment {
                Segment::Literal(lit) if *lit == decoded => {}
                Segment::Literal(_) => return None,
                Segment::Variable(_) if decoded.is_empty() => return None,
                Segment::Variable(field) => vars.push((field.clone(), decoded.into_owned())),
            }
        }
        Some(vars)
    }

    /// The template as an OpenAPI path: the same text, variables written
    /// `{field.path}`.
    pub fn openapi_path(&self) -> String {
        let mut out = String::new();
        for segment in &self.segments {
            out.push('/');
            match segment {
                Segment::Literal(l) => out.push_str(l),
                Segment::Variable(v) => {
                    out.push('{');
                    out.push_str(v);
                    out.push('}');
                }
            }
        }
        if let Some(verb) = &self.verb {
            out.push(':');
            out.push_str(verb);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(t: &str, path: &str) -> Option<Vec<(String, String)>> {
        Template::parse(t).expect("parses").matches(path)
    }

    #[test]
    fn literals_variables_and_verbs_match() {
        assert_eq!(vars("/api/tasks", "/api/tasks"), Some(vec![]));
        assert_eq!(vars("/api/tasks", "/api/tasks/"), None);
        assert_eq!(vars("/api/tasks", "/api/tasks:batch"), None);
        assert_eq!(vars("/api/tasks:batch", "/api/tasks:batch"), Some(vec![]));
        assert_eq!(vars("/api/tasks:batch", "/api/tasks"), None);
        assert_eq!(
            vars("/api/tasks/{task_id}/cancel", "/api/tasks/abc/cancel"),
            Some(vec![("task_id".into(), "abc".into())])
        );
        assert_eq!(vars("/api/tasks/{task_id}", "/api/tasks//"), None);
        assert_eq!(
            vars("/api/tasks/{task_id}", "/api/tasks/"),
            None,
            "empty value"
        );
        assert_eq!(
            vars("/api/tasks/{task_id=*}", "/api/tasks/a%20b%3Ac"),
            Some(vec![("task_id".into(), "a b:c".into())])
        );
        assert_eq!(vars("/api/tasks/{task_id}", "/api/tasks/%FF"), None);
        assert_eq!(
            vars("/v1/{a.b}/x/{c}:run", "/v1/1/x/2:run"),
            Some(vec![("a.b".into(), "1".into()), ("c".into(), "2".into())])
        );
    }

    #[test]
    fn unsupported_templates_are_refused_by_name() {
        for bad in [
            "api/tasks",
            "/api//tasks",
            "/api/{name=**}",
            "/api/{name=shelves/*}",
            "/api/x{y}",
            "/api/*",
            "/api/{}",
            "/api/tasks:",
            "/api/{a-b}",
        ] {
            let err = Template::parse(bad).expect_err(bad);
            assert!(err.contains(bad), "{err}");
        }
    }

    #[test]
    fn openapi_paths_keep_the_template_shape() {
        for t in [
            "/api/tasks",
            "/api/tasks:batch",
            "/api/tasks/{task_id}/watch",
        ] {
            assert_eq!(Template::parse(t).unwrap().openapi_path(), t);
        }
        assert_eq!(
            Template::parse("/api/{id=*}").unwrap().openapi_path(),
            "/api/{id}"
        );
    }
}
