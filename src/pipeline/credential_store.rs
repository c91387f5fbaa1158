//! The pipeline's [`CredentialStore`]: OAuth refreshes serialised per connection by a
//! claim on its `connections` row, with no transaction open while the token endpoint
//! answers, and committed (durably) before the new token is used.
//!
//! A refresh is three steps: claim the row (`refresh_holder`, `refresh_claimed_until`) with
//! one conditional `UPDATE`; spend the refresh token at the provider; write the new
//! credentials and clear the claim with one `UPDATE` that only matches while the claim is
//! still ours. The steps run in a task of their own, so a run that is cancelled meanwhile
//! (`run_timeout`, SIGTERM, a lost lease) does not drop a refresh the provider may already
//! have answered: the task commits it, and [`wait_for_refreshes`] lets the process wait for
//! it before exiting.

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use chrono::Utc;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait,
    QueryFilter, TransactionTrait,
};
use tokio_util::task::TaskTracker;
use tributary_providers::{CredentialStore, Credentials, FetchError, TokenRefresher};

use crate::credentials::StoredCredentials;
use crate::db::{Announce, DatabasePools};
use crate::entities::connection;
use crate::lease::Holder;
use crate::secrets::{Binding, Keyring};

/// How long a claim holds. Longer than any token request can take (the HTTP client's
/// timeout bounds it, and a POST is not retried once sent), so a live claim is never taken
/// over; a claim left by a crashed process blocks refreshes of that connection this long.
const CLAIM_TTL: Duration = Duration::from_secs(5 * 60);

/// How often a refresh waiting for another one's claim looks again.
const CLAIM_POLL: Duration = Duration::from_millis(200);

/// The refreshes in flight, in tasks of their own.
static REFRESHES: LazyLock<TaskTracker> = LazyLock::new(TaskTracker::new);

/// SQLite's durability level is per connection and cannot change inside a transaction, so
/// the durable commits of this process take turns at raising it.
static DURABLE_COMMIT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits (at most `limit`) for refreshes still in flight, e.g. of runs cancelled by a
/// shutdown, so that a token the provider already rotated is committed before the process
/// exits. Returns whether they all finished.
pub(crate) async fn wait_for_refreshes(limit: Duration) -> bool {
    REFRESHES.close();
    let finished = tokio::time::timeout(limit, REFRESHES.wait()).await.is_ok();
    REFRESHES.reopen();
    finished
}

/// The credentials of one connection for one run, refreshed through its row; the
/// pipeline makes one per run.
pub(crate) struct ConnectionCredentials {
    db: DatabaseConnection,
    secrets: Arc<Keyring>,
    connection_id: i64,
    owner: Owner,
    announce: Announce,
    current: Mutex<Credentials>,
}

/// What the connection's sealed credentials are bound to.
#[derive(Clone)]
struct Owner {
    user_id: String,
    provider: String,
}

impl Owner {
    fn binding(&self) -> Binding<'_> {
        Binding {
            user_id: &self.user_id,
            provider: &self.provider,
        }
    }
}

