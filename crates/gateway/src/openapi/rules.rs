//! The contract's `buf.validate` rules as JSON Schema: what a field may
//! hold (lengths, patterns, UUIDs, ranges, defined enum values, sizes of
//! lists and maps), which fields a request must carry, and the rules across
//! fields, so a client generated from the document knows every rule the
//! server enforces on the shape of a request.
//!
//! Durations travel as strings ("1.5s"), so their ranges become patterns;
//! a message-level CEL rule has no general JSON Schema form, so each one the
//! contract uses has its translation here, and a test fails for a rule
//! without one.

use prost_protovalidate::types::{
    FieldConstraintsExt, FieldRules, Ignore, MessageConstraintsExt, double_rules, duration_rules,
    field_rules, string_rules, u_int32_rules,
};
use prost_reflect::{DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, Value as Pv};
use serde_json::{Value, json};

/// The rules of `field`, if it carries any.
pub fn of(field: &FieldDescriptor) -> Option<FieldRules> {
    field.field_constraints().ok().flatten()
}

/// The contract's own `taskmesh.options.v1.format` option of a string field.
pub fn format(field: &FieldDescriptor) -> Option<String> {
    let options: DynamicMessage = field.options();
    let ext = field
        .parent_pool()
        .get_extension_by_name("taskmesh.options.v1.format")?;
    if !options.has_extension(&ext) {
        return None;
    }
    match options.get_extension(&ext).as_ref() {
        Pv::String(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

fn ignores_zero(rules: &FieldRules) -> bool {
    rules.ignore == Some(Ignore::IfZeroValue as i32)
}

/// Whether a request must carry `field` (its zero value breaks a rule).
pub fn required(field: &FieldDescriptor) -> bool {
    let Some(rules) = of(field) else { return false };
    if rules.required == Some(true) {
        return true;
    }
    if ignores_zero(&rules) {
        return false;
    }
    match &rules.r#type {
        Some(field_rules::Type::String(s)) => {
            s.min_len.unwrap_or(0) > 0
                || matches!(s.well_known, Some(string_rules::WellKnown::Uuid(true)))
        }
        Some(field_rules::Type::Enum(e)) => e.not_in.contains(&0),
        Some(field_rules::Type::Repeated(r)) => r.min_items.unwrap_or(0) > 0,
        _ => false,
    }
}

const UUID: &str = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";

/// `schema` (the schema of one value of `field`, or of the list or map it
/// holds) narrowed by the field's rules.
pub fn apply(field: &FieldDescriptor, mut schema: Value) -> Value {
    let format = format(field);
    let Some(rules) = of(field) else {
        return schema;
    };
    let optional = ignores_zero(&rules);
    match &rules.r#type {
        Some(field_rules::Type::Map(m)) => {
            if let Some(n) = m.max_pairs {
                schema["maxProperties"] = n.into();
            }
            if let Some(n) = m.min_pairs {
                schema["minProperties"] = n.into();
            }
            if let Some(keys) = &m.keys {
                let mut names = json!({"type": "string"});
                scalar(keys, &mut names, false);
                schema["propertyNames"] = names;
            }
            if let Some(values) = &m.values {
                scalar(values, &mut schema["additionalProperties"], false);
            }
        }
        Some(field_rules::Type::Repeated(r)) => {
            if let Some(n) = r.min_items {
                schema["minItems"] = n.into();
            }
            if let Some(n) = r.max_items {
                schema["maxItems"] = n.into();
            }
            if let Some(items) = &r.items {
                scalar(items, &mut schema["items"], false);
            }
        }
        Some(field_rules::Type::Enum(e)) => {
            if let Kind::Enum(desc) = field.kind() {
                // Names and numbers alike (the JSON mapping accepts both),
                // only the defined ones, less those refused.
                let values: Vec<_> = desc
                    .values()
                    .filter(|v| !e.not_in.contains(&v.number()))
                    .collect();
                let mut allowed: Vec<Value> = values.iter().map(|v| v.name().into()).collect();
                allowed.extend(values.iter().map(|v| Value::from(v.number())));
                schema = json!({"enum": allowed});
            }
        }
        _ => scalar(&rules, &mut schema, optional),
    }
    if let Some(format) = format {
        match format.as_str() {
            "time-zone" => {
                let mut names: Vec<Value> = Vec::new();
                if optional {
                    names.push("".into());
                }
                names.extend(taskmesh_core::timetable::zone_names().map(Value::from));
                schema = json!({"type": "string", "enum": names});
            }
            other => schema["format"] = other.into(),
        }
    }
    schema
}

/// The rules of one scalar value onto its schema.
fn scalar(rules: &FieldRules, schema: &mut Value, optional: bool) {
    match &rules.r#type {
        Some(field_rules::Type::String(s)) => {
            if let Some(n) = s.max_len {
                schema["maxLength"] = n.into();
            }
            if let Some(n) = s.min_len.filter(|_| !optional) {
                schema["minLength"] = n.into();
            }
            let mut pattern = s.pattern.clone();
            if matches!(s.well_known, Some(string_rules::WellKnown::Uuid(true))) {
                pattern = Some(UUID.into());
                if !optional {
                    schema["format"] = "uuid".into();
                }
            }
            if let Some(p) = pattern {
                // An empty value is allowed where the rules ignore it.
                schema["pattern"] = if optional { format!("^$|{p}") } else { p }.into();
            }
        }
        Some(field_rules::Type::Uint32(u)) => {
            if let Some(u_int32_rules::LessThan::Lte(n)) = u.less_than {
                schema["maximum"] = n.into();
            }
            if let Some(u_int32_rules::GreaterThan::Gte(n)) = u.greater_than {
                schema["minimum"] = n.into();
            }
        }
        Some(field_rules::Type::Double(d)) => {
            let mut range = json!({});
            if let Some(double_rules::LessThan::Lte(n)) = d.less_than {
                range["maximum"] = n.into();
            }
            if let Some(double_rules::GreaterThan::Gte(n)) = d.greater_than {
                range["minimum"] = n.into();
            }
            if optional {
                schema["anyOf"] = json!([{"enum": [0]}, range]);
            } else if let (Some(obj), Some(r)) = (schema.as_object_mut(), range.as_object()) {
                obj.extend(r.clone());
            }
        }
        Some(field_rules::Type::Duration(d)) => {
            let lo = match d.greater_than {
                Some(duration_rules::GreaterThan::Gte(g)) => Some(nanos(&g)),
                _ => None,
            };
            let hi = match d.less_than {
                Some(duration_rules::LessThan::Lte(l)) => Some(nanos(&l)),
                _ => None,
            };
            if let Some(p) = duration_pattern(lo.unwrap_or(i128::MIN), hi) {
                schema["pattern"] = p.into();
                let words = match (lo, hi) {
                    (Some(lo), Some(hi)) => {
                        format!(" Between {} and {}.", seconds(lo), seconds(hi))
                    }
                    (Some(lo), None) => format!(" At least {}.", seconds(lo)),
                    _ => String::new(),
                };
                if let Some(text) = schema.get("description").and_then(Value::as_str) {
                    schema["description"] = format!("{text}{words}").into();
                }
            }
        }
        _ => {}
    }
}

