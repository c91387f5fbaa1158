//! The authorization code grant with PKCE on the Connect page (docs/decisions/connect.md):
//! a provider's button sends the browser to the provider's authorization endpoint with a
//! fresh `state`, and the one callback path, `public_url/connect/callback`, finds the
//! session by that `state`, checks the browser's cookie, marks the session used and only
//! then exchanges the code, once.
//!
//! The row keeps SHA-256 of `state`. The PKCE verifier is not stored at all: it is an
//! HMAC of `state` keyed by the browser's cookie, so only the bound browser's callback
//! can produce it again, and a copy of the database gives nothing to redeem a code with.
//!
//! Shopify's per-shop flow (docs/decisions/connect-shopify.md) asks for the shop first
//! (a form with the key form's CSRF check), keeps it beside the state, and checks the
//! callback's `hmac` and `shop` before the session is spent; the code is exchanged on
//! the kept shop with the client [`ShopifyClients`] gives, and the connection's API base
//! becomes the shop's origin.

use base64::Engine;
use hmac::{Hmac, Mac};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, TransactionTrait};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

use std::collections::BTreeMap;
use std::sync::Arc;

use tributary_providers::authorize::{AuthorizationApp, Exchanged};
use tributary_providers::shopify_app::{Shop, ShopifyApp};
use tributary_providers::{FetchError, HttpClient};

use super::{
    account_of, bound_cookie, check_csrf, connect_in, csrf_of, hash, live_session, mark_used,
    offered_provider, outcome, page_path, random_token, Account, ConnectError,
};
use crate::config::{ConnectSettings, ProviderSettings, Settings};
use crate::db::DatabasePools;
use crate::entities::connect_session;

/// The longest `state` taken: ours are 43 characters.
const MAX_STATE_BYTES: usize = 128;

/// Where the browser goes to authorize, and the cookie that lets the callback be checked.
#[derive(Debug)]
pub(crate) struct Authorization {
    /// The provider's authorization endpoint with the request's parameters.
    pub location: String,
    /// The session's cookie again, for the callback's path: the page's cookie is scoped
    /// to the session's own path, which the callback's is not.
    pub cookie: String,
    pub cookie_path: String,
    pub cookie_max_age: i64,
}

/// Starts the authorization of `provider` in session `token` when the provider has an
/// OAuth2 application; `None`: it takes a key instead.
pub(crate) async fn begin(
    db: &DatabasePools,
    settings: &Settings,
    token: &str,
    provider: &str,
    cookie: Option<&str>,
) -> Result<Option<Authorization>, ConnectError> {
    let connect = settings.connect.as_ref().ok_or(ConnectError::Off)?;
    let session = live_session(db, token).await?;
    let cookie = bound_cookie(&session, cookie)?;
    let provider_settings = offered_provider(settings, &session, provider)?;
    let Some(app) = provider_settings.adapter.authorization() else {
        return Ok(None);
    };
    let state = random_token();
    keep_state(db, &session, &state, provider, None).await?;
    let challenge = app.pkce.then(|| challenge_of(&verifier_of(cookie, &state)));
    let location = app
        .authorization_url(&callback_url(connect), &state, challenge.as_deref())
        .to_string();
    tracing::info!(
        session_id = session.id,
        provider,
        "The Connect page sent a browser to the provider's authorization."
    );
    Ok(Some(authorization(connect, &session, cookie, location)))
}

/// Keeps the hash of `state` on the session with the provider (and Shopify's shop) it
/// authorizes. A later button press replaces them: only the newest authorization
/// completes.
async fn keep_state(
    db: &DatabasePools,
    session: &connect_session::Model,
    state: &str,
    provider: &str,
    shop: Option<&Shop>,
) -> Result<(), ConnectError> {
    let begun = connect_session::Entity::update_many()
        .col_expr(
            connect_session::Column::StateHash,
            Expr::value(Some(hash(state))),
        )
        .col_expr(
            connect_session::Column::OauthProvider,
            Expr::value(Some(provider.to_string())),
        )
        .col_expr(
            connect_session::Column::OauthShop,
            Expr::value(shop.map(|shop| shop.as_str().to_string())),
        )
        .filter(connect_session::Column::Id.eq(session.id))
        .filter(connect_session::Column::UsedAt.is_null())
        .exec(db.main())
        .await?;
    match begun.rows_affected {
        0 => Err(ConnectError::Used),
        _ => Ok(()),
    }
}

