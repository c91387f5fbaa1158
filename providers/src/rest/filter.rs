//! `records_filter`: which of a page's records are kept. The others are dropped before
//! they are keyed, stored or read for the watermark, and counted in [`crate::Page::filtered`].

use std::fmt;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::field_path::FieldPath;

/// `records_filter = { field = "status", not_in = ["deleted"] }`: keeps only the records
/// whose `field` passes the one test given. A missing field, or `null`, equals no value:
/// `equals` and `in` drop such a record, `not_equals` and `not_in` keep it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordsFilter {
    /// Dotted path of the field tested, e.g. `"status"` or `"meta.state"`; a segment in
    /// double quotes may hold dots.
    pub field: String,
    /// Keeps the records whose field equals this value.
    #[serde(default)]
    pub equals: Option<FilterValue>,
    /// Keeps the records whose field does not equal this value.
    #[serde(default)]
    pub not_equals: Option<FilterValue>,
    /// Keeps the records whose field equals one of these values.
    #[serde(default, rename = "in")]
    pub one_of: Option<Vec<FilterValue>>,
    /// Keeps the records whose field equals none of these values.
    #[serde(default)]
    pub not_in: Option<Vec<FilterValue>>,
    /// `true` keeps the records that have the field (not `null`); `false` those that do not.
    #[serde(default)]
    pub exists: Option<bool>,
}

/// A value a record's field is compared with: a string, an integer or a boolean, equal
/// only to a JSON value of the same type (the string `"1"` is not the integer `1`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum FilterValue {
    /// `true` or `false`.
    Bool(bool),
    /// An integer.
    Integer(i64),
    /// A string.
    String(String),
}

impl FilterValue {
    fn matches(&self, value: &Value) -> bool {
        match (self, value) {
            (FilterValue::Bool(own), Value::Bool(other)) => own == other,
            (FilterValue::Integer(own), Value::Number(other)) => other.as_i64() == Some(*own),
            (FilterValue::String(own), Value::String(other)) => own == other,
            _ => false,
        }
    }
}

impl fmt::Display for FilterValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FilterValue::Bool(value) => write!(f, "{value}"),
            FilterValue::Integer(value) => write!(f, "{value}"),
            FilterValue::String(value) => write!(f, "{value:?}"),
        }
    }
}

/// The checked filter.
#[derive(Clone, Debug)]
pub(crate) struct Filter {
    field: FieldPath,
    test: Test,
}

#[derive(Clone, Debug)]
enum Test {
    Equals(FilterValue),
    NotEquals(FilterValue),
    In(Vec<FilterValue>),
    NotIn(Vec<FilterValue>),
    Exists(bool),
}

impl RecordsFilter {
    /// The checked filter, or a message naming the key (`key` is where the table is, e.g.
    /// `records_filter` or `resources.tasks.records_filter`).
    pub(crate) fn plan(&self, key: &str) -> Result<Filter, String> {
        let field =
            FieldPath::parse(&self.field).map_err(|message| format!("{key}.field {message}"))?;
        let mut tests = Vec::new();
        if let Some(value) = &self.equals {
            tests.push(Test::Equals(value.clone()));
        }
        if let Some(value) = &self.not_equals {
            tests.push(Test::NotEquals(value.clone()));
        }
        if let Some(values) = &self.one_of {
            if values.is_empty() {
                return Err(format!("{key}.in must list at least one value"));
            }
            tests.push(Test::In(values.clone()));
        }
        if let Some(values) = &self.not_in {
            if values.is_empty() {
                return Err(format!("{key}.not_in must list at least one value"));
            }
            tests.push(Test::NotIn(values.clone()));
        }
        if let Some(exists) = self.exists {
            tests.push(Test::Exists(exists));
        }
        let mut tests = tests.into_iter();
        match (tests.next(), tests.next()) {
            (Some(test), None) => Ok(Filter { field, test }),
            (None, _) => Err(format!(
                "{key} needs one test: equals, not_equals, in, not_in or exists"
            )),
            (Some(_), Some(_)) => Err(format!(
                "{key} has more than one of equals, not_equals, in, not_in and exists; give one"
            )),
        }
    }
}

impl Filter {
    /// Whether `record` is kept.
    pub(crate) fn keeps(&self, record: &RawValue) -> bool {
        let value = self
            .field
            .lookup(record)
            .map(crate::raw::to_value)
            .filter(|value| !value.is_null());
        let equals = |wanted: &FilterValue| value.as_ref().is_some_and(|v| wanted.matches(v));
        match &self.test {
            Test::Equals(wanted) => equals(wanted),
            Test::NotEquals(wanted) => !equals(wanted),
            Test::In(values) => values.iter().any(equals),
            Test::NotIn(values) => !values.iter().any(equals),
            Test::Exists(exists) => value.is_some() == *exists,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn filter(value: Value) -> Result<Filter, String> {
        serde_json::from_value::<RecordsFilter>(value)
            .unwrap()
            .plan("records_filter")
    }

    fn kept(filter: &Filter, records: &[Value]) -> Vec<usize> {
        records
            .iter()
            .enumerate()
            .filter(|(_, record)| {
                let raw = serde_json::value::to_raw_value(record).unwrap();
                filter.keeps(&raw)
            })
            .map(|(index, _)| index)
            .collect()
    }

    #[test]
    fn each_test_keeps_what_it_says() {
        let records = [
            json!({"s": "open", "n": 1, "b": true}),
            json!({"s": "deleted", "n": 2}),
            json!({"s": null}),
            json!({"meta": {"s": "open"}}),
            json!({"s": 1}),
        ];
        let cases = [
            (json!({"field": "s", "equals": "open"}), vec![0]),
            (
                json!({"field": "s", "not_equals": "open"}),
                vec![1, 2, 3, 4],
            ),
            (json!({"field": "s", "in": ["open", "deleted"]}), vec![0, 1]),
            (
                json!({"field": "s", "not_in": ["deleted"]}),
                vec![0, 2, 3, 4],
            ),
            (json!({"field": "s", "exists": true}), vec![0, 1, 4]),
            (json!({"field": "s", "exists": false}), vec![2, 3]),
            (json!({"field": "n", "equals": 2}), vec![1]),
            (json!({"field": "s", "equals": 1}), vec![4]),
            (json!({"field": "b", "equals": true}), vec![0]),
            (json!({"field": "meta.s", "equals": "open"}), vec![3]),
        ];
        for (settings, expected) in cases {
            let checked = filter(settings.clone()).unwrap();
            assert_eq!(kept(&checked, &records), expected, "{settings}");
        }
    }

    #[test]
    fn a_filter_needs_exactly_one_test_and_a_field() {
        for (settings, expected) in [
            (json!({"field": "s"}), "records_filter needs one test"),
            (
                json!({"field": "s", "equals": "a", "exists": true}),
                "more than one",
            ),
            (
                json!({"field": "s", "in": []}),
                "records_filter.in must list",
            ),
            (
                json!({"field": "s", "not_in": []}),
                "records_filter.not_in must list",
            ),
            (json!({"field": "", "exists": true}), "records_filter.field"),
        ] {
            let message = filter(settings.clone()).unwrap_err();
            assert!(message.contains(expected), "{settings}: {message}");
        }
    }
}