fn nanos(d: &prost_types::Duration) -> i128 {
    i128::from(d.seconds) * 1_000_000_000 + i128::from(d.nanos)
}

fn seconds(n: i128) -> String {
    if n % 1_000_000_000 == 0 {
        format!("{}s", n / 1_000_000_000)
    } else {
        format!("{}s", n as f64 / 1e9)
    }
}

/// A pattern for the JSON form of a duration (`S[.F]s`) from `lo` to `hi`
/// nanoseconds, both included. Handles the bounds the contract uses: a
/// non-negative `lo` that is whole seconds or under one second, and a
/// whole-seconds `hi` (or none).
fn duration_pattern(lo: i128, hi: Option<i128>) -> Option<String> {
    const S: i128 = 1_000_000_000;
    let lo = lo.max(0);
    if hi.is_some_and(|h| h % S != 0 || h < lo) || (lo >= S && lo % S != 0) {
        return None;
    }
    let frac = "(\\.[0-9]{1,9})?";
    let mut alts = Vec::new();
    // Whole seconds from `first` up to (not including) the top, any fraction.
    let first = if lo == 0 {
        0
    } else if lo < S {
        1
    } else {
        lo / S
    };
    if lo > 0 && lo < S {
        // Under a second: a fraction at least `lo`.
        alts.push(format!("0\\.{}", fraction_at_least(lo)));
    }
    match hi {
        Some(h) => {
            let top = h / S;
            if first < top {
                alts.push(format!("{}{frac}", int_range(first, top - 1)));
            }
            alts.push(format!("{top}(\\.0{{1,9}})?"));
        }
        None => match first {
            0 => alts.push(format!("(0|[1-9][0-9]{{0,11}}){frac}")),
            1 => alts.push(format!("[1-9][0-9]{{0,11}}{frac}")),
            _ => return None,
        },
    }
    Some(format!("^({})s$", alts.join("|")))
}

