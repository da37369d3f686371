//! JSON Schemas (the OpenAPI 3.0 dialect) for messages, enums and fields,
//! following the proto3 JSON mapping the gateway speaks: lowerCamel
//! property names, 64-bit integers as strings, enums by name, Timestamp and
//! Duration as strings. Messages and enums become `components.schemas`
//! entries named by their full proto name, with comments as descriptions.

use std::collections::{BTreeMap, HashMap};

use prost_reflect::{DescriptorPool, EnumDescriptor, FieldDescriptor, Kind, MessageDescriptor};
use serde_json::{Map, Value, json};

/// Leading comments of every described element, keyed by file and path.
pub struct Comments {
    by_path: HashMap<(String, Vec<i32>), String>,
}

impl Comments {
    /// Collects the source comments of every file in `pool`.
    pub fn new(pool: &DescriptorPool) -> Self {
        let mut by_path = HashMap::new();
        for file in pool.files() {
            let proto = file.file_descriptor_proto();
            let Some(info) = &proto.source_code_info else {
                continue;
            };
            for location in &info.location {
                if let Some(text) = location.leading_comments.as_deref() {
                    let text = clean(text);
                    if !text.is_empty() {
                        by_path.insert((file.name().to_string(), location.path.clone()), text);
                    }
                }
            }
        }
        Self { by_path }
    }

    /// The comment at `path` of `file`, if any.
    pub fn get(&self, file: &str, path: &[i32]) -> Option<&str> {
        self.by_path
            .get(&(file.to_string(), path.to_vec()))
            .map(String::as_str)
    }

    /// The comment of a field.
    pub fn field(&self, field: &FieldDescriptor) -> Option<&str> {
        self.get(field.parent_file().name(), field.path())
    }
}

/// A comment's lines joined into paragraphs.
fn clean(text: &str) -> String {
    let mut paragraphs: Vec<String> = vec![String::new()];
    for line in text.lines().map(str::trim) {
        if line.is_empty() {
            if !paragraphs.last().is_some_and(String::is_empty) {
                paragraphs.push(String::new());
            }
            continue;
        }
        let last = paragraphs.last_mut().expect("never empty");
        if !last.is_empty() {
            last.push(' ');
        }
        last.push_str(line);
    }
    paragraphs.retain(|p| !p.is_empty());
    paragraphs.join("\n\n")
}

/// The component schemas referenced so far.
pub struct Schemas<'a> {
    comments: &'a Comments,
    components: BTreeMap<String, Value>,
}

impl<'a> Schemas<'a> {
    /// No components yet.
    pub fn new(comments: &'a Comments) -> Self {
        Self {
            comments,
            components: BTreeMap::new(),
        }
    }

    /// Every component, by name.
    pub fn into_components(self) -> BTreeMap<String, Value> {
        self.components
    }

    /// Adds a hand-written component.
    pub fn insert(&mut self, name: &str, schema: Value) {
        self.components.insert(name.to_string(), schema);
    }

    /// A `$ref` to `message`'s component, adding it (and everything it
    /// references) on first use.
    pub fn message_ref(&mut self, message: &MessageDescriptor) -> Value {
        let name = message.full_name().to_string();
        if !self.components.contains_key(&name) {
            // A placeholder first, so a recursive message refers to itself.
            self.components.insert(name.clone(), Value::Null);
            let schema = self.object(message, &[]);
            self.components.insert(name.clone(), schema);
        }
        reference(&name)
    }

    /// `message` as an inline object schema without the fields in `skip`.
    pub fn object(&mut self, message: &MessageDescriptor, skip: &[FieldDescriptor]) -> Value {
        let mut properties = Map::new();
        let mut required = Vec::new();
        for field in message.fields() {
            if skip.contains(&field) {
                continue;
            }
            let mut schema = self.field(&field);
            if super::rules::required(&field) {
                required.push(Value::from(field.json_name()));
            } else {
                // The JSON mapping reads null as the field's default.
                schema = nullable(schema);
            }
            properties.insert(field.json_name().to_string(), schema);
        }
        let mut schema = json!({
            "type": "object",
            "properties": properties,
            "additionalProperties": false,
        });
        if !required.is_empty() {
            schema["required"] = required.into();
        }
        // A rule across fields the contract has no translation for is left
        // out here; a test fails for it (rules::tests).
        let across = super::rules::message(message).unwrap_or_default();
        if !across.is_empty() {
            schema["allOf"] = across.into();
        }
        if let Some(text) = self
            .comments
            .get(message.parent_file().name(), message.path())
        {
            schema["description"] = text.into();
        }
        schema
    }

