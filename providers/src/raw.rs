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

/// Some top-level fields of one JSON object, each still raw text: only the keys asked
/// for are kept, so an object of millions of fields costs no more than one of two. Keys
/// without escapes borrow from the text.
#[derive(Debug, Default)]
pub struct RawObject<'a> {
    fields: Vec<(Cow<'a, str>, &'a RawValue)>,
}

impl<'a> RawObject<'a> {
    /// The fields of `raw` named in `keys`, or `None` when `raw` is not an object.
    pub fn parse(raw: &'a RawValue, keys: &[&str]) -> Option<RawObject<'a>> {
        if json_kind(raw) != JsonKind::Object {
            return None;
        }
        let mut deserializer = serde_json::Deserializer::from_str(raw.get());
        ObjectSeed { keys }.deserialize(&mut deserializer).ok()
    }

    /// The field named `key` (when it was asked for); when a key repeats, the last one
    /// counts (as it does for `serde_json::Value`).
    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.fields
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| *value)
    }

    /// Keeps `value` under `key` when `key` is asked for, replacing an earlier copy.
    fn keep(&mut self, keys: &[&str], key: Cow<'a, str>, value: &'a RawValue) {
        match self.fields.iter_mut().find(|(name, _)| *name == key) {
            Some(field) => field.1 = value,
            None if keys.contains(&key.as_ref()) => self.fields.push((key, value)),
            None => {}
        }
    }
}

/// Reads an object keeping only the fields named in `keys`.
struct ObjectSeed<'k> {
    keys: &'k [&'k str],
}

impl<'de> DeserializeSeed<'de> for ObjectSeed<'_> {
    type Value = RawObject<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ObjectSeed<'_> {
    type Value = RawObject<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
        let mut object = RawObject::default();
        while let Some(Key(key)) = map.next_key()? {
            if self.keys.contains(&key.as_ref()) {
                object.keep(self.keys, key, map.next_value::<&RawValue>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(object)
    }
}

/// Why no list of items was read where one was expected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotItems {
    /// Another kind of value was found (for text that is not JSON, a guess).
    Kind(JsonKind),
    /// An array of more elements than the limit; only their number was kept.
    TooMany {
        /// How many elements the array holds.
        count: usize,
    },
}

/// A list body (`{"data": [...], ...}`): some of its top-level fields, with the array
/// under one key read element by element in the same scan, so the records are not
/// scanned twice.
#[derive(Debug)]
pub struct RawList<'a> {
    /// The other fields asked for (the array's own key is not among them).
    pub fields: RawObject<'a>,
    /// The array's elements, or why there are none; `None` when the key is missing.
    pub items: Option<Result<Vec<&'a RawValue>, NotItems>>,
}

/// What to read of a list body.
#[derive(Clone, Copy, Debug)]
pub struct ListShape<'a> {
    /// The key of the array.
    pub key: &'a str,
    /// The other top-level fields to keep.
    pub fields: &'a [&'a str],
    /// The most elements kept; past it, only their number is.
    pub max_items: usize,
}

impl<'a> RawList<'a> {
    /// Reads `raw` as an object whose `shape.key` holds an array. `None` when `raw` is not
    /// an object or its text cannot be read this way (e.g. a number beyond f64 under the
    /// key); callers then fall back to [`RawObject::parse`].
    pub fn parse(raw: &'a RawValue, shape: ListShape<'_>) -> Option<RawList<'a>> {
        RawList::parse_text(raw.get(), shape)
    }

    /// Like [`RawList::parse`], for text not yet known to be JSON: the one scan that reads
    /// the list also checks that the whole text is JSON, and `None` is also the answer
    /// when it is not. A body read this way needs no scan of its own first.
    pub fn parse_text(text: &'a str, shape: ListShape<'_>) -> Option<RawList<'a>> {
        if text_kind(text) != JsonKind::Object {
            return None;
        }
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let list = ListSeed { shape }.deserialize(&mut deserializer).ok()?;
        deserializer.end().ok()?;
        Some(list)
    }
}