/// Nine-digit fractions (given with 1-9 digits) of at least `lo` ns (< 1 s).
fn fraction_at_least(lo: i128) -> String {
    // Supported: lo a power of ten (1 ms = 0.001 s, the contract's bound).
    let digits = format!("{lo:09}");
    let zeros = digits.chars().take_while(|&c| c == '0').count();
    let mut alts = Vec::new();
    for z in 0..=zeros {
        // `z` leading zeros, then a non-zero digit within the first zeros+1 places.
        alts.push(format!("{}[1-9][0-9]{{0,{}}}", "0".repeat(z), 8 - z));
    }
    format!("({})", alts.join("|"))
}

/// A regex matching the decimal integers `lo..=hi` (no leading zeros).
pub fn int_range(lo: i128, hi: i128) -> String {
    let mut alts = Vec::new();
    range_parts(lo, hi, &mut alts);
    format!("({})", alts.join("|"))
}

fn range_parts(lo: i128, hi: i128, out: &mut Vec<String>) {
    if lo > hi {
        return;
    }
    let (ls, hs) = (lo.to_string(), hi.to_string());
    if ls.len() < hs.len() {
        let top = 10i128.pow(ls.len() as u32) - 1;
        range_parts(lo, top, out);
        range_parts(top + 1, hi, out);
        return;
    }
    // Same length: fixed-width numbers without a leading zero.
    range_parts_width(lo, hi, ls.len(), out);
}

/// The numbers `lo..=hi` written with `width` digits (leading zeros kept),
/// split on the first digit where the bounds differ.
fn range_parts_width(lo: i128, hi: i128, width: usize, out: &mut Vec<String>) {
    let (ls, hs) = (format!("{lo:0width$}"), format!("{hi:0width$}"));
    let common = ls
        .chars()
        .zip(hs.chars())
        .take_while(|(a, b)| a == b)
        .count();
    if common == width {
        out.push(ls);
        return;
    }
    let rest = width - common - 1;
    let prefix = &ls[..common];
    let a = ls.as_bytes()[common] - b'0';
    let b = hs.as_bytes()[common] - b'0';
    let all_low = ls[common + 1..].chars().all(|c| c == '0');
    let all_high = hs[common + 1..].chars().all(|c| c == '9');
    let any = |n: usize| {
        if n == 0 {
            String::new()
        } else {
            format!("[0-9]{{{n}}}")
        }
    };
    let digit = |x: u8, y: u8| {
        if x == y {
            x.to_string()
        } else {
            format!("[{x}-{y}]")
        }
    };
    let mut first = a;
    if !all_low {
        let tail: i128 = ls[common + 1..].parse().unwrap_or(0);
        let mut sub = Vec::new();
        range_parts_width(tail, 10i128.pow(rest as u32) - 1, rest, &mut sub);
        out.push(format!("{prefix}{a}({})", sub.join("|")));
        first = a + 1;
    }
    let mut last = b;
    if !all_high {
        last = b - 1;
    }
    if first <= last {
        out.push(format!("{prefix}{}{}", digit(first, last), any(rest)));
    }
    if !all_high {
        let tail: i128 = hs[common + 1..].parse().unwrap_or(0);
        let mut sub = Vec::new();
        range_parts_width(0, tail, rest, &mut sub);
        out.push(format!("{prefix}{b}({})", sub.join("|")));
    }
}

/// The message-level rules of `message` as schemas every value must also
/// match (`allOf` members): `oneof` rules and the CEL rules translated
/// below. `Err` names a CEL rule without a translation.
pub fn message(message: &MessageDescriptor) -> Result<Vec<Value>, String> {
    let Ok(Some(rules)) = message.message_constraints() else {
        return Ok(Vec::new());
    };
    let json_name = |name: &str| {
        message
            .get_field_by_name(name)
            .map(|f| f.json_name().to_string())
            .unwrap_or_else(|| name.to_string())
    };
    let mut out = Vec::new();
    for oneof in &rules.oneof {
        let names: Vec<String> = oneof.fields.iter().map(|f| json_name(f)).collect();
        // At most one: no two of them together.
        for (i, a) in names.iter().enumerate() {
            for b in &names[i + 1..] {
                out.push(json!({"not": {"required": [a, b]}}));
            }
        }
        if oneof.required == Some(true) {
            out.push(json!({"anyOf": names.iter().map(|n| json!({"required": [n]})).collect::<Vec<_>>()}));
        }
    }
    for rule in &rules.cel {
        let id = rule.id.clone().unwrap_or_default();
        out.push(cel(&id).ok_or_else(|| {
            format!(
                "{}: the CEL rule {id:?} has no JSON Schema translation",
                message.full_name()
            )
        })?);
    }
    Ok(out)
}

