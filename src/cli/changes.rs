//! `tributary changes`: the change feed after a cursor, and the cursor to pass next.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;
use serde::Serialize;

use crate::app::{Access, App};
use crate::config::Settings;
use crate::ops::changes::{self, ChangesQuery};
use crate::pipeline::changes::FeedCursor;

#[derive(Debug, Args)]
pub struct ChangesArgs {
    /// Show the changes after this cursor (as a previous `changes` printed it); from the
    /// first change kept when omitted.
    #[arg(long, value_name = "CURSOR", conflicts_with = "head")]
    since: Option<FeedCursor>,
    /// Only changes of this provider's records.
    #[arg(long)]
    provider: Option<String>,
    /// Only changes of this user's records.
    #[arg(long, value_name = "USER_ID")]
    user: Option<String>,
    /// The most changes to show (1 to 10000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=changes::MAX_LIMIT))]
    limit: u64,
    /// Print only the head: the cursor after every change committed so far. Take it
    /// before copying `records`, then follow the feed from it.
    #[arg(long)]
    head: bool,
    /// Print JSON (with whole payloads) instead of a table.
    #[arg(long)]
    json: bool,
}

/// The exit code when the cursor cannot be served (expired, from another database, or
/// from a release whose cursors named no database): the reader must resync from
/// `records`.
pub const EXIT_RESYNC: u8 = 3;

/// `tributary changes`.
pub async fn run(config: &Path, args: ChangesArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(config)?;
    let app = App::open(settings, Access::Read).await?;
    let db = app.db();
    if args.head {
        let head = changes::head(db).await?;
        match args.json {
            true => println!(
                "{}",
                serde_json::to_string_pretty(&Head { next_cursor: head })?
            ),
            false => println!("{head}"),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let query = ChangesQuery {
        since: args.since,
        provider: args.provider,
        user_id: args.user,
        limit: args.limit,
    };
    let page = match changes::read(db, &query).await {
        Ok(page) => page,
        Err(error) if error.needs_resync() => {
            eprintln!("error: {error}");
            return Ok(ExitCode::from(EXIT_RESYNC));
        }
        Err(error) => return Err(error.into()),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(ExitCode::SUCCESS);
    }
    let header = [
        "committed (UTC)",
        "kind",
        "provider",
        "user",
        "external_id",
        "run",
        "payload",
    ];
    let empty = "No changes after that cursor.";
    super::history::print_rows(&page.changes, false, Some(empty), &header, |change| {
        vec![
            change
                .committed_at
                .map(|time| time.format("%Y-%m-%d %H:%M:%S").to_string())
                .unwrap_or_default(),
            change.kind.to_string(),
            change.provider.to_string(),
            change.user_id.to_string(),
            change.external_id.to_string(),
            change.run_id.to_string(),
            match &change.payload {
                Some(payload) => super::history::shorten(payload.text()),
                None => "(deleted)".to_string(),
            },
        ]
    })?;
    println!("Next cursor: {}", page.next_cursor);
    let first = match page.feed_start.first_committed_at {
        Some(time) => format!(
            "its first change kept committed {}",
            time.format("%Y-%m-%d %H:%M:%S UTC")
        ),
        None => "no change is kept yet".to_string(),
    };
    println!(
        "The feed begins at {} ({first}): earlier changes were swept, and records stored \
         before the feed existed have none. For every record, take the head (`changes \
         --head`), copy `records`, then follow from the head.",
        page.feed_start.cursor
    );
    Ok(ExitCode::SUCCESS)
}

/// `--head --json`.
#[derive(Serialize)]
struct Head {
    #[serde(serialize_with = "changes::as_text")]
    next_cursor: FeedCursor,
}
