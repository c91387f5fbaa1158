//! `tributary changes`: the change feed after a cursor, and the cursor to pass next.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::config::Settings;
use crate::entities::change::ChangeKind;
use crate::pipeline::changes::{self, DatabaseId, FeedChange, FeedCursor, FeedError, FeedQuery};

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
    let app = crate::app::App::open(settings, crate::app::Access::Read).await?;
    let db = app.db();
    if args.head {
        let head = FeedCursor {
            database: Some(changes::database_id(db.main()).await?),
            position: changes::head(db.main()).await?,
        };
        match args.json {
            true => println!(
                "{}",
                serde_json::to_string_pretty(&Head { next_cursor: head })?
            ),
            false => println!("{head}"),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let read = async {
        let since = match args.since {
            Some(cursor) => Some(changes::position_in(db.main(), cursor).await?),
            None => None,
        };
        let query = FeedQuery {
            since,
            provider: args.provider.as_deref(),
            user_id: args.user.as_deref(),
            limit: args.limit,
        };
        changes::read_changes(db.main(), &query).await
    };
    let page = match read.await {
        Ok(page) => page,
        Err(
            error @ (FeedError::Expired { .. }
            | FeedError::Ahead { .. }
            | FeedError::OtherDatabase { .. }
            | FeedError::Unidentified { .. }),
        ) => {
            eprintln!("error: {error}");
            return Ok(ExitCode::from(EXIT_RESYNC));
        }
        Err(error) => return Err(error.into()),
    };
    let issued = |position| FeedCursor {
        database: Some(page.database),
        position,
    };
    let changes: Vec<ChangeLine> = page
        .changes
        .iter()
        .map(|change| ChangeLine::of(change, page.database))
        .collect();
    if args.json {
        let output = Output {
            changes,
            next_cursor: issued(page.next),
            feed_start: Start {
                cursor: issued(page.start.cursor),
                first_committed_at: page.start.first_committed_at,
            },
        };
        println!("{}", serde_json::to_string_pretty(&output)?);
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
    super::history::print_rows(&changes, false, Some(empty), &header, |change| {
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
                Some(Payload::Json(json)) => super::history::shorten(json.get()),
                Some(Payload::Text(text)) => super::history::shorten(text),
                None => "(deleted)".to_string(),
            },
        ]
    })?;
    println!("Next cursor: {}", issued(page.next));
    let first = match page.start.first_committed_at {
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
        issued(page.start.cursor)
    );
    Ok(ExitCode::SUCCESS)
}

/// `--json`: the changes, the cursor to pass next, and where the feed begins.
#[derive(Serialize)]
struct Output<'a> {
    changes: Vec<ChangeLine<'a>>,
    #[serde(serialize_with = "as_text")]
    next_cursor: FeedCursor,
    feed_start: Start,
}

/// Where the feed begins: a reader from `cursor` reads every change kept.
#[derive(Serialize)]
struct Start {
    #[serde(serialize_with = "as_text")]
    cursor: FeedCursor,
    first_committed_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// `--head --json`.
#[derive(Serialize)]
struct Head {
    #[serde(serialize_with = "as_text")]
    next_cursor: FeedCursor,
}

/// One change in `--json`: the payload is the record's JSON itself, not a string.
#[derive(Serialize)]
struct ChangeLine<'a> {
    #[serde(serialize_with = "as_text")]
    cursor: FeedCursor,
    user_id: &'a str,
    provider: &'a str,
    external_id: &'a str,
    kind: ChangeKind,
    run_id: i64,
    committed_at: Option<chrono::DateTime<chrono::Utc>>,
    deleted: bool,
    payload: Option<Payload<'a>>,
}

/// A payload as stored: JSON as the API sent it, or (should a row hold something else)
/// its text.
#[derive(Serialize)]
#[serde(untagged)]
enum Payload<'a> {
    Json(&'a RawValue),
    Text(&'a str),
}

impl<'a> ChangeLine<'a> {
    fn of(change: &'a FeedChange, database: DatabaseId) -> ChangeLine<'a> {
        ChangeLine {
            cursor: FeedCursor {
                database: Some(database),
                position: change.cursor,
            },
            user_id: &change.user_id,
            provider: &change.provider,
            external_id: &change.external_id,
            kind: change.kind,
            run_id: change.run_id,
            committed_at: change.committed_at,
            deleted: change.deleted,
            payload: change.payload.as_deref().map(|payload| {
                match serde_json::from_str::<&RawValue>(payload) {
                    Ok(json) => Payload::Json(json),
                    Err(_) => Payload::Text(payload),
                }
            }),
        }
    }
}

fn as_text<S: serde::Serializer>(cursor: &FeedCursor, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(cursor)
}
