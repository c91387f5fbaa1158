//! `records_path`: where a page's records are in its body. Segments are separated by `.`;
//! a segment ending in `[]` names an array whose elements the rest of the path is followed
//! in, so `data.groups[].items` yields every item of every group, in order. The value the
//! path ends at is an array of records, in every element it is followed in.

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::raw::{array_items, json_kind, JsonKind, NotItems, RawObject};

/// A parsed `records_path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RecordsPath {
    /// The path as written, for messages; empty for the body itself.
    text: String,
    steps: Vec<Step>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    /// The object's field of this name.
    Key(String),
    /// The array's elements, each followed on with the rest of the path.
    Flatten,
}

/// Why the records could not be read at the path.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NotRecords {
    /// The body holds something else than the path says: the message names where.
    Shape(String),
    /// The path's arrays hold more records together than the per-page cap.
    TooMany {
        /// How many records they hold.
        count: usize,
    },
}

impl RecordsPath {
    /// Parses `text` (`None` or empty: the body itself is the array of records).
    pub(crate) fn parse(text: Option<&str>) -> Result<RecordsPath, String> {
        let text = text.unwrap_or_default();
        let mut steps = Vec::new();
        if !text.is_empty() {
            for segment in text.split('.') {
                let (key, flatten) = match segment.strip_suffix("[]") {
                    Some(key) => (key, true),
                    None => (segment, false),
                };
                if key.contains(['[', ']']) {
                    return Err(format!(
                        "records_path `{text}`: the segment `{segment}` holds a bracket; only \
                         `[]` at the end of a segment is understood (it flattens an array)"
                    ));
                }
                match (key.is_empty(), flatten) {
                    (true, false) => {
                        return Err(format!("records_path `{text}` has an empty segment"))
                    }
                    // `[]` alone: the value reached so far is the array.
                    (true, true) => {}
                    (false, _) => steps.push(Step::Key(key.to_string())),
                }
                if flatten {
                    steps.push(Step::Flatten);
                }
            }
        }
        Ok(RecordsPath {
            text: text.to_string(),
            steps,
        })
    }

    /// The records in `body`: at most `max` of them are kept in memory; past that, only
    /// their number is counted.
    pub(crate) fn read<'a>(
        &self,
        body: &'a RawValue,
        max: usize,
    ) -> Result<Vec<&'a RawValue>, NotRecords> {
        let mut found = Found {
            records: Vec::new(),
            max,
            overflow: None,
        };
        self.collect(body, &self.steps, &mut Vec::new(), &mut found)?;
        match found.overflow {
            Some(count) => Err(NotRecords::TooMany { count }),
            None => Ok(found.records),
        }
    }

    /// Follows `steps` from `value`, which `at` reached (for messages), into `found`.
    fn collect<'a>(
        &self,
        value: &'a RawValue,
        steps: &[Step],
        at: &mut Vec<String>,
        found: &mut Found<'a>,
    ) -> Result<(), NotRecords> {
        let Some((step, rest)) = steps.split_first() else {
            return found.take(value, || self.where_(at));
        };
        match step {
            Step::Key(key) => {
                let Some(field) =
                    RawObject::parse(value, &[key.as_str()]).and_then(|object| object.get(key))
                else {
                    at.push(key.clone());
                    let message = format!("{} is not in the body", self.where_(at));
                    return Err(NotRecords::Shape(message));
                };
                at.push(key.clone());
                self.collect(field, rest, at, found)?;
                at.pop();
                Ok(())
            }
            Step::Flatten => {
                let kind = json_kind(value);
                if kind != JsonKind::Array {
                    return Err(NotRecords::Shape(format!(
                        "{} is {}, expected an array to flatten",
                        self.where_(at),
                        kind.name()
                    )));
                }
                // The elements are visited as they are read, never held together: only the
                // records count against the per-page cap.
                let mut index = 0usize;
                for_each_element(value, &mut |element| {
                    at.push(format!("[{index}]"));
                    self.collect(element, rest, at, found)?;
                    at.pop();
                    index = index.saturating_add(1);
                    Ok(())
                })
            }
        }
    }

    /// Where `at` is, for messages: the records path, and for a nested one the place reached.
    fn where_(&self, at: &[String]) -> String {
        let reached = at.iter().fold(String::new(), |mut reached, step| {
            if !step.starts_with('[') && !reached.is_empty() {
                reached.push('.');
            }
            reached.push_str(step);
            reached
        });
        if self.steps.contains(&Step::Flatten) {
            if reached.is_empty() {
                format!("records_path `{}`: the body", self.text)
            } else {
                format!("records_path `{}`: `{reached}`", self.text)
            }
        } else if self.text.is_empty() {
            "the body".to_string()
        } else {
            format!("records_path `{}`", self.text)
        }
    }
}

