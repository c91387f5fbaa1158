//! Templates in a child resource's `path`, `query` values and `headers` values:
//! `{parent.FIELD}` is replaced with the value of the dotted path FIELD in the parent
//! record's JSON (`{parent.id}`, `{parent.owner.login}`), and `{{` and `}}` stand for `{`
//! and `}`.

use std::fmt::Write as _;

use serde_json::value::RawValue;
use serde_json::Value;

use super::field_path::FieldPath;
use crate::quote::quoted;
use crate::record::json_type_name;

/// What opens a placeholder, after its `{`.
const PARENT_PREFIX: &str = "parent.";

/// A parsed template: text with placeholders for fields of the parent record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Template {
    parts: Vec<Part>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Text(String),
    Parent(FieldPath),
}

/// How a field's value is written into the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Encoding {
    /// Percent-encoded as one segment of a URL path: only unreserved characters stay.
    PathSegment,
    /// As it is; the URL builder encodes query values, and header values are checked.
    Raw,
}

impl Template {
    /// Parses `text`; the message says what is wrong, without naming the key.
    pub(crate) fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|(_, next)| *next) == Some('{') => {
                    chars.next();
                    literal.push('{');
                }
                '{' => {
                    let start = at + 1;
                    let end = loop {
                        match chars.next() {
                            Some((close, '}')) => break close,
                            Some((_, '{')) | None => {
                                return Err(format!(
                                    "has a `{{` at byte {at} that is not closed by `}}` (write \
                                     `{{{{` for a literal brace)"
                                ))
                            }
                            Some(_) => {}
                        }
                    };
                    let inner = text.get(start..end).unwrap_or_default();
                    let Some(field) = inner.strip_prefix(PARENT_PREFIX) else {
                        return Err(format!(
                            "has the placeholder `{{{inner}}}`, expected `{{parent.FIELD}}` \
                             (write `{{{{` for a literal brace)"
                        ));
                    };
                    let path = FieldPath::parse(field).map_err(|message| {
                        format!("has the placeholder `{{{inner}}}` whose field {message}")
                    })?;
                    if !literal.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Parent(path));
                }
                '}' if chars.peek().map(|(_, next)| *next) == Some('}') => {
                    chars.next();
                    literal.push('}');
                }
                '}' => {
                    return Err(format!(
                        "has a `}}` at byte {at} that closes no placeholder (write `}}}}` for a \
                         literal brace)"
                    ))
                }
                other => literal.push(other),
            }
        }
        if !literal.is_empty() || parts.is_empty() {
            parts.push(Part::Text(literal));
        }
        Ok(Template { parts })
    }

    /// The parent fields the template names.
    pub(crate) fn fields(&self) -> impl Iterator<Item = &FieldPath> {
        self.parts.iter().filter_map(|part| match part {
            Part::Parent(path) => Some(path),
            Part::Text(_) => None,
        })
    }

    /// The text with every placeholder replaced by `value(field)`, written as `encoding`
    /// says.
    fn render_with(
        &self,
        encoding: Encoding,
        mut value: impl FnMut(&FieldPath) -> Result<String, String>,
    ) -> Result<String, String> {
        let mut text = String::new();
        for part in &self.parts {
            match part {
                Part::Text(literal) => text.push_str(literal),
                Part::Parent(path) => {
                    let value = value(path)?;
                    match encoding {
                        Encoding::PathSegment => push_segment(&mut text, &value),
                        Encoding::Raw => text.push_str(&value),
                    }
                }
            }
        }
        Ok(text)
    }

    /// The text with every placeholder replaced by the parent's field; the message says
    /// which field is missing or unusable.
    pub(crate) fn render(&self, parent: &RawValue, encoding: Encoding) -> Result<String, String> {
        self.render_with(encoding, |path| parent_value(parent, path, encoding))
    }

    /// The text with every placeholder replaced by `sample`, for checking the rendered
    /// text at validation.
    pub(crate) fn render_sample(&self, sample: &str) -> String {
        // The closure never fails, so neither does rendering.
        self.render_with(Encoding::Raw, |_| Ok(sample.to_string()))
            .unwrap_or_default()
    }
}

