//! The HTTP API's keys: creating (the key is returned once), listing, revoking, checking
//! a presented key, and the audit row of a write request.
//!
//! A key is `trb_<prefix>_<secret>`: 6 random bytes in hex, then 32 random bytes in
//! base64url. The row keeps the prefix, to find the key, and the SHA-256 hash of the
//! secret, compared in constant time (docs/decisions/api-keys.md). Every check reads the
//! row, so a revoked key is refused by every instance from the next request on.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Condition, Expr};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, Set,
};
use serde::Serialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{check_limit, OpsError, Page};
use crate::entities::{api_audit, api_key};

/// What every key starts with, so that a leaked one is recognisable (secret scanners).
const KEY_PREFIX: &str = "trb_";
/// Random bytes in a key's public prefix and in its secret.
const PREFIX_BYTES: usize = 6;
const SECRET_BYTES: usize = 32;
/// The longest key name.
const MAX_NAME_CHARS: usize = 128;
/// The longest path an audit row keeps (the column's length).
const MAX_AUDIT_PATH_CHARS: usize = 1024;
/// `last_used_at` is written at most this often per key, so that reads do not each cost
/// a write.
const LAST_USED_GRANULARITY: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

/// What a key may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Scope {
    /// List and read connections and runs.
    #[serde(rename = "connections:read")]
    ConnectionsRead,
    /// Change connections.
    #[serde(rename = "connections:write")]
    ConnectionsWrite,
    /// Start syncs.
    #[serde(rename = "syncs:write")]
    SyncsWrite,
    /// Read records, the change feed and runs' errors (whose payloads are records).
    #[serde(rename = "records:read")]
    RecordsRead,
    /// List webhook deliveries.
    #[serde(rename = "notifications:read")]
    NotificationsRead,
    /// Send a webhook delivery again.
    #[serde(rename = "notifications:write")]
    NotificationsWrite,
    /// List the inbound provider webhooks' deliveries (their bodies are records).
    #[serde(rename = "webhooks:read")]
    WebhooksRead,
    /// Everything, keys included.
    #[serde(rename = "admin")]
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 8] = [
        Scope::ConnectionsRead,
        Scope::ConnectionsWrite,
        Scope::SyncsWrite,
        Scope::RecordsRead,
        Scope::NotificationsRead,
        Scope::NotificationsWrite,
        Scope::WebhooksRead,
        Scope::Admin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::ConnectionsRead => "connections:read",
            Scope::ConnectionsWrite => "connections:write",
            Scope::SyncsWrite => "syncs:write",
            Scope::RecordsRead => "records:read",
            Scope::NotificationsRead => "notifications:read",
            Scope::NotificationsWrite => "notifications:write",
            Scope::WebhooksRead => "webhooks:read",
            Scope::Admin => "admin",
        }
    }

    /// The scope named `name`.
    pub fn parse(name: &str) -> Result<Scope, OpsError> {
        Scope::ALL
            .into_iter()
            .find(|scope| scope.as_str() == name)
            .ok_or_else(|| OpsError::Invalid {
                field: "scope",
                message: format!(
                    "unknown scope {:?}; expected one of: {}",
                    tributary_providers::quote::truncated(name, 64),
                    Scope::ALL.map(Scope::as_str).join(", ")
                ),
            })
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A key as listed: never its secret nor its hash.
#[derive(Clone, Debug, Serialize)]
pub struct KeyView {
    pub id: i64,
    pub name: String,
    pub prefix: String,
    pub scopes: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// Its own rate limit; `None`: `[api] rate_limit`.
    pub rate_limit: Option<String>,
}

impl From<api_key::Model> for KeyView {
    fn from(row: api_key::Model) -> KeyView {
        KeyView {
            id: row.id,
            name: row.name,
            prefix: row.prefix,
            scopes: row.scopes.split_whitespace().map(str::to_string).collect(),
            created_at: row.created_at,
            last_used_at: row.last_used_at,
            revoked_at: row.revoked_at,
            rate_limit: row.rate_limit,
        }
    }
}

/// A new key: the only time its secret is at hand.
pub struct Created {
    /// The whole key, `trb_<prefix>_<secret>`, to show once.
    pub key: secrecy::SecretString,
    pub view: KeyView,
}

/// Creates a key named `name` granting `scopes`, limited to `rate_limit` (`"N/minute"`)
/// requests per window instead of `[api] rate_limit` when given.
pub async fn create(
    db: &DatabaseConnection,
    name: &str,
    scopes: &[Scope],
    rate_limit: Option<&str>,
) -> Result<Created, OpsError> {
    if let Some(limit) = rate_limit {
        crate::config::parse_rate_limit(limit).map_err(|message| OpsError::Invalid {
            field: "rate_limit",
            message,
        })?;
    }
    let name = name.trim();
    if name.is_empty()
        || name.chars().count() > MAX_NAME_CHARS
        || name.chars().any(char::is_control)
    {
        return Err(OpsError::Invalid {
            field: "name",
            message: format!("must be 1 to {MAX_NAME_CHARS} characters, none a control character"),
        });
    }
    if scopes.is_empty() {
        return Err(OpsError::Invalid {
            field: "scope",
            message: format!(
                "give at least one, from: {}",
                Scope::ALL.map(Scope::as_str).join(", ")
            ),
        });
    }
    let exists = api_key::Entity::find()
        .filter(api_key::Column::Name.eq(name))
        .one(db)
        .await?;
    if exists.is_some() {
        return Err(OpsError::Conflict(format!(
            "an API key named {name:?} already exists; choose another name"
        )));
    }
    let mut scopes = scopes.to_vec();
    scopes.sort();
    scopes.dedup();
    let prefix = const_hex::encode(rand::random::<[u8; PREFIX_BYTES]>());
    let secret = {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(rand::random::<[u8; SECRET_BYTES]>())
    };
    let row = api_key::ActiveModel {
        name: Set(name.to_string()),
        prefix: Set(prefix.clone()),
        secret_hash: Set(hash(&secret)),
        scopes: Set(scopes
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(" ")),
        created_at: Set(Utc::now()),
        last_used_at: Set(None),
        revoked_at: Set(None),
        rate_limit: Set(rate_limit.map(str::to_string)),
        ..Default::default()
    }
    .insert(db)
    .await?;
    Ok(Created {
        key: format!("{KEY_PREFIX}{prefix}_{secret}").into(),
        view: row.into(),
    })
}

/// The largest page of keys.
pub const MAX_LIMIT: u64 = 1_000;

/// Which keys to list: oldest first, a page at a time.
#[derive(Clone, Debug)]
pub struct KeysQuery {
    /// Only keys after this key's id (the `next` of the page before).
    pub after: Option<i64>,
    /// At most this many keys (1 to [`MAX_LIMIT`]).
    pub limit: u64,
}

/// The keys that match `query`, oldest first; ids never change, so paging by the last id
/// shows every key once however many are created meanwhile.
pub async fn list(db: &DatabaseConnection, query: &KeysQuery) -> Result<Page<KeyView>, OpsError> {
    let limit = check_limit(query.limit, MAX_LIMIT)?;
    let mut select = api_key::Entity::find();
    if let Some(after) = query.after {
        select = select.filter(api_key::Column::Id.gt(after));
    }
    let rows = select
        .order_by_asc(api_key::Column::Id)
        .limit(limit.saturating_add(1))
        .all(db)
        .await?;
    let page = Page::from_rows(rows, limit, |row| row.id);
    Ok(Page {
        items: page.items.into_iter().map(KeyView::from).collect(),
        next: page.next,
    })
}

/// Which key to revoke.
#[derive(Clone, Debug)]
pub enum KeyRef {
    Name(String),
    Prefix(String),
}

/// The key revoked, and whether it already was.
#[derive(Clone, Debug, Serialize)]
pub struct Revoked {
    pub key: KeyView,
    pub already: bool,
}

/// Revokes a key: from the next request on, every instance refuses it. Its row among the
/// change feed's readers is deleted.
pub async fn revoke(db: &DatabaseConnection, which: &KeyRef) -> Result<Revoked, OpsError> {
    let (column, value, what) = match which {
        KeyRef::Name(name) => (api_key::Column::Name, name, "name"),
        KeyRef::Prefix(prefix) => (api_key::Column::Prefix, prefix, "prefix"),
    };
    let row = api_key::Entity::find()
        .filter(column.eq(value.as_str()))
        .one(db)
        .await?
        .ok_or_else(|| OpsError::NotFound {
            what: format!(
                "API key with {what} {:?}",
                tributary_providers::quote::truncated(value, 64)
            ),
            hint: "; `tributary api-keys list` lists them",
        })?;
    if row.revoked_at.is_some() {
        return Ok(Revoked {
            key: row.into(),
            already: true,
        });
    }
    let mut active: api_key::ActiveModel = row.into();
    active.revoked_at = Set(Some(Utc::now()));
    let row = active.update(db).await?;
    // A revoked key reads the change feed no more: its lag would only grow on the
    // operator page (docs/decisions/feed-readers.md).
    let reader = crate::pipeline::changes::key_reader(row.id);
    crate::pipeline::changes::forget_reader(db, &reader).await?;
    Ok(Revoked {
        key: row.into(),
        already: false,
    })
}

/// Why a presented key was refused. None of them quotes the key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("the API key is malformed: expected trb_<prefix>_<secret>")]
    Malformed,
    #[error("the API key is not known")]
    Unknown,
    #[error("the API key has been revoked")]
    Revoked,
    #[error("checking the API key failed: {0}")]
    Database(#[from] DbErr),
}

/// A key that was accepted.
#[derive(Clone, Debug)]
pub struct Caller {
    pub key_id: i64,
    pub name: String,
    scopes: Vec<Scope>,
    /// Its own rate limit, replacing `[api] rate_limit`.
    pub(crate) rate_limit: Option<crate::config::BudgetWindow>,
}

impl Caller {
    /// Whether the key grants `scope` (`admin` grants every one).
    pub fn allows(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope) || self.scopes.contains(&Scope::Admin)
    }
}

