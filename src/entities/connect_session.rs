//! `connect_sessions`: a link an app hands a user to connect their own accounts on the
//! Connect page. The row keeps SHA-256 hashes of the link's token and of the cookie that
//! binds it to one browser, never either value.

use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "connect_sessions")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    /// SHA-256 of the link's token, in lowercase hex: how a request's link is found.
    #[sea_orm(unique)]
    pub token_hash: String,
    /// The user whose connection it creates.
    pub user_id: String,
    /// The providers the user may connect, as a JSON array of names.
    pub providers: String,
    /// The connection whose credentials it replaces; `None`: it creates one.
    pub reconnect_connection_id: Option<i64>,
    /// Where the user is sent back, one of `[connect] return_urls`.
    pub return_url: String,
    pub created_at: DateTimeUtc,
    pub expires_at: DateTimeUtc,
    /// When a connection was made through it; a used session is refused.
    pub used_at: Option<DateTimeUtc>,
    /// SHA-256 of the cookie set by the first page load; `None` until then.
    pub binding_hash: Option<String>,
    /// SHA-256 of the `state` of the authorization the browser was last sent to; the
    /// callback finds the session by it. `None` until an OAuth2 provider is chosen.
    pub state_hash: Option<String>,
    /// The provider that authorization is for.
    pub oauth_provider: Option<String>,
    /// For Shopify's per-shop flow, the shop the user named (`NAME.myshopify.com`): the
    /// callback's `shop` must be it, and the code is exchanged there.
    pub oauth_shop: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
