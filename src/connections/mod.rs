//! The connections config.toml lists, as rows: loading them into `connections` at the
//! start of a syncing command, retiring those the file no longer lists, and keeping their
//! credentials sealed (`sealing.rs`). Domain rules over the database, so above `db`.

use chrono::Utc;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder,
    Set,
};

use crate::config::{ConnectionSettings, Settings};
use crate::credentials::StoredCredentials;
use crate::db::DatabasePools;
use crate::entities::connection;
use crate::secrets::{Binding, SecretsError};

pub(crate) mod sealing;

/// Loading the configured connections failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionsError {
    #[error("storing the configured connections failed: {0}")]
    Database(#[source] DbErr),
    #[error("storing the configured connections failed: {0}")]
    Credentials(#[from] SecretsError),
}

/// Inserts the connections listed in config.toml, or updates their credentials and
/// `enabled` flag; the sync state (cursor, checkpoint) of existing rows is kept, and so
/// are refreshed OAuth credentials unless the configured credentials changed. Secrets
/// are sealed with the pools' keyring; a row that cannot be opened is left as it is
/// (its runs fail naming it).
pub async fn upsert_configured(
    db: &DatabasePools,
    settings: &Settings,
) -> Result<(), ConnectionsError> {
    for provider in settings.providers.values() {
        for configured in &provider.connections {
            upsert_connection(db, &provider.name, configured).await?;
        }
    }
    Ok(())
}

async fn upsert_connection(
    db: &DatabasePools,
    provider: &str,
    configured: &ConnectionSettings,
) -> Result<(), ConnectionsError> {
    let source = StoredCredentials::from_config(configured);
    let now = Utc::now();
    let binding = Binding {
        user_id: &configured.user_id,
        provider,
    };
    let column = source.to_column_for(db.secrets(), binding)?;
    // Insert-if-missing first: several instances starting at once must not race a
    // lookup against each other's inserts.
    let mut new = connection::ActiveModel::new_connection(
        &configured.user_id,
        provider,
        configured.enabled,
        column.clone(),
    );
    new.defined_in = Set(connection::DefinedIn::Config);
    connection::Entity::insert(new)
        .on_conflict_do_nothing_on([connection::Column::UserId, connection::Column::Provider])
        .exec_without_returning(db.main())
        .await
        .map_err(ConnectionsError::Database)?;
    let row = connection::Entity::find()
        .filter(connection::Column::UserId.eq(&configured.user_id))
        .filter(connection::Column::Provider.eq(provider))
        .one(db.main())
        .await
        .map_err(ConnectionsError::Database)?
        .ok_or_else(|| {
            ConnectionsError::Database(DbErr::RecordNotFound(format!(
                "connection {}@{provider}",
                configured.user_id
            )))
        })?;
    let unchanged_source = match StoredCredentials::from_column(
        db.secrets(),
        binding,
        &row.credentials,
    ) {
        Ok(stored) => stored.same_source(&source),
        Err(message) => {
            tracing::error!(user_id = %configured.user_id, provider, error = %message, "Stored credentials cannot be opened; the row is left as it is.");
            return Ok(());
        }
    };
    let listed = row.defined_in == connection::DefinedIn::Config;
    if unchanged_source && row.enabled == configured.enabled && listed {
        return Ok(());
    }
    let mut active: connection::ActiveModel = row.into();
    if !unchanged_source {
        active.credentials = Set(column);
    }
    active.enabled = Set(configured.enabled);
    active.defined_in = Set(connection::DefinedIn::Config);
    active.updated_at = Set(now);
    active
        .update(db.main())
        .await
        .map_err(ConnectionsError::Database)?;
    Ok(())
}

/// Disables the connections config.toml defined and no longer lists, and drops their
/// credentials, so a connection taken out of the file stops syncing with its old token.
/// Their records and history are kept. Returns how many were retired.
pub(crate) async fn retire_removed(
    db: &DatabaseConnection,
    settings: &Settings,
) -> Result<u64, ConnectionsError> {
    let rows = connection::Entity::find()
        .filter(connection::Column::DefinedIn.eq(connection::DefinedIn::Config))
        .all(db)
        .await
        .map_err(ConnectionsError::Database)?;
    let mut retired = 0;
    for row in rows {
        if settings.lists_connection(&row.provider, &row.user_id) {
            continue;
        }
        connection::Entity::update_many()
            .col_expr(connection::Column::Enabled, Expr::value(false))
            .col_expr(
                connection::Column::Credentials,
                Expr::value(StoredCredentials::default().to_column()),
            )
            .col_expr(
                connection::Column::DefinedIn,
                Expr::value(connection::DefinedIn::Removed),
            )
            .col_expr(connection::Column::UpdatedAt, Expr::value(Utc::now()))
            .filter(connection::Column::Id.eq(row.id))
            .filter(connection::Column::DefinedIn.eq(connection::DefinedIn::Config))
            .exec(db)
            .await
            .map_err(ConnectionsError::Database)?;
        tracing::warn!(
            provider = %row.provider,
            user_id = %row.user_id,
            "A connection config.toml no longer lists was disabled and its credentials dropped; its records are kept."
        );
        retired += 1;
    }
    Ok(retired)
}

/// Empties the stored credentials of `provider`'s connections (the demo's, which an
/// earlier demo sealed with a key of its own; they are stored again at the next start).
pub(crate) async fn forget_credentials(db: &DatabasePools, provider: &str) -> Result<u64, DbErr> {
    Ok(connection::Entity::update_many()
        .col_expr(connection::Column::Credentials, Expr::value("{}"))
        .filter(connection::Column::Provider.eq(provider))
        .exec(db.main())
        .await?
        .rows_affected)
}

/// The credentials column of each of `provider`'s connections as stored (sealed unless
/// `allow_plaintext`), by user: the demo shows their start to prove no token is in clear.
pub(crate) async fn stored_columns(
    db: &DatabasePools,
    provider: &str,
) -> Result<Vec<(String, String)>, DbErr> {
    let rows = connection::Entity::find()
        .filter(connection::Column::Provider.eq(provider))
        .order_by_asc(connection::Column::UserId)
        .all(db.main())
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.user_id, row.credentials))
        .collect())
}
