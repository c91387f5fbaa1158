//! `tributary replay RUN_ID`: re-ingest a run's failed records from their stored payloads
//! through the same pipeline, as a new run with trigger `replay`.
//!
//! Each open record-level error of the run is re-keyed with the provider's current
//! configuration and stored like any record, so a replay is idempotent: what went through
//! once is unchanged the second time. Errors whose record now goes through are marked
//! resolved by the replay run; the rest stay open. An error whose record a newer run has
//! stored or marked deleted since is superseded: it is closed by the replay run without
//! writing its old payload over the newer state. A payload is checked by the adapter as a
//! fetched record is (`Provider::check_stored`). Page-level errors (a body that could
//! not be read) are not replayable: the next sync fetches those pages again.

use sea_orm::sea_query::Expr;
use sea_orm::Condition;
use sea_orm::{ColumnTrait, DbErr, EntityTrait, QueryFilter, QueryOrder};
use serde::Serialize;
use tributary_providers::{build_provider, FetchError, PageItem};

use super::checkpoint::CheckpointMove;
use super::deletions::DeletionPass;
use super::run::{Run, RunEnd, RunPage, RunStatus, Trigger};
use super::store::ErrorScope;
use crate::config::{Settings, StreamSettings};
use crate::db::DatabasePools;
use crate::entities::{connection, record, run_error, sync_run};
use crate::lease::{claim, release, renewing, Holder};

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("there is no run with id {0}; `tributary runs` lists them")]
    NoSuchRun(i64),
    #[error("run {run_id} belongs to provider {provider:?}, which is not in the config")]
    UnknownProvider { run_id: i64, provider: String },
    #[error("the connection {user_id}@{provider} of run {run_id} no longer exists")]
    NoConnection {
        run_id: i64,
        user_id: String,
        provider: String,
    },
    #[error(
        "a run of {user_id}@{provider} is going (held by {holder}); replay when it has finished"
    )]
    Busy {
        user_id: String,
        provider: String,
        holder: String,
    },
    #[error("building provider {provider:?} failed: {source}")]
    Provider {
        provider: String,
        source: FetchError,
    },
    #[error("database error: {0}")]
    Database(#[from] DbErr),
}

/// What a replay did.
#[derive(Debug, Default, Serialize)]
pub struct ReplayReport {
    /// The replay run, when there was anything to replay.
    pub replay_run_id: Option<i64>,
    /// Errors whose record went through, now resolved.
    pub resolved: Vec<i64>,
    /// Errors whose record still fails, with today's reason; they stay open.
    pub still_failing: Vec<(i64, String)>,
    /// Errors whose record a run newer than the failed one has stored or marked deleted
    /// since: closed without replaying, so the old payload never replaces the newer
    /// record nor brings back a deleted one.
    pub superseded: Vec<i64>,
    /// Page-level errors, which a replay cannot redo.
    pub not_replayable: Vec<i64>,
    /// Why the replay stopped before its last error (it lost the connection's lease, or a
    /// write failed): its run ended `interrupted` or `failed`, and the errors it did not
    /// replay are in `still_failing`, open.
    pub stopped: Option<String>,
}

