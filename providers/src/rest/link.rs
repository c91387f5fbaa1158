//! A parser for the RFC 8288 `Link` header, enough to find the `rel="next"` target.
//!
//! Written here rather than taken from the `parse_link_header` crate because that one strips
//! all whitespace and quotes before parsing: it reads `rel="next last"` as the relation
//! `nextlast`, splits a target URL at any comma, and rejects targets whose query has a
//! parameter without `=`.

/// One link-value: its target (as written, maybe relative) and its relation types,
/// lowercased.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct LinkValue {
    /// The URI-Reference between `<` and `>`.
    pub target: String,
    /// The relation types of the first `rel` parameter, lowercased.
    pub rels: Vec<String>,
}

/// The target of the first link whose relation types include `next`, across all the given
/// `Link` header values.
pub(crate) fn next_target<'a>(
    values: impl IntoIterator<Item = &'a str>,
) -> Result<Option<String>, String> {
    for value in values {
        for link in parse(value)? {
            if link.rels.iter().any(|rel| rel == "next") {
                return Ok(Some(link.target));
            }
        }
    }
    Ok(None)
}

/// Parses one `Link` header value: `<target>; param=value; param="quoted", <target>...`.
pub(crate) fn parse(header: &str) -> Result<Vec<LinkValue>, String> {
    let mut links = Vec::new();
    let mut rest = header;
    loop {
        rest = rest.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
        if rest.is_empty() {
            return Ok(links);
        }
        let Some(after_open) = rest.strip_prefix('<') else {
            return Err(format!(
                "expected `<` to open a link target at {:?}",
                start(rest)
            ));
        };
        let Some(close) = after_open.find('>') else {
            return Err(format!(
                "the link target {:?} has no closing `>`",
                start(rest)
            ));
        };
        let target = after_open[..close].trim().to_string();
        rest = &after_open[close + 1..];
        let mut rels: Option<Vec<String>> = None;
        loop {
            rest = rest.trim_start();
            if rest.is_empty() || rest.starts_with(',') {
                break;
            }
            let Some(after_semicolon) = rest.strip_prefix(';') else {
                return Err(format!(
                    "expected `;` or `,` after the link <{target}> at {:?}",
                    start(rest)
                ));
            };
            let (name, value, remaining) = parameter(after_semicolon.trim_start())?;
            rest = remaining;
            // RFC 8288 §3.3: only the first `rel` parameter counts.
            if name.eq_ignore_ascii_case("rel") && rels.is_none() {
                rels = Some(
                    value
                        .unwrap_or_default()
                        .split_whitespace()
                        .map(str::to_ascii_lowercase)
                        .collect(),
                );
            }
        }
        links.push(LinkValue {
            target,
            rels: rels.unwrap_or_default(),
        });
    }
}

/// `name [= (token | "quoted")]` at the start of `text`: the name, the value, what follows.
fn parameter(text: &str) -> Result<(&str, Option<String>, &str), String> {
    let name_end = text
        .find(|c: char| c == '=' || c == ';' || c == ',' || c.is_whitespace())
        .unwrap_or(text.len());
    let name = &text[..name_end];
    if name.is_empty() {
        return Err(format!("expected a parameter name at {:?}", start(text)));
    }
    let rest = text[name_end..].trim_start();
    let Some(after_equals) = rest.strip_prefix('=') else {
        return Ok((name, None, rest));
    };
    let after_equals = after_equals.trim_start();
    if let Some(quoted) = after_equals.strip_prefix('"') {
        let mut value = String::new();
        let mut chars = quoted.char_indices();
        while let Some((index, c)) = chars.next() {
            match c {
                '"' => return Ok((name, Some(value), &quoted[index + 1..])),
                '\\' => match chars.next() {
                    Some((_, escaped)) => value.push(escaped),
                    None => break,
                },
                other => value.push(other),
            }
        }
        return Err(format!(
            "the value of the parameter {name} has no closing quote"
        ));
    }
    let value_end = after_equals
        .find(|c: char| c == ';' || c == ',' || c.is_whitespace())
        .unwrap_or(after_equals.len());
    Ok((
        name,
        Some(after_equals[..value_end].to_string()),
        &after_equals[value_end..],
    ))
}

/// The first characters of `text`, for messages.
fn start(text: &str) -> String {
    text.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_next_among_several_links_and_rel_lists() {
        let header = r#"<https://api.example.com/items?page=1>; rel="first", <https://api.example.com/items?page=3&flag>; rel="next last"; title="a, b""#;
        assert_eq!(
            next_target([header]).unwrap().as_deref(),
            Some("https://api.example.com/items?page=3&flag")
        );
        let links = parse(header).unwrap();
        assert_eq!(links.len(), 2);
        assert_eq!(links[1].rels, ["next", "last"]);
    }

    #[test]
    fn accepts_tokens_relative_targets_commas_in_urls_and_several_headers() {
        assert_eq!(
            next_target(["</a?x=1,2>;REL=Next"]).unwrap().as_deref(),
            Some("/a?x=1,2")
        );
        assert_eq!(
            next_target([r#"</p>; rel="prev""#, r#"</n>; rel=next"#])
                .unwrap()
                .as_deref(),
            Some("/n")
        );
        assert_eq!(next_target([r#"</p>; rel="prev""#]).unwrap(), None);
        assert_eq!(next_target([""]).unwrap(), None);
    }

    #[test]
    fn only_the_first_rel_counts() {
        assert_eq!(
            next_target([r#"</a>; rel="prev"; rel="next""#]).unwrap(),
            None
        );
    }

    #[test]
    fn malformed_headers_are_errors() {
        for header in [
            "https://no-brackets; rel=next",
            "<https://unclosed; rel=next",
            r#"</a>; rel="next"#,
            "</a> rel=next",
            "</a>; =next",
        ] {
            assert!(next_target([header]).is_err(), "{header}");
        }
    }
}