    /// A field's schema with its comment as description.
    pub fn field(&mut self, field: &FieldDescriptor) -> Value {
        let schema = if field.is_map() {
            let value_kind = match field.kind() {
                Kind::Message(entry) => entry.map_entry_value_field().kind(),
                other => other,
            };
            json!({"type": "object", "additionalProperties": self.kind(&value_kind)})
        } else if field.is_list() {
            json!({"type": "array", "items": self.kind(&field.kind())})
        } else {
            self.kind(&field.kind())
        };
        let schema = describe(schema, self.comments.field(field));
        super::rules::apply(field, schema)
    }

    /// The schema of one value of `kind`.
    pub fn kind(&mut self, kind: &Kind) -> Value {
        match kind {
            Kind::Double => json!({"type": "number", "format": "double"}),
            Kind::Float => json!({"type": "number", "format": "float"}),
            Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
                json!({"type": "integer", "format": "int32"})
            }
            Kind::Uint32 | Kind::Fixed32 => {
                json!({"type": "integer", "format": "int64", "minimum": 0, "maximum": u32::MAX})
            }
            // Sent as strings; read as strings or numbers (the JSON mapping).
            Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => json!({"anyOf": [
                {"type": "string", "format": "int64", "pattern": format!("^-?({})$", up_to(&i64::MAX.to_string()))},
                {"type": "integer", "minimum": -9_007_199_254_740_991_i64, "maximum": 9_007_199_254_740_991_i64},
            ]}),
            Kind::Uint64 | Kind::Fixed64 => json!({"anyOf": [
                {"type": "string", "format": "uint64", "pattern": format!("^({})$", up_to(&u64::MAX.to_string()))},
                {"type": "integer", "minimum": 0, "maximum": 9_007_199_254_740_991_i64},
            ]}),
            Kind::Bool => json!({"type": "boolean"}),
            Kind::String => json!({"type": "string"}),
            Kind::Bytes => json!({"type": "string", "format": "byte"}),
            Kind::Enum(e) => self.enum_ref(e),
            Kind::Message(m) => match well_known(m.full_name()) {
                Some(schema) => schema,
                None => self.message_ref(m),
            },
        }
    }

    fn enum_ref(&mut self, e: &EnumDescriptor) -> Value {
        let name = e.full_name().to_string();
        if !self.components.contains_key(&name) {
            let names: Vec<String> = e.values().map(|v| v.name().to_string()).collect();
            let mut text = self
                .comments
                .get(e.parent_file().name(), e.path())
                .unwrap_or_default()
                .to_string();
            for value in e.values() {
                if let Some(c) = self.comments.get(value.parent_file().name(), value.path()) {
                    text.push_str(&format!("\n\n- `{}`: {c}", value.name()));
                }
            }
            let schema = describe(
                json!({"type": "string", "enum": names}),
                Some(text.trim()).filter(|t| !t.is_empty()),
            );
            self.components.insert(name.clone(), schema);
        }
        reference(&name)
    }
}

/// Schemas of the well-known types whose JSON form is not an object.
fn well_known(full_name: &str) -> Option<Value> {
    Some(match full_name {
        "google.protobuf.Timestamp" => json!({"type": "string", "format": "date-time"}),
        "google.protobuf.Duration" => json!({
            "type": "string",
            "pattern": "^-?[0-9]{1,12}(\\.[0-9]{1,9})?s$",
            "description": "A duration in seconds with up to nine fractional digits, ending in \"s\", e.g. \"1.5s\"."
        }),
        "google.protobuf.FieldMask" | "google.protobuf.StringValue" => json!({"type": "string"}),
        "google.protobuf.BytesValue" => json!({"type": "string", "format": "byte"}),
        "google.protobuf.BoolValue" => json!({"type": "boolean"}),
        "google.protobuf.Int32Value" => json!({"type": "integer", "format": "int32"}),
        "google.protobuf.UInt32Value" => {
            json!({"type": "integer", "format": "int64", "minimum": 0})
        }
        "google.protobuf.Int64Value" | "google.protobuf.UInt64Value" => {
            json!({"type": "string", "format": "int64"})
        }
        "google.protobuf.FloatValue" | "google.protobuf.DoubleValue" => json!({"type": "number"}),
        "google.protobuf.Empty" => json!({"type": "object", "additionalProperties": false}),
        "google.protobuf.Struct" | "google.protobuf.Any" => json!({"type": "object"}),
        "google.protobuf.ListValue" => json!({"type": "array", "items": {}}),
        "google.protobuf.Value" => json!({}),
        _ => return None,
    })
}