/// Replays the open record-level errors of `run_id`.
pub async fn replay_run(
    db: &DatabasePools,
    settings: &Settings,
    run_id: i64,
) -> Result<ReplayReport, ReplayError> {
    let run = sync_run::Entity::find_by_id(run_id)
        .one(db)
        .await?
        .ok_or(ReplayError::NoSuchRun(run_id))?;
    let open = run_error::Entity::find()
        .filter(run_error::Column::RunId.eq(run_id))
        .filter(run_error::Column::ResolvedByRunId.is_null())
        .order_by_asc(run_error::Column::Id)
        .all(db)
        .await?;
    let mut report = ReplayReport::default();
    let (records, pages): (Vec<_>, Vec<_>) = open
        .into_iter()
        .partition(|error| error.scope == ErrorScope::Record);
    report.not_replayable = pages.iter().map(|error| error.id).collect();
    if records.is_empty() {
        return Ok(report);
    }

    let provider_settings =
        settings
            .providers
            .get(&run.provider)
            .ok_or_else(|| ReplayError::UnknownProvider {
                run_id,
                provider: run.provider.clone(),
            })?;
    let stream_name = run
        .stream
        .clone()
        .unwrap_or_else(|| provider_settings.primary_stream().name);
    // The adapter keys and checks a stored payload as it would a fetched record.
    let provider =
        build_provider(&provider_settings.adapter, &provider_settings.http).map_err(|source| {
            ReplayError::Provider {
                provider: provider_settings.name.clone(),
                source,
            }
        })?;
    let connection = connection::Entity::find()
        .filter(connection::Column::UserId.eq(run.user_id.as_str()))
        .filter(connection::Column::Provider.eq(run.provider.as_str()))
        .one(db)
        .await?
        .ok_or_else(|| ReplayError::NoConnection {
            run_id,
            user_id: run.user_id.clone(),
            provider: run.provider.clone(),
        })?;
    let holder = Holder::current();
    let lease = match claim(db, &connection, &holder, settings.daemon.lease_ttl).await? {
        Ok(lease) => lease,
        Err(busy) => {
            return Err(ReplayError::Busy {
                user_id: connection.user_id,
                provider: connection.provider,
                holder: busy.holder,
            })
        }
    };
    let stream_settings = stream_of(provider_settings, run.stream.as_deref());
    let lost = tokio_util::sync::CancellationToken::new();
    let target = ReplayTarget {
        connection: &connection,
        stream: &stream_settings,
        provider_settings,
        provider: provider.as_ref(),
        stream_name: &stream_name,
        lease: &lease,
        lost: &lost,
    };
    let ttl = settings.daemon.lease_ttl;
    let work = replay_records(db, &target, records, &mut report);
    let result = renewing(db, &connection, &lease, ttl, &lost, work).await;
    let released = release(db, &connection, &holder).await;
    result?;
    released?;
    Ok(report)
}

/// The stream a failed run synced, as configured now; a run from before streams synced
/// the primary one. A stream no longer configured still has its namespace.
fn stream_of(settings: &crate::config::ProviderSettings, stream: Option<&str>) -> StreamSettings {
    let primary = settings.primary_stream();
    match stream {
        None => primary,
        Some(name) => settings
            .stream(name)
            .cloned()
            .unwrap_or_else(|| StreamSettings {
                name: name.to_string(),
                namespace: crate::config::namespace(&settings.name, &primary.name, name),
                parent: None,
            }),
    }
}

/// Where a replay stores its records.
struct ReplayTarget<'a> {
    connection: &'a connection::Model,
    stream: &'a StreamSettings,
    provider_settings: &'a crate::config::ProviderSettings,
    provider: &'a dyn tributary_providers::Provider,
    /// The stream as the adapter names it.
    stream_name: &'a str,
    /// The lease the replay claimed: a replay is a run, fenced like any other.
    lease: &'a crate::lease::Fence,
    /// Cancelled when a renewal finds the lease lost.
    lost: &'a tokio_util::sync::CancellationToken,
}