/// The parent's value at `path`: a string or an integer; anything else is refused with the
/// reason. A path segment must also not be empty, `.` or `..`, which a URL's path would
/// resolve away.
fn parent_value(parent: &RawValue, path: &FieldPath, encoding: Encoding) -> Result<String, String> {
    let Some(raw) = path.lookup(parent) else {
        return Err(format!("has no field `{path}`"));
    };
    let text = match crate::raw::to_value(raw) {
        Value::String(text) => text,
        Value::Number(number) if number.is_i64() || number.is_u64() => number.to_string(),
        other => {
            return Err(format!(
                "has {} in `{path}`, expected a string or an integer",
                json_type_name(&other)
            ))
        }
    };
    if encoding == Encoding::PathSegment && matches!(text.as_str(), "" | "." | "..") {
        return Err(format!(
            "has {} in `{path}`, which cannot be a segment of a URL path",
            quoted(&text)
        ));
    }
    Ok(text)
}

/// Appends `value` percent-encoded as one path segment: every byte but the unreserved
/// characters of RFC 3986 (`A-Z a-z 0-9 - . _ ~`) as `%XX`.
fn push_segment(text: &mut String, value: &str) {
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            text.push(char::from(byte));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(text, "%{byte:02X}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn placeholders_and_escaped_braces_are_read() {
        let template = Template::parse("/p/{parent.id}/t?x={{y}}").unwrap();
        let fields: Vec<String> = template.fields().map(ToString::to_string).collect();
        assert_eq!(fields, ["id"]);
        let parent = raw(r#"{"id": 7}"#);
        assert_eq!(
            template.render(&parent, Encoding::Raw).unwrap(),
            "/p/7/t?x={y}"
        );
        let plain = Template::parse("no placeholders").unwrap();
        assert_eq!(plain.fields().count(), 0);
        assert_eq!(plain.render_sample("x"), "no placeholders");
        assert_eq!(Template::parse("").unwrap().render_sample("x"), "");
    }

    #[test]
    fn values_are_percent_encoded_as_path_segments() {
        let template = Template::parse("/u/{parent.owner.login}").unwrap();
        let parent = raw(r#"{"owner": {"login": "a b/ü?"}}"#);
        assert_eq!(
            template.render(&parent, Encoding::PathSegment).unwrap(),
            "/u/a%20b%2F%C3%BC%3F"
        );
        assert_eq!(
            template.render(&parent, Encoding::Raw).unwrap(),
            "/u/a b/ü?"
        );
    }

    #[test]
    fn malformed_templates_say_what_is_wrong() {
        for (bad, expected) in [
            ("/p/{parent.id", "not closed"),
            ("/p/{parent.{id}}", "not closed"),
            ("/p/{id}", "expected `{parent.FIELD}`"),
            ("/p/{}", "expected `{parent.FIELD}`"),
            ("/p/{parent.}", "whose field"),
            ("/p/{parent.a..b}", "whose field"),
            ("/p/}", "closes no placeholder"),
        ] {
            let message = Template::parse(bad).unwrap_err();
            assert!(message.contains(expected), "{bad}: {message}");
        }
    }

    #[test]
    fn unusable_parent_values_are_refused_with_the_reason() {
        let template = Template::parse("{parent.v}").unwrap();
        for (parent, expected) in [
            (r#"{}"#, "has no field `v`"),
            (r#"{"v": null}"#, "has null in `v`"),
            (r#"{"v": 1.5}"#, "expected a string or an integer"),
            (r#"{"v": {"a": 1}}"#, "expected a string or an integer"),
            (r#"{"v": ".."}"#, "cannot be a segment"),
            (r#"{"v": ""}"#, "cannot be a segment"),
        ] {
            let message = template
                .render(&raw(parent), Encoding::PathSegment)
                .unwrap_err();
            assert!(message.contains(expected), "{parent}: {message}");
        }
        assert_eq!(
            template
                .render(&raw(r#"{"v": ""}"#), Encoding::Raw)
                .unwrap(),
            ""
        );
    }
}
