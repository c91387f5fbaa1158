//! Choosing which connections to sync and running them, a bounded number at a time, each
//! under its lease so no connection ever has two runs at once.

use std::time::Duration;

use futures::stream::{self, StreamExt};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder,
    SqliteTransactionMode, TransactionOptions, TransactionTrait,
};
use tributary_providers::{build_provider, FetchError, Provider};

use crate::config::{ProviderSettings, Settings, StreamSettings};
use crate::db::{DatabasePools, DbSetupError};
use crate::entities::connection;
use crate::entities::sync_run::RunStatus;
use crate::lease::{claim_in, mark_abandoned_runs, release, renewing, Busy, Fence, Holder};
use crate::pipeline::{
    sync_opened, CloseStep, OpenedRun, ProgressSink, Run, RunHooks, RunOptions, RunOutcome,
};

/// Which connections a `sync` covers. `None` matches all.
#[derive(Clone, Debug, Default)]
pub struct SyncFilter {
    pub provider: Option<String>,
    pub user_id: Option<String>,
    /// One stream of the providers that sync it; `None`: every configured stream.
    pub stream: Option<String>,
}

/// Why a sync could not start or could not record its runs.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("no provider named {name:?} in {config}; configured: {known}")]
    UnknownProvider {
        name: String,
        config: String,
        known: String,
    },
    #[error("no provider {scope} syncs a stream named {stream:?}; configured: {known}")]
    UnknownStream {
        stream: String,
        /// `named "github"`, or `in config.toml` without a provider filter.
        scope: String,
        known: String,
    },
    #[error("provider {provider:?} is disabled in the config (enabled = false)")]
    ProviderDisabled { provider: String },
    #[error("building provider {provider:?} failed: {source}")]
    Provider {
        provider: String,
        source: FetchError,
    },
    #[error("database error: {0}")]
    Database(#[from] DbErr),
    #[error(transparent)]
    KeyIndex(#[from] DbSetupError),
}

impl SyncError {
    /// Whether the configuration (or the command line's provider) is at fault.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            SyncError::UnknownProvider { .. } | SyncError::ProviderDisabled { .. }
        )
    }
}

/// What a sync pass did: the runs it made, and the connections it skipped because a run
/// of theirs was already going (here or in another process).
#[derive(Debug, Default)]
pub struct SyncReport {
    pub outcomes: Vec<RunOutcome>,
    pub skipped: Vec<Skipped>,
}

/// A connection not synced because another run holds its lease.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Skipped {
    pub user_id: String,
    pub provider: String,
    /// The lease holder (`host:pid:nonce`).
    pub holder: String,
    /// When its lease expires unless renewed.
    pub until: Option<chrono::DateTime<chrono::Utc>>,
}

/// How a pass claims connections.
#[derive(Clone, Debug)]
pub(crate) struct LeaseSettings {
    pub holder: Holder,
    /// How long a claim lasts without renewal; renewed every third of it.
    pub ttl: Duration,
    /// The caller releases the leases of the connections whose runs went (those not in
    /// the report's `skipped`) itself, in the transaction that records what the runs
    /// came to (a job's end); released here only when the runs fail to record.
    pub keep: bool,
}

/// Syncs every enabled connection that matches `filter`, one run each. Providers are
/// synced one after the other; each provider's connections run up to
/// `max_concurrent_connections` at a time.
pub async fn sync_matching(
    db: &DatabasePools,
    settings: &Settings,
    filter: &SyncFilter,
    options: &RunOptions,
    progress: &dyn ProgressSink,
) -> Result<SyncReport, SyncError> {
    check_filter(settings, filter)?;
    // `App::open` checks this too, but an embedding app may sync on pools of its own, and
    // without the index concurrent runs could store a key twice.
    crate::db::require_key_index(db).await?;
    warn_about_unconfigured_connections(db, settings).await?;
    let lease = LeaseSettings {
        holder: Holder::current(),
        ttl: settings.daemon.lease_ttl,
        keep: false,
    };

    let mut report = SyncReport::default();
    for (provider_settings, streams) in covered(settings, filter) {
        let connections = enabled_connections(db, &provider_settings.name, filter).await?;
        let provider = build(provider_settings)?;
        let part = sync_provider(
            db,
            provider_settings,
            provider.as_ref(),
            connections,
            &streams,
            options,
            &lease,
            progress,
            None,
        )
        .await?;
        report.outcomes.extend(part.outcomes);
        report.skipped.extend(part.skipped);
    }
    Ok(report)
}

