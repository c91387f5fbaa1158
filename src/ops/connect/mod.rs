//! Connect: an app's users connect their own accounts on a hosted page
//! (docs/decisions/connect.md). The app asks for a session (a single-use link); the page
//! binds it to the first browser that opens it with a cookie; a pasted key is checked
//! with one request to the provider, then sealed into a connection (or, on reconnect,
//! into the connection's credentials) and its first sync queued, in the transaction that
//! marks the session used.
//!
//! Only SHA-256 hashes of the link's token and of the cookie are stored, so a copy of the
//! database connects nothing; the CSRF token is an HMAC of the cookie, so nothing else
//! is stored for it and every instance checks it alike. A provider with an OAuth2
//! application is authorized instead of given a key (`oauth.rs`).

pub(crate) mod oauth;

use chrono::{DateTime, TimeDelta, Utc};
use hmac::{Hmac, Mac};
use sea_orm::sea_query::Expr;
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, Set, TransactionTrait};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tributary_providers::{Credentials, FetchError};

use super::connections::{self, NewConnection, Target};
use super::OpsError;
use crate::config::{ConnectSettings, ProviderSettings, Settings};
use crate::credentials::StoredCredentials;
use crate::db::connection_events::ConnectionEvent;
use crate::db::{Announce, DatabasePools};
use crate::entities::notification_delivery::DeliveryEvent;
use crate::entities::{connect_session, connection};

/// The most providers one session offers.
const MAX_PROVIDERS: usize = 32;
/// The longest key the form takes.
pub(crate) const MAX_KEY_BYTES: usize = 4096;
/// Random bytes in a link's token and in a cookie.
const TOKEN_BYTES: usize = 32;

/// A session to create.
#[derive(Debug)]
pub(crate) struct NewSession {
    pub user_id: String,
    pub providers: Vec<String>,
    pub return_url: String,
    /// A connection whose credentials the session replaces.
    pub reconnect: Option<i64>,
}

/// A session created: its link, shown once, and when it expires.
#[derive(Debug)]
pub(crate) struct CreatedSession {
    pub url: String,
    pub expires_at: DateTime<Utc>,
}

/// Why the page refuses a request; each is a page in plain words.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    /// Connect is off (no `[connect]`); the page says no more to the public.
    #[error("this page is not available")]
    Off,
    #[error("this link is not known; ask the app for a new one")]
    Unknown,
    #[error("this link has expired; ask the app for a new one")]
    Expired,
    #[error("this link was used already; ask the app for a new one")]
    Used,
    #[error(
        "this link was opened in another browser; open it there, or ask the app for a new one"
    )]
    OtherBrowser,
    #[error("the form was not sent from this page; reload the page and try again")]
    Forged,
    #[error("this link does not connect {0}")]
    NotOffered(String),
    /// A callback whose `state` matches no authorization in progress.
    #[error("this sign-in is not known or was replaced by a newer one; start again from the app")]
    UnknownAuthorization,
    #[error("{0}")]
    BadCallback(String),
    /// `[connect] one_user_per_account`: the account is another user's connection.
    #[error("this {provider} account is already connected for another user of the app; nothing was saved. Connect another {provider} account, or ask the app for help")]
    AccountTaken { provider: String },
    #[error("{0}")]
    BadForm(String),
    #[error("{provider} refused this key (HTTP {status}); check it and try again")]
    KeyRefused { provider: String, status: u16 },
    #[error("{provider} could not check the key just now; try again in a moment")]
    ProviderFailed { provider: String },
    #[error(transparent)]
    Ops(#[from] OpsError),
}

impl From<sea_orm::DbErr> for ConnectError {
    fn from(error: sea_orm::DbErr) -> ConnectError {
        ConnectError::Ops(OpsError::Database(error))
    }
}

