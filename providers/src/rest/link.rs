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

/// Property tests: no text makes the parser panic, and well-formed headers, however they
/// quote and space their parameters, parse back to their links.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    /// A fixed seed unless `PROPTEST_RNG_SEED` is set, so the suite is repeatable.
    fn config(cases: u32) -> ProptestConfig {
        let mut config = ProptestConfig::with_cases(cases);
        if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
            config.rng_seed = proptest::test_runner::RngSeed::Fixed(0x6c69_6e6b);
        }
        config.failure_persistence = None;
        config
    }

    /// One link as the test means it, and how to write it.
    #[derive(Clone, Debug)]
    struct Link {
        target: String,
        rels: Vec<String>,
        /// Other parameters: (name, value, quoted).
        params: Vec<(String, String, bool)>,
        /// Write the rel parameter before the others.
        rel_first: bool,
        spaces: String,
    }

    impl Link {
        fn render(&self) -> String {
            let rel = if self.rels.len() == 1 && !self.rels[0].is_empty() && !self.rel_first {
                format!("rel={}", self.rels[0])
            } else {
                format!("rel=\"{}\"", self.rels.join(" "))
            };
            let mut params: Vec<String> = self
                .params
                .iter()
                .map(|(name, value, quoted)| {
                    if *quoted {
                        let escaped = value.replace('\\', "\\\\").replace('"', "\\\"");
                        format!("{name}=\"{escaped}\"")
                    } else {
                        format!("{name}={value}")
                    }
                })
                .collect();
            if self.rel_first {
                params.insert(0, rel);
            } else {
                params.push(rel);
            }
            let separator = format!("{};{}", self.spaces, self.spaces);
            format!("<{}>{separator}{}", self.target, params.join(&separator))
        }
    }

    fn link() -> impl Strategy<Value = Link> {
        (
            // Targets may hold commas, semicolons, quotes and spaces inside the brackets.
            "[a-z0-9/?&=,;:\" .-]{0,30}".prop_map(|t| format!("https://api.example.com/{t}")),
            prop::collection::vec("next|prev|first|last|NEXT|[a-z]{1,6}", 1..3),
            prop::collection::vec(
                (
                    "title|type|anchor|[a-z]{1,5}",
                    "[a-zA-Z0-9,;= \"\\\\]{0,10}",
                    any::<bool>(),
                ),
                0..3,
            ),
            any::<bool>(),
            "[ \t]{0,2}",
        )
            .prop_map(|(target, rels, params, rel_first, spaces)| {
                // Unquoted values are tokens; names other than rel.
                let params = params
                    .into_iter()
                    .filter(|(name, _, _)| name != "rel")
                    .map(|(name, value, quoted)| {
                        if quoted {
                            (name, value, true)
                        } else {
                            let token: String = value
                                .chars()
                                .filter(|c| c.is_ascii_alphanumeric())
                                .collect();
                            (name, format!("t{token}"), false)
                        }
                    })
                    .collect();
                Link {
                    target: target.trim().to_string(),
                    rels,
                    params,
                    rel_first,
                    spaces,
                }
            })
    }

    proptest! {
        #![proptest_config(config(1024))]

        #[test]
        fn arbitrary_text_never_panics(header in "\\PC{0,80}|[<>;,=\" a-z]{0,40}") {
            let _ = parse(&header);
            let _ = next_target([header.as_str(), "</x>; rel=next"]);
        }

        #[test]
        fn well_formed_headers_parse_back_to_their_links(
            links in prop::collection::vec(link(), 1..4),
            joiner in ",|, |,\t| ,  ",
        ) {
            let header = links.iter().map(Link::render).collect::<Vec<_>>().join(&joiner);
            let parsed = parse(&header).map_err(TestCaseError::fail)?;
            prop_assert_eq!(parsed.len(), links.len(), "{}", header);
            for (parsed, link) in parsed.iter().zip(&links) {
                prop_assert_eq!(&parsed.target, &link.target);
                let rels: Vec<String> = link.rels.iter().map(|r| r.to_ascii_lowercase()).collect();
                prop_assert_eq!(&parsed.rels, &rels, "{}", header);
            }
            let expected = links
                .iter()
                .find(|l| l.rels.iter().any(|r| r.eq_ignore_ascii_case("next")))
                .map(|l| l.target.clone());
            prop_assert_eq!(next_target([header.as_str()]).map_err(TestCaseError::fail)?, expected);
        }

        /// Any one character deleted, doubled or replaced in a well-formed header: an
        /// answer or an error, never a panic.
        #[test]
        fn damaged_headers_never_panic(
            link in link(),
            at in any::<prop::sample::Index>(),
            damage in 0..3u8,
            with in "[<>;,=\"\\\\ a]",
        ) {
            let header = link.render();
            let chars: Vec<char> = header.chars().collect();
            let i = at.index(chars.len());
            let mut damaged: String = chars[..i].iter().collect();
            match damage {
                0 => {}
                1 => { damaged.push(chars[i]); damaged.push(chars[i]); }
                _ => damaged.push_str(&with),
            }
            damaged.extend(&chars[i + 1..]);
            let _ = parse(&damaged);
        }
    }
}
