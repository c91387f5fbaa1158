//! Dotted paths to a field of a JSON body or record (`links.next`), where a segment in
//! double quotes may hold dots, so that keys such as OData's `@odata.nextLink` can be
//! named: `'"@odata.nextLink"'`, `meta."a.b".c`.

use std::fmt;

use serde_json::value::RawValue;

use crate::raw::RawObject;

/// A parsed dotted path: one object key per segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FieldPath {
    /// The path as written, for messages.
    text: String,
    /// The keys, unquoted.
    segments: Vec<String>,
}

impl FieldPath {
    /// Parses `text`: segments separated by `.`, each a bare key (without `.` or `"`) or a
    /// key in double quotes, where `\"` and `\\` stand for `"` and `\`.
    pub(crate) fn parse(text: &str) -> Result<FieldPath, String> {
        if text.trim().is_empty() {
            return Err("must not be empty".to_string());
        }
        let mut segments = Vec::new();
        let mut chars = text.chars().peekable();
        loop {
            let mut segment = String::new();
            let mut at_end = false;
            if chars.peek() == Some(&'"') {
                chars.next();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(escaped @ ('"' | '\\')) => segment.push(escaped),
                            _ => {
                                return Err(format!(
                                    "`{text}`: inside quotes, `\\` may only escape `\"` or `\\`"
                                ))
                            }
                        },
                        Some(other) => segment.push(other),
                        None => return Err(format!("`{text}` has a quote that is not closed")),
                    }
                }
                match chars.next() {
                    None => at_end = true,
                    Some('.') => {}
                    Some(other) => {
                        return Err(format!(
                            "`{text}`: expected `.` after a quoted segment, found `{other}`"
                        ))
                    }
                }
            } else {
                loop {
                    match chars.next() {
                        None => {
                            at_end = true;
                            break;
                        }
                        Some('.') => break,
                        Some('"') => {
                            return Err(format!(
                                "`{text}`: a quote may only open a segment (quote the whole key)"
                            ))
                        }
                        Some(other) => segment.push(other),
                    }
                }
            }
            if segment.is_empty() {
                return Err(format!("`{text}` has an empty segment"));
            }
            segments.push(segment);
            // A path ending in `.` goes round once more and finds an empty segment.
            if at_end {
                break;
            }
        }
        Ok(FieldPath {
            text: text.to_string(),
            segments,
        })
    }

    /// The keys, unquoted: two paths name the same field when these are equal.
    pub(crate) fn segments(&self) -> &[String] {
        &self.segments
    }

    /// The field at this path in `raw`; `None` when a segment is missing or a value on the
    /// way is not an object.
    pub(crate) fn lookup<'a>(&self, raw: &'a RawValue) -> Option<&'a RawValue> {
        self.segments.iter().try_fold(raw, |current, segment| {
            RawObject::parse(current, &[segment.as_str()])?.get(segment)
        })
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segments(text: &str) -> Vec<String> {
        FieldPath::parse(text).unwrap().segments
    }

    #[test]
    fn bare_and_quoted_segments() {
        assert_eq!(segments("links.next"), ["links", "next"]);
        assert_eq!(segments("\"@odata.nextLink\""), ["@odata.nextLink"]);
        assert_eq!(segments("meta.\"a.b\".c"), ["meta", "a.b", "c"]);
        assert_eq!(segments(r#""say \"hi\"\\""#), [r#"say "hi"\"#]);
        assert_eq!(segments("@count"), ["@count"]);
    }

    #[test]
    fn malformed_paths_are_refused() {
        for bad in [
            "", " ", "a..b", ".a", "a.", "\"a\".", "\"open", "\"a\"b", "a\"b\"", "\"\"", r#""\x""#,
        ] {
            assert!(FieldPath::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lookup_follows_the_segments() {
        let body: Box<RawValue> =
            serde_json::from_str(r#"{"@odata.nextLink": "u", "links": {"next": null}}"#).unwrap();
        let path = FieldPath::parse("\"@odata.nextLink\"").unwrap();
        assert_eq!(path.lookup(&body).unwrap().get(), r#""u""#);
        let path = FieldPath::parse("links.next").unwrap();
        assert_eq!(path.lookup(&body).unwrap().get(), "null");
        let path = FieldPath::parse("links.next.deeper").unwrap();
        assert!(path.lookup(&body).is_none());
    }
}