/// The records found so far, or past the cap only their number.
struct Found<'a> {
    records: Vec<&'a RawValue>,
    max: usize,
    /// Past the cap: how many records the arrays have held so far.
    overflow: Option<usize>,
}

impl<'a> Found<'a> {
    /// Adds the records of `value`, which must be an array; `place` names it for messages.
    fn take(
        &mut self,
        value: &'a RawValue,
        place: impl FnOnce() -> String,
    ) -> Result<(), NotRecords> {
        let room = match self.overflow {
            Some(_) => 0,
            None => self.max.saturating_sub(self.records.len()),
        };
        match array_items(value, room) {
            Ok(items) => {
                self.records.extend(items);
                Ok(())
            }
            Err(NotItems::TooMany { count }) => {
                let before = match self.overflow {
                    Some(before) => before,
                    None => self.records.len(),
                };
                self.records = Vec::new();
                self.overflow = Some(before.saturating_add(count));
                Ok(())
            }
            Err(NotItems::Kind(kind)) => Err(NotRecords::Shape(not_an_array(&place(), kind))),
        }
    }
}

/// Calls `each` with every element of `array` (a JSON array) in order, stopping at the
/// first error.
fn for_each_element<'a>(
    array: &'a RawValue,
    each: &mut dyn FnMut(&'a RawValue) -> Result<(), NotRecords>,
) -> Result<(), NotRecords> {
    let mut failed = None;
    let mut deserializer = serde_json::Deserializer::from_str(array.get());
    let visitor = EachElement {
        each,
        failed: &mut failed,
    };
    let read = deserializer.deserialize_seq(visitor);
    match (failed, read) {
        (Some(error), _) => Err(error),
        (None, Ok(())) => Ok(()),
        // The body was checked to be JSON when it was read, and `array` is an array.
        (None, Err(err)) => Err(NotRecords::Shape(format!(
            "an array to flatten cannot be read: {err}"
        ))),
    }
}

/// Visits an array's elements, each still raw, handing each to `each`.
struct EachElement<'e, 'a> {
    each: &'e mut dyn FnMut(&'a RawValue) -> Result<(), NotRecords>,
    /// The error `each` stopped at; the deserializer sees a stand-in.
    failed: &'e mut Option<NotRecords>,
}

impl<'a> Visitor<'a> for EachElement<'_, 'a> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<S: SeqAccess<'a>>(self, mut seq: S) -> Result<(), S::Error> {
        while let Some(element) = seq.next_element::<&'a RawValue>()? {
            if let Err(error) = (self.each)(element) {
                *self.failed = Some(error);
                return Err(de::Error::custom("stopped at an element"));
            }
        }
        Ok(())
    }
}