/// Creates a session for `new.user_id` to connect one of `new.providers`, sending the
/// user back to `new.return_url` (one of `[connect] return_urls`).
pub(crate) async fn create_session(
    db: &DatabasePools,
    settings: &Settings,
    new: NewSession,
) -> Result<CreatedSession, OpsError> {
    let connect = settings.connect.as_ref().ok_or_else(|| {
        OpsError::Conflict(
            "Connect is off: add a [connect] table to config.toml (docs/operations.md)".to_string(),
        )
    })?;
    connections::check_user_id(&new.user_id)?;
    if !connect.return_urls.contains(&new.return_url) {
        return Err(OpsError::Invalid {
            field: "return_url",
            message: format!(
                "{:?} is not one of [connect] return_urls (matched exactly)",
                tributary_providers::quote::truncated(&new.return_url, 128)
            ),
        });
    }
    let providers = check_providers(settings, &new.user_id, &new.providers)?;
    if let Some(id) = new.reconnect {
        check_reconnect(db, &new.user_id, &providers, id).await?;
    }
    let ttl = TimeDelta::from_std(connect.session_ttl).unwrap_or(TimeDelta::minutes(30));
    let now = crate::db::now();
    let expires_at = now
        .checked_add_signed(ttl)
        .ok_or_else(|| OpsError::Invalid {
            field: "session_ttl",
            message: "the expiry is past the calendar's end".to_string(),
        })?;
    let token = random_token();
    let providers_json = serde_json::to_string(&providers).unwrap_or_default();
    connect_session::ActiveModel {
        token_hash: Set(hash(&token)),
        user_id: Set(new.user_id),
        providers: Set(providers_json),
        reconnect_connection_id: Set(new.reconnect),
        return_url: Set(new.return_url),
        created_at: Set(now),
        expires_at: Set(expires_at),
        used_at: Set(None),
        binding_hash: Set(None),
        ..Default::default()
    }
    .insert(db.main())
    .await?;
    Ok(CreatedSession {
        url: page_url(connect, &token, None),
        expires_at,
    })
}

/// The providers named, each once: configured, taking a key, and not a connection
/// config.toml lists for the user.
fn check_providers(
    settings: &Settings,
    user_id: &str,
    names: &[String],
) -> Result<Vec<String>, OpsError> {
    let invalid = |message: String| OpsError::Invalid {
        field: "providers",
        message,
    };
    if names.is_empty() {
        return Err(invalid("name at least one provider".to_string()));
    }
    if names.len() > MAX_PROVIDERS {
        return Err(invalid(format!(
            "at most {MAX_PROVIDERS} providers, got {}",
            names.len()
        )));
    }
    let mut providers: Vec<String> = Vec::new();
    for name in names {
        let shown = tributary_providers::quote::truncated(name, 64);
        let Some(provider) = settings.providers.get(name) else {
            return Err(invalid(format!(
                "no provider named {shown:?} in {}",
                settings.path.display()
            )));
        };
        if !connectable(provider) {
            return Err(invalid(format!(
                "provider {shown:?} takes no key and has no OAuth2 application to authorize (an OAuth2 provider needs client_id and client_secret_env, and for kind = \"rest\" auth.authorize_url or auth.shopify_app)"
            )));
        }
        if settings.lists_connection(name, user_id) {
            return Err(invalid(format!(
                "config.toml lists {user_id}@{name}; change its credentials there"
            )));
        }
        if !providers.contains(name) {
            providers.push(name.clone());
        }
    }
    Ok(providers)
}

/// A reconnect names an existing connection of the user, of the one provider offered.
async fn check_reconnect(
    db: &DatabasePools,
    user_id: &str,
    providers: &[String],
    id: i64,
) -> Result<(), OpsError> {
    let invalid = |message: String| OpsError::Invalid {
        field: "reconnect",
        message,
    };
    let row = connection::Entity::find_by_id(id).one(db.main()).await?;
    match row {
        Some(row) if row.user_id == user_id && providers == [row.provider.clone()] => Ok(()),
        Some(row) if row.user_id == user_id => Err(invalid(format!(
            "connection {id} is of provider {:?}: name it alone in providers",
            row.provider
        ))),
        _ => Err(invalid(format!("user {user_id:?} has no connection {id}"))),
    }
}

/// The session's page: what it offers, and the cookie it sets on the first visit.
#[derive(Debug)]
pub(crate) struct PageView {
    /// The providers offered, with the path of each one's form.
    pub providers: Vec<(String, String)>,
    /// The cookie's value, when this visit bound the session to the browser.
    pub new_cookie: Option<String>,
    /// The cookie's path: the session's own, so that sessions open side by side keep
    /// their cookies apart.
    pub cookie_path: String,
    /// Seconds the cookie lives: until the session expires.
    pub cookie_max_age: i64,
    pub reconnect: bool,
    /// The origins of the offered providers' authorization endpoints, where a button's
    /// answer may redirect.
    pub authorize_origins: Vec<String>,
}