struct ListSeed<'k> {
    shape: ListShape<'k>,
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
        let mut fields = RawObject::default();
        let mut items = None;
        let max = self.shape.max_items;
        while let Some(Key(key)) = map.next_key()? {
            if key == self.shape.key {
                items = Some(map.next_value_seed(ItemsSeed { max })?);
            } else if self.shape.fields.contains(&key.as_ref()) {
                fields.keep(self.shape.fields, key, map.next_value::<&RawValue>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(RawList { fields, items })
    }
}

/// Reads an array's elements, each still raw, at most `max` of them (past that, only
/// their number), or the kind of value found instead.
#[derive(Clone, Copy)]
struct ItemsSeed {
    max: usize,
}

impl<'de> DeserializeSeed<'de> for ItemsSeed {
    type Value = Result<Vec<&'de RawValue>, NotItems>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed {
    type Value = Result<Vec<&'de RawValue>, NotItems>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Self::Value, S::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(100).min(self.max));
        while let Some(item) = seq.next_element::<&RawValue>()? {
            if items.len() == self.max {
                // Past the limit only the count is kept, so the array's size costs nothing.
                let mut count = items.len() + 1;
                drop(items);
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    count = count.saturating_add(1);
                }
                return Ok(Err(NotItems::TooMany { count }));
            }
            items.push(item);
        }
        Ok(Ok(items))
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Err(NotItems::Kind(JsonKind::Object)))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Err(NotItems::Kind(JsonKind::Bool)))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Err(NotItems::Kind(JsonKind::Number)))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Err(NotItems::Kind(JsonKind::Number)))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Err(NotItems::Kind(JsonKind::Number)))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Err(NotItems::Kind(JsonKind::String)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Err(NotItems::Kind(JsonKind::Null)))
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

/// The elements of a raw array, each still raw, at most `max` of them.
pub fn array_items(raw: &RawValue, max: usize) -> Result<Vec<&RawValue>, NotItems> {
    array_items_text(raw.get(), max)
}

/// Like [`array_items`], for text not yet known to be JSON: the scan that finds the
/// elements also checks that the whole text is JSON, and text that is not is refused as
/// the kind its first character suggests.
pub fn array_items_text(text: &str, max: usize) -> Result<Vec<&RawValue>, NotItems> {
    let not_items = NotItems::Kind(text_kind(text));
    if text_kind(text) != JsonKind::Array {
        return Err(not_items);
    }
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let items = ItemsSeed { max }
        .deserialize(&mut deserializer)
        .map_err(|_| not_items)?;
    deserializer.end().map_err(|_| not_items)?;
    items
}