fn not_an_array(place: &str, kind: JsonKind) -> String {
    if place == "the body" {
        format!(
            "the body is {}, expected an array of records (set records_path to the dotted \
             path of the array)",
            kind.name()
        )
    } else {
        format!("{place} is {}, expected an array of records", kind.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        serde_json::from_str(text).unwrap()
    }

    fn read(path: &str, body: &str, max: usize) -> Result<Vec<String>, NotRecords> {
        let body = raw(body);
        let path = RecordsPath::parse(Some(path)).unwrap();
        path.read(&body, max)
            .map(|records| records.iter().map(|r| r.get().to_string()).collect())
    }

    #[test]
    fn plain_paths_read_one_array() {
        assert_eq!(read("", "[1, 2]", 10).unwrap(), ["1", "2"]);
        assert_eq!(read("a.b", r#"{"a": {"b": [3]}}"#, 10).unwrap(), ["3"]);
        assert_eq!(
            read("a.b", r#"{"a": {}}"#, 10).unwrap_err(),
            NotRecords::Shape("records_path `a.b` is not in the body".into())
        );
        assert_eq!(
            read("a", r#"{"a": 1}"#, 10).unwrap_err(),
            NotRecords::Shape("records_path `a` is a number, expected an array of records".into())
        );
    }

    #[test]
    fn flattened_segments_join_every_elements_records_in_order() {
        let body = r#"{"data": {"groups": [{"items": [1, 2]}, {"items": []}, {"items": [3]}]}}"#;
        assert_eq!(
            read("data.groups[].items", body, 10).unwrap(),
            ["1", "2", "3"]
        );
        assert_eq!(read("[]", "[[1], [2, 3]]", 10).unwrap(), ["1", "2", "3"]);
        assert_eq!(
            read("[].items", r#"[{"items": [1]}, {"items": [2]}]"#, 10).unwrap(),
            ["1", "2"]
        );
        assert_eq!(
            read(
                "a[].b[].c",
                r#"{"a": [{"b": [{"c": [1]}, {"c": [2]}]}, {"b": []}]}"#,
                10
            )
            .unwrap(),
            ["1", "2"]
        );
    }

    #[test]
    fn flattened_paths_name_the_element_that_does_not_fit() {
        let error = read(
            "data[].items",
            r#"{"data": [{"items": [1]}, {"other": 1}]}"#,
            10,
        );
        assert_eq!(
            error.unwrap_err(),
            NotRecords::Shape(
                "records_path `data[].items`: `data[1].items` is not in the body".into()
            )
        );
        let error = read("data[].items", r#"{"data": {"items": [1]}}"#, 10);
        assert_eq!(
            error.unwrap_err(),
            NotRecords::Shape(
                "records_path `data[].items`: `data` is an object, expected an array to flatten"
                    .into()
            )
        );
        let error = read("data[].items", r#"{"data": [{"items": 5}]}"#, 10);
        assert_eq!(
            error.unwrap_err(),
            NotRecords::Shape(
                "records_path `data[].items`: `data[0].items` is a number, expected an array of \
                 records"
                    .into()
            )
        );
    }

    #[test]
    fn the_cap_counts_the_records_of_every_element_together() {
        let body = r#"{"g": [{"i": [1, 2]}, {"i": [3, 4]}, {"i": [5]}]}"#;
        assert_eq!(read("g[].i", body, 5).unwrap().len(), 5);
        assert_eq!(
            read("g[].i", body, 3).unwrap_err(),
            NotRecords::TooMany { count: 5 }
        );
        assert_eq!(
            read("g[].i", body, 1).unwrap_err(),
            NotRecords::TooMany { count: 5 }
        );
        // Empty groups cost nothing against the cap.
        let empty = r#"{"g": [{"i": []}, {"i": []}, {"i": []}, {"i": [1]}]}"#;
        assert_eq!(read("g[].i", empty, 1).unwrap(), ["1"]);
    }

    #[test]
    fn malformed_paths_are_refused() {
        for bad in ["a..b", ".a", "a.", "a[0]", "a[].b]", "a[]x"] {
            let message = RecordsPath::parse(Some(bad)).unwrap_err();
            assert!(message.starts_with("records_path"), "{bad}: {message}");
        }
        assert!(RecordsPath::parse(None).is_ok());
    }
}