/// Refuses a filter naming a provider the config lacks or disables, or a stream no
/// provider it covers syncs.
pub(crate) fn check_filter(settings: &Settings, filter: &SyncFilter) -> Result<(), SyncError> {
    if let Some(name) = &filter.provider {
        match settings.providers.get(name) {
            None => {
                return Err(SyncError::UnknownProvider {
                    name: name.clone(),
                    config: settings.path.display().to_string(),
                    known: settings
                        .providers
                        .keys()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", "),
                })
            }
            Some(provider) if !provider.enabled => {
                return Err(SyncError::ProviderDisabled {
                    provider: name.clone(),
                })
            }
            Some(_) => {}
        }
    }
    check_stream_filter(settings, filter)
}

/// The enabled providers `filter` covers, each with the streams of it that it covers
/// (none left out: a provider without such a stream is not covered).
fn covered<'a>(
    settings: &'a Settings,
    filter: &'a SyncFilter,
) -> impl Iterator<Item = (&'a ProviderSettings, Vec<StreamSettings>)> + 'a {
    settings
        .providers
        .values()
        .filter(|provider| {
            provider.enabled
                && filter
                    .provider
                    .as_ref()
                    .is_none_or(|name| *name == provider.name)
        })
        .map(|provider| (provider, streams_matching(provider, filter)))
        .filter(|(_, streams)| !streams.is_empty())
}

/// The enabled connections a sync with `filter` runs, with the streams it runs of each,
/// provider by provider.
pub(crate) async fn matching_connections(
    db: &DatabaseConnection,
    settings: &Settings,
    filter: &SyncFilter,
) -> Result<Vec<(connection::Model, Vec<StreamSettings>)>, SyncError> {
    check_filter(settings, filter)?;
    let mut matching = Vec::new();
    for (provider_settings, streams) in covered(settings, filter) {
        for connection in enabled_connections(db, &provider_settings.name, filter).await? {
            matching.push((connection, streams.clone()));
        }
    }
    Ok(matching)
}

/// Refuses a stream filter that no provider it covers syncs, naming what they sync.
fn check_stream_filter(settings: &Settings, filter: &SyncFilter) -> Result<(), SyncError> {
    let Some(stream) = &filter.stream else {
        return Ok(());
    };
    let covered: Vec<&ProviderSettings> = settings
        .providers
        .values()
        .filter(|provider| {
            filter
                .provider
                .as_ref()
                .is_none_or(|name| *name == provider.name)
        })
        .collect();
    if covered
        .iter()
        .any(|provider| provider.stream(stream).is_some())
    {
        return Ok(());
    }
    let known: Vec<String> = covered
        .iter()
        .flat_map(|provider| {
            provider
                .streams
                .iter()
                .map(move |configured| format!("{}.{}", provider.name, configured.name))
        })
        .collect();
    Err(SyncError::UnknownStream {
        stream: stream.clone(),
        scope: match &filter.provider {
            Some(name) => format!("named {name:?}"),
            None => "in the config".to_string(),
        },
        known: known.join(", "),
    })
}

/// The provider's configured streams that `filter` covers, parents first.
pub(crate) fn streams_matching(
    settings: &ProviderSettings,
    filter: &SyncFilter,
) -> Vec<StreamSettings> {
    settings
        .streams
        .iter()
        .filter(|stream| {
            filter
                .stream
                .as_ref()
                .is_none_or(|name| *name == stream.name)
        })
        .cloned()
        .collect()
}

/// Builds a provider's adapter.
pub fn build(settings: &ProviderSettings) -> Result<Box<dyn Provider>, SyncError> {
    build_provider(&settings.adapter, &settings.http).map_err(|source| SyncError::Provider {
        provider: settings.name.clone(),
        source,
    })
}

/// Syncs `streams` of the given connections of one provider, bounded by its
/// `max_concurrent_connections`, each connection under its lease. `with_close`: writes
/// that commit with the close of a run of one stream (a job's end).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn sync_provider(
    db: &DatabasePools,
    settings: &ProviderSettings,
    provider: &dyn Provider,
    connections: Vec<connection::Model>,
    streams: &[StreamSettings],
    options: &RunOptions,
    lease: &LeaseSettings,
    progress: &dyn ProgressSink,
    with_close: Option<&dyn CloseStep>,
) -> Result<SyncReport, SyncError> {
    let results: Vec<Result<Leased, DbErr>> = stream::iter(connections)
        .map(|connection| async move {
            let run = ConnectionRun {
                db,
                provider,
                settings,
                connection: &connection,
                streams,
                with_close,
            };
            sync_leased(&run, options, lease, progress).await
        })
        .buffer_unordered(settings.max_concurrent_connections)
        .collect()
        .await;
    let mut report = SyncReport::default();
    for result in results {
        match result? {
            Leased::Ran(outcomes) => report.outcomes.extend(outcomes),
            Leased::Skipped(skipped) => report.skipped.push(skipped),
        }
    }
    Ok(report)
}