/// Opens session `token` for the browser that holds `cookie`: the first visit binds it
/// (and sets the cookie), later visits must present that cookie.
pub(crate) async fn open_page(
    db: &DatabasePools,
    settings: &Settings,
    token: &str,
    cookie: Option<&str>,
) -> Result<PageView, ConnectError> {
    let connect = settings.connect.as_ref().ok_or(ConnectError::Off)?;
    let session = live_session(db, token).await?;
    let new_cookie = match (&session.binding_hash, cookie) {
        (Some(bound), Some(cookie)) if same(bound, &hash(cookie)) => None,
        (Some(_), _) => return Err(ConnectError::OtherBrowser),
        (None, _) => {
            let cookie = random_token();
            // Conditional, so that of two browsers opening the link at once one binds it.
            let bound = connect_session::Entity::update_many()
                .col_expr(
                    connect_session::Column::BindingHash,
                    Expr::value(hash(&cookie)),
                )
                .filter(connect_session::Column::Id.eq(session.id))
                .filter(connect_session::Column::BindingHash.is_null())
                .exec(db.main())
                .await?;
            if bound.rows_affected == 0 {
                return Err(ConnectError::OtherBrowser);
            }
            Some(cookie)
        }
    };
    let providers = offered(&session)
        .into_iter()
        .map(|name| {
            let path = page_path(connect, token, Some(&name));
            (name, path)
        })
        .collect();
    let remaining = session
        .expires_at
        .signed_duration_since(crate::db::now())
        .num_seconds()
        .max(1);
    Ok(PageView {
        providers,
        new_cookie,
        cookie_path: page_path(connect, token, None),
        cookie_max_age: remaining,
        reconnect: session.reconnect_connection_id.is_some(),
        authorize_origins: offered(&session)
            .iter()
            .filter_map(|name| settings.providers.get(name))
            .filter_map(|provider| provider.adapter.authorization())
            .map(|app| app.authorize_url.origin().ascii_serialization())
            .collect(),
    })
}

/// A provider's key form.
#[derive(Debug)]
pub(crate) struct KeyForm {
    pub provider: String,
    /// Where the form posts.
    pub action: String,
    /// Where "back" goes: the session's page.
    pub back: String,
    pub csrf: String,
    /// What the key looks like, when the provider says.
    pub hint: &'static str,
    /// The origin of the return URL, where the form's answer redirects.
    pub return_origin: Option<String>,
}

/// The key form of `provider` in session `token`, for the browser the session is bound to.
pub(crate) async fn key_form(
    db: &DatabasePools,
    settings: &Settings,
    token: &str,
    provider: &str,
    cookie: Option<&str>,
) -> Result<KeyForm, ConnectError> {
    let connect = settings.connect.as_ref().ok_or(ConnectError::Off)?;
    let session = live_session(db, token).await?;
    let cookie = bound_cookie(&session, cookie)?;
    let settings_of = key_provider(settings, &session, provider)?;
    Ok(KeyForm {
        provider: provider.to_string(),
        action: page_path(connect, token, Some(provider)),
        back: page_path(connect, token, None),
        csrf: csrf_of(cookie),
        hint: hint_of(settings_of),
        return_origin: url::Url::parse(&session.return_url)
            .ok()
            .map(|url| url.origin().ascii_serialization()),
    })
}

/// A key as the form sent it.
pub(crate) struct KeySubmission<'a> {
    pub token: &'a str,
    pub provider: &'a str,
    pub cookie: Option<&'a str>,
    pub csrf: Option<&'a str>,
    pub key: SecretString,
}

