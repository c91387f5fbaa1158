//! The authorization code grant with PKCE on the Connect page (docs/decisions/connect.md):
//! a provider's button sends the browser to the provider's authorization endpoint with a
//! fresh `state`, and the one callback path, `public_url/connect/callback`, finds the
//! session by that `state`, checks the browser's cookie, marks the session used and only
//! then exchanges the code, once.
//!
//! The row keeps SHA-256 of `state`. The PKCE verifier is not stored at all: it is an
//! HMAC of `state` keyed by the browser's cookie, so only the bound browser's callback
//! can produce it again, and a copy of the database gives nothing to redeem a code with.

use base64::Engine;
use hmac::{Hmac, Mac};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, TransactionTrait};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

use super::{
    account_of, bound_cookie, connect_in, hash, live_session, mark_used, offered_provider, outcome,
    random_token, Account, ConnectError,
};
use crate::config::{ConnectSettings, Settings};
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
    // A later button press replaces the state: only the newest authorization completes.
    let begun = connect_session::Entity::update_many()
        .col_expr(
            connect_session::Column::StateHash,
            Expr::value(Some(hash(&state))),
        )
        .col_expr(
            connect_session::Column::OauthProvider,
            Expr::value(Some(provider.to_string())),
        )
        .filter(connect_session::Column::Id.eq(session.id))
        .filter(connect_session::Column::UsedAt.is_null())
        .exec(db.main())
        .await?;
    if begun.rows_affected == 0 {
        return Err(ConnectError::Used);
    }
    let challenge = app.pkce.then(|| challenge_of(&verifier_of(cookie, &state)));
    let location = app
        .authorization_url(&callback_url(connect), &state, challenge.as_deref())
        .to_string();
    tracing::info!(
        session_id = session.id,
        provider,
        "The Connect page sent a browser to the provider's authorization."
    );
    Ok(Some(Authorization {
        location,
        cookie: cookie.to_string(),
        cookie_path: callback_path(connect),
        cookie_max_age: session
            .expires_at
            .signed_duration_since(crate::db::now())
            .num_seconds()
            .max(1),
    }))
}

/// The provider's redirect back, as its query gave it.
#[derive(Default)]
pub(crate) struct Callback {
    pub code: Option<SecretString>,
    pub state: Option<String>,
    /// `error` (RFC 6749 §4.1.2.1), e.g. `access_denied`.
    pub error: Option<String>,
}

/// Completes an authorization: the session found by `state`, the cookie checked, the
/// session marked used, the code exchanged once and the connection stored. Returns where
/// to send the browser: the session's return URL with the outcome.
pub(crate) async fn complete(
    db: &DatabasePools,
    settings: &Settings,
    callback: Callback,
    cookie: Option<&str>,
) -> Result<String, ConnectError> {
    let connect = settings.connect.as_ref().ok_or(ConnectError::Off)?;
    let state = callback.state.ok_or_else(|| {
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
    let app = provider_settings
        .adapter
        .authorization()
        .ok_or_else(|| ConnectError::NotOffered(provider.clone()))?;
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
    let verifier = app
        .pkce
        .then(|| SecretString::from(verifier_of(cookie, &state)));
    let exchanged = app
        .exchange_code(
            &provider_settings.http,
            &code,
            &callback_url(connect),
            verifier.as_ref(),
        )
        .await;
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
    let account = Account {
        credentials: exchanged.credentials,
        account_id,
    };
    let txn = db.begin().await?;
    connect_in(txn, db, settings, &session, &provider, account).await
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