enum Leased {
    /// One outcome per stream run, in the order they ran.
    Ran(Vec<RunOutcome>),
    Skipped(Skipped),
}

/// What one connection's turn syncs.
struct ConnectionRun<'a> {
    db: &'a DatabasePools,
    provider: &'a dyn Provider,
    settings: &'a ProviderSettings,
    connection: &'a connection::Model,
    streams: &'a [StreamSettings],
    /// Writes that commit with the run's close, when there is one stream to run.
    with_close: Option<&'a dyn CloseStep>,
}

/// Claims the connection's lease, runs its streams one after another while renewing the
/// lease, and releases it. A stream that fails or stops early leaves its siblings to run;
/// a lost lease (taken over after it expired) or a shutdown interrupts the run between
/// pages and runs no further stream.
async fn sync_leased(
    run: &ConnectionRun<'_>,
    options: &RunOptions,
    lease: &LeaseSettings,
    progress: &dyn ProgressSink,
) -> Result<Leased, DbErr> {
    let ConnectionRun {
        db,
        provider,
        settings,
        connection,
        streams,
        ..
    } = *run;
    // A run stopped already opens no run: it would end at once, `interrupted`.
    let first = streams.first().filter(|_| !options.cancel.is_cancelled());
    let (fence, mut opened) = match claim_and_open(db, connection, lease, first, options).await? {
        Ok(claimed) => claimed,
        Err(busy) => {
            tracing::info!(
                user_id = %connection.user_id,
                provider = %connection.provider,
                holder = %busy.holder,
                until = ?busy.until,
                "Connection skipped: a run of it is already going."
            );
            crate::telemetry::record_skip(&connection.provider);
            return Ok(Leased::Skipped(Skipped {
                user_id: connection.user_id.clone(),
                provider: connection.provider.clone(),
                holder: busy.holder,
                until: busy.until,
            }));
        }
    };
    let run_options = RunOptions {
        cancel: options.cancel.child_token(),
        lease: Some(fence.clone()),
        ..options.clone()
    };
    let lost_lease = run_options.cancel.clone();
    let runs = async {
        let mut outcomes = Vec::with_capacity(streams.len());
        for stream in streams {
            // A run opened with the claim goes on to its close, stopped or not.
            let opened = opened.take();
            if opened.is_none() && run_options.cancel.is_cancelled() {
                break;
            }
            let options = RunOptions {
                stream: Some(stream.clone()),
                ..run_options.clone()
            };
            let hooks = RunHooks {
                opened,
                with_close: run.with_close.filter(|_| streams.len() == 1),
            };
            let outcome =
                sync_opened(db, provider, settings, connection, options, progress, hooks).await?;
            // A run ends `interrupted` only when it was stopped or lost the lease, which
            // its page may find before the renewal does: no further stream opens a run.
            // A run that yielded its turn leaves its siblings to the job it queues.
            let interrupted = outcome.status == RunStatus::Interrupted || outcome.yielded;
            outcomes.push(outcome);
            if interrupted {
                break;
            }
        }
        Ok::<_, DbErr>(outcomes)
    };
    let outcomes = renewing(db, connection, &fence, lease.ttl, &lost_lease, runs).await;
    if lease.keep && outcomes.is_ok() {
        return outcomes.map(Leased::Ran);
    }
    let released = release(db, connection, &lease.holder).await;
    let outcomes = outcomes?;
    released?;
    Ok(Leased::Ran(outcomes))
}