/// Checks a presented key against its row, read now: found by its prefix, its secret's
/// hash compared in constant time, refused when revoked. Notes when it was used, at most
/// once a minute.
pub async fn authenticate(db: &DatabaseConnection, presented: &str) -> Result<Caller, KeyError> {
    let (prefix, secret) = presented
        .strip_prefix(KEY_PREFIX)
        .and_then(|rest| rest.split_once('_'))
        .ok_or(KeyError::Malformed)?;
    let well_formed = prefix.len() == PREFIX_BYTES * 2
        && prefix.bytes().all(|b| b.is_ascii_hexdigit())
        && !secret.is_empty()
        && secret.len() <= 64;
    if !well_formed {
        return Err(KeyError::Malformed);
    }
    let row = api_key::Entity::find()
        .filter(api_key::Column::Prefix.eq(prefix.to_ascii_lowercase()))
        .one(db)
        .await?
        .ok_or(KeyError::Unknown)?;
    let matches: bool = hash(secret)
        .as_bytes()
        .ct_eq(row.secret_hash.as_bytes())
        .into();
    if !matches {
        return Err(KeyError::Unknown);
    }
    if row.revoked_at.is_some() {
        return Err(KeyError::Revoked);
    }
    let now = Utc::now();
    let stale = now - LAST_USED_GRANULARITY;
    if row.last_used_at.is_none_or(|at| at < stale) {
        // Conditional, so that concurrent requests on several instances write it once.
        api_key::Entity::update_many()
            .col_expr(api_key::Column::LastUsedAt, Expr::value(now))
            .filter(api_key::Column::Id.eq(row.id))
            .filter(
                Condition::any()
                    .add(api_key::Column::LastUsedAt.is_null())
                    .add(api_key::Column::LastUsedAt.lt(stale)),
            )
            .exec(db)
            .await?;
    }
    Ok(caller_of(row))
}

