//! From a raw JSON record to a keyed [`Record`], or a [`RejectedRecord`] that keeps the raw
//! payload so the error report can be inspected and replayed.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::quote::truncated;
use crate::raw::{json_kind, lookup_raw, to_value, RawObject};

/// The longest external id stored. Longer ids are rejected (stage `validate`) rather than
/// truncated, because a truncated id could collide with another record's.
pub const MAX_EXTERNAL_ID_LEN: usize = 255;

/// A record ready to store under the key (user_id, provider, external_id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The provider's own id for the record, or the hash of its immutable key fields.
    pub external_id: String,
    /// The record's JSON text exactly as the API sent it.
    pub payload: String,
    /// Hex sha256 of `payload`: equal hashes mean an unchanged record. A record whose
    /// fields come back in another order or spacing hashes differently and is rewritten
    /// once; it is never stored twice, because the key does not depend on the text.
    pub content_hash: String,
}

/// Where in the pipeline a record failed (the `run_errors.stage` column).
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

/// A record set aside: the reason and the raw payload as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejectedRecord {
    /// The external id when one could be read, else `None`.
    pub external_id: Option<String>,
    /// Where the record failed.
    pub stage: RecordStage,
    /// Why the record was set aside. Shared: the records of a page set aside for the same
    /// reason hold one copy of it.
    pub message: Arc<str>,
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
    pub fn identify_raw(&self, raw: &RawValue) -> Result<Record, RejectedRecord> {
        self.identify_with_field(raw, None).0
    }

    /// Like [`IdSpec::identify_raw`], for a record already parsed: its compact JSON text
    /// stands for the text as received.
    pub fn identify(&self, value: Value) -> Result<Record, RejectedRecord> {
        match serde_json::value::to_raw_value(&value) {
            Ok(raw) => self.identify_raw(&raw),
            Err(error) => Err(RejectedRecord {
                external_id: None,
                stage: RecordStage::Parse,
                message: format!("the record cannot be written as JSON: {error}").into(),
                payload: value.to_string(),
            }),
        }
    }

    /// Keys one raw record, and reads its top-level `field` (e.g. the watermark's) in the
    /// same scan. The payload is the record's text exactly as received, and the content
    /// hash is the sha256 of that text: nothing is parsed into a tree or written back out.
    pub fn identify_with_field<'a>(
        &self,
        raw: &'a RawValue,
        field: Option<&str>,
    ) -> (Result<Record, RejectedRecord>, Option<&'a RawValue>) {
        let reject = |stage, message: String| RejectedRecord {
            external_id: None,
            stage,
            message: message.into(),
            payload: raw.get().to_string(),
        };
        // Only the top-level fields keying reads are kept; for an id field, on the stack.
        let (id_keys, key_fields);
        let keys: &[&str] = match self {
            IdSpec::Field(path) => {
                id_keys = [first_segment(path), field.unwrap_or_default()];
                &id_keys
            }
            IdSpec::KeyFields(fields) => {
                key_fields = fields
                    .iter()
                    .map(|path| first_segment(path))
                    .chain(field)
                    .collect::<Vec<_>>();
                &key_fields
            }
        };
        let Some(object) = RawObject::parse(raw, keys) else {
            let message = format!("record is not a JSON object but {}", json_kind(raw).name());
            return (Err(reject(RecordStage::Parse, message)), None);
        };
        let extra = field.and_then(|name| object.get(name));
        let external_id = match self {
            IdSpec::Field(path) => id_from_field(raw, &object, path),
            IdSpec::KeyFields(fields) => id_from_key_fields(raw, &object, fields),
        };
        let external_id = match external_id {
            Ok(id) => id,
            Err(message) => return (Err(reject(RecordStage::Validate, message)), extra),
        };
        if external_id.len() > MAX_EXTERNAL_ID_LEN {
            let shown = truncated(&external_id, 32);
            let message = format!(
                "id is {} bytes long, more than the {MAX_EXTERNAL_ID_LEN} allowed (starts with {shown:?})",
                external_id.len()
            );
            return (Err(reject(RecordStage::Validate, message)), extra);
        }
        let payload = raw.get().to_string();
        let content_hash = sha256_hex(payload.as_bytes());
        let record = Record {
            external_id,
            payload,
            content_hash,
        };
        (Ok(record), extra)
    }
}