/// Claims the connection's lease and, in the same transaction, opens the run of its
/// `first` stream when that stream ran before (its first run creates its state in a
/// transaction of its own, after the claim). Runs a vanished holder left `running` are
/// marked `interrupted` after the claim commits, and then no run is opened with it: the
/// claim holds the connection's row, and a stalled holder's page holds its run's row
/// before it waits for the connection's.
async fn claim_and_open(
    db: &DatabasePools,
    connection: &connection::Model,
    lease: &LeaseSettings,
    first: Option<&StreamSettings>,
    options: &RunOptions,
) -> Result<Result<(Fence, Option<OpenedRun>), Busy>, DbErr> {
    // SQLite: the write lock up front, as every transaction that writes.
    let txn = db
        .begin_with_options(TransactionOptions {
            sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
            ..TransactionOptions::default()
        })
        .await?;
    let claim = match claim_in(&txn, connection, &lease.holder, lease.ttl).await? {
        Ok(claim) => claim,
        Err(busy) => {
            txn.rollback().await?;
            return Ok(Err(busy));
        }
    };
    let opened = match first {
        Some(stream) if claim.abandoned.is_empty() => {
            Run::open_in(&txn, connection, stream, options.trigger).await?
        }
        _ => None,
    };
    txn.commit().await?;
    mark_abandoned_runs(db, connection, claim.abandoned).await?;
    Ok(Ok((claim.fence, opened)))
}

/// The enabled connections of one provider that match the filter's user.
pub(crate) async fn enabled_connections(
    db: &DatabaseConnection,
    provider: &str,
    filter: &SyncFilter,
) -> Result<Vec<connection::Model>, DbErr> {
    let mut query = connection::Entity::find()
        .filter(connection::Column::Provider.eq(provider))
        .filter(connection::Column::Enabled.eq(true));
    if let Some(user_id) = &filter.user_id {
        query = query.filter(connection::Column::UserId.eq(user_id.as_str()));
    }
    query.order_by_asc(connection::Column::Id).all(db).await
}

/// Connections stored for providers the config no longer has are not synced; say so.
async fn warn_about_unconfigured_connections(
    db: &DatabaseConnection,
    settings: &Settings,
) -> Result<(), DbErr> {
    let configured: Vec<&str> = settings.providers.keys().map(String::as_str).collect();
    let orphans = connection::Entity::find()
        .filter(connection::Column::Provider.is_not_in(configured))
        .filter(connection::Column::Enabled.eq(true))
        .all(db)
        .await?;
    for orphan in orphans {
        tracing::warn!(
            user_id = %orphan.user_id,
            provider = %orphan.provider,
            "Connection skipped: its provider is not in the config."
        );
    }
    Ok(())
}
