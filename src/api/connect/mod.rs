//! Connect (docs/decisions/connect.md): `POST /v1/connect/sessions`, where the app asks
//! for a user's single-use link, and the page that link opens, `/connect/{token}`:
//! server-rendered HTML with no script and no outside asset, one button per provider,
//! a key form per provider that takes a key, a shop form for a Shopify app. Errors are
//! pages in plain words.

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use chrono::{DateTime, Utc};
use maud::{html, Markup, PreEscaped, DOCTYPE};
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::{Authorized, ConnectionsWrite};
use super::input::Json;
use super::problem::Problem;
use super::state::ApiState;
use crate::ops::connect::oauth::{self, Callback, ShopForm, ShopSubmission};
use crate::ops::connect::{self as ops, ConnectError, KeySubmission};

/// The cookie that binds a session to the browser that first opened it.
const COOKIE: &str = "tributary_connect";
/// The same cookie for the callback's path, set when the browser leaves to authorize.
const CALLBACK_COOKIE: &str = "tributary_connect_callback";
/// The longest callback query taken: a code and a state are a few hundred bytes.
const MAX_CALLBACK_QUERY_BYTES: usize = 8192;
/// The largest key form body: a key of `MAX_KEY_BYTES`, percent-encoded, and the token.
const MAX_FORM_BYTES: usize = 3 * ops::MAX_KEY_BYTES + 256;
/// Where the shop form's answer redirects: any shop's own host (Chromium holds a form's
/// redirect to `form-action`).
const SHOPS: &str = "https://*.myshopify.com";
/// The page's one stylesheet, allowed by its hash.
const CSS: &str = "body{font-family:system-ui,sans-serif;margin:0;padding:1rem;color:#1a1a1a;background:#f6f6f6}main{max-width:28rem;margin:2rem auto;background:#fff;padding:1.5rem;border-radius:.5rem}h1{font-size:1.4rem}button,.button{display:block;width:100%;box-sizing:border-box;padding:.8rem;margin:.5rem 0;font-size:1rem;border:1px solid #333;border-radius:.4rem;background:#fff;color:#1a1a1a;text-align:center;text-decoration:none;cursor:pointer}button:focus,input:focus,a:focus{outline:3px solid #0a58ca;outline-offset:2px}label{display:block;font-weight:600;margin-top:1rem}input{width:100%;box-sizing:border-box;padding:.6rem;font-size:1rem;margin:.3rem 0 .8rem}.hint{color:#555;font-size:.9rem}.error{color:#9b1c1c;background:#fdecec;padding:.6rem;border-radius:.3rem}";

/// A connect session to create.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewSessionBody {
    /// The user's id in the app: the connection made is theirs.
    #[schema(min_length = 1, max_length = 255)]
    user_id: String,
    /// The `[providers.NAME]` tables the user may connect, each one that takes a key.
    #[schema(min_items = 1, max_items = 32)]
    providers: Vec<String>,
    /// Where the user is sent back, with `outcome=connected` (or `outcome=error&code=...`):
    /// one of `[connect] return_urls`, matched exactly.
    return_url: String,
    /// A connection of the user whose credentials the session replaces, keeping its
    /// records and cursors; `providers` then names its provider alone.
    #[schema(minimum = 1)]
    reconnect: Option<i64>,
}

/// A session's link, shown once: the database keeps only its hash.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ConnectSession {
    /// The page to send the user to; single use.
    url: String,
    /// When the link stops working (`[connect] session_ttl` after it was made).
    expires_at: DateTime<Utc>,
}

/// Create a connect session: a single-use link where the user connects their own account.
#[utoipa::path(
    post,
    path = "/v1/connect/sessions",
    request_body = NewSessionBody,
    security(("bearer" = ["connections:write"])),
    responses(
        (status = 201, description = "The session; its `url` is shown once", body = ConnectSession),
        (status = 400, description = "A body field is wrong (a return URL off the allow-list, an unknown provider, a bad user id)", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "The key lacks connections:write", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Connect is off: config.toml has no [connect] table", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "The body is larger than [api] max_body_bytes", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not JSON", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(crate) async fn create_session(
    _caller: Authorized<ConnectionsWrite>,
    State(state): State<ApiState>,
    Json(body): Json<NewSessionBody>,
) -> Result<(StatusCode, axum::Json<ConnectSession>), Problem> {
    let new = ops::NewSession {
        user_id: body.user_id,
        providers: body.providers,
        return_url: body.return_url,
        reconnect: body.reconnect,
    };
    let created = ops::create_session(&state.db, &state.settings, new).await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(ConnectSession {
            url: created.url,
            expires_at: created.expires_at,
        }),
    ))
}

