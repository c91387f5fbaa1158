//! Reading JSON without building a tree: a page body is validated once, and its records
//! stay slices of it (`&RawValue`). A record's payload and content hash are its text as
//! received; only the few fields the pipeline needs (the id, a watermark, a cursor) are
//! looked up, in one scan of the record that skips everything else without allocating.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// The top-level fields of one JSON object, each still raw text. Keys without escapes
/// borrow from the text.
#[derive(Debug, Default)]
pub struct RawObject<'a> {
    fields: Vec<(Cow<'a, str>, &'a RawValue)>,
}

impl<'a> RawObject<'a> {
    /// The object's fields, or `None` when `raw` is not an object.
    pub fn parse(raw: &'a RawValue) -> Option<RawObject<'a>> {
        if json_kind(raw) != JsonKind::Object {
            return None;
        }
        serde_json::from_str(raw.get()).ok()
    }

    /// The field named `key`; when a key repeats, the last one counts (as it does for
    /// `serde_json::Value`).
    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.fields
            .iter()
            .rev()
            .find(|(name, _)| name == key)
            .map(|(_, value)| *value)
    }
}

impl<'de> Deserialize<'de> for RawObject<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = RawObject<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(16));
                while let Some(Key(key)) = map.next_key()? {
                    fields.push((key, map.next_value::<&RawValue>()?));
                }
                Ok(RawObject { fields })
            }
        }
        deserializer.deserialize_map(ObjectVisitor)
    }
}

/// An object key, borrowed from the text unless it holds escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E: de::Error>(self, key: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(key)))
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(key.to_string())))
            }
            fn visit_string<E: de::Error>(self, key: String) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(key)))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// What kind of JSON value a raw value is, read from its first character.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JsonKind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

impl JsonKind {
    /// "a string", "an array", ... for error messages (as [`crate::record::json_type_name`]).
    pub fn name(self) -> &'static str {
        match self {
            JsonKind::Null => "null",
            JsonKind::Bool => "a boolean",
            JsonKind::Number => "a number",
            JsonKind::String => "a string",
            JsonKind::Array => "an array",
            JsonKind::Object => "an object",
        }
    }
}

/// The kind of a (valid) raw JSON value.
pub fn json_kind(raw: &RawValue) -> JsonKind {
    match raw.get().trim_start().as_bytes().first() {
        Some(b'{') => JsonKind::Object,
        Some(b'[') => JsonKind::Array,
        Some(b'"') => JsonKind::String,
        Some(b't' | b'f') => JsonKind::Bool,
        Some(b'n') => JsonKind::Null,
        _ => JsonKind::Number,
    }
}

/// The elements of a raw array, each still raw; `None` when `raw` is not an array.
pub fn array_items(raw: &RawValue) -> Option<Vec<&RawValue>> {
    if json_kind(raw) != JsonKind::Array {
        return None;
    }
    serde_json::from_str(raw.get()).ok()
}

/// Follows a dotted path (`a.b.c`) into a raw value. An empty path is the value itself.
pub fn lookup_raw<'a>(raw: &'a RawValue, path: &str) -> Option<&'a RawValue> {
    if path.is_empty() {
        return Some(raw);
    }
    path.split('.').try_fold(raw, |current, segment| {
        RawObject::parse(current)?.get(segment)
    })
}

/// A raw value read as a [`Value`] (for the small values looked up: ids, cursors, times).
pub fn to_value(raw: &RawValue) -> Value {
    // The text was validated when the body was read, so this cannot fail; `Null` keeps
    // the signature total anyway.
    serde_json::from_str(raw.get()).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> &RawValue {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn fields_are_found_by_key_and_path_without_a_tree() {
        let record = raw(r#"{"id":"ch_1", "meta":{"id":7,"a\"b":1}, "n":[1,2]}"#);
        let object = RawObject::parse(record).unwrap();
        assert_eq!(object.get("id").unwrap().get(), r#""ch_1""#);
        assert_eq!(object.get("n").unwrap().get(), "[1,2]");
        assert!(object.get("missing").is_none());
        assert_eq!(lookup_raw(record, "meta.id").unwrap().get(), "7");
        assert_eq!(lookup_raw(record, "meta.a\"b").unwrap().get(), "1");
        assert!(lookup_raw(record, "n.x").is_none());
        assert_eq!(lookup_raw(record, "").unwrap().get(), record.get());
    }

    #[test]
    fn a_repeated_key_reads_as_its_last_value() {
        let object = RawObject::parse(raw(r#"{"id":1,"id":2}"#)).unwrap();
        assert_eq!(object.get("id").unwrap().get(), "2");
    }

    #[test]
    fn kinds_are_read_from_the_first_character() {
        let kinds = [
            ("null", JsonKind::Null),
            ("true", JsonKind::Bool),
            ("-1.5", JsonKind::Number),
            (r#""x""#, JsonKind::String),
            ("[1]", JsonKind::Array),
            ("{}", JsonKind::Object),
        ];
        for (text, kind) in kinds {
            assert_eq!(json_kind(raw(text)), kind, "{text}");
        }
        assert!(RawObject::parse(raw("[1]")).is_none());
        assert!(array_items(raw("{}")).is_none());
        let items = array_items(raw(r#"[ {"a":1} , 2 ]"#)).unwrap();
        assert_eq!(
            items.iter().map(|item| item.get()).collect::<Vec<_>>(),
            [r#"{"a":1}"#, "2"]
        );
    }
}