/// The top-level key a dotted path starts with.
fn first_segment(path: &str) -> &str {
    path.split('.').next().unwrap_or(path)
}

/// Hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    const_hex::encode(Sha256::digest(bytes))
}

/// The value at a dotted path of a record, read as a [`Value`]. An empty path is the
/// record itself.
fn lookup_field(record: &RawValue, object: &RawObject<'_>, path: &str) -> Option<Value> {
    if path.is_empty() {
        return Some(to_value(record));
    }
    let (first, rest) = path.split_once('.').unwrap_or((path, ""));
    let raw = lookup_raw(object.get(first)?, rest)?;
    Some(to_value(raw))
}

fn id_from_field(record: &RawValue, object: &RawObject<'_>, path: &str) -> Result<String, String> {
    match lookup_field(record, object, path) {
        None | Some(Value::Null) => Err(format!("record has no id field `{path}`")),
        Some(Value::String(s)) if s.trim().is_empty() => {
            Err(format!("id field `{path}` is an empty string"))
        }
        // PostgreSQL cannot store a NUL character in text at all; the key must mean the
        // same on every backend, so such an id is refused everywhere.
        Some(Value::String(s)) if s.contains('\0') => Err(format!(
            "id field `{path}` contains a NUL character, which cannot be stored in a key"
        )),
        Some(Value::String(s)) => Ok(s),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        Some(Value::Number(n)) => Err(format!(
            "id field `{path}` is the number {n}, which is not an integer that fits 64 bits"
        )),
        Some(other) => Err(format!(
            "id field `{path}` is {}, expected a string or an integer",
            json_type_name(&other)
        )),
    }
}

