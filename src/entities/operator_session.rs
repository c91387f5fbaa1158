//! `operator_sessions`: a browser's session on the operator page. The row keeps the
//! SHA-256 hash of the session's cookie, never the cookie.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "operator_sessions")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    /// SHA-256 of the cookie's token, in lowercase hex: how a request's session is found.
    #[sea_orm(unique)]
    pub token_hash: String,
    /// The admin key posted to make it; revoking the key ends the session.
    pub key_id: i64,
    pub created_at: DateTimeUtc,
    pub expires_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
