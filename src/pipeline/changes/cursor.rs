//! The feed's cursor: a position in commit order, `(seq, ordinal)` (a batch and a change's
//! place in it), and the database that issued it, shown to readers as opaque text (`c2.`
//! and the database's id and the two numbers in base64url). The previous release's
//! cursors (`c1.`, without the database) still parse, so that a reader holding one is
//! told to resync rather than that its cursor is malformed.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use tributary_providers::quote::truncated;

/// The prefix of the cursor's text form: its format's version.
const PREFIX: &str = "c2.";

/// The prefix of the previous release's cursors, which name no database.
const LEGACY_PREFIX: &str = "c1.";

/// The id of the database whose feed issued a cursor: 16 random bytes, drawn once per
/// database (`change_clock.database_id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DatabaseId([u8; 16]);

impl DatabaseId {
    /// The id as `change_clock.database_id` stores it (32 hexadecimal digits).
    pub fn from_column(text: &str) -> Option<DatabaseId> {
        let mut bytes = [0u8; 16];
        const_hex::decode_to_slice(text.trim(), &mut bytes).ok()?;
        Some(DatabaseId(bytes))
    }
}

impl fmt::Display for DatabaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&const_hex::encode(self.0))
    }
}

/// A cursor as a reader holds it: a position in the feed of one database.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FeedCursor {
    /// The database that issued it; `None` for a cursor of the previous release.
    pub database: Option<DatabaseId>,
    pub position: Cursor,
}

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

impl fmt::Display for FeedCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let position = self.position.to_bytes();
        match self.database {
            Some(DatabaseId(database)) => {
                let mut bytes = [0u8; 32];
                bytes[..16].copy_from_slice(&database);
                bytes[16..].copy_from_slice(&position);
                write!(f, "{PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
            }
            None => write!(f, "{LEGACY_PREFIX}{}", URL_SAFE_NO_PAD.encode(position)),
        }
    }
}

/// The position alone, for messages: `after seq 3`, or `seq 3, change 5` partway.
impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ordinal {
            i64::MAX => write!(f, "after seq {}", self.seq),
            ordinal => write!(f, "seq {}, change {ordinal}", self.seq),
        }
    }
}

impl Cursor {
    fn to_bytes(self) -> [u8; 16] {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.seq.to_be_bytes());
        bytes[8..].copy_from_slice(&self.ordinal.to_be_bytes());
        bytes
    }
}

/// The longest part of a bad cursor quoted in its error.
const SHOWN_CHARS: usize = 40;

impl FromStr for FeedCursor {
    type Err = CursorError;

    fn from_str(text: &str) -> Result<FeedCursor, CursorError> {
        let error = |reason| CursorError {
            shown: truncated(text, SHOWN_CHARS),
            reason,
        };
        let text = text.trim();
        let (body, with_database) =
            match (text.strip_prefix(PREFIX), text.strip_prefix(LEGACY_PREFIX)) {
                (Some(body), _) => (body, true),
                (None, Some(body)) => (body, false),
                (None, None) => return Err(error("it does not start with \"c2.\"")),
            };
        let bytes = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| error("it is not base64url"))?;
        let (database, position) = match (with_database, bytes.len()) {
            (true, 32) => {
                let (database, position) = bytes.split_at(16);
                let database = <[u8; 16]>::try_from(database)
                    .map_err(|_| error("it does not hold a database and two numbers"))?;
                (Some(DatabaseId(database)), position)
            }
            (false, 16) => (None, bytes.as_slice()),
            _ => return Err(error("it does not hold a database and two numbers")),
        };
        let (seq, ordinal) = position.split_at(8);
        let number = |part: &[u8]| <[u8; 8]>::try_from(part).map(i64::from_be_bytes);
        let (Ok(seq), Ok(ordinal)) = (number(seq), number(ordinal)) else {
            return Err(error("it does not hold a database and two numbers"));
        };
        if seq < 0 || ordinal < 0 {
            return Err(error("it holds a negative position"));
        }
        Ok(FeedCursor {
            database,
            position: Cursor { seq, ordinal },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATABASE: DatabaseId = DatabaseId([7; 16]);

    #[test]
    fn a_cursor_reads_back_as_itself() {
        for position in [
            Cursor::START,
            Cursor::after_batch(7),
            Cursor {
                seq: 123_456,
                ordinal: 99,
            },
        ] {
            for database in [Some(DATABASE), None] {
                let cursor = FeedCursor { database, position };
                let text = cursor.to_string();
                let prefix = if database.is_some() { "c2." } else { "c1." };
                assert!(text.starts_with(prefix), "{text}");
                assert_eq!(text.parse::<FeedCursor>(), Ok(cursor));
            }
        }
    }

    #[test]
    fn a_database_id_reads_from_its_column() {
        let text = "00112233445566778899aabbccddeeff";
        let id = DatabaseId::from_column(text).expect("an id");
        assert_eq!(id.to_string(), text);
        assert_eq!(DatabaseId::from_column("0011"), None);
        assert_eq!(DatabaseId::from_column(""), None);
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
            let mut bytes = [0u8; 32];
            bytes[16..24].copy_from_slice(&(-1i64).to_be_bytes());
            format!("c2.{}", URL_SAFE_NO_PAD.encode(bytes))
        };
        let legacy_length = format!("c2.{}", URL_SAFE_NO_PAD.encode([0u8; 16]));
        for (text, reason) in [
            ("", "does not start with"),
            ("x1.AAAA", "does not start with"),
            ("c2.!!!", "not base64url"),
            ("c2.AAAA", "two numbers"),
            ("c1.AAAA", "two numbers"),
            (legacy_length.as_str(), "two numbers"),
            (negative.as_str(), "negative"),
        ] {
            let error = text.parse::<FeedCursor>().unwrap_err().to_string();
            assert!(error.contains(reason), "{text}: {error}");
            assert!(error.contains("malformed change cursor"), "{error}");
        }
    }
}