fn id_from_key_fields(
    record: &RawValue,
    object: &RawObject<'_>,
    fields: &[String],
) -> Result<String, String> {
    let mut key = serde_json::Map::new();
    for field in fields {
        match lookup_field(record, object, field) {
            None | Some(Value::Null) => {
                return Err(format!("record has no key field `{field}`"));
            }
            Some(value) => {
                key.insert(field.clone(), value);
            }
        }
    }
    // serde_json's map is ordered by key, so this text is canonical: the id does not
    // depend on the order or spacing of the record's fields.
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
            (json!({"id": "a\u{0}b"}), "contains a NUL character"),
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
    fn the_payload_and_hash_are_the_text_as_received() {
        let raw = |text: &str| serde_json::from_str::<Box<RawValue>>(text).unwrap();
        let sent = r#"{"id": 1, "b": 2,"a" :3}"#;
        let record = field("id").identify_raw(&raw(sent)).unwrap();
        assert_eq!(record.payload, sent);
        assert_eq!(record.content_hash, sha256_hex(sent.as_bytes()));
        let again = field("id").identify_raw(&raw(sent)).unwrap();
        assert_eq!(again, record);
        // Another order is another text: the same key, a new hash (one rewrite, no copy).
        let reordered = field("id")
            .identify_raw(&raw(r#"{"a":3,"id":1,"b":2}"#))
            .unwrap();
        assert_eq!(reordered.external_id, record.external_id);
        assert_ne!(reordered.content_hash, record.content_hash);
    }
}

/// Property tests: arbitrary JSON never panics `identify`, a record is either keyed or set
/// aside with its payload, and a usable id is never lost.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The oracle: follows a dotted path (`a.b.c`) into a parsed JSON value. An empty path is the value itself.
    fn lookup_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
        if path.is_empty() {
            return Some(value);
        }
        path.split('.')
            .try_fold(value, |current, segment| current.get(segment))
    }

    /// A fixed seed unless `PROPTEST_RNG_SEED` is set, so the suite is repeatable.
    fn config(cases: u32) -> ProptestConfig {
        let mut config = ProptestConfig::with_cases(cases);
        if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
            config.rng_seed = proptest::test_runner::RngSeed::Fixed(0x7269_6465);
        }
        config.failure_persistence = None;
        config
    }

    /// Strings that probe ids: empty, blank, NUL, long, non-ASCII, digits.
    fn probe_string() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            "[ \t\n\u{a0}\u{3000}]{1,4}",
            ".{0,12}",
            "[a-zA-Z0-9_]{1,12}",
            "[0-9]{1,30}",
            "\\PC{250,260}",
            ".{0,3}\u{0}.{0,3}",
        ]
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            probe_string().prop_map(Value::String),
        ]
    }

    /// Arbitrary JSON up to a few levels deep, whose object keys are often the ones the
    /// specs below look for.
    fn json_value() -> impl Strategy<Value = Value> {
        let key = prop_oneof!["id", "meta", "date", "type", ".{0,6}"];
        leaf().prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(key.clone(), inner, 0..6)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    fn id_path() -> impl Strategy<Value = String> {
        prop_oneof!["id", "meta.id", "meta", "date", "", ".{0,8}"]
    }

    fn assert_keyed_or_set_aside(
        spec: &IdSpec,
        raw: Value,
    ) -> Result<Option<Record>, TestCaseError> {
        let payload = raw.to_string();
        match spec.identify(raw.clone()) {
            Ok(record) => {
                prop_assert!(raw.is_object());
                prop_assert!(!record.external_id.trim().is_empty());
                prop_assert!(record.external_id.len() <= MAX_EXTERNAL_ID_LEN);
                prop_assert!(!record.external_id.contains('\0'));
                prop_assert_eq!(&record.payload, &payload);
                prop_assert_eq!(&record.content_hash, &sha256_hex(payload.as_bytes()));
                Ok(Some(record))
            }
            Err(rejected) => {
                prop_assert_eq!(
                    &rejected.payload,
                    &payload,
                    "the payload is kept as received"
                );
                prop_assert_eq!(rejected.external_id, None);
                prop_assert!(!rejected.message.is_empty());
                let expected = if raw.is_object() {
                    RecordStage::Validate
                } else {
                    RecordStage::Parse
                };
                prop_assert_eq!(rejected.stage, expected);
                Ok(None)
            }
        }
    }

    proptest! {
        #![proptest_config(config(512))]

        #[test]
        fn an_id_field_keys_a_record_or_sets_it_aside(raw in json_value(), path in id_path()) {
            let spec = IdSpec::Field(path.clone());
            if let Some(record) = assert_keyed_or_set_aside(&spec, raw.clone())? {
                // The id is exactly the field's string, or its integer written out.
                let expected = match lookup_path(&raw, &path) {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Number(n)) => n.to_string(),
                    other => return Err(TestCaseError::fail(format!("accepted {other:?}"))),
                };
                prop_assert_eq!(record.external_id, expected);
            }
        }

        #[test]
        fn key_fields_key_a_record_or_set_it_aside(
            raw in json_value(),
            fields in prop::collection::vec(id_path(), 1..3),
        ) {
            let spec = IdSpec::KeyFields(fields);
            if let Some(record) = assert_keyed_or_set_aside(&spec, raw)? {
                prop_assert_eq!(record.external_id.len(), 64);
                prop_assert!(record.external_id.chars().all(|c| c.is_ascii_hexdigit()));
            }
        }

        /// No lost good record: a usable id is always accepted, whatever else the record
        /// holds.
        #[test]
        fn a_usable_id_is_always_accepted(
            id in "[^\u{0}]{0,200}".prop_filter("not blank", |s| !s.trim().is_empty()),
            number in any::<i64>(),
            use_number in any::<bool>(),
            rest in json_value(),
        ) {
            let value = if use_number { json!(number) } else { json!(id) };
            let raw = json!({"id": value.clone(), "rest": rest});
            let record = IdSpec::Field("id".into()).identify(raw);
            let expected = match &value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            prop_assert!(expected.len() <= MAX_EXTERNAL_ID_LEN || record.is_err());
            if expected.len() <= MAX_EXTERNAL_ID_LEN {
                prop_assert_eq!(record.map(|r| r.external_id), Ok(expected));
            }
        }
    }
}