/// Checks the key with one request to the provider and, if it is taken, stores it as
/// the API's create does (or replaces the reconnected connection's credentials), marks
/// the session used and queues the first sync. Returns where to send the browser: the
/// session's return URL with the outcome.
pub(crate) async fn submit_key(
    db: &DatabasePools,
    settings: &Settings,
    submission: KeySubmission<'_>,
) -> Result<String, ConnectError> {
    settings.connect.as_ref().ok_or(ConnectError::Off)?;
    let session = live_session(db, submission.token).await?;
    let cookie = bound_cookie(&session, submission.cookie)?;
    check_csrf(cookie, submission.csrf)?;
    let provider_settings = key_provider(settings, &session, submission.provider)?;
    let key = submission.key.expose_secret();
    if key.trim().is_empty() {
        return Err(ConnectError::BadForm("paste the key first".to_string()));
    }
    if key.len() > MAX_KEY_BYTES || key.chars().any(char::is_control) {
        return Err(ConnectError::BadForm(format!(
            "a key is at most {MAX_KEY_BYTES} characters on one line; check what was pasted"
        )));
    }
    let key = SecretString::from(key.trim().to_string());
    verify(provider_settings, &key).await?;
    let credentials = Credentials {
        token: Some(key),
        ..Default::default()
    };
    let account_id = account_of(provider_settings, &credentials).await;
    let provider = submission.provider;
    let txn = db.begin().await?;
    // Marked first, conditionally: of two posts racing, one connects.
    mark_used(&txn, &session, None).await?;
    let account = Account {
        credentials,
        account_id,
        base_url: None,
    };
    connect_in(txn, db, settings, &session, provider, account).await
}

/// Refuses a form whose CSRF token is not the one of the browser holding `cookie`.
fn check_csrf(cookie: &str, sent: Option<&str>) -> Result<(), ConnectError> {
    match sent {
        Some(sent) if same(sent, &csrf_of(cookie)) => Ok(()),
        _ => Err(ConnectError::Forged),
    }
}

/// What a user connected: the credentials, the provider-side account when known, and
/// the connection's own API origin when it has one (a Shopify shop's).
struct Account {
    credentials: Credentials,
    account_id: Option<String>,
    base_url: Option<String>,
}

/// The provider-side account `credentials` belong to, asked of the provider; `None` when
/// it has no way to tell or the request failed (the credentials were checked already).
async fn account_of(provider: &ProviderSettings, credentials: &Credentials) -> Option<String> {
    let asked = async {
        tributary_providers::build_provider(&provider.adapter, &provider.http)?
            .account_id(credentials)
            .await
    };
    match asked.await {
        Ok(account_id) => account_id,
        Err(error) => {
            tracing::warn!(provider = %provider.name, %error, "Reading the account of credentials given on the Connect page failed; the connection is stored without it.");
            None
        }
    }
}

/// Refuses (with `[connect] one_user_per_account`) or reports an account that is another
/// user's connection of `provider` already.
async fn check_account(
    txn: &sea_orm::DatabaseTransaction,
    settings: &Settings,
    session: &connect_session::Model,
    provider: &str,
    account_id: &str,
) -> Result<(), ConnectError> {
    let others = connection::Entity::find()
        .filter(connection::Column::Provider.eq(provider))
        .filter(connection::Column::AccountId.eq(account_id))
        .filter(connection::Column::UserId.ne(session.user_id.as_str()))
        .all(txn)
        .await?;
    if others.is_empty() {
        return Ok(());
    }
    let refused = settings
        .connect
        .as_ref()
        .is_some_and(|connect| connect.one_user_per_account);
    tracing::warn!(
        session_id = session.id,
        provider,
        account_id,
        other_connections = others.len(),
        refused,
        "An account given on the Connect page is another user's connection already."
    );
    match refused {
        true => Err(ConnectError::AccountTaken {
            provider: provider.to_string(),
        }),
        false => Ok(()),
    }
}

/// Marks `session` used, conditionally (and, given its hash, only while `state` is the
/// session's): of two requests racing, one goes on and the other is [`ConnectError::Used`].
async fn mark_used(
    db: &impl sea_orm::ConnectionTrait,
    session: &connect_session::Model,
    state_hash: Option<&str>,
) -> Result<(), ConnectError> {
    let now = crate::db::now();
    let mut update = connect_session::Entity::update_many()
        .col_expr(connect_session::Column::UsedAt, Expr::value(Some(now)))
        .filter(connect_session::Column::Id.eq(session.id))
        .filter(connect_session::Column::UsedAt.is_null())
        .filter(connect_session::Column::ExpiresAt.gt(now));
    if let Some(state_hash) = state_hash {
        update = update.filter(connect_session::Column::StateHash.eq(state_hash));
    }
    let marked = update.exec(db).await?;
    match marked.rows_affected {
        0 => Err(ConnectError::Used),
        _ => Ok(()),
    }
}