async fn replay_records(
    db: &DatabasePools,
    target: &ReplayTarget<'_>,
    errors: Vec<run_error::Model>,
    report: &mut ReplayReport,
) -> Result<(), DbErr> {
    let ReplayTarget {
        connection,
        stream,
        provider_settings,
        provider,
        stream_name,
        lease,
        lost,
    } = *target;
    let mut run = Run::open(db, connection, stream, Trigger::Replay, Some(lease)).await?;
    let replay_run_id = run.id();
    report.replay_run_id = Some(replay_run_id);
    let started = std::time::Instant::now();
    let mut errors = errors.into_iter();
    let mut stopped = None;
    for error in errors.by_ref() {
        if lost.is_cancelled() {
            stopped = Some("the connection's lease was taken over by another process".to_string());
            report
                .still_failing
                .push((error.id, NOT_REPLAYED.to_string()));
            break;
        }
        // The payload is the record's text as received, so it keys and hashes the same.
        let record = match serde_json::from_str::<&serde_json::value::RawValue>(&error.payload) {
            Ok(raw) => provider.check_stored(stream_name, raw),
            Err(parse) => {
                report
                    .still_failing
                    .push((error.id, format!("the stored payload is not JSON: {parse}")));
                run.count_unstored_failure();
                continue;
            }
        };
        let record = match record {
            Ok(record) => record,
            Err(rejected) => {
                report
                    .still_failing
                    .push((error.id, rejected.message.to_string()));
                run.count_unstored_failure();
                continue;
            }
        };
        let namespace = run.stream().namespace();
        if changed_since(db, connection, namespace, &record.external_id, error.run_id).await? {
            close_error(db, error.id, replay_run_id).await?;
            report.superseded.push(error.id);
            continue;
        }
        let page = RunPage {
            items: vec![PageItem::Record(record)],
            mode: provider_settings.write_mode,
            leave_checkpoint: true,
            ..RunPage::default()
        };
        let stored = match run.store(page).await {
            Ok(stored) => stored,
            // Fenced out (the lease moved on) or the database failed: what is stored
            // stays, the rest stays open, and the run closes saying why.
            Err(failed) => {
                stopped = Some(failed.to_string());
                report
                    .still_failing
                    .push((error.id, NOT_REPLAYED.to_string()));
                break;
            }
        };
        if stored.failed == 0 {
            close_error(db, error.id, replay_run_id).await?;
            report.resolved.push(error.id);
        } else {
            report.still_failing.push((
                error.id,
                "writing the record failed again; see the replay run's errors".to_string(),
            ));
        }
    }
    for error in errors {
        report
            .still_failing
            .push((error.id, NOT_REPLAYED.to_string()));
    }
    let status = match (&stopped, report.still_failing.is_empty()) {
        (Some(_), _) => RunStatus::Failed,
        (None, true) => RunStatus::Succeeded,
        (None, false) => RunStatus::Partial,
    };
    let end = RunEnd {
        status,
        error: stopped.as_deref(),
        // A replay is not a pass over the listing: the cursor, the checkpoint and the
        // connection's last success stay as they are.
        listing_complete: false,
        checkpoint: CheckpointMove::Keep,
        watermark: None,
        notify: provider_settings.notify,
        deletions: DeletionPass::Off,
        full_passes_served: 0,
        authorization_refused: false,
    };
    let closed = run.close(end).await?;
    if stopped.is_some() {
        // A run that lost its lease closes `interrupted` with the reason saying so.
        report.stopped = closed.error.or(stopped);
    }
    tracing::info!(
        run_id = replay_run_id,
        resolved = report.resolved.len(),
        superseded = report.superseded.len(),
        still_failing = report.still_failing.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "Replay finished."
    );
    Ok(())
}

/// Why an error the replay did not reach stays open.
const NOT_REPLAYED: &str = "not replayed: the replay stopped before this error";

/// Whether a run newer than `failed_run_id` stored the record with new content or marked
/// it deleted: then the error's payload is older than what `records` holds, and storing it
/// would bring back a record the provider no longer lists.
async fn changed_since(
    db: &DatabasePools,
    connection: &connection::Model,
    namespace: &str,
    external_id: &str,
    failed_run_id: i64,
) -> Result<bool, DbErr> {
    let newer = record::Entity::find()
        .filter(record::Column::UserId.eq(connection.user_id.as_str()))
        .filter(record::Column::Provider.eq(namespace))
        .filter(record::Column::ExternalId.eq(external_id))
        .filter(
            Condition::any()
                .add(record::Column::LastSeenRunId.gt(failed_run_id))
                .add(record::Column::DeletedByRunId.gt(failed_run_id)),
        )
        .one(db)
        .await?;
    Ok(newer.is_some())
}

async fn close_error(db: &DatabasePools, error_id: i64, replay_run_id: i64) -> Result<(), DbErr> {
    run_error::Entity::update_many()
        .col_expr(
            run_error::Column::ResolvedByRunId,
            Expr::value(replay_run_id),
        )
        .filter(run_error::Column::Id.eq(error_id))
        .exec(db)
        .await?;
    Ok(())
}