/// The page's routes, outside `/v1` and its keys: the link is the credential.
pub(crate) fn pages() -> Router<ApiState> {
    use axum::routing::get;
    Router::new()
        .route("/connect/callback", get(callback))
        .route("/connect/{token}", get(session_page))
        .route("/connect/{token}/{provider}", get(key_page).post(post_key))
        .layer(axum::middleware::map_response(page_headers))
}

/// The session's page: one button per provider.
async fn session_page(
    State(state): State<ApiState>,
    Path(token): Path<String>,
    headers: HeaderMap,
) -> Response {
    let cookie = cookie_of(&headers, COOKIE);
    match ops::open_page(&state.db, &state.settings, &token, cookie.as_deref()).await {
        Ok(view) => {
            let title = match view.reconnect {
                true => "Reconnect your account",
                false => "Connect your account",
            };
            let body = html! {
                h1 { (title) }
                p { "Choose the service to connect." }
                @for (provider, path) in &view.providers {
                    form method="get" action=(path) {
                        button type="submit" { "Connect " (provider) }
                    }
                }
            };
            let mut response = (StatusCode::OK, page(title, body)).into_response();
            if let Some(value) = &view.new_cookie {
                set_cookie(
                    &state,
                    &mut response,
                    COOKIE,
                    value,
                    &view.cookie_path,
                    view.cookie_max_age,
                );
            }
            // A button's answer may redirect to a provider's authorization endpoint, and
            // browsers hold the redirect to the form's policy.
            with_policy(response, &view.authorize_origins.join(" "))
        }
        Err(error) => error_page(&error),
    }
}

