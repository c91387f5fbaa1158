//! Choosing which connections to sync and running them, a bounded number at a time.

use futures::stream::{self, StreamExt};
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder};
use tributary_providers::{build_provider, FetchError};

use crate::config::{ProviderSettings, Settings};
use crate::entities::connection;
use crate::pipeline::{sync_connection, ProgressSink, RunOptions, RunOutcome};

/// Which connections a `sync` covers. `None` matches all.
#[derive(Clone, Debug, Default)]
pub struct SyncFilter {
    pub provider: Option<String>,
    pub user_id: Option<String>,
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
    #[error("provider {provider:?} is disabled in the config (enabled = false)")]
    ProviderDisabled { provider: String },
    #[error("building provider {provider:?} failed: {source}")]
    Provider {
        provider: String,
        source: FetchError,
    },
    #[error("database error: {0}")]
    Database(#[from] DbErr),
}

/// Syncs every enabled connection that matches `filter`, one run each, and returns the
/// runs in the order they finished. Providers are synced one after the other; each
/// provider's connections run up to `max_concurrent_connections` at a time.
pub async fn sync_matching(
    db: &DatabaseConnection,
    settings: &Settings,
    filter: &SyncFilter,
    options: RunOptions,
    progress: &dyn ProgressSink,
) -> Result<Vec<RunOutcome>, SyncError> {
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
    warn_about_unconfigured_connections(db, settings).await?;

    let mut outcomes = Vec::new();
    for provider_settings in settings.providers.values() {
        if !provider_settings.enabled
            || filter
                .provider
                .as_ref()
                .is_some_and(|name| *name != provider_settings.name)
        {
            continue;
        }
        let connections = enabled_connections(db, &provider_settings.name, filter).await?;
        outcomes
            .extend(sync_provider(db, provider_settings, connections, options, progress).await?);
    }
    Ok(outcomes)
}

/// Syncs the given connections of one provider, bounded by its `max_concurrent_connections`.
pub async fn sync_provider(
    db: &DatabaseConnection,
    settings: &ProviderSettings,
    connections: Vec<connection::Model>,
    options: RunOptions,
    progress: &dyn ProgressSink,
) -> Result<Vec<RunOutcome>, SyncError> {
    let provider = build_provider(&settings.adapter, &settings.http).map_err(|source| {
        SyncError::Provider {
            provider: settings.name.clone(),
            source,
        }
    })?;
    let provider = provider.as_ref();
    let results: Vec<Result<RunOutcome, DbErr>> = stream::iter(connections.iter())
        .map(|connection| sync_connection(db, provider, settings, connection, options, progress))
        .buffer_unordered(settings.max_concurrent_connections)
        .collect()
        .await;
    results
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(SyncError::from)
}

/// The enabled connections of one provider that match the filter's user.
pub async fn enabled_connections(
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
