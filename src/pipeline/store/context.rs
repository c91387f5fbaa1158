//! What the store knows about the page being stored: its run, connection, stream and
//! checkpoint, how it is written, and what it most likely holds.

use chrono::{DateTime, Utc};

use crate::config::WriteMode;
use crate::entities::connection;
use crate::lease::Fence;
use crate::pipeline::changes::BatchOwner;
use crate::pipeline::checkpoint::Checkpoint;
use crate::pipeline::ground::row::RowPage;
use crate::pipeline::streams::StreamScope;

/// What the store needs to know about the page being stored.
pub struct PageContext<'a> {
    pub run_id: i64,
    pub connection: &'a connection::Model,
    /// The stream whose page it is: its records' namespace and its checkpoint's row.
    pub stream: &'a StreamScope,
    /// Where the next page starts: committed as the connection's checkpoint with the page
    /// (`None` on the last page).
    pub next_checkpoint: Option<&'a Checkpoint>,
    /// How the provider's records are written.
    pub mode: WriteMode,
    /// Leave the connection's checkpoint as it is (replays store loose records, not a
    /// page of the listing).
    pub leave_checkpoint: bool,
    /// What the page most likely holds (from the page before), which picks a shortcut.
    pub expect: PageExpectation,
    /// Note the page's keys in `run_sightings` (a full pass of a provider that tracks
    /// deletions): the run's records that no page noted are its deletions.
    pub sightings: bool,
    /// The lease the run holds: the page commits only while the connection's row still
    /// holds it and the run's row is `running` (`None`: a run without a lease, such as
    /// `sync_connection` called directly, fenced by its run's status only).
    pub lease: Option<&'a Fence>,
    /// The version of the page's objects, for a page a webhook delivery carried: each is
    /// written only over an older stored version (`versioned.rs`). `None`: a page of the
    /// listing, written as fetched.
    pub version: Option<&'a str>,
}

impl PageContext<'_> {
    /// Whose records the page's changes are.
    pub fn batch_owner(&self) -> BatchOwner<'_> {
        BatchOwner {
            run_id: self.run_id,
            user_id: &self.connection.user_id,
            provider: self.stream.namespace(),
        }
    }

    /// What every record row the page writes at `now` shares.
    pub(crate) fn row_page(&self, now: DateTime<Utc>) -> RowPage<'_> {
        RowPage {
            user_id: &self.connection.user_id,
            provider: self.stream.namespace(),
            run_id: self.run_id,
            now,
        }
    }
}

/// What a page most likely holds; a wrong guess costs one wasted statement, never a
/// different outcome (see ARCHITECTURE.md, "Shortcuts for unchanged and new pages").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PageExpectation {
    /// No guess: look up, then insert, update or skip.
    #[default]
    Unknown,
    /// Every record stored already with the same content: look it up outside any
    /// transaction, and if so write nothing; the page's counters and checkpoint ride
    /// with the run's next commit or its end.
    Unchanged,
    /// Every record new: insert first, and commit without a lookup if every row went in;
    /// otherwise roll back and take the usual way.
    New,
}
