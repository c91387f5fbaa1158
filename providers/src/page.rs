//! What a provider hands the pipeline: one page of records and where the next page is.

use secrecy::SecretString;
use serde::{Deserialize, Serialize};

use crate::record::{Record, RejectedRecord};

/// The credentials of one connection, resolved for one run. `Debug` never shows the secret.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// The API token (bearer token or API key), if the provider needs one.
    pub token: Option<SecretString>,
}

/// Where a page starts. It is serialised into the connection's checkpoint, so it must be
/// plain data.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PagePosition {
    /// An opaque cursor token returned by the previous page.
    Cursor {
        /// The token, sent back as the configured query parameter.
        cursor: String,
    },
    /// A record offset (`offset` pagination).
    Offset {
        /// The number of records before this page.
        offset: u64,
    },
    /// A page number (`page` pagination).
    Page {
        /// The page number.
        page: u64,
    },
    /// A full URL to fetch next (`link` pagination, RFC 8288 `rel="next"`).
    Url {
        /// The absolute URL.
        url: String,
    },
}

/// One item of a page: a record ready to store, or one that was set aside with its payload.
#[derive(Clone, Debug)]
pub enum PageItem {
    /// A record ready to store.
    Record(Record),
    /// A record set aside, with the reason and its raw payload.
    Rejected(RejectedRecord),
}

/// One fetched page.
#[derive(Clone, Debug, Default)]
pub struct Page {
    /// The page's records in the order the API returned them.
    pub items: Vec<PageItem>,
    /// Where the next page starts; `None` when this was the last page.
    pub next: Option<PagePosition>,
}
