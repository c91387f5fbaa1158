//! Streams: the listings one connection serves (GitHub's repositories, issues and pull
//! requests; Stripe's charges and customers). Each has its own cursor, checkpoint and
//! runs; a child stream is listed once per record of its parent.

use crate::FetchError;

/// One stream an adapter can sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamSpec {
    /// The name used in config (`streams = [...]`), `sync --stream` and `sync_runs.stream`:
    /// lowercase letters, digits and `_`.
    pub name: String,
    /// The stream whose stored records this one is listed per (GitHub's pull requests per
    /// repository), if any.
    pub parent: Option<String>,
}

impl StreamSpec {
    /// A stream listed once per run.
    pub fn top(name: &str) -> StreamSpec {
        StreamSpec {
            name: name.to_string(),
            parent: None,
        }
    }

    /// A stream listed once per stored record of `parent`.
    pub fn child(name: &str, parent: &str) -> StreamSpec {
        StreamSpec {
            name: name.to_string(),
            parent: Some(parent.to_string()),
        }
    }
}

/// The parent record a child stream's page is listed for, as the pipeline stored it.
#[derive(Clone, Copy, Debug)]
pub struct ParentRecord<'a> {
    /// The parent's key within its stream.
    pub external_id: &'a str,
    /// The parent's JSON text as the API sent it.
    pub payload: &'a str,
}

/// The error for a stream the adapter does not serve: only a bug in the caller sends one,
/// since config validation names the streams a kind has.
pub(crate) fn unknown_stream(kind: &str, stream: &str) -> FetchError {
    FetchError::Client {
        message: format!("{kind} has no stream {stream:?}"),
    }
}