/// The key with id `key_id`, read now, as a caller: how a session made from a key learns
/// that the key was revoked.
pub(crate) async fn caller_by_id(db: &DatabaseConnection, key_id: i64) -> Result<Caller, KeyError> {
    let row = api_key::Entity::find_by_id(key_id)
        .one(db)
        .await?
        .ok_or(KeyError::Unknown)?;
    if row.revoked_at.is_some() {
        return Err(KeyError::Revoked);
    }
    Ok(caller_of(row))
}

/// The caller a key's row describes.
fn caller_of(row: api_key::Model) -> Caller {
    let scopes = row
        .scopes
        .split_whitespace()
        .filter_map(|name| Scope::ALL.into_iter().find(|s| s.as_str() == name))
        .collect();
    // Checked when the key was created; a value that no longer parses falls back to the
    // configured limit.
    let rate_limit = row
        .rate_limit
        .as_deref()
        .and_then(|limit| crate::config::parse_rate_limit(limit).ok());
    Caller {
        key_id: row.id,
        name: row.name,
        scopes,
        rate_limit,
    }
}

/// Whether a key's request is within its rate limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    Admitted,
    /// The key's window is spent; it reopens in `retry_after` seconds (at least 1).
    Limited {
        retry_after: u64,
    },
}

/// Counts one request of key `key_id` against `limit`, in `rate_budgets` under the scope
/// `api_key:ID`: one conditional `UPDATE` per request (the window's first also inserts
/// its row), so every instance on the database shares the key's count.
pub(crate) async fn admit(
    db: &DatabaseConnection,
    key_id: i64,
    limit: &crate::config::BudgetWindow,
) -> Result<Admission, DbErr> {
    let now = crate::db::now();
    let scope = format!("api_key:{key_id}");
    Ok(
        match crate::pipeline::take_one_from(db, &scope, limit, now).await? {
            None => Admission::Admitted,
            Some(reopens_at) => {
                let wait = reopens_at.signed_duration_since(now).num_seconds();
                // Whole seconds, rounded up: a client that waits this long finds the
                // window open.
                let retry_after = u64::try_from(wait).unwrap_or(0).saturating_add(1);
                Admission::Limited { retry_after }
            }
        },
    )
}