/// The redirect to `location`, with the session's cookie again for the callback's path.
fn authorization(
    connect: &ConnectSettings,
    session: &connect_session::Model,
    cookie: &str,
    location: String,
) -> Authorization {
    Authorization {
        location,
        cookie: cookie.to_string(),
        cookie_path: callback_path(connect),
        cookie_max_age: session
            .expires_at
            .signed_duration_since(crate::db::now())
            .num_seconds()
            .max(1),
    }
}

/// The HTTP clients Shopify code exchanges send with, by provider name. Start-up leaves it
/// empty, and each exchange builds its provider's client from its `http` settings, as the
/// other providers' exchanges do; a test puts in a client that resolves its emulated shop
/// to loopback and trusts that shop's certificate. Nothing in config or the environment
/// fills it (docs/decisions/connect-shopify.md).
#[derive(Clone, Default)]
pub(crate) struct ShopifyClients(Arc<BTreeMap<String, HttpClient>>);

impl ShopifyClients {
    /// `client` for provider `name`'s exchanges.
    #[cfg(test)]
    pub(crate) fn with(name: &str, client: HttpClient) -> ShopifyClients {
        ShopifyClients(Arc::new(BTreeMap::from([(name.to_string(), client)])))
    }

    /// The client `provider`'s exchanges send with.
    fn client_for(&self, provider: &ProviderSettings) -> Result<HttpClient, FetchError> {
        match self.0.get(&provider.name) {
            Some(client) => Ok(client.clone()),
            None => HttpClient::new(provider.http.clone()),
        }
    }
}

/// A Shopify provider's shop form.
#[derive(Debug)]
pub(crate) struct ShopForm {
    pub provider: String,
    /// Where the form posts.
    pub action: String,
    /// Where "back" goes: the session's page.
    pub back: String,
    pub csrf: String,
}

/// The shop form of `provider` in session `token`, for the browser the session is bound
/// to; `None`: the provider is not a Shopify app.
pub(crate) async fn shop_form(
    db: &DatabasePools,
    settings: &Settings,
    token: &str,
    provider: &str,
    cookie: Option<&str>,
) -> Result<Option<ShopForm>, ConnectError> {
    let connect = settings.connect.as_ref().ok_or(ConnectError::Off)?;
    let session = live_session(db, token).await?;
    let cookie = bound_cookie(&session, cookie)?;
    let provider_settings = offered_provider(settings, &session, provider)?;
    if provider_settings.adapter.shopify_app().is_none() {
        return Ok(None);
    }
    Ok(Some(ShopForm {
        provider: provider.to_string(),
        action: page_path(connect, token, Some(provider)),
        back: page_path(connect, token, None),
        csrf: csrf_of(cookie),
    }))
}

/// A shop as the form sent it.
pub(crate) struct ShopSubmission<'a> {
    pub token: &'a str,
    pub provider: &'a str,
    pub cookie: Option<&'a str>,
    pub csrf: Option<&'a str>,
    /// `NAME.myshopify.com`, or `NAME` alone.
    pub shop: &'a str,
}

/// Starts Shopify's authorization on the shop the form named: the shop checked (a bad
/// one is [`ConnectError::BadForm`], nothing stored), kept beside a fresh `state`, and the
/// browser sent to the shop's authorization page.
pub(crate) async fn begin_shop(
    db: &DatabasePools,
    settings: &Settings,
    submission: ShopSubmission<'_>,
) -> Result<Authorization, ConnectError> {
    let connect = settings.connect.as_ref().ok_or(ConnectError::Off)?;
    let session = live_session(db, submission.token).await?;
    let cookie = bound_cookie(&session, submission.cookie)?;
    check_csrf(cookie, submission.csrf)?;
    let provider = submission.provider;
    let provider_settings = offered_provider(settings, &session, provider)?;
    let app = provider_settings
        .adapter
        .shopify_app()
        .ok_or_else(|| ConnectError::NotOffered(provider.to_string()))?;
    let shop = shop_of(submission.shop)?;
    let state = random_token();
    keep_state(db, &session, &state, provider, Some(&shop)).await?;
    let location = app
        .authorization_url(&shop, &callback_url(connect), &state)
        .to_string();
    tracing::info!(
        session_id = session.id,
        provider,
        shop = shop.as_str(),
        "The Connect page sent a browser to a Shopify shop's authorization."
    );
    Ok(authorization(connect, &session, cookie, location))
}

