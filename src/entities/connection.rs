//! `connections`: one row per (user_id, provider), with its credentials and sync state.

use sea_orm::entity::prelude::*;
use sea_orm::Set;

// Debug is written out below so that the credentials column never reaches a log line.
#[derive(Clone, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "connections")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub user_id: String,
    pub provider: String,
    pub enabled: bool,
    /// JSON: `{"token_env": "NAME"}` (resolved at run time), or the sealed form of JSON
    /// that holds a secret (`sealed:v1:...`, see the `secrets` module).
    #[sea_orm(column_type = "Text")]
    pub credentials: String,
    /// The cursor from before streams; the primary stream's row in `connection_streams`
    /// takes it over at its first run, and it is null from then on.
    #[sea_orm(column_type = "Text", nullable)]
    pub cursor: Option<String>,
    /// The checkpoint from before streams, taken over like `cursor`.
    #[sea_orm(column_type = "Text", nullable)]
    pub checkpoint: Option<String>,
    /// The last success from before streams, taken over like `cursor`.
    pub last_success_run_id: Option<i64>,
    pub last_success_at: Option<DateTimeUtc>,
    /// The process that runs this connection now (`host:pid:nonce`), if any.
    pub lease_holder: Option<String>,
    /// Until when the lease holds unless renewed.
    pub lease_expires_at: Option<DateTimeUtc>,
    /// How many times the lease was claimed: with the holder, the fencing token a run's
    /// writes are conditional on.
    pub lease_generation: i64,
    /// The process spending the connection's OAuth refresh token now, if any.
    pub refresh_holder: Option<String>,
    /// Until when that claim holds; an expired claim may be taken over.
    pub refresh_claimed_until: Option<DateTimeUtc>,
    pub defined_in: DefinedIn,
    /// Set while the operator has paused the connection: its schedule's firings leave it
    /// out (a `sync` asked for still runs it). Runtime state, kept when config.toml's
    /// connections are loaded.
    pub paused_at: Option<DateTimeUtc>,
    /// The connection's own cron expression (with seconds), set by the operator; it
    /// replaces the provider's `schedule`. Runtime state, like `paused_at`.
    pub schedule: Option<String>,
    /// The provider-side account (a GitHub user id, a Strava athlete id, a Stripe
    /// account), when the Connect page learnt it; `None` otherwise.
    pub account_id: Option<String>,
    /// Since when the provider has refused the connection's authorization (its token
    /// endpoint answered `invalid_grant`): scheduled jobs skip it until a reconnect or a
    /// run that succeeds clears it.
    pub needs_reconnect_since: Option<DateTimeUtc>,
    /// The origin the connection's requests go to in place of its provider's `base_url`
    /// (a Shopify shop connected on the Connect page, `https://NAME.myshopify.com`);
    /// `None`: the provider's.
    pub base_url: Option<String>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

/// Where a connection was defined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, EnumIter, DeriveActiveEnum, serde::Serialize)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
#[serde(rename_all = "lowercase")]
pub enum DefinedIn {
    /// config.toml lists the connection.
    #[sea_orm(string_value = "config")]
    Config,
    /// Added with `tributary connections add`.
    #[sea_orm(string_value = "cli")]
    Cli,
    /// config.toml listed it and no longer does; disabled, credentials dropped.
    #[sea_orm(string_value = "removed")]
    Removed,
}

super::display_as_stored!(DefinedIn);

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("id", &self.id)
            .field("user_id", &self.user_id)
            .field("provider", &self.provider)
            .field("enabled", &self.enabled)
            .field("credentials", &crate::config::REDACTED)
            .field("cursor", &self.cursor)
            .field("checkpoint", &self.checkpoint)
            .field("last_success_run_id", &self.last_success_run_id)
            .field("last_success_at", &self.last_success_at)
            .field("lease_holder", &self.lease_holder)
            .field("lease_expires_at", &self.lease_expires_at)
            .field("lease_generation", &self.lease_generation)
            .field("refresh_holder", &self.refresh_holder)
            .field("refresh_claimed_until", &self.refresh_claimed_until)
            .field("defined_in", &self.defined_in)
            .field("account_id", &self.account_id)
            .field("needs_reconnect_since", &self.needs_reconnect_since)
            .field("base_url", &self.base_url)
            .field("created_at", &self.created_at)
            .field("updated_at", &self.updated_at)
            .finish()
    }
}

impl ActiveModel {
    /// A new connection with no sync state yet.
    pub fn new_connection(
        user_id: &str,
        provider: &str,
        enabled: bool,
        credentials: String,
    ) -> ActiveModel {
        let now = chrono::Utc::now();
        ActiveModel {
            user_id: Set(user_id.to_string()),
            provider: Set(provider.to_string()),
            enabled: Set(enabled),
            credentials: Set(credentials),
            cursor: Set(None),
            checkpoint: Set(None),
            last_success_run_id: Set(None),
            last_success_at: Set(None),
            lease_holder: Set(None),
            lease_expires_at: Set(None),
            refresh_holder: Set(None),
            refresh_claimed_until: Set(None),
            defined_in: Set(DefinedIn::Cli),
            paused_at: Set(None),
            schedule: Set(None),
            account_id: Set(None),
            needs_reconnect_since: Set(None),
            created_at: Set(now),
            updated_at: Set(now),
            ..Default::default()
        }
    }
}