impl ConnectionCredentials {
    /// `announce`: whether a revoked authorization writes a connection event.
    pub fn new(
        db: &DatabasePools,
        connection: &connection::Model,
        credentials: Credentials,
        announce: Announce,
    ) -> ConnectionCredentials {
        ConnectionCredentials {
            db: db.main().clone(),
            secrets: db.shared_secrets(),
            connection_id: connection.id,
            owner: Owner {
                user_id: connection.user_id.clone(),
                provider: connection.provider.clone(),
            },
            announce,
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
}

#[async_trait::async_trait]
impl CredentialStore for ConnectionCredentials {
    async fn refresh(
        &self,
        stale: &Credentials,
        refresher: Arc<dyn TokenRefresher>,
    ) -> Result<Credentials, FetchError> {
        let refresh = Refresh {
            db: self.db.clone(),
            secrets: Arc::clone(&self.secrets),
            connection_id: self.connection_id,
            owner: self.owner.clone(),
            announce: self.announce,
            holder: Holder::current(),
        };
        let stale = stale.clone();
        let task = REFRESHES.spawn(async move { refresh.run(&stale, refresher.as_ref()).await });
        let fresh = task.await.map_err(|error| FetchError::Client {
            message: format!("the credentials refresh stopped: {error}"),
        })??;
        self.set_current(&fresh);
        Ok(fresh)
    }
}

/// One refresh of one connection, run in its own task.
struct Refresh {
    db: DatabaseConnection,
    secrets: Arc<Keyring>,
    connection_id: i64,
    owner: Owner,
    announce: Announce,
    holder: Holder,
}

impl Refresh {
    async fn run(
        &self,
        stale: &Credentials,
        refresher: &dyn TokenRefresher,
    ) -> Result<Credentials, FetchError> {
        // Checked before the token endpoint is asked, which may rotate the refresh token.
        let what = format!(
            "the tokens an OAuth refresh of {} returns",
            self.owner.binding()
        );
        self.secrets
            .check_can_store(&what)
            .map_err(|error| FetchError::MissingCredentials {
                message: error.to_string(),
            })?;
        let (stored, current) = match self.claim(stale).await? {
            Claimed::AlreadyRefreshed(current) => {
                tracing::info!("Credentials were already refreshed by another run.");
                return Ok(current);
            }
            Claimed::Ours { stored, current } => (stored, current),
        };
        let fresh = match refresher.refresh(&current).await {
            Ok(fresh) => fresh,
            Err(FetchError::RefusedWithRotation { error, kept }) => {
                // The answer was refused, but the endpoint rotated the refresh token and may
                // have revoked the one spent: keep the new one, then fail as refused.
                self.save(stored, &kept).await?;
                tracing::warn!(
                    %error,
                    "The token endpoint's answer was refused; the refresh token it rotated was saved."
                );
                return Err(*error);
            }
            Err(error) => {
                // The provider refused or never answered: the stored tokens stay as they were.
                if let Err(release) = self.release().await {
                    tracing::warn!(error = %release, "Releasing the refresh claim failed; it expires by itself.");
                }
                if revoked(&error) {
                    self.mark_needs_reconnect().await;
                }
                return Err(error);
            }
        };
        self.save(stored, &fresh).await?;
        tracing::info!(
            expires_at = fresh.expires_at,
            "Credentials refreshed and saved."
        );
        Ok(fresh)
    }

    /// Notes that the provider revoked the authorization, so that scheduled runs stop
    /// asking until the user reconnects. The run fails with the refusal either way.
    async fn mark_needs_reconnect(&self) {
        match self.write_needs_reconnect().await {
            Ok(true) => tracing::warn!(
                connection_id = self.connection_id,
                "The token endpoint refused the refresh with invalid_grant; the connection needs a reconnect."
            ),
            Ok(false) => {}
            Err(error) => tracing::warn!(
                connection_id = self.connection_id,
                %error,
                "Marking the connection as needing a reconnect failed."
            ),
        }
    }

    /// Sets `needs_reconnect_since`, with its connection event, in one transaction.
    async fn write_needs_reconnect(&self) -> Result<bool, DbErr> {
        let txn = self.db.begin().await?;
        let marked = crate::db::mark_needs_reconnect(
            &txn,
            self.connection_id,
            crate::db::now(),
            self.announce,
        )
        .await?;
        txn.commit().await?;
        Ok(marked)
    }

    /// Claims the row for this refresh, waiting while another refresh holds it. When the
    /// stored credentials are no longer `stale`, someone refreshed them first: no claim.
    async fn claim(&self, stale: &Credentials) -> Result<Claimed, FetchError> {
        let waited_since = tokio::time::Instant::now();
        loop {
            let (_, current) = self.read().await?;
            if !current.same_as(stale) {
                return Ok(Claimed::AlreadyRefreshed(current));
            }
            if self.try_claim().await.map_err(claiming)? {
                // Whoever refreshed before our claim has committed by now: read again.
                let (stored, current) = self.read().await?;
                if !current.same_as(stale) {
                    self.release().await.map_err(claiming)?;
                    return Ok(Claimed::AlreadyRefreshed(current));
                }
                return Ok(Claimed::Ours { stored, current });
            }
            if waited_since.elapsed() > CLAIM_TTL {
                return Err(FetchError::Client {
                    message: format!(
                        "another process has been refreshing this connection's credentials \
                         for over {}s",
                        CLAIM_TTL.as_secs()
                    ),
                });
            }
            tokio::time::sleep(CLAIM_POLL).await;
        }
    }

    async fn read(&self) -> Result<(StoredCredentials, Credentials), FetchError> {
        let row = connection::Entity::find_by_id(self.connection_id)
            .one(&self.db)
            .await
            .map_err(claiming)?
            .ok_or_else(|| claiming(DbErr::RecordNotFound(self.row_name())))?;
        let stored = StoredCredentials::from_column(&self.secrets, row.binding(), &row.credentials)
            .map_err(|message| FetchError::MissingCredentials { message })?;
        let current = stored
            .resolve()
            .map_err(|message| FetchError::MissingCredentials { message })?;
        Ok((stored, current))
    }

    /// One conditional `UPDATE`: the claim is ours when the row had none or an expired one.
    async fn try_claim(&self) -> Result<bool, DbErr> {
        let now = crate::db::now();
        let ttl = chrono::Duration::from_std(CLAIM_TTL).unwrap_or(chrono::Duration::zero());
        let until = now.checked_add_signed(ttl).unwrap_or(now);
        let free = Condition::any()
            .add(connection::Column::RefreshHolder.is_null())
            .add(connection::Column::RefreshClaimedUntil.is_null())
            .add(connection::Column::RefreshClaimedUntil.lt(now));
        let claimed = connection::Entity::update_many()
            .col_expr(
                connection::Column::RefreshHolder,
                Expr::value(self.holder.as_str()),
            )
            .col_expr(connection::Column::RefreshClaimedUntil, Expr::value(until))
            .filter(connection::Column::Id.eq(self.connection_id))
            .filter(free)
            .exec(&self.db)
            .await?;
        Ok(claimed.rows_affected == 1)
    }

    async fn release(&self) -> Result<(), DbErr> {
        self.ending_our_claim().exec(&self.db).await?;
        Ok(())
    }

    /// Writes the new credentials and clears the claim, only while the claim is ours, in a
    /// transaction that survives a power cut (SQLite: `synchronous = FULL` for it).
    async fn save(
        &self,
        mut stored: StoredCredentials,
        fresh: &Credentials,
    ) -> Result<(), FetchError> {
        stored.set_refreshed(fresh);
        let column = stored
            .to_column_for(&self.secrets, self.owner.binding())
            .map_err(|error| FetchError::MissingCredentials {
                message: error.to_string(),
            })?;
        let saving = |error: DbErr| FetchError::Client {
            message: format!("saving the refreshed credentials failed: {error}"),
        };
        let sqlite = self.db.get_database_backend() == DbBackend::Sqlite;
        let _turn = if sqlite {
            let turn = DURABLE_COMMIT.lock().await;
            self.db
                .execute_unprepared("PRAGMA synchronous = FULL")
                .await
                .map_err(saving)?;
            Some(turn)
        } else {
            None
        };
        let written = self.write_claimed(column).await;
        if sqlite {
            if let Err(error) = self
                .db
                .execute_unprepared("PRAGMA synchronous = NORMAL")
                .await
            {
                tracing::warn!(%error, "Restoring synchronous = NORMAL after a durable commit failed.");
            }
        }
        match written.map_err(saving)? {
            1 => Ok(()),
            _ => Err(FetchError::Client {
                message: "saving the refreshed credentials failed: this process's refresh \
                          claim on the connection was lost while the token endpoint answered"
                    .to_string(),
            }),
        }
    }

    /// An `UPDATE` of this connection's row that clears the refresh claim, matching only
    /// while the claim is this refresh's.
    fn ending_our_claim(&self) -> sea_orm::UpdateMany<connection::Entity> {
        connection::Entity::update_many()
            .col_expr(
                connection::Column::RefreshHolder,
                Expr::value(Option::<String>::None),
            )
            .col_expr(
                connection::Column::RefreshClaimedUntil,
                Expr::value(Option::<chrono::DateTime<Utc>>::None),
            )
            .filter(connection::Column::Id.eq(self.connection_id))
            .filter(connection::Column::RefreshHolder.eq(self.holder.as_str()))
    }

    async fn write_claimed(&self, column: String) -> Result<u64, DbErr> {
        let txn = self.db.begin().await?;
        let written = self
            .ending_our_claim()
            .col_expr(connection::Column::Credentials, Expr::value(column))
            .col_expr(connection::Column::UpdatedAt, Expr::value(crate::db::now()))
            .exec(&txn)
            .await?
            .rows_affected;
        txn.commit().await?;
        Ok(written)
    }

    fn row_name(&self) -> String {
        format!("connection {}", self.connection_id)
    }
}

/// What claiming found.
enum Claimed {
    /// The stored credentials are no longer the stale ones: use them, no refresh.
    AlreadyRefreshed(Credentials),
    /// The claim is ours, and these are the credentials to spend.
    Ours {
        stored: StoredCredentials,
        current: Credentials,
    },
}

/// How Strava's token endpoint says a refresh token is revoked or unknown (it does not
/// answer RFC 6749's `invalid_grant`), as the Strava provider words it.
const STRAVA_REVOKED: &str = "(RefreshToken refresh_token invalid)";

/// Whether the token endpoint refused the refresh because the grant itself is gone
/// (RFC 6749 §5.2 `invalid_grant`: revoked, expired or issued to another client); any
/// other refusal (`invalid_client`, a 5xx) is the operator's or the provider's to fix.
fn revoked(error: &FetchError) -> bool {
    matches!(
        error,
        FetchError::Unauthorized { status: 400 | 401, message }
            if message.contains(": invalid_grant") || message.contains(STRAVA_REVOKED)
    )
}

fn claiming(error: DbErr) -> FetchError {
    FetchError::Client {
        message: format!("claiming the connection to refresh its credentials failed: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use sea_orm::ActiveModelTrait;
    use secrecy::{ExposeSecret, SecretString};
    use tributary_providers::TokenRefresher;

    use super::*;
    use crate::credentials::StoredCredentials;
    use crate::testing::TestDb;

    /// Stands in for a token endpoint: counts the refreshes it was asked for.
    struct CountingRefresher(AtomicU32);

    #[async_trait::async_trait]
    impl TokenRefresher for CountingRefresher {
        async fn refresh(&self, current: &Credentials) -> Result<Credentials, FetchError> {
            let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
            assert_eq!(
                current
                    .refresh_token
                    .as_ref()
                    .map(|token| token.expose_secret()),
                Some("r0")
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(Credentials {
                token: Some(SecretString::from(format!("a{n}"))),
                refresh_token: Some(SecretString::from(format!("r{n}"))),
                expires_at: Some(i64::MAX / 2),
            })
        }
    }

    /// Only a refused grant marks a connection: a refused client or an outage does not.
    #[test]
    fn only_a_refused_grant_counts_as_revoked() {
        let refused = |status, message: &str| FetchError::Unauthorized {
            status,
            message: message.to_string(),
        };
        let revoked_answers = [
            refused(
                400,
                "the token endpoint refused the refresh: invalid_grant: revoked",
            ),
            refused(
                400,
                "the Strava token endpoint refused the refresh: Bad Request \
                 (RefreshToken refresh_token invalid)",
            ),
        ];
        for error in &revoked_answers {
            assert!(revoked(error), "{error}");
        }
        let other_answers = [
            refused(
                401,
                "the token endpoint refused the refresh: invalid_client: bad secret",
            ),
            refused(403, "the token endpoint refused the refresh: invalid_grant"),
            FetchError::Client {
                message: "invalid_grant".to_string(),
            },
        ];
        for error in &other_answers {
            assert!(!revoked(error), "{error}");
        }
    }

    /// Two runs of one connection that find its token expired at once spend the refresh
    /// token once: the second waits for the first's refresh and takes its result.
    #[tokio::test]
    async fn concurrent_refreshes_of_one_connection_spend_the_refresh_token_once() {
        let test = TestDb::new().await;
        let stored = StoredCredentials {
            token: Some("a0".to_string()),
            refresh_token: Some("r0".to_string()),
            ..StoredCredentials::default()
        };
        let row =
            connection::ActiveModel::new_connection("alice", "acme", true, stored.to_column())
                .insert(test.main())
                .await
                .expect("alice's connection");
        let stale = stored.resolve().expect("credentials");
        let refresher = Arc::new(CountingRefresher(AtomicU32::new(0)));
        let first = ConnectionCredentials::new(&test.db, &row, stale.clone(), Announce::No);
        let second = ConnectionCredentials::new(&test.db, &row, stale.clone(), Announce::No);
        let (a, b) = tokio::join!(
            first.refresh(&stale, refresher.clone()),
            second.refresh(&stale, refresher.clone())
        );
        let (a, b) = (a.expect("refreshed"), b.expect("refreshed"));
        assert_eq!(
            refresher.0.load(Ordering::SeqCst),
            1,
            "the refresh token was spent once"
        );
        let token = |credentials: Credentials| {
            credentials
                .token
                .map(|token| token.expose_secret().to_string())
        };
        assert_eq!(token(a).as_deref(), Some("a1"));
        assert_eq!(
            token(b).as_deref(),
            Some("a1"),
            "the second waited and reused it"
        );
        let row = connection::Entity::find_by_id(row.id)
            .one(test.main())
            .await
            .expect("query")
            .expect("the row");
        let stored =
            StoredCredentials::from_column(test.db.secrets(), row.binding(), &row.credentials)
                .expect("credentials open");
        assert_eq!(
            stored
                .oauth
                .and_then(|oauth| oauth.refresh_token)
                .as_deref(),
            Some("r1")
        );
    }
}
