//! The pipeline's [`CredentialStore`]: OAuth refreshes serialised per connection through
//! its `connections` row, and committed before the new token is used.

use std::sync::Mutex;

use chrono::Utc;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr,
    EntityTrait, QueryFilter, QuerySelect, TransactionTrait,
};
use tributary_providers::{CredentialStore, Credentials, FetchError, TokenRefresher};

use crate::credentials::StoredCredentials;
use crate::entities::connection;

/// The credentials of one connection for one run, refreshed through its row.
pub struct ConnectionCredentials<'a> {
    db: &'a DatabaseConnection,
    connection_id: i64,
    current: Mutex<Credentials>,
}

impl<'a> ConnectionCredentials<'a> {
    pub fn new(
        db: &'a DatabaseConnection,
        connection_id: i64,
        credentials: Credentials,
    ) -> ConnectionCredentials<'a> {
        ConnectionCredentials {
            db,
            connection_id,
            current: Mutex::new(credentials),
        }
    }

    /// The newest credentials this run knows: the stored ones, or a refresh's result.
    pub fn current(&self) -> Credentials {
        match self.current.lock() {
            Ok(current) => current.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set_current(&self, credentials: &Credentials) {
        match self.current.lock() {
            Ok(mut current) => *current = credentials.clone(),
            Err(poisoned) => *poisoned.into_inner() = credentials.clone(),
        }
    }

    /// Takes the connection row's write lock for the rest of the transaction: a row lock
    /// on PostgreSQL and MySQL, the database write lock on SQLite.
    async fn lock_row(&self, txn: &DatabaseTransaction) -> Result<connection::Model, DbErr> {
        let query = connection::Entity::find_by_id(self.connection_id);
        let row = if txn.get_database_backend() == DbBackend::Sqlite {
            connection::Entity::update_many()
                .col_expr(
                    connection::Column::UpdatedAt,
                    Expr::col(connection::Column::UpdatedAt),
                )
                .filter(connection::Column::Id.eq(self.connection_id))
                .exec(txn)
                .await?;
            query.one(txn).await?
        } else {
            query.lock_exclusive().one(txn).await?
        };
        row.ok_or_else(|| DbErr::RecordNotFound(format!("connection {}", self.connection_id)))
    }

    async fn save(
        &self,
        txn: &DatabaseTransaction,
        mut stored: StoredCredentials,
        fresh: &Credentials,
    ) -> Result<(), DbErr> {
        stored.set_refreshed(fresh);
        connection::Entity::update_many()
            .col_expr(
                connection::Column::Credentials,
                Expr::value(stored.to_column()),
            )
            .col_expr(connection::Column::UpdatedAt, Expr::value(Utc::now()))
            .filter(connection::Column::Id.eq(self.connection_id))
            .exec(txn)
            .await?;
        Ok(())
    }
}

fn store_failure(what: &str, error: DbErr) -> FetchError {
    FetchError::Client {
        message: format!("{what}: {error}"),
    }
}

#[async_trait::async_trait]
impl CredentialStore for ConnectionCredentials<'_> {
    async fn refresh(
        &self,
        stale: &Credentials,
        refresher: &dyn TokenRefresher,
    ) -> Result<Credentials, FetchError> {
        let locking = "locking the connection to refresh its credentials failed";
        let txn = self
            .db
            .begin()
            .await
            .map_err(|e| store_failure(locking, e))?;
        let row = self
            .lock_row(&txn)
            .await
            .map_err(|e| store_failure(locking, e))?;
        let stored = StoredCredentials::parse(&row.credentials)
            .map_err(|message| FetchError::MissingCredentials { message })?;
        let current = stored
            .resolve()
            .map_err(|message| FetchError::MissingCredentials { message })?;
        if !current.same_as(stale) {
            // Another run refreshed while we waited for the lock: use its result.
            txn.commit().await.map_err(|e| store_failure(locking, e))?;
            tracing::info!("Credentials were already refreshed by another run.");
            self.set_current(&current);
            return Ok(current);
        }
        let fresh = match refresher.refresh(&current).await {
            Ok(fresh) => fresh,
            Err(error) => {
                let _ = txn.rollback().await;
                return Err(error);
            }
        };
        let saving = "saving the refreshed credentials failed";
        self.save(&txn, stored, &fresh)
            .await
            .map_err(|e| store_failure(saving, e))?;
        txn.commit().await.map_err(|e| store_failure(saving, e))?;
        tracing::info!(
            expires_at = fresh.expires_at,
            "Credentials refreshed and saved."
        );
        self.set_current(&fresh);
        Ok(fresh)
    }
}