/// The JSON Schema form of each message-level CEL rule of the contract.
fn cel(id: &str) -> Option<Value> {
    Some(match id {
        // kind CRON needs a cron expression.
        "schedule.cron_expression" => json!({"anyOf": [
            {"not": {"properties": {"kind": {"enum": ["SCHEDULE_KIND_CRON", 1]}}, "required": ["kind"]}},
            {"properties": {"cronExpression": {"type": "string", "minLength": 1}}, "required": ["cronExpression"]},
        ]}),
        // The other kinds need an interval.
        "schedule.interval" => json!({"anyOf": [
            {"properties": {"kind": {"enum": ["SCHEDULE_KIND_CRON", 1]}}, "required": ["kind"]},
            {"properties": {"interval": {"type": "string"}}, "required": ["interval"]},
        ]}),
        // A template or a workflow, exactly one (null reads as absent).
        "schedule.template_or_workflow" => json!({"anyOf": [
            {"properties": {"template": {"type": "object"}, "workflow": {"type": "null"}},
             "required": ["template"]},
            {"properties": {"workflow": {"type": "object"}, "template": {"type": "null"}},
             "required": ["workflow"]},
        ]}),
        // A concurrency key and its limit go together: neither (absent,
        // null or zero, which proto3 JSON reads alike) or both.
        "submit.concurrency" | "template.concurrency" => json!({"anyOf": [
            {"properties": {
                "concurrencyKey": {"enum": ["", null]},
                "concurrencyLimit": {"enum": [0, "0", null]},
            }},
            {"properties": {
                "concurrencyKey": {"not": {"enum": ["", null]}},
                "concurrencyLimit": {"not": {"enum": [0, "0", null]}},
            }, "required": ["concurrencyKey", "concurrencyLimit"]},
        ]}),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_protovalidate::regex::Regex;

    fn matches(pattern: &str, text: &str) -> bool {
        Regex::new(pattern).expect("compiles").is_match(text)
    }

    #[test]
    fn every_rule_across_fields_has_a_translation() {
        let pool = crate::descriptor_pool().expect("the contract loads");
        let mut with_rules = 0;
        for m in pool.all_messages() {
            let rules = message(&m).unwrap_or_else(|e| panic!("{e}"));
            with_rules += usize::from(!rules.is_empty());
        }
        assert!(with_rules >= 2, "{with_rules}");
    }

    #[test]
    fn integer_ranges_match_exactly_their_members() {
        for (lo, hi) in [
            (0, 9),
            (1, 100),
            (7, 604_799),
            (13, 13),
            (10, 99),
            (5, 1234),
            (1, 31_622_399),
        ] {
            let re = Regex::new(&format!("^{}$", int_range(lo, hi))).expect("compiles");
            // Every number near the bounds and a sample between them.
            let near = (0..lo + 200).chain(hi.saturating_sub(200)..hi + 200);
            for n in near.chain((lo..hi).step_by(997)) {
                assert_eq!(
                    re.is_match(&n.to_string()),
                    (lo..=hi).contains(&n),
                    "{re} {n}"
                );
            }
        }
    }

    #[test]
    fn duration_patterns_follow_the_bounds() {
        let timeout = duration_pattern(1_000_000, Some(604_800 * 1_000_000_000)).unwrap();
        for ok in [
            "0.001s",
            "0.5s",
            "1s",
            "1.000000001s",
            "604799.9s",
            "604800s",
            "604800.000s",
        ] {
            assert!(matches(&timeout, ok), "{ok} {timeout}");
        }
        for bad in [
            "0s",
            "0.0009s",
            "0.000999999s",
            "604800.1s",
            "604801s",
            "-1s",
            "1",
            "1.s",
        ] {
            assert!(!matches(&timeout, bad), "{bad} {timeout}");
        }
        let interval = duration_pattern(1_000_000_000, Some(31_622_400 * 1_000_000_000)).unwrap();
        assert!(matches(&interval, "1s") && matches(&interval, "31622400s"));
        assert!(!matches(&interval, "0.9s") && !matches(&interval, "31622400.5s"));
        let any = duration_pattern(0, None).unwrap();
        assert!(matches(&any, "0s") && matches(&any, "12.5s") && !matches(&any, "-1s"));
    }
}