/// A write request made through the API, for its audit row.
pub struct AuditEntry<'a> {
    pub key_id: Option<i64>,
    pub method: &'a str,
    /// Without the query string, which could hold anything.
    pub path: &'a str,
    pub status: u16,
}

/// Writes the audit row of a write request.
pub async fn audit(db: &DatabaseConnection, entry: AuditEntry<'_>) -> Result<(), OpsError> {
    let path: String = entry.path.chars().take(MAX_AUDIT_PATH_CHARS).collect();
    let method: String = entry.method.chars().take(16).collect();
    api_audit::ActiveModel {
        key_id: Set(entry.key_id),
        method: Set(method),
        path: Set(path),
        status: Set(i32::from(entry.status)),
        // The database's clock, as runs are stamped: the retention sweep walks the
        // rows by id up to the first young one, so ids and times should agree.
        at: Set(crate::db::now()),
        ..Default::default()
    }
    .insert(db)
    .await?;
    Ok(())
}

/// SHA-256 of a key's secret, in lowercase hex. A fast hash suffices: the secret is 32
/// random bytes, beyond any guessing (docs/decisions/api-keys.md).
pub(crate) fn hash(secret: &str) -> String {
    const_hex::encode(Sha256::digest(secret.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scope_parses_from_its_name_and_others_are_refused_with_the_list() {
        for scope in Scope::ALL {
            assert_eq!(Scope::parse(scope.as_str()).ok(), Some(scope));
        }
        let error = Scope::parse("records:write").unwrap_err().to_string();
        assert!(
            error.contains("records:write") && error.contains("connections:read"),
            "{error}"
        );
    }

    #[test]
    fn admin_allows_every_scope_and_others_only_their_own() {
        let caller = |scopes: Vec<Scope>| Caller {
            key_id: 1,
            name: "k".into(),
            scopes,
            rate_limit: None,
        };
        assert!(Scope::ALL
            .iter()
            .all(|s| caller(vec![Scope::Admin]).allows(*s)));
        let reader = caller(vec![Scope::ConnectionsRead]);
        assert!(reader.allows(Scope::ConnectionsRead));
        assert!(!reader.allows(Scope::ConnectionsWrite));
    }
}