/// Stores `credentials` in `txn` as the session's new connection (or the reconnected
/// one's), commits, and queues the first sync. Returns where to send the browser.
async fn connect_in(
    txn: sea_orm::DatabaseTransaction,
    db: &DatabasePools,
    settings: &Settings,
    session: &connect_session::Model,
    provider: &str,
    account: Account,
) -> Result<String, ConnectError> {
    let Account {
        credentials,
        account_id,
        base_url,
    } = account;
    if let Some(account_id) = &account_id {
        check_account(&txn, settings, session, provider, account_id).await?;
    }
    let (connection_id, event) = match session.reconnect_connection_id {
        Some(id) => {
            replace_credentials(&txn, db, session, provider, id, &credentials).await?;
            (id, DeliveryEvent::ConnectionReconnected)
        }
        None => {
            let new = NewConnection {
                target: Target {
                    provider: provider.to_string(),
                    user_id: session.user_id.clone(),
                },
                token_env: None,
                token: credentials.token,
                refresh_token_env: None,
                refresh_token: credentials.refresh_token,
                expires_at: credentials.expires_at,
                enabled: true,
                schedule: None,
                stream_schedules: Vec::new(),
            };
            match connections::add_in(&txn, db, settings, new).await {
                Ok(added) => (added.id, DeliveryEvent::ConnectionCreated),
                Err(OpsError::Conflict(_)) => {
                    drop(txn);
                    return Ok(outcome(
                        &session.return_url,
                        "error",
                        Some("already_connected"),
                    ));
                }
                Err(error) => return Err(error.into()),
            }
        }
    };
    if account_id.is_some() || base_url.is_some() {
        let mut update = connection::Entity::update_many();
        if account_id.is_some() {
            update = update.col_expr(connection::Column::AccountId, Expr::value(account_id));
        }
        if base_url.is_some() {
            update = update.col_expr(connection::Column::BaseUrl, Expr::value(base_url));
        }
        update
            .filter(connection::Column::Id.eq(connection_id))
            .exec(&txn)
            .await?;
    }
    let announce = match settings.notify {
        Some(_) => Announce::Yes,
        None => Announce::No,
    };
    announce_connected(&txn, announce, connection_id, session, event).await?;
    // The user authorized again: scheduled runs may ask the provider once more.
    crate::db::clear_needs_reconnect(&txn, connection_id, crate::db::now(), announce).await?;
    txn.commit().await?;
    tracing::info!(
        session_id = session.id,
        connection_id,
        provider,
        user_id = %session.user_id,
        "A user connected an account on the Connect page."
    );
    // The connection is stored; a first sync that cannot be queued waits for its schedule.
    if let Err(error) =
        super::sync::queue_connection(db, settings, connection_id, None, false).await
    {
        tracing::warn!(connection_id, %error, "Queueing the first sync of a connection made on the Connect page failed; its schedule will sync it.");
    }
    Ok(outcome(&session.return_url, "connected", None))
}

/// Writes the connection event of a connect (created) or reconnect in `txn`, named by the
/// session, which connects once.
async fn announce_connected(
    txn: &sea_orm::DatabaseTransaction,
    announce: Announce,
    connection_id: i64,
    session: &connect_session::Model,
    event: DeliveryEvent,
) -> Result<(), ConnectError> {
    if announce == Announce::No {
        return Ok(());
    }
    let transition = format!("session-{}", session.id);
    let event = ConnectionEvent {
        connection_id,
        event,
        transition: &transition,
        now: crate::db::now(),
    };
    crate::db::connection_events::write(txn, &event).await?;
    Ok(())
}