/// `schema` allowing null too. OpenAPI 3.0 ignores siblings of `$ref`, so a
/// reference is wrapped in `allOf`; an enum lists null among its values.
fn nullable(schema: Value) -> Value {
    let mut schema = if schema.get("$ref").is_some() {
        json!({"allOf": [schema]})
    } else {
        schema
    };
    if let Some(values) = schema.get_mut("enum").and_then(Value::as_array_mut) {
        values.push(Value::Null);
    }
    schema["nullable"] = true.into();
    schema
}

fn reference(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// `schema` with `text` as its description. OpenAPI 3.0 ignores siblings of
/// `$ref`, so a described reference is wrapped in `allOf`.
pub fn describe(schema: Value, text: Option<&str>) -> Value {
    let Some(text) = text else { return schema };
    if schema.get("$ref").is_some() {
        return json!({"allOf": [schema], "description": text});
    }
    let mut schema = schema;
    if let Some(obj) = schema.as_object_mut() {
        obj.insert("description".into(), text.into());
    }
    schema
}

/// A regular expression (alternatives, no anchors) for the decimal numbers
/// from 0 to `max` (its decimal digits): every shorter number, then each
/// number of `max`'s length that is below it at its first differing digit,
/// then `max`. So a 64-bit field's string form is exactly its range: a
/// pattern of "up to 20 digits" let clients (and schemathesis) send
/// numbers the server must refuse as out of range.
pub(crate) fn up_to(max: &str) -> String {
    let digits = max.as_bytes();
    let n = digits.len();
    let mut alts = Vec::with_capacity(n + 2);
    if n > 1 {
        alts.push(format!("[0-9]{{1,{}}}", n - 1));
    }
    for (i, &d) in digits.iter().enumerate() {
        let d = d - b'0';
        // A number of n > 1 digits does not start with 0.
        let lo = u8::from(i == 0 && n > 1);
        if d > lo {
            let rest = n - i - 1;
            let tail = if rest > 0 {
                format!("[0-9]{{{rest}}}")
            } else {
                String::new()
            };
            alts.push(format!("{}[{lo}-{}]{tail}", &max[..i], d - 1));
        }
    }
    alts.push(max.to_string());
    alts.join("|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_to_spells_the_range_exactly() {
        let matches = |max: &str, x: &str| {
            regex::Regex::new(&format!("^({})$", up_to(max)))
                .unwrap()
                .is_match(x)
        };
        for max in [7u64, 10, 99, 100, 305, 1000, 2019] {
            for x in 0..=3000u64 {
                assert_eq!(
                    matches(&max.to_string(), &x.to_string()),
                    x <= max,
                    "{x} against up to {max}: {}",
                    up_to(&max.to_string())
                );
            }
        }
        let u = u64::MAX.to_string();
        assert!(matches(&u, "18446744073709551615"));
        assert!(matches(&u, "9999999999999999999"));
        assert!(!matches(&u, "18446744073709551616"));
        assert!(!matches(&u, "86327510643149304510"), "schemathesis's find");
        let i = i64::MAX.to_string();
        assert!(matches(&i, "9223372036854775807"));
        assert!(!matches(&i, "9223372036854775808"));
        assert!(!matches(&i, "9999999999999999999"));
    }

    #[test]
    fn comments_become_paragraphs() {
        assert_eq!(clean(" a\n b\n\n c \n"), "a b\n\nc");
        assert_eq!(clean("\n\n"), "");
    }

    #[test]
    fn described_refs_are_wrapped() {
        let r = reference("x.Y");
        assert_eq!(
            describe(r.clone(), Some("d")),
            json!({"allOf": [r], "description": "d"})
        );
        assert_eq!(
            describe(json!({"type": "string"}), Some("d")),
            json!({"type": "string", "description": "d"})
        );
    }
}
