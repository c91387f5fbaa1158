//! Reading JSON without building a tree: a page body is validated once, and its records
//! stay slices of it (`&RawValue`). A record's payload and content hash are its text as
//! received; only the few fields the pipeline needs (the id, a watermark, a cursor) are
//! looked up, in one scan of the record that skips everything else without allocating.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
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

/// A list body (`{"data": [...], ...}`): its top-level fields, with the array under one
/// key read element by element in the same scan, so the records are not scanned twice.
#[derive(Debug)]
pub struct RawList<'a> {
    /// The other fields (the array's own key is not among them).
    pub fields: RawObject<'a>,
    /// The array's elements, or the kind of value found instead; `None` when the key is
    /// missing.
    pub items: Option<Result<Vec<&'a RawValue>, JsonKind>>,
}

impl<'a> RawList<'a> {
    /// Reads `raw` as an object whose `key` holds an array. `None` when `raw` is not an
    /// object or its text cannot be read this way (e.g. a number beyond f64 under `key`);
    /// callers then fall back to [`RawObject::parse`].
    pub fn parse(raw: &'a RawValue, key: &str) -> Option<RawList<'a>> {
        RawList::parse_text(raw.get(), key)
    }

    /// Like [`RawList::parse`], for text not yet known to be JSON: the one scan that reads
    /// the list also checks that the whole text is JSON, and `None` is also the answer
    /// when it is not. A body read this way needs no scan of its own first.
    pub fn parse_text(text: &'a str, key: &str) -> Option<RawList<'a>> {
        if text_kind(text) != JsonKind::Object {
            return None;
        }
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let list = ListSeed { key }.deserialize(&mut deserializer).ok()?;
        deserializer.end().ok()?;
        Some(list)
    }
}

struct ListSeed<'k> {
    key: &'k str,
}

impl<'de> DeserializeSeed<'de> for ListSeed<'_> {
    type Value = RawList<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ListSeed<'_> {
    type Value = RawList<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
        let mut fields = Vec::new();
        let mut items = None;
        while let Some(Key(key)) = map.next_key()? {
            if key == self.key {
                items = Some(map.next_value::<ArrayItems>()?.0);
            } else {
                fields.push((key, map.next_value::<&RawValue>()?));
            }
        }
        Ok(RawList {
            fields: RawObject { fields },
            items,
        })
    }
}

/// An array's elements, each still raw, or the kind of value found instead.
struct ArrayItems<'a>(Result<Vec<&'a RawValue>, JsonKind>);

impl<'de> Deserialize<'de> for ArrayItems<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ItemsVisitor;
        impl<'de> Visitor<'de> for ItemsVisitor {
            type Value = ArrayItems<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Self::Value, S::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(100));
                while let Some(item) = seq.next_element::<&RawValue>()? {
                    items.push(item);
                }
                Ok(ArrayItems(Ok(items)))
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(ArrayItems(Err(JsonKind::Object)))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(ArrayItems(Err(JsonKind::Bool)))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(ArrayItems(Err(JsonKind::Number)))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(ArrayItems(Err(JsonKind::Number)))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(ArrayItems(Err(JsonKind::Number)))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(ArrayItems(Err(JsonKind::String)))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(ArrayItems(Err(JsonKind::Null)))
            }
        }
        deserializer.deserialize_any(ItemsVisitor)
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
    text_kind(raw.get())
}

/// The kind of JSON value `text` holds, judged by its first character (for text that is
/// not JSON, a guess good enough for an error message).
pub fn text_kind(text: &str) -> JsonKind {
    match text.trim_start().as_bytes().first() {
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
    array_items_text(raw.get())
}

/// Like [`array_items`], for text not yet known to be JSON: the scan that finds the
/// elements also checks that the whole text is JSON, and `None` is also the answer when
/// it is not.
pub fn array_items_text(text: &str) -> Option<Vec<&RawValue>> {
    if text_kind(text) != JsonKind::Array {
        return None;
    }
    serde_json::from_str(text).ok()
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
    fn a_list_read_from_text_is_read_only_when_the_whole_text_is_json() {
        let text = r#" {"object":"list","data":[{"id":"ch_1"}],"has_more":false} "#;
        let list = RawList::parse_text(text, "data").unwrap();
        assert_eq!(list.items.unwrap().unwrap()[0].get(), r#"{"id":"ch_1"}"#);
        assert_eq!(list.fields.get("object").unwrap().get(), r#""list""#);
        let not_json = [
            // cut short
            r#"{"object":"list","data":[{"id":"ch_1"}"#,
            // trailing text after the object
            r#"{"object":"list","data":[],"has_more":false} and more"#,
            // broken inside a field that is not read
            r#"{"object":"list","url":"/v1/charges","meta":{"a":[1,}],"data":[]}"#,
            // broken inside a record
            r#"{"object":"list","data":[{"id":"ch_1","amount":01}]}"#,
            "",
        ];
        for text in not_json {
            assert!(RawList::parse_text(text, "data").is_none(), "{text}");
            assert!(serde_json::from_str::<IgnoredAny>(text).is_err(), "{text}");
        }
        assert!(RawList::parse_text("[1, 2]", "data").is_none());
        assert_eq!(text_kind(" [1, 2]"), JsonKind::Array);
    }

    #[test]
    fn a_list_reads_its_array_in_the_same_scan() {
        let body = raw(r#"{"object":"list","data":[{"id":1}, 2],"has_more":true}"#);
        let list = RawList::parse(body, "data").unwrap();
        let items = list.items.unwrap().unwrap();
        assert_eq!(
            items.iter().map(|item| item.get()).collect::<Vec<_>>(),
            [r#"{"id":1}"#, "2"]
        );
        assert_eq!(list.fields.get("has_more").unwrap().get(), "true");
        assert!(list.fields.get("data").is_none());
        let kinds = [
            (r#"{"data":{"a":[1]}}"#, Some(Err(JsonKind::Object))),
            (r#"{"data":"x"}"#, Some(Err(JsonKind::String))),
            (r#"{"data":null}"#, Some(Err(JsonKind::Null))),
            (r#"{"data":-2.5}"#, Some(Err(JsonKind::Number))),
            (r#"{"other":1}"#, None),
        ];
        for (text, expected) in kinds {
            let list = RawList::parse(raw(text), "data").unwrap();
            assert_eq!(
                list.items.map(|items| items.map(|_| ())),
                expected,
                "{text}"
            );
        }
        assert!(RawList::parse(raw("[1]"), "data").is_none());
        assert!(RawList::parse(raw(r#"{"data":1e400}"#), "data").is_none());
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
