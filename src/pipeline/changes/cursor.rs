//! The feed's cursor: a position in commit order, `(seq, ordinal)` (a batch and a change's
//! place in it), shown to readers as opaque text (`c1.` and the two numbers in
//! base64url).

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use tributary_providers::quote::truncated;

/// The prefix of the cursor's text form: its format's version.
const PREFIX: &str = "c1.";

/// A position in the feed: everything up to and including the change at `ordinal` in the
/// batch stamped `seq` has been read. Cursors order as the feed does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cursor {
    pub seq: i64,
    pub ordinal: i64,
}

impl Cursor {
    /// Before the first change.
    pub const START: Cursor = Cursor { seq: 0, ordinal: 0 };

    /// After every change of the batch stamped `seq` (and of every batch before it).
    pub fn after_batch(seq: i64) -> Cursor {
        Cursor {
            seq,
            ordinal: i64::MAX,
        }
    }
}

/// Why a cursor's text is not a cursor.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed change cursor {shown:?}: {reason}; pass a cursor exactly as `tributary changes` printed it")]
pub struct CursorError {
    /// The text, cut short if long.
    shown: String,
    reason: &'static str,
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.seq.to_be_bytes());
        bytes[8..].copy_from_slice(&self.ordinal.to_be_bytes());
        write!(f, "{PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
    }
}

/// The longest part of a bad cursor quoted in its error.
const SHOWN_CHARS: usize = 40;

impl FromStr for Cursor {
    type Err = CursorError;

    fn from_str(text: &str) -> Result<Cursor, CursorError> {
        let error = |reason| CursorError {
            shown: truncated(text, SHOWN_CHARS),
            reason,
        };
        let body = text
            .trim()
            .strip_prefix(PREFIX)
            .ok_or_else(|| error("it does not start with \"c1.\""))?;
        let bytes = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| error("it is not base64url"))?;
        let bytes: [u8; 16] = bytes
            .try_into()
            .map_err(|_| error("it does not hold two numbers"))?;
        let (seq, ordinal) = bytes.split_at(8);
        let number = |part: &[u8]| <[u8; 8]>::try_from(part).map(i64::from_be_bytes);
        let (Ok(seq), Ok(ordinal)) = (number(seq), number(ordinal)) else {
            return Err(error("it does not hold two numbers"));
        };
        if seq < 0 || ordinal < 0 {
            return Err(error("it holds a negative position"));
        }
        Ok(Cursor { seq, ordinal })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_itself() {
        for cursor in [
            Cursor::START,
            Cursor::after_batch(7),
            Cursor {
                seq: 123_456,
                ordinal: 99,
            },
        ] {
            let text = cursor.to_string();
            assert!(text.starts_with("c1."), "{text}");
            assert_eq!(text.parse::<Cursor>(), Ok(cursor));
        }
    }

    #[test]
    fn cursors_order_as_the_feed() {
        let a = Cursor {
            seq: 1,
            ordinal: 50,
        };
        let b = Cursor { seq: 2, ordinal: 3 };
        assert!(a < b && b < Cursor::after_batch(2) && Cursor::after_batch(1) < b);
    }

    #[test]
    fn malformed_cursors_say_what_is_wrong() {
        let negative = {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&(-1i64).to_be_bytes());
            format!("c1.{}", URL_SAFE_NO_PAD.encode(bytes))
        };
        for (text, reason) in [
            ("", "does not start with"),
            ("x1.AAAA", "does not start with"),
            ("c1.!!!", "not base64url"),
            ("c1.AAAA", "two numbers"),
            (negative.as_str(), "negative"),
        ] {
            let error = text.parse::<Cursor>().unwrap_err().to_string();
            assert!(error.contains(reason), "{text}: {error}");
            assert!(error.contains("malformed change cursor"), "{error}");
        }
    }
}
