//! Who may see the operator page (docs/decisions/operator-page.md): an API key with the
//! `admin` scope, presented on each request or posted once to make a session. A session
//! is a random token in the browser's cookie; its row keeps the token's SHA-256 hash, the
//! key it came from and its expiry, and every request reads the key's row again, so a
//! revoked key ends its sessions at their next request.

use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, Set};
use secrecy::{ExposeSecret, SecretString};

use super::api_keys::{self, Caller, KeyError, Scope};
use crate::entities::operator_session;

/// How long a session lasts: a working day, after which the key is posted again.
pub(crate) const SESSION_TTL: chrono::TimeDelta = chrono::TimeDelta::hours(8);
/// Random bytes in a session's token.
const TOKEN_BYTES: usize = 32;

/// Why the page refused a caller. None of them quotes the key or the token.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AccessError {
    #[error("sign in with an API key that has the admin scope")]
    Missing,
    #[error("{0}")]
    Key(KeyError),
    #[error("the key {0:?} lacks the admin scope")]
    NotAdmin(String),
    #[error("the session has ended; sign in again")]
    SessionEnded,
}

impl From<KeyError> for AccessError {
    fn from(error: KeyError) -> AccessError {
        AccessError::Key(error)
    }
}

impl AccessError {
    /// Whether the database failed, rather than the caller.
    pub(crate) fn is_database(&self) -> bool {
        matches!(self, AccessError::Key(KeyError::Database(_)))
    }
}

/// The admin caller a presented key is, checked as the API checks keys.
pub(crate) async fn admin_by_key(
    db: &DatabaseConnection,
    presented: &str,
) -> Result<Caller, AccessError> {
    admin(api_keys::authenticate(db, presented).await?)
}

fn admin(caller: Caller) -> Result<Caller, AccessError> {
    match caller.allows(Scope::Admin) {
        true => Ok(caller),
        false => Err(AccessError::NotAdmin(caller.name)),
    }
}

/// Makes a session for an admin key posted to the login form, deleting expired sessions
/// on the way; returns its token for the cookie, the only time it is at hand.
pub(crate) async fn sign_in(
    db: &DatabaseConnection,
    presented: &str,
) -> Result<SecretString, AccessError> {
    let caller = admin_by_key(db, presented).await?;
    let now = crate::db::now();
    operator_session::Entity::delete_many()
        .filter(operator_session::Column::ExpiresAt.lte(now))
        .exec(db)
        .await
        .map_err(KeyError::from)?;
    let token = {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; TOKEN_BYTES]>())
    };
    operator_session::Entity::insert(operator_session::ActiveModel {
        token_hash: Set(api_keys::hash(&token)),
        key_id: Set(caller.key_id),
        created_at: Set(now),
        expires_at: Set(now + SESSION_TTL),
        ..Default::default()
    })
    .exec(db)
    .await
    .map_err(KeyError::from)?;
    Ok(token.into())
}

/// The admin caller whose session `token` is. An expired session, or one whose key was
/// revoked or lost the scope, is deleted and refused.
pub(crate) async fn admin_by_session(
    db: &DatabaseConnection,
    token: &SecretString,
) -> Result<Caller, AccessError> {
    // The token is 32 random bytes: finding its row by its hash leaks nothing a guess
    // could use, as for the keys (docs/decisions/api-keys.md).
    let hash = api_keys::hash(token.expose_secret());
    let row = operator_session::Entity::find()
        .filter(operator_session::Column::TokenHash.eq(hash))
        .one(db)
        .await
        .map_err(KeyError::from)?
        .ok_or(AccessError::SessionEnded)?;
    let checked = match row.expires_at > crate::db::now() {
        true => api_keys::caller_by_id(db, row.key_id)
            .await
            .map_err(AccessError::from)
            .and_then(admin),
        false => Err(AccessError::SessionEnded),
    };
    match checked {
        Err(error) if !error.is_database() => {
            operator_session::Entity::delete_by_id(row.id)
                .exec(db)
                .await
                .map_err(KeyError::from)?;
            Err(match error {
                AccessError::Key(KeyError::Revoked) => AccessError::Key(KeyError::Revoked),
                _ => AccessError::SessionEnded,
            })
        }
        checked => checked,
    }
}

/// Ends the session `token` is, if any.
pub(crate) async fn sign_out(
    db: &DatabaseConnection,
    token: &SecretString,
) -> Result<(), AccessError> {
    operator_session::Entity::delete_many()
        .filter(operator_session::Column::TokenHash.eq(api_keys::hash(token.expose_secret())))
        .exec(db)
        .await
        .map_err(KeyError::from)?;
    Ok(())
}