/// Sets cookie `name` on `response`: HttpOnly, SameSite=Lax (sent on the provider's
/// redirect back, a top-level GET), Secure under https.
fn set_cookie(
    state: &ApiState,
    response: &mut Response,
    name: &str,
    value: &str,
    path: &str,
    max_age: i64,
) {
    let secure = state
        .settings
        .connect
        .as_ref()
        .is_some_and(|connect| connect.secure());
    let cookie = format!(
        "{name}={value}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Lax{}",
        if secure { "; Secure" } else { "" }
    );
    if let Ok(cookie) = HeaderValue::from_str(&cookie) {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
}

/// A provider's button: a redirect to its authorization endpoint when it has an OAuth2
/// application, else its key form.
async fn key_page(
    State(state): State<ApiState>,
    Path((token, provider)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let cookie = cookie_of(&headers, COOKIE);
    match oauth::begin(
        &state.db,
        &state.settings,
        &token,
        &provider,
        cookie.as_deref(),
    )
    .await
    {
        Ok(Some(authorization)) => return to_authorization(&state, &authorization),
        Ok(None) => {}
        Err(error) => return error_page(&error),
    }
    match oauth::shop_form(
        &state.db,
        &state.settings,
        &token,
        &provider,
        cookie.as_deref(),
    )
    .await
    {
        Ok(Some(form)) => return shop_page(&form, StatusCode::OK, None),
        Ok(None) => {}
        Err(error) => return error_page(&error),
    }
    form_page(
        &state,
        &token,
        &provider,
        cookie.as_deref(),
        StatusCode::OK,
        None,
    )
    .await
}

/// The redirect to a provider's authorization, setting the cookie the callback checks.
fn to_authorization(state: &ApiState, authorization: &oauth::Authorization) -> Response {
    let Ok(location) = HeaderValue::from_str(&authorization.location) else {
        return error_page(&ConnectError::BadCallback(
            "the provider's authorization address cannot be sent".to_string(),
        ));
    };
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response();
    set_cookie(
        state,
        &mut response,
        CALLBACK_COOKIE,
        &authorization.cookie,
        &authorization.cookie_path,
        authorization.cookie_max_age,
    );
    response
}

/// Shopify's shop form, with `message` above it when the last try failed.
fn shop_page(form: &ShopForm, status: StatusCode, message: Option<String>) -> Response {
    let title = format!("Connect {}", form.provider);
    let fields = html! {
        label for="shop" { "Your shop's address" }
        p class="hint" id="shop-hint" { "Its myshopify.com address, e.g. example.myshopify.com (or example alone). Shopify asks you to approve the access next." }
        input type="text" id="shop" name="shop" required autocomplete="off" autocapitalize="none" spellcheck="false" aria-describedby="shop-hint";
        button type="submit" { "Continue to Shopify" }
    };
    let body = form_body(
        &title,
        message.as_deref(),
        (&form.action, &form.csrf),
        fields,
        &form.back,
    );
    with_policy((status, page(&title, body)).into_response(), SHOPS)
}

/// The shop posted: checked, then the browser sent to the shop's authorization page.
async fn post_shop(
    state: &ApiState,
    token: &str,
    provider: &str,
    cookie: Option<&str>,
    form: KeyFields,
) -> Response {
    let typed = form.shop.unwrap_or_default();
    let submission = ShopSubmission {
        token,
        provider,
        cookie,
        csrf: form.csrf.as_deref(),
        shop: &typed,
    };
    match oauth::begin_shop(&state.db, &state.settings, submission).await {
        Ok(authorization) => to_authorization(state, &authorization),
        // The user may type it again: the form, with what went wrong above it.
        Err(error @ ConnectError::BadForm(_)) => {
            match oauth::shop_form(&state.db, &state.settings, token, provider, cookie).await {
                Ok(Some(form)) => shop_page(&form, status_of(&error), Some(error.to_string())),
                Ok(None) => error_page(&error),
                Err(error) => error_page(&error),
            }
        }
        Err(error) => error_page(&error),
    }
}

/// The key form, with `message` above it when the last try failed.
async fn form_page(
    state: &ApiState,
    token: &str,
    provider: &str,
    cookie: Option<&str>,
    status: StatusCode,
    message: Option<String>,
) -> Response {
    let form = match ops::key_form(&state.db, &state.settings, token, provider, cookie).await {
        Ok(form) => form,
        Err(error) => return error_page(&error),
    };
    let title = format!("Connect {}", form.provider);
    let fields = html! {
        label for="key" { "Your " (form.provider) " key" }
        p class="hint" id="key-hint" { (form.hint) }
        input type="password" id="key" name="key" required autocomplete="off" aria-describedby="key-hint";
        button type="submit" { "Connect" }
    };
    let body = form_body(
        &title,
        message.as_deref(),
        (&form.action, &form.csrf),
        fields,
        &form.back,
    );
    // The form's answer sends the browser to the return URL: the policy must allow it.
    let return_origin = form.return_origin.as_deref().unwrap_or_default();
    with_policy((status, page(&title, body)).into_response(), return_origin)
}

/// A form page's body: `title`, `message` above the form when the last try failed, the
/// form posting `fields` and its CSRF token to `action`, and a way `back`.
fn form_body(
    title: &str,
    message: Option<&str>,
    (action, csrf): (&str, &str),
    fields: Markup,
    back: &str,
) -> Markup {
    html! {
        h1 { (title) }
        @if let Some(message) = message {
            p class="error" role="alert" { (message) }
        }
        form method="post" action=(action) {
            input type="hidden" name="csrf" value=(csrf);
            (fields)
        }
        a class="button" href=(back) { "Back" }
    }
}

/// `response` with the page's policy, its forms' answers allowed to redirect to
/// `origins`.
fn with_policy(mut response: Response, origins: &str) -> Response {
    if let Ok(policy) = HeaderValue::from_str(&policy(origins)) {
        response
            .headers_mut()
            .insert(header::CONTENT_SECURITY_POLICY, policy);
    }
    response
}

/// The key posted: checked at the provider, then stored, and the browser sent back.
async fn post_key(
    State(state): State<ApiState>,
    Path((token, provider)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let cookie = cookie_of(&headers, COOKIE);
    let form = match read_form(&headers, &body) {
        Ok(form) => form,
        Err(error) => return error_page(&error),
    };
    if form.shop.is_some() {
        return post_shop(&state, &token, &provider, cookie.as_deref(), form).await;
    }
    let submission = KeySubmission {
        token: &token,
        provider: &provider,
        cookie: cookie.as_deref(),
        csrf: form.csrf.as_deref(),
        key: form
            .key
            .unwrap_or_else(|| SecretString::from(String::new())),
    };
    match ops::submit_key(&state.db, &state.settings, submission).await {
        Ok(location) => match HeaderValue::from_str(&location) {
            Ok(location) => (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response(),
            Err(_) => error_page(&ConnectError::BadForm(
                "the return URL cannot be sent back".to_string(),
            )),
        },
        // The user may try again: the form, with what went wrong above it.
        Err(
            error @ (ConnectError::BadForm(_)
            | ConnectError::KeyRefused { .. }
            | ConnectError::ProviderFailed { .. }),
        ) => {
            let message = Some(error.to_string());
            let status = status_of(&error);
            form_page(
                &state,
                &token,
                &provider,
                cookie.as_deref(),
                status,
                message,
            )
            .await
        }
        Err(error) => error_page(&error),
    }
}

/// The key form's fields, or the shop form's (`shop` instead of `key`).
struct KeyFields {
    csrf: Option<String>,
    key: Option<SecretString>,
    shop: Option<String>,
}

/// Reads the form body: urlencoded, small, each field once, no other field.
fn read_form(headers: &HeaderMap, body: &Bytes) -> Result<KeyFields, ConnectError> {
    if !urlencoded(headers) {
        return Err(ConnectError::BadForm(
            "the form must be sent as application/x-www-form-urlencoded".to_string(),
        ));
    }
    if body.len() > MAX_FORM_BYTES {
        return Err(ConnectError::BadForm(format!(
            "the form is larger than {MAX_FORM_BYTES} bytes"
        )));
    }
    let mut fields = KeyFields {
        csrf: None,
        key: None,
        shop: None,
    };
    for (name, value) in form_urlencoded::parse(body) {
        let seen = match name.as_ref() {
            "csrf" => fields.csrf.replace(value.into_owned()).is_some(),
            "key" => fields
                .key
                .replace(SecretString::from(value.into_owned()))
                .is_some(),
            "shop" => fields.shop.replace(value.into_owned()).is_some(),
            other => {
                return Err(ConnectError::BadForm(format!(
                    "the form has an unknown field {:?}",
                    tributary_providers::quote::truncated(other, 32)
                )))
            }
        };
        if seen {
            return Err(ConnectError::BadForm(format!(
                "the form sent {name} more than once"
            )));
        }
    }
    if fields.key.is_some() && fields.shop.is_some() {
        return Err(ConnectError::BadForm(
            "the form sent both a key and a shop".to_string(),
        ));
    }
    Ok(fields)
}

/// Whether the body is a form, `application/x-www-form-urlencoded`.
pub(super) fn urlencoded(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            let essence = value.split(';').next().unwrap_or_default().trim();
            essence.eq_ignore_ascii_case("application/x-www-form-urlencoded")
        })
}

/// The value of cookie `name` the request carries, if any.
pub(super) fn cookie_of(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(found, _)| *found == name)
        .map(|(_, value)| value.to_string())
}

/// The provider's redirect back: the code exchanged and the browser sent to the return
/// URL with the outcome, or a page saying why not.
async fn callback(
    State(state): State<ApiState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let cookie = cookie_of(&headers, CALLBACK_COOKIE);
    let callback = match read_callback(query.as_deref().unwrap_or_default()) {
        Ok(callback) => callback,
        Err(error) => return error_page(&error),
    };
    let completed = oauth::complete(
        &state.db,
        &state.settings,
        &state.shopify_clients,
        callback,
        cookie.as_deref(),
    )
    .await;
    match completed {
        Ok(location) => match HeaderValue::from_str(&location) {
            Ok(location) => (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response(),
            Err(_) => error_page(&ConnectError::BadCallback(
                "the return URL cannot be sent back".to_string(),
            )),
        },
        Err(error) => error_page(&error),
    }
}

/// Reads the callback's query: small, and `code`, `state`, `error` and `shop` each at most
/// once; other parameters (a provider's `scope`, `error_description`) are ignored but
/// kept in the raw query, which Shopify signs whole.
fn read_callback(query: &str) -> Result<Callback, ConnectError> {
    if query.len() > MAX_CALLBACK_QUERY_BYTES {
        return Err(ConnectError::BadCallback(format!(
            "the provider's answer is larger than {MAX_CALLBACK_QUERY_BYTES} bytes; start again from the app"
        )));
    }
    let mut callback = Callback {
        raw_query: query.to_string(),
        ..Callback::default()
    };
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        let seen = match name.as_ref() {
            "code" => callback
                .code
                .replace(SecretString::from(value.into_owned()))
                .is_some(),
            "state" => callback.state.replace(value.into_owned()).is_some(),
            "error" => callback.error.replace(value.into_owned()).is_some(),
            "shop" => callback.shop.replace(value.into_owned()).is_some(),
            _ => false,
        };
        if seen {
            return Err(ConnectError::BadCallback(format!(
                "the provider's answer has {name} more than once; start again from the app"
            )));
        }
    }
    Ok(callback)
}

/// The status of a page that shows `error`.
fn status_of(error: &ConnectError) -> StatusCode {
    match error {
        ConnectError::Off
        | ConnectError::Unknown
        | ConnectError::NotOffered(_)
        | ConnectError::UnknownAuthorization => StatusCode::NOT_FOUND,
        ConnectError::BadCallback(_) => StatusCode::BAD_REQUEST,
        ConnectError::AccountTaken { .. } => StatusCode::CONFLICT,
        ConnectError::Expired | ConnectError::Used => StatusCode::GONE,
        ConnectError::OtherBrowser | ConnectError::Forged => StatusCode::FORBIDDEN,
        ConnectError::BadForm(_) | ConnectError::KeyRefused { .. } => StatusCode::BAD_REQUEST,
        ConnectError::ProviderFailed { .. } => StatusCode::BAD_GATEWAY,
        ConnectError::Ops(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// An error as a page: its status and what to do, in plain words.
fn error_page(error: &ConnectError) -> Response {
    let status = status_of(error);
    let message = match error {
        ConnectError::Ops(error) => {
            tracing::error!(%error, "A Connect page failed.");
            "Something went wrong on our side; nothing was saved. Try again later.".to_string()
        }
        error => {
            let text = error.to_string();
            let mut chars = text.chars();
            match chars.next() {
                Some(first) => format!("{}{}.", first.to_uppercase(), chars.as_str()),
                None => text,
            }
        }
    };
    let body = html! {
        h1 { "This did not work" }
        p class="error" role="alert" { (message) }
    };
    (status, page("Connect", body)).into_response()
}

/// A whole page around `body`.
fn page(title: &str, body: Markup) -> axum::response::Html<String> {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) }
                style { (PreEscaped(CSS)) }
            }
            body { main { (body) } }
        }
    };
    axum::response::Html(markup.into_string())
}

/// The Content-Security-Policy: nothing but the page's own style and forms (and the
/// return URL's origin, where a form's answer redirects).
fn policy(return_origin: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    let style = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(CSS));
    format!(
        "default-src 'none'; style-src 'sha256-{style}'; form-action 'self' {return_origin}; frame-ancestors 'none'; base-uri 'none'"
    )
    .replace(" ;", ";")
}

/// The headers every Connect answer carries.
pub(super) async fn page_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    if !headers.contains_key(header::CONTENT_SECURITY_POLICY) {
        if let Ok(policy) = HeaderValue::from_str(&policy("")) {
            headers.insert(header::CONTENT_SECURITY_POLICY, policy);
        }
    }
    for (name, value) in [
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests;
