//! From a raw JSON record to a keyed [`Record`], or a [`RejectedRecord`] that keeps the raw
//! payload so the error report can be inspected and replayed.

use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The longest external id stored. Longer ids are rejected (stage `validate`) rather than
/// truncated, because a truncated id could collide with another record's.
pub const MAX_EXTERNAL_ID_LEN: usize = 255;

/// A record ready to store under the key (user_id, provider, external_id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The provider's own id for the record, or the hash of its immutable key fields.
    pub external_id: String,
    /// The record as canonical JSON text (compact, object keys sorted).
    pub payload: String,
    /// Hex sha256 of `payload`: equal hashes mean an unchanged record.
    pub content_hash: String,
}

/// Where in the pipeline a record failed. Stored in `run_errors.stage`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordStage {
    /// The page could not be fetched.
    Fetch,
    /// The body or the record is not the JSON shape expected.
    Parse,
    /// The record has no usable id (missing, empty, wrong type, too long).
    Validate,
    /// Writing the record to the database failed.
    Persist,
}

impl RecordStage {
    /// The value stored in `run_errors.stage`.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordStage::Fetch => "fetch",
            RecordStage::Parse => "parse",
            RecordStage::Validate => "validate",
            RecordStage::Persist => "persist",
        }
    }
}

/// A record set aside: the reason and the raw payload as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejectedRecord {
    /// The external id when one could be read, else `None`.
    pub external_id: Option<String>,
    /// Where the record failed.
    pub stage: RecordStage,
    /// Why the record was set aside.
    pub message: String,
    /// The raw record (JSON text) as received, so it can be replayed.
    pub payload: String,
}

/// How a provider's records are identified.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub enum IdSpec {
    /// A field (dotted path, e.g. `id` or `meta.id`) that holds a stable id: a non-empty
    /// string or an integer.
    Field(String),
    /// Immutable fields whose values, hashed, become the id (for sources without a stable id):
    /// `sha256` of the canonical JSON object `{field: value, ...}`.
    KeyFields(Vec<String>),
}

impl IdSpec {
    /// Turns one raw record into a [`Record`], or rejects it with its payload kept.
    pub fn identify(&self, raw: Value) -> Result<Record, RejectedRecord> {
        let payload = raw.to_string();
        let reject = |stage, message: String, external_id: Option<String>| RejectedRecord {
            external_id,
            stage,
            message,
            payload: payload.clone(),
        };
        if !raw.is_object() {
            return Err(reject(
                RecordStage::Parse,
                format!("record is not a JSON object but {}", json_type_name(&raw)),
                None,
            ));
        }
        let external_id = match self {
            IdSpec::Field(path) => id_from_field(&raw, path)
                .map_err(|message| reject(RecordStage::Validate, message, None))?,
            IdSpec::KeyFields(fields) => id_from_key_fields(&raw, fields)
                .map_err(|message| reject(RecordStage::Validate, message, None))?,
        };
        if external_id.len() > MAX_EXTERNAL_ID_LEN {
            let shown: String = external_id.chars().take(32).collect();
            return Err(reject(
                RecordStage::Validate,
                format!(
                    "id is {} bytes long, more than the {MAX_EXTERNAL_ID_LEN} allowed (starts with {shown:?})",
                    external_id.len()
                ),
                None,
            ));
        }
        let content_hash = sha256_hex(payload.as_bytes());
        Ok(Record {
            external_id,
            payload,
            content_hash,
        })
    }
}

/// Hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Follows a dotted path (`a.b.c`) into a JSON value. An empty path is the value itself.
pub fn lookup_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    if path.is_empty() {
        return Some(value);
    }
    path.split('.')
        .try_fold(value, |current, segment| current.get(segment))
}

fn id_from_field(raw: &Value, path: &str) -> Result<String, String> {
    match lookup_path(raw, path) {
        None | Some(Value::Null) => Err(format!("record has no id field `{path}`")),
        Some(Value::String(s)) if s.trim().is_empty() => {
            Err(format!("id field `{path}` is an empty string"))
        }
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        Some(Value::Number(n)) => Err(format!(
            "id field `{path}` is the number {n}, which is not an integer that fits 64 bits"
        )),
        Some(other) => Err(format!(
            "id field `{path}` is {}, expected a string or an integer",
            json_type_name(other)
        )),
    }
}