/// Replaces connection `id`'s credentials, keeping its records, cursors and history.
async fn replace_credentials(
    txn: &sea_orm::DatabaseTransaction,
    db: &DatabasePools,
    session: &connect_session::Model,
    provider: &str,
    id: i64,
    credentials: &Credentials,
) -> Result<(), ConnectError> {
    let row = connection::Entity::find_by_id(id)
        .one(txn)
        .await?
        .filter(|row| row.user_id == session.user_id && row.provider == provider)
        .ok_or_else(|| {
            ConnectError::BadForm(
                "the connection to reconnect is gone; ask the app for a new link".to_string(),
            )
        })?;
    let expose = |secret: &Option<SecretString>| {
        secret
            .as_ref()
            .map(|secret| secret.expose_secret().to_string())
    };
    let stored = StoredCredentials {
        token: expose(&credentials.token),
        refresh_token: expose(&credentials.refresh_token),
        expires_at: credentials.expires_at,
        ..Default::default()
    };
    let column = stored
        .to_column_for(db.secrets(), row.binding())
        .map_err(OpsError::from)?;
    let mut active: connection::ActiveModel = row.into();
    active.credentials = Set(column);
    active.updated_at = Set(crate::db::now());
    active.update(txn).await?;
    Ok(())
}

/// One request to the provider with `key`: refused (401, 403) and failed are told apart.
async fn verify(provider: &ProviderSettings, key: &SecretString) -> Result<(), ConnectError> {
    let name = provider.name.clone();
    let failed = |error: FetchError| {
        tracing::warn!(provider = %name, %error, "Checking a key pasted on the Connect page failed.");
        ConnectError::ProviderFailed {
            provider: name.clone(),
        }
    };
    let adapter =
        tributary_providers::build_provider(&provider.adapter, &provider.http).map_err(&failed)?;
    let stream = provider
        .streams
        .iter()
        .find(|stream| stream.parent.is_none())
        .map(|stream| stream.name.clone())
        .unwrap_or_default();
    let credentials = Credentials {
        token: Some(key.clone()),
        ..Default::default()
    };
    match adapter.verify_credentials(&credentials, &stream).await {
        Ok(()) => Ok(()),
        Err(FetchError::Unauthorized { status, .. }) => Err(ConnectError::KeyRefused {
            provider: name.clone(),
            status,
        }),
        // The key cannot be put in a request as the provider takes it (a basic pair
        // without its ':'): the user can write it again; the provider is not at fault.
        Err(error @ FetchError::MissingCredentials { .. }) => {
            tracing::info!(provider = %name, %error, "A key pasted on the Connect page cannot be sent as the provider takes it.");
            Err(ConnectError::BadForm(format!(
                "{name} cannot take this key as it was pasted. {}",
                hint_of(provider)
            )))
        }
        Err(error) => Err(failed(error)),
    }
}

/// Session `token`, if it is known, unused and unexpired.
async fn live_session(
    db: &DatabasePools,
    token: &str,
) -> Result<connect_session::Model, ConnectError> {
    if token.is_empty() || token.len() > 128 {
        return Err(ConnectError::Unknown);
    }
    let session = connect_session::Entity::find()
        .filter(connect_session::Column::TokenHash.eq(hash(token)))
        .one(db.main())
        .await?
        .ok_or(ConnectError::Unknown)?;
    if session.used_at.is_some() {
        return Err(ConnectError::Used);
    }
    if session.expires_at <= crate::db::now() {
        return Err(ConnectError::Expired);
    }
    Ok(session)
}

/// The cookie, when it is the one the session is bound to.
fn bound_cookie<'a>(
    session: &connect_session::Model,
    cookie: Option<&'a str>,
) -> Result<&'a str, ConnectError> {
    match (&session.binding_hash, cookie) {
        (Some(bound), Some(cookie)) if same(bound, &hash(cookie)) => Ok(cookie),
        _ => Err(ConnectError::OtherBrowser),
    }
}

/// Provider `name`'s settings, when the session offers it.
fn offered_provider<'a>(
    settings: &'a Settings,
    session: &connect_session::Model,
    name: &str,
) -> Result<&'a ProviderSettings, ConnectError> {
    let not_offered = || ConnectError::NotOffered(tributary_providers::quote::truncated(name, 64));
    if !offered(session).iter().any(|offered| offered == name) {
        return Err(not_offered());
    }
    settings
        .providers
        .get(name)
        .filter(|provider| connectable(provider))
        .ok_or_else(not_offered)
}

/// Provider `name`'s settings, when the session offers it and it takes a key: an OAuth2
/// provider's tokens come from its token endpoint only.
fn key_provider<'a>(
    settings: &'a Settings,
    session: &connect_session::Model,
    name: &str,
) -> Result<&'a ProviderSettings, ConnectError> {
    let provider = offered_provider(settings, session, name)?;
    match provider.adapter.takes_key() {
        true => Ok(provider),
        false => Err(ConnectError::NotOffered(
            tributary_providers::quote::truncated(name, 64),
        )),
    }
}

