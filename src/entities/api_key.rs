//! `api_keys`: the HTTP API's keys. A key is `trb_<prefix>_<secret>`; the row keeps the
//! prefix, to find the key, and the SHA-256 hash of the secret, never the secret.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "api_keys")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    /// The operator's name for it, unique.
    #[sea_orm(unique)]
    pub name: String,
    /// The public part of the key, unique: how a request's key is found.
    #[sea_orm(unique)]
    pub prefix: String,
    /// SHA-256 of the secret part, in lowercase hex.
    pub secret_hash: String,
    /// The scopes it grants, separated by spaces.
    pub scopes: String,
    pub created_at: DateTimeUtc,
    /// When a request last used it, to the minute.
    pub last_used_at: Option<DateTimeUtc>,
    /// When it was revoked; a revoked key is refused.
    pub revoked_at: Option<DateTimeUtc>,
    /// Its own rate limit (`"N/minute"`), replacing `[api] rate_limit`; null: that one.
    pub rate_limit: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