fn id_from_key_fields(raw: &Value, fields: &[String]) -> Result<String, String> {
    let mut key = serde_json::Map::new();
    for field in fields {
        match lookup_path(raw, field) {
            None | Some(Value::Null) => {
                return Err(format!("record has no key field `{field}`"));
            }
            Some(value) => {
                key.insert(field.clone(), value.clone());
            }
        }
    }
    // serde_json's map is ordered by key, so this text is canonical.
    Ok(sha256_hex(Value::Object(key).to_string().as_bytes()))
}

/// "a string", "an array", ... for error messages.
pub fn json_type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(path: &str) -> IdSpec {
        IdSpec::Field(path.to_string())
    }

    #[test]
    fn string_and_integer_ids_are_accepted() {
        let record = field("id").identify(json!({"id": "ch_1", "a": 1})).unwrap();
        assert_eq!(record.external_id, "ch_1");
        assert_eq!(record.payload, r#"{"a":1,"id":"ch_1"}"#);
        let record = field("id").identify(json!({"id": 42})).unwrap();
        assert_eq!(record.external_id, "42");
        let record = field("meta.id")
            .identify(json!({"meta": {"id": 7}}))
            .unwrap();
        assert_eq!(record.external_id, "7");
    }

    #[test]
    fn unusable_ids_are_rejected_with_their_payload() {
        let cases = [
            (json!({"name": "x"}), "has no id field `id`"),
            (json!({"id": null}), "has no id field `id`"),
            (json!({"id": ""}), "empty string"),
            (
                json!({"id": true}),
                "a boolean, expected a string or an integer",
            ),
            (json!({"id": {"a": 1}}), "an object, expected"),
            (json!({"id": 1.5}), "not an integer"),
            (json!({"id": 1e300}), "not an integer"),
            (json!({"id": "x".repeat(300)}), "more than the 255 allowed"),
        ];
        for (raw, expected) in cases {
            let payload = raw.to_string();
            let rejected = field("id").identify(raw).unwrap_err();
            assert_eq!(rejected.stage, RecordStage::Validate, "{payload}");
            assert!(rejected.message.contains(expected), "{}", rejected.message);
            assert_eq!(rejected.payload, payload);
            assert_eq!(rejected.external_id, None);
        }
    }

    #[test]
    fn a_record_that_is_not_an_object_is_a_parse_error() {
        let rejected = field("id").identify(json!([1, 2])).unwrap_err();
        assert_eq!(rejected.stage, RecordStage::Parse);
        assert_eq!(rejected.payload, "[1,2]");
    }

    #[test]
    fn key_fields_hash_only_the_named_fields_in_canonical_order() {
        let spec = IdSpec::KeyFields(vec!["date".into(), "type".into()]);
        let a = spec
            .identify(json!({"date": "2026-01-01", "type": "run", "km": 5}))
            .unwrap();
        let b = spec
            .identify(json!({"type": "run", "km": 9, "date": "2026-01-01"}))
            .unwrap();
        assert_eq!(a.external_id, b.external_id);
        assert_eq!(
            a.external_id,
            sha256_hex(br#"{"date":"2026-01-01","type":"run"}"#)
        );
        assert_ne!(a.content_hash, b.content_hash);
        let missing = spec.identify(json!({"date": "2026-01-01"})).unwrap_err();
        assert!(missing.message.contains("no key field `type`"));
    }

    #[test]
    fn equal_content_hashes_equal_regardless_of_key_order() {
        let a = field("id")
            .identify(json!({"id": 1, "b": 2, "a": 3}))
            .unwrap();
        let b: Value = serde_json::from_str(r#"{"a":3,"id":1,"b":2}"#).unwrap();
        let b = field("id").identify(b).unwrap();
        assert_eq!(a.content_hash, b.content_hash);
    }
}