/// Whether a user can connect `provider` on the page: by a key, or by authorizing its
/// OAuth2 application or its Shopify app.
fn connectable(provider: &ProviderSettings) -> bool {
    provider.adapter.takes_key()
        || provider.adapter.authorization().is_some()
        || provider.adapter.shopify_app().is_some()
}

fn offered(session: &connect_session::Model) -> Vec<String> {
    serde_json::from_str(&session.providers).unwrap_or_default()
}

/// What a provider's key looks like.
fn hint_of(provider: &ProviderSettings) -> &'static str {
    use tributary_providers::rest::Auth;
    use tributary_providers::ProviderConfig;
    match &provider.adapter {
        ProviderConfig::Stripe(_) => "A secret key (sk_...) or a restricted key (rk_...) with read access, from the Stripe Dashboard's API keys page.",
        ProviderConfig::Github(_) => "A personal access token with read access.",
        // Freshdesk's docs, for one: the API key as the user, any password such as X.
        ProviderConfig::Rest(rest) if rest.auth == (Auth::Basic { username: None }) => "Your user name and password as USER:PASSWORD; an API key without a password as KEY:X.",
        _ => "The API key or token the service gave you.",
    }
}

/// `return_url` with `outcome` (and `code`) added to its query.
fn outcome(return_url: &str, outcome: &str, code: Option<&str>) -> String {
    match url::Url::parse(return_url) {
        Ok(mut url) => {
            {
                let mut query = url.query_pairs_mut();
                query.append_pair("outcome", outcome);
                if let Some(code) = code {
                    query.append_pair("code", code);
                }
            }
            url.to_string()
        }
        // The allow-list holds URLs only; a row from an older config still goes back.
        Err(_) => return_url.to_string(),
    }
}

/// The session's page (or a provider's form) as an absolute URL.
fn page_url(connect: &ConnectSettings, token: &str, provider: Option<&str>) -> String {
    let mut url = connect.public_url.clone();
    set_page_path(&mut url, token, provider);
    url.to_string()
}

/// The session's page (or a provider's form) as a path under `public_url`'s.
fn page_path(connect: &ConnectSettings, token: &str, provider: Option<&str>) -> String {
    let mut url = connect.public_url.clone();
    set_page_path(&mut url, token, provider);
    url.path().to_string()
}

fn set_page_path(url: &mut url::Url, token: &str, provider: Option<&str>) {
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.pop_if_empty().push("connect").push(token);
        if let Some(provider) = provider {
            segments.push(provider);
        }
    }
}

/// A new random token: URL-safe base64 of 32 random bytes.
fn random_token() -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; TOKEN_BYTES]>())
}

/// SHA-256 of `value` in lowercase hex.
fn hash(value: &str) -> String {
    const_hex::encode(Sha256::digest(value.as_bytes()))
}

/// The CSRF token of the browser holding `cookie`: only that browser can compute it.
fn csrf_of(cookie: &str) -> String {
    match Hmac::<Sha256>::new_from_slice(cookie.as_bytes()) {
        Ok(mut mac) => {
            mac.update(b"tributary connect csrf");
            const_hex::encode(mac.finalize().into_bytes())
        }
        // HMAC takes a key of any length: unreachable, and an empty token matches nothing.
        Err(_) => String::new(),
    }
}

/// Constant-time equality of two secrets' texts.
fn same(a: &str, b: &str) -> bool {
    !a.is_empty() && a.as_bytes().ct_eq(b.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_outcome_is_added_to_the_return_urls_query() {
        assert_eq!(
            super::outcome("https://app.example/done?x=1", "connected", None),
            "https://app.example/done?x=1&outcome=connected"
        );
        assert_eq!(
            super::outcome(
                "https://app.example/done",
                "error",
                Some("already_connected")
            ),
            "https://app.example/done?outcome=error&code=already_connected"
        );
    }

    #[test]
    fn a_csrf_token_is_bound_to_its_cookie() {
        assert_eq!(super::csrf_of("a"), super::csrf_of("a"));
        assert_ne!(super::csrf_of("a"), super::csrf_of("b"));
        assert!(!super::same("", ""));
    }
}