/// The shop a user typed: `NAME.myshopify.com`, or `NAME` alone (Shopify's admin shows
/// both).
fn shop_of(typed: &str) -> Result<Shop, ConnectError> {
    let typed = typed.trim();
    let domain = match typed.contains('.') || typed.is_empty() {
        true => typed.to_string(),
        false => format!("{typed}.myshopify.com"),
    };
    Shop::parse(&domain).map_err(|_| {
        ConnectError::BadForm(format!(
            "{:?} is not a Shopify shop; type its address as NAME.myshopify.com (or NAME alone)",
            tributary_providers::quote::truncated(typed, 64)
        ))
    })
}

/// The provider's redirect back, as its query gave it.
#[derive(Default)]
pub(crate) struct Callback {
    pub code: Option<SecretString>,
    pub state: Option<String>,
    /// `error` (RFC 6749 §4.1.2.1), e.g. `access_denied`.
    pub error: Option<String>,
    /// Shopify's `shop`: the shop the callback is for.
    pub shop: Option<String>,
    /// The query as received, which Shopify's `hmac` signs.
    pub raw_query: String,
}

/// The grant a session's authorization runs.
enum Grant {
    /// The authorization code grant at the provider's endpoints.
    Standard(AuthorizationApp),
    /// Shopify's, on the shop the user named.
    Shopify(ShopifyApp, Shop),
}

/// Completes an authorization: the session found by `state`, the cookie checked (and for
/// a Shopify session the `hmac` and the shop), the session marked used, the code
/// exchanged once and the connection stored. Returns where to send the browser: the
/// session's return URL with the outcome.
pub(crate) async fn complete(
    db: &DatabasePools,
    settings: &Settings,
    clients: &ShopifyClients,
    callback: Callback,
    cookie: Option<&str>,
) -> Result<String, ConnectError> {
    let connect = settings.connect.as_ref().ok_or(ConnectError::Off)?;
    let state = callback.state.clone().ok_or_else(|| {
        ConnectError::BadCallback(
            "the provider's answer has no state; start again from the app".to_string(),
        )
    })?;
    if state.is_empty() || state.len() > MAX_STATE_BYTES {
        return Err(ConnectError::UnknownAuthorization);
    }
    let state_hash = hash(&state);
    let session = connect_session::Entity::find()
        .filter(connect_session::Column::StateHash.eq(state_hash.as_str()))
        .one(db.main())
        .await?
        .ok_or(ConnectError::UnknownAuthorization)?;
    if session.used_at.is_some() {
        return Err(ConnectError::Used);
    }
    if session.expires_at <= crate::db::now() {
        return Err(ConnectError::Expired);
    }
    let cookie = bound_cookie(&session, cookie)?;
    let provider = session.oauth_provider.clone().unwrap_or_default();
    let provider_settings = offered_provider(settings, &session, &provider)?;
    let grant = match &session.oauth_shop {
        // Checked before the session is spent, so a forged callback spends nothing.
        Some(kept) => shopify_grant(provider_settings, &session, kept, &callback)?,
        None => Grant::Standard(
            provider_settings
                .adapter
                .authorization()
                .ok_or_else(|| ConnectError::NotOffered(provider.clone()))?,
        ),
    };
    // Before the exchange, conditionally: a replayed callback finds the session used and
    // sends nothing to the provider.
    mark_used(db.main(), &session, Some(&state_hash)).await?;
    let back = |result: &str, code: Option<&str>| outcome(&session.return_url, result, code);
    if let Some(error) = callback.error {
        let error = tributary_providers::quote::truncated(&error, 64);
        tracing::info!(
            session_id = session.id,
            provider,
            error,
            "The provider's authorization ended without a code."
        );
        return Ok(match error.as_str() {
            "access_denied" => back("denied", None),
            _ => back("error", Some("authorization_failed")),
        });
    }
    let Some(code) = callback
        .code
        .filter(|code| !code.expose_secret().is_empty())
    else {
        return Ok(back("error", Some("no_code")));
    };
    let exchanged = match &grant {
        Grant::Standard(app) => {
            let verifier = app
                .pkce
                .then(|| SecretString::from(verifier_of(cookie, &state)));
            app.exchange_code(
                &provider_settings.http,
                &code,
                &callback_url(connect),
                verifier.as_ref(),
            )
            .await
        }
        Grant::Shopify(app, shop) => {
            exchange_on_shop(clients, provider_settings, app, shop, &code).await
        }
    };
    let exchanged = match exchanged {
        Ok(exchanged) => exchanged,
        Err(error) => {
            tracing::warn!(session_id = session.id, provider, %error, "Exchanging an authorization code from the Connect page failed; nothing was stored.");
            return Ok(back("error", Some("token_exchange_failed")));
        }
    };
    let account_id = match exchanged.account_id {
        Some(account_id) => Some(account_id),
        None => account_of(provider_settings, &exchanged.credentials).await,
    };
    let base_url = match &grant {
        Grant::Shopify(_, shop) => Some(shop.origin().origin().ascii_serialization()),
        Grant::Standard(_) => None,
    };
    let account = Account {
        credentials: exchanged.credentials,
        account_id,
        base_url,
    };
    let txn = db.begin().await?;
    connect_in(txn, db, settings, &session, &provider, account).await
}

