//! Quoting text from outside (URLs, cursors, ids) in messages, logs and stored errors:
//! bounded, and cut on a character boundary, so an API's over-long value can never make a
//! message as long as itself.

/// The most characters of a URL or a cursor quoted in a message or a log line.
pub const MAX_QUOTED_CHARS: usize = 256;

/// `text` cut to at most `max_chars` characters, with "…" appended when it was cut.
pub fn truncated(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        None => text.to_string(),
        Some((end, _)) => format!("{}…", &text[..end]),
    }
}

/// A cursor as messages and logs quote it: a string literal of at most
/// [`MAX_QUOTED_CHARS`] characters.
pub fn quote_cursor(cursor: &str) -> String {
    quoted(cursor)
}

/// Text from outside (an id, a repository's name) as messages and logs quote it: a string
/// literal of at most [`MAX_QUOTED_CHARS`] characters.
pub fn quoted(text: &str) -> String {
    format!("{:?}", truncated(text, MAX_QUOTED_CHARS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_on_a_character_boundary_and_marked() {
        assert_eq!(truncated("abc", 3), "abc");
        assert_eq!(truncated("abcd", 3), "abc…");
        assert_eq!(truncated("éèêë", 2), "éè…");
        assert_eq!(truncated("", 0), "");
        assert_eq!(truncated("a", 0), "…");
        let long = "🦀".repeat(MAX_QUOTED_CHARS * 4);
        let quoted = quote_cursor(&long);
        assert_eq!(quoted.chars().count(), MAX_QUOTED_CHARS + 3);
        assert!(quoted.starts_with("\"🦀") && quoted.ends_with("…\""));
        assert_eq!(quote_cursor("c_1"), "\"c_1\"");
    }
}