/// Follows a dotted path (`a.b.c`) into a raw value. An empty path is the value itself.
pub fn lookup_raw<'a>(raw: &'a RawValue, path: &str) -> Option<&'a RawValue> {
    if path.is_empty() {
        return Some(raw);
    }
    path.split('.').try_fold(raw, |current, segment| {
        RawObject::parse(current, &[segment])?.get(segment)
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
        let object = RawObject::parse(record, &["id", "n", "missing"]).unwrap();
        assert_eq!(object.get("id").unwrap().get(), r#""ch_1""#);
        assert_eq!(object.get("n").unwrap().get(), "[1,2]");
        assert!(object.get("missing").is_none());
        assert_eq!(lookup_raw(record, "meta.id").unwrap().get(), "7");
        assert_eq!(lookup_raw(record, "meta.a\"b").unwrap().get(), "1");
        assert!(lookup_raw(record, "n.x").is_none());
        assert_eq!(lookup_raw(record, "").unwrap().get(), record.get());
    }

    const DATA: ListShape<'static> = ListShape {
        key: "data",
        fields: &["object", "has_more"],
        max_items: 10,
    };

    #[test]
    fn a_list_read_from_text_is_read_only_when_the_whole_text_is_json() {
        let text = r#" {"object":"list","data":[{"id":"ch_1"}],"has_more":false} "#;
        let list = RawList::parse_text(text, DATA).unwrap();
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
            assert!(RawList::parse_text(text, DATA).is_none(), "{text}");
            assert!(serde_json::from_str::<IgnoredAny>(text).is_err(), "{text}");
        }
        assert!(RawList::parse_text("[1, 2]", DATA).is_none());
        assert_eq!(text_kind(" [1, 2]"), JsonKind::Array);
    }

    #[test]
    fn a_list_reads_its_array_in_the_same_scan() {
        let body = raw(r#"{"object":"list","data":[{"id":1}, 2],"has_more":true}"#);
        let list = RawList::parse(body, DATA).unwrap();
        let items = list.items.unwrap().unwrap();
        assert_eq!(
            items.iter().map(|item| item.get()).collect::<Vec<_>>(),
            [r#"{"id":1}"#, "2"]
        );
        assert_eq!(list.fields.get("has_more").unwrap().get(), "true");
        assert!(list.fields.get("data").is_none());
        let kinds = [
            (
                r#"{"data":{"a":[1]}}"#,
                Some(Err(NotItems::Kind(JsonKind::Object))),
            ),
            (
                r#"{"data":"x"}"#,
                Some(Err(NotItems::Kind(JsonKind::String))),
            ),
            (
                r#"{"data":null}"#,
                Some(Err(NotItems::Kind(JsonKind::Null))),
            ),
            (
                r#"{"data":-2.5}"#,
                Some(Err(NotItems::Kind(JsonKind::Number))),
            ),
            (r#"{"other":1}"#, None),
        ];
        for (text, expected) in kinds {
            let list = RawList::parse(raw(text), DATA).unwrap();
            assert_eq!(
                list.items.map(|items| items.map(|_| ())),
                expected,
                "{text}"
            );
        }
        assert!(RawList::parse(raw("[1]"), DATA).is_none());
        assert!(RawList::parse(raw(r#"{"data":1e400}"#), DATA).is_none());
    }

    #[test]
    fn arrays_past_the_limit_keep_only_their_count() {
        assert_eq!(
            array_items_text("[1,2,3]", 3).map(|items| items.len()),
            Ok(3)
        );
        assert_eq!(
            array_items_text("[1,[2],{},4]", 3).err(),
            Some(NotItems::TooMany { count: 4 })
        );
        let shape = ListShape {
            max_items: 2,
            ..DATA
        };
        let list = RawList::parse_text(r#"{"data":[0,0,0],"has_more":true}"#, shape).unwrap();
        let items = list.items.unwrap();
        assert_eq!(items.err(), Some(NotItems::TooMany { count: 3 }));
        assert_eq!(list.fields.get("has_more").unwrap().get(), "true");
        // Past the limit the text is still checked to be JSON.
        assert!(RawList::parse_text(r#"{"data":[0,0,0,}]}"#, shape).is_none());
        assert_eq!(
            array_items_text("[0,0,0,", 2).err(),
            Some(NotItems::Kind(JsonKind::Array))
        );
    }

    #[test]
    fn only_the_fields_asked_for_are_kept() {
        let text = r#"{"a":1,"id":2,"b":{"id":3},"id":4,"c":[5]}"#;
        let object = RawObject::parse(raw(text), &["id", "c"]).unwrap();
        assert_eq!(object.fields.len(), 2);
        assert_eq!(object.get("id").unwrap().get(), "4");
        assert_eq!(object.get("c").unwrap().get(), "[5]");
        assert!(object.get("a").is_none());
        let list = RawList::parse_text(text, ListShape { key: "c", ..DATA }).unwrap();
        assert!(list.fields.fields.is_empty());
    }

    #[test]
    fn a_repeated_key_reads_as_its_last_value() {
        let object = RawObject::parse(raw(r#"{"id":1,"id":2}"#), &["id"]).unwrap();
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
        assert!(RawObject::parse(raw("[1]"), &["id"]).is_none());
        assert_eq!(
            array_items(raw("{}"), 10).err(),
            Some(NotItems::Kind(JsonKind::Object))
        );
        let items = array_items(raw(r#"[ {"a":1} , 2 ]"#), 10).unwrap();
        assert_eq!(
            items.iter().map(|item| item.get()).collect::<Vec<_>>(),
            [r#"{"a":1}"#, "2"]
        );
    }
}