/// Shopify's grant for a session that kept `kept`, when the callback is signed with the
/// app's secret and names that shop; else why not, with nothing spent.
fn shopify_grant(
    provider_settings: &ProviderSettings,
    session: &connect_session::Model,
    kept: &str,
    callback: &Callback,
) -> Result<Grant, ConnectError> {
    let provider = provider_settings.name.as_str();
    let app = provider_settings
        .adapter
        .shopify_app()
        .ok_or_else(|| ConnectError::NotOffered(provider.to_string()))?;
    let refused = |why: &str| {
        tracing::warn!(
            session_id = session.id,
            provider,
            why,
            "A Shopify callback was refused; nothing was stored."
        );
        ConnectError::BadCallback(
            "Shopify's answer could not be checked; start again from the app".to_string(),
        )
    };
    match app.callback_is_signed(&callback.raw_query) {
        Ok(true) => {}
        Ok(false) => return Err(refused("its hmac is not the app's signature")),
        Err(error) => {
            tracing::error!(provider, %error, "The Shopify app's client secret cannot be read.");
            return Err(refused("the client secret cannot be read"));
        }
    }
    if callback.shop.as_deref() != Some(kept) {
        return Err(refused("its shop is not the one the user named"));
    }
    let shop = Shop::parse(kept).map_err(|_| refused("the kept shop is not a shop"))?;
    Ok(Grant::Shopify(app, shop))
}

/// Exchanges `code` on `shop` with the client `clients` gives.
async fn exchange_on_shop(
    clients: &ShopifyClients,
    provider_settings: &ProviderSettings,
    app: &ShopifyApp,
    shop: &Shop,
    code: &SecretString,
) -> Result<Exchanged, FetchError> {
    let client = clients.client_for(provider_settings)?;
    app.exchange_code(&client, shop, code).await
}

/// `public_url` + `/connect/callback`: the `redirect_uri` registered with each provider,
/// sent alike in the authorization request and the token request.
pub(crate) fn callback_url(connect: &ConnectSettings) -> String {
    let mut url = connect.public_url.clone();
    push_callback(&mut url);
    url.to_string()
}

fn callback_path(connect: &ConnectSettings) -> String {
    let mut url = connect.public_url.clone();
    push_callback(&mut url);
    url.path().to_string()
}

fn push_callback(url: &mut url::Url) {
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.pop_if_empty().push("connect").push("callback");
    }
}

/// The PKCE verifier (RFC 7636 §4.1) of `state` in the browser holding `cookie`: 43
/// characters of base64url, derived, never stored.
fn verifier_of(cookie: &str, state: &str) -> String {
    match Hmac::<Sha256>::new_from_slice(cookie.as_bytes()) {
        Ok(mut mac) => {
            mac.update(b"tributary connect pkce ");
            mac.update(state.as_bytes());
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
        }
        // HMAC takes a key of any length: unreachable.
        Err(_) => random_token(),
    }
}

/// The S256 challenge of `verifier` (RFC 7636 §4.2).
fn challenge_of(verifier: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_verifier_is_bound_to_the_cookie_and_the_state_and_is_a_valid_pkce_verifier() {
        let verifier = super::verifier_of("cookie", "state");
        assert_eq!(verifier, super::verifier_of("cookie", "state"));
        assert_ne!(verifier, super::verifier_of("other", "state"));
        assert_ne!(verifier, super::verifier_of("cookie", "other"));
        assert_eq!(verifier.len(), 43);
        // RFC 7636 appendix B's example.
        assert_eq!(
            super::challenge_of("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }
}
