//! Receiving a provider's webhook: verify its signature over the raw body, parse it, and
//! keep it in the `webhook_deliveries` inbox, once per delivery id
//! (docs/decisions/inbound-webhooks.md). Applying it is the inbox worker's.

mod verify;

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};

use sea_orm::{ActiveValue::Set, DatabaseConnection, DbErr, EntityTrait, SqlErr};
use secrecy::SecretString;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::config::{ConfigError, Settings, WebhookScheme, WebhookSettings};
use crate::entities::webhook_delivery::{self, InboxStatus};
use crate::secrets::{sealed_key_id, Binding, Keyring, SecretsError};
use secrecy::ExposeSecret;
pub(crate) use verify::{Headers, Refusal};

/// The longest delivery id kept (the column's length).
const MAX_DELIVERY_ID_LEN: usize = 255;

/// What became of a verified delivery.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Received {
    /// `accepted` when it was stored now, `duplicate` when it had been before.
    pub status: &'static str,
    /// The provider's id of the delivery.
    pub delivery_id: String,
}

/// Why a delivery was not kept.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WebhookError {
    /// No provider of that name receives webhooks.
    #[error("no provider {0:?} receives webhooks")]
    UnknownProvider(String),
    #[error("{0}")]
    Refused(Refusal),
    /// Verified, but not a delivery we can keep: the JSON or its id.
    #[error("{0}")]
    Malformed(String),
    /// Past the provider's `rate_limit`: nothing was kept.
    #[error("more deliveries than the provider's rate_limit of {requests} per {seconds} seconds; retry after {retry_after} s")]
    Limited {
        requests: u64,
        seconds: u64,
        retry_after: u64,
    },
    /// The check on the blocking pool did not finish: the runtime is shutting down.
    #[error("the delivery could not be checked")]
    Interrupted,
    #[error(transparent)]
    Database(#[from] DbErr),
}

/// One request to `/webhooks/{provider}`.
pub(crate) struct Inbound<'a> {
    pub provider: &'a str,
    pub headers: &'a Headers,
    pub body: &'a Bytes,
}

/// Bodies at least this large are verified and parsed on tokio's blocking pool, as the
/// pipeline parses pages: an HMAC and a JSON parse over megabytes would hold a runtime
/// thread that other requests are waiting for.
const CHECK_OFF_THREAD_BYTES: usize = 16 * 1024;

/// A delivery verified and parsed: what its inbox row keeps.
#[derive(Debug)]
struct Checked {
    text: String,
    delivery_id: String,
    event_type: Option<String>,
    account_ids: Option<String>,
}

/// Verifies `inbound` with the provider's `secrets` and stores it unless its delivery id
/// was stored before. Nothing is written for a refused or malformed delivery.
pub(crate) async fn receive(
    db: &DatabaseConnection,
    settings: &Settings,
    secrets: &Arc<BTreeMap<String, Vec<SecretString>>>,
    inbound: Inbound<'_>,
) -> Result<Received, WebhookError> {
    let provider = inbound.provider;
    let unknown = || WebhookError::UnknownProvider(provider.to_string());
    let webhooks = settings
        .providers
        .get(provider)
        .and_then(|settings| settings.webhooks.as_ref())
        .ok_or_else(unknown)?;
    if !secrets.contains_key(provider) {
        return Err(unknown());
    }
    let outcome = store_verified(db, webhooks, secrets, &inbound).await;
    let label = match &outcome {
        Ok(received) => received.status,
        Err(WebhookError::Refused(Refusal::Stale { .. })) => "stale",
        Err(WebhookError::Refused(_)) => "unauthorized",
        Err(WebhookError::Malformed(_)) => "malformed",
        Err(WebhookError::Limited { .. }) => "limited",
        Err(_) => "error",
    };
    record_outcome(provider, label);
    outcome
}

/// Every webhook provider's secrets: from their variables, and `secret`'s opened with
/// `keyring` when sealed (as written when `[secrets] allow_plaintext` let it be literal).
pub(crate) fn secrets(
    settings: &Settings,
    keyring: &Keyring,
) -> Result<BTreeMap<String, Vec<SecretString>>, ConfigError> {
    settings.webhook_secrets(&|provider, written| {
        let written = written.expose_secret();
        if sealed_key_id(written).is_none() {
            return Ok(SecretString::from(written));
        }
        keyring
            .open(binding(&format!("webhooks:{provider}")), written)
            .map(|opened| SecretString::from(opened.as_str()))
            .map_err(|error| match error {
                SecretsError::UnknownKey {
                    key_id, configured, ..
                } => format!(
                    "sealed with key id {key_id}, which is not configured (configured: {configured}); configure that key as [secrets] key_file or in previous_key_files"
                ),
                SecretsError::Decrypt { key_id, .. } => format!(
                    "cannot be opened with key id {key_id}: it was sealed for another provider, or altered"
                ),
                _ => "not in the sealed form `tributary secrets seal-webhook` writes".to_string(),
            })
    })
}

/// Seals `secret` for `provider`'s `webhooks.secret` under the current key; refused
/// without one, since a sealed text is the point.
pub(crate) fn seal_secret(
    keyring: &Keyring,
    provider: &str,
    secret: &str,
) -> Result<String, SecretsError> {
    let what = format!("the webhook secret of provider {provider}");
    if keyring.current_key_id().is_none() {
        return Err(SecretsError::NoKey { what });
    }
    keyring.seal(binding(&format!("webhooks:{provider}")), secret, &what)
}

/// A webhook secret is bound to its provider under a name no connection can have
/// (provider names hold no `:`, and user ids are never empty), so a connection's sealed
/// credentials never open as one.
fn binding(scope: &str) -> Binding<'_> {
    Binding {
        user_id: "",
        provider: scope,
    }
}

/// The largest page of the inbox.
pub(crate) const MAX_INBOX_LIMIT: u64 = 1_000;

/// Which deliveries of the inbox to list, newest first.
pub(crate) struct InboxQuery<'a> {
    /// Only this provider's (its name in config.toml).
    pub provider: Option<&'a str>,
    /// Only those standing so (`failed`: still failing after their retries).
    pub status: Option<InboxStatus>,
    /// Only those older than this row id: the `next` of the page before.
    pub before: Option<i64>,
    pub limit: u64,
}

/// The inbox newest first, as `query` filters it, with each delivery's error.
pub(crate) async fn inbox(
    db: &DatabaseConnection,
    query: &InboxQuery<'_>,
) -> Result<super::Page<webhook_delivery::Model>, super::OpsError> {
    use sea_orm::{ColumnTrait, QueryFilter, QueryOrder, QuerySelect};
    let limit = super::check_limit(query.limit, MAX_INBOX_LIMIT)?;
    let mut select = webhook_delivery::Entity::find();
    if let Some(provider) = query.provider {
        select = select.filter(webhook_delivery::Column::Provider.eq(provider));
    }
    if let Some(status) = query.status {
        select = select.filter(webhook_delivery::Column::Status.eq(status));
    }
    if let Some(before) = query.before {
        select = select.filter(webhook_delivery::Column::Id.lt(before));
    }
    let rows = select
        .order_by_desc(webhook_delivery::Column::Id)
        .limit(limit.saturating_add(1))
        .all(db)
        .await?;
    Ok(super::Page::from_rows(rows, limit, |delivery| delivery.id))
}

/// Which deliveries [`replay`] puts back.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ReplayWhich {
    /// The delivery with this row id.
    One(i64),
    /// Every `failed` delivery.
    AllFailed,
}

/// What [`replay`] did.
#[derive(Debug, Default, serde::Serialize)]
pub(crate) struct Replayed {
    /// The `failed` deliveries put back in the inbox, due now.
    pub requeued: Vec<i64>,
    /// Named deliveries that had not failed, left as they are.
    pub not_failed: Vec<i64>,
}

/// Puts `failed` deliveries back as `received`, due `now` with their attempts and error
/// cleared, for the daemons' processing to apply again as it applies any delivery (at
/// least once, with one effect). A delivery that has not failed is left as it is, so a
/// second replay of one does nothing.
pub(crate) async fn replay(
    db: &DatabaseConnection,
    which: ReplayWhich,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Replayed, super::OpsError> {
    use sea_orm::sea_query::Expr;
    use sea_orm::{ColumnTrait, QueryFilter, QuerySelect};
    let mut replayed = Replayed::default();
    let mut failed = webhook_delivery::Entity::find()
        .select_only()
        .column(webhook_delivery::Column::Id)
        .filter(webhook_delivery::Column::Status.eq(InboxStatus::Failed));
    if let ReplayWhich::One(id) = which {
        let exists = webhook_delivery::Entity::find_by_id(id).one(db).await?;
        let Some(delivery) = exists else {
            return Err(super::OpsError::NotFound {
                what: format!("webhook delivery with id {id}"),
                hint: "; `tributary webhooks --failed` lists the failed ones",
            });
        };
        if delivery.status != InboxStatus::Failed {
            replayed.not_failed.push(id);
            return Ok(replayed);
        }
        failed = failed.filter(webhook_delivery::Column::Id.eq(id));
    }
    let ids: Vec<i64> = failed.into_tuple().all(db).await?;
    for chunk in ids.chunks(500) {
        // Only rows still failed: a concurrent replay's rows are not counted twice.
        webhook_delivery::Entity::update_many()
            .col_expr(
                webhook_delivery::Column::Status,
                Expr::value(InboxStatus::Received),
            )
            .col_expr(webhook_delivery::Column::Attempts, Expr::value(0i64))
            .col_expr(webhook_delivery::Column::NextAttemptAt, Expr::value(now))
            .col_expr(
                webhook_delivery::Column::Error,
                Expr::value(Option::<String>::None),
            )
            .filter(webhook_delivery::Column::Id.is_in(chunk.iter().copied()))
            .filter(webhook_delivery::Column::Status.eq(InboxStatus::Failed))
            .exec(db)
            .await?;
        replayed.requeued.extend_from_slice(chunk);
    }
    Ok(replayed)
}

/// Counts a delivery of `provider` that ended in `outcome`.
pub(crate) fn record_outcome(provider: &str, outcome: &'static str) {
    crate::telemetry::record_webhook_delivery(provider, outcome);
}

/// Strava's subscription handshake (`GET /webhooks/{provider}`), as its query gives it.
pub(crate) struct Handshake<'a> {
    pub provider: &'a str,
    pub mode: Option<&'a str>,
    pub challenge: Option<&'a str>,
    pub verify_token: Option<&'a str>,
}

/// The longest `hub.challenge` echoed.
const MAX_CHALLENGE_LEN: usize = 255;

/// Answers Strava's subscription handshake: the challenge to echo when the verify token
/// is the provider's secret. Only a `strava` provider answers one.
pub(crate) fn handshake(
    settings: &Settings,
    secrets: &BTreeMap<String, Vec<SecretString>>,
    handshake: &Handshake<'_>,
) -> Result<String, WebhookError> {
    let provider = handshake.provider;
    let unknown = || WebhookError::UnknownProvider(provider.to_string());
    settings
        .providers
        .get(provider)
        .and_then(|settings| settings.webhooks.as_ref())
        .filter(|webhooks| matches!(webhooks.scheme, WebhookScheme::Strava { .. }))
        .ok_or_else(unknown)?;
    let secrets = secrets.get(provider).ok_or_else(unknown)?;
    let outcome = answer_handshake(secrets, handshake);
    let label = match &outcome {
        Ok(_) => "handshake",
        Err(WebhookError::Refused(_)) => "unauthorized",
        Err(_) => "malformed",
    };
    record_outcome(provider, label);
    outcome
}

fn answer_handshake(
    secrets: &[SecretString],
    handshake: &Handshake<'_>,
) -> Result<String, WebhookError> {
    if handshake.mode != Some("subscribe") {
        return Err(WebhookError::Malformed(
            "hub.mode must be \"subscribe\"".to_string(),
        ));
    }
    verify::verify_token(secrets, handshake.verify_token).map_err(WebhookError::Refused)?;
    handshake
        .challenge
        .filter(|challenge| {
            !challenge.is_empty()
                && challenge.len() <= MAX_CHALLENGE_LEN
                && !challenge.chars().any(char::is_control)
        })
        .map(str::to_string)
        .ok_or_else(|| {
            WebhookError::Malformed(format!(
                "hub.challenge must be 1 to {MAX_CHALLENGE_LEN} bytes without control characters"
            ))
        })
}

/// [`check`]s `inbound` inline when its body is small, else on the blocking pool.
async fn checked(
    webhooks: &WebhookSettings,
    secrets: &Arc<BTreeMap<String, Vec<SecretString>>>,
    inbound: &Inbound<'_>,
    now: DateTime<Utc>,
) -> Result<Checked, WebhookError> {
    if inbound.body.len() < CHECK_OFF_THREAD_BYTES {
        let secrets = secrets.get(inbound.provider).map_or(&[][..], Vec::as_slice);
        return check(webhooks, secrets, inbound.headers, inbound.body, now);
    }
    let (webhooks, all, provider) = (
        webhooks.clone(),
        Arc::clone(secrets),
        inbound.provider.to_string(),
    );
    let (headers, body) = (inbound.headers.clone(), inbound.body.clone());
    tokio::task::spawn_blocking(move || {
        let secrets = all.get(&provider).map_or(&[][..], Vec::as_slice);
        check(&webhooks, secrets, &headers, &body, now)
    })
    .await
    .map_err(|_| WebhookError::Interrupted)?
}

/// Verifies `body` and parses it: the text, the delivery id and the event type.
fn check(
    webhooks: &WebhookSettings,
    secrets: &[SecretString],
    headers: &Headers,
    body: &[u8],
    now: DateTime<Utc>,
) -> Result<Checked, WebhookError> {
    let scheme = &webhooks.scheme;
    verify::verify(scheme, secrets, headers, body, now).map_err(WebhookError::Refused)?;
    let text = std::str::from_utf8(body)
        .map_err(|_| WebhookError::Malformed("the body is not UTF-8 text".into()))?;
    let json: serde_json::Value = serde_json::from_str(text)
        .map_err(|error| WebhookError::Malformed(format!("the body is not JSON: {error}")))?;
    Ok(Checked {
        delivery_id: delivery_id(scheme, headers, &json, body)?,
        event_type: event_type(scheme, headers, &json),
        account_ids: account_ids(webhooks, headers, &json),
        text: text.to_string(),
    })
}

async fn store_verified(
    db: &DatabaseConnection,
    webhooks: &WebhookSettings,
    secrets: &Arc<BTreeMap<String, Vec<SecretString>>>,
    inbound: &Inbound<'_>,
) -> Result<Received, WebhookError> {
    let received_at = crate::db::now();
    let Checked {
        text,
        delivery_id,
        event_type,
        account_ids,
    } = checked(webhooks, secrets, inbound, received_at).await?;
    // Counted only once verified, in the database: forged deliveries cannot spend the
    // provider's budget, and every instance shares it.
    let window = &webhooks.rate_limit;
    let scope = format!("webhooks:{}", inbound.provider);
    if let Some(reopens_at) =
        crate::pipeline::take_one_from(db, &scope, window, received_at).await?
    {
        let wait = reopens_at.signed_duration_since(received_at).num_seconds();
        return Err(WebhookError::Limited {
            requests: window.requests,
            seconds: window.per.as_secs(),
            // Whole seconds, rounded up: a sender that waits this long finds room.
            retry_after: u64::try_from(wait).unwrap_or(0).saturating_add(1),
        });
    }
    let row = webhook_delivery::ActiveModel {
        provider: Set(inbound.provider.to_string()),
        delivery_id: Set(delivery_id.clone()),
        event_type: Set(event_type),
        received_at: Set(received_at),
        body: Set(text),
        status: Set(InboxStatus::Received),
        attempts: Set(0),
        next_attempt_at: Set(received_at),
        error: Set(None),
        applied_at: Set(None),
        account_ids: Set(account_ids),
        ..Default::default()
    };
    // The unique index decides, on every backend and across instances: a second insert
    // of the id is the provider's retry.
    let status = match webhook_delivery::Entity::insert(row).exec(db).await {
        Ok(_) => "accepted",
        Err(error) if matches!(error.sql_err(), Some(SqlErr::UniqueConstraintViolation(_))) => {
            "duplicate"
        }
        Err(error) => return Err(error.into()),
    };
    Ok(Received {
        status,
        delivery_id,
    })
}

/// The provider's id of the delivery (docs/decisions/inbound-webhooks.md).
fn delivery_id(
    scheme: &WebhookScheme,
    headers: &Headers,
    json: &serde_json::Value,
    body: &[u8],
) -> Result<String, WebhookError> {
    let from_header = |names: &[&str]| {
        names
            .iter()
            .find_map(|name| headers.get(&name.to_ascii_lowercase()))
            .map(|value| value.trim().to_string())
            .filter(|value| !value.is_empty())
            .ok_or_else(|| {
                WebhookError::Malformed(format!(
                    "the delivery has no id: expected the {} header",
                    names.join(" or ")
                ))
            })
    };
    let id = match scheme {
        WebhookScheme::Github => from_header(&["X-GitHub-Delivery"])?,
        WebhookScheme::Shopify => from_header(&["X-Shopify-Webhook-Id"])?,
        WebhookScheme::Gitlab => from_header(&["Idempotency-Key", "X-Gitlab-Event-UUID"])?,
        WebhookScheme::Standard => from_header(&["webhook-id"])?,
        WebhookScheme::Stripe => json
            .get("id")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string)
            .filter(|id| !id.is_empty())
            .ok_or_else(|| WebhookError::Malformed("the event has no string `id`".to_string()))?,
        WebhookScheme::Hmac(hmac) => match &hmac.id_header {
            Some(name) => from_header(&[name.as_str()])?,
            None => const_hex::encode(Sha256::digest(body)),
        },
        WebhookScheme::Strava { .. } => strava_event_id(json)?,
    };
    if id.len() > MAX_DELIVERY_ID_LEN || id.chars().any(char::is_control) {
        return Err(WebhookError::Malformed(format!(
            "the delivery id is longer than {MAX_DELIVERY_ID_LEN} bytes or holds control characters"
        )));
    }
    Ok(id)
}

/// A Strava event has no id: it is the event's own fields, which a retry repeats and two
/// different events do not share (`activity:123:update:1516126040:456`).
fn strava_event_id(json: &serde_json::Value) -> Result<String, WebhookError> {
    let text = |name: &str| json.get(name).and_then(serde_json::Value::as_str);
    let number = |name: &str| json.get(name).and_then(serde_json::Value::as_u64);
    match (
        text("object_type"),
        number("object_id"),
        text("aspect_type"),
        number("event_time"),
        number("owner_id"),
    ) {
        (
            Some(object_type),
            Some(object_id),
            Some(aspect_type),
            Some(event_time),
            Some(owner_id),
        ) => Ok(format!(
            "{object_type}:{object_id}:{aspect_type}:{event_time}:{owner_id}"
        )),
        _ => Err(WebhookError::Malformed(
            "the event lacks one of object_type, object_id, aspect_type, event_time and owner_id"
                .to_string(),
        )),
    }
}

/// The provider-side account ids a delivery names, most specific first, separated by
/// spaces (docs/decisions/inbound-webhooks.md); `Some("")` for a Stripe platform's own
/// event, `None` when it names none.
fn account_ids(
    webhooks: &WebhookSettings,
    headers: &Headers,
    json: &serde_json::Value,
) -> Option<String> {
    let at = |pointer: &str| match json.pointer(pointer)? {
        serde_json::Value::String(text) => Some(text.trim().to_string()),
        serde_json::Value::Number(number) => Some(number.to_string()),
        _ => None,
    };
    let mut ids: Vec<String> = match (&webhooks.account_pointer, &webhooks.scheme) {
        (Some(pointer), _) => at(pointer).into_iter().collect(),
        (None, WebhookScheme::Github) => ["/installation/id", "/repository/owner/id", "/sender/id"]
            .iter()
            .filter_map(|pointer| at(pointer))
            .collect(),
        // A platform's own event has no `account`: it concerns the platform's own data,
        // which the connections without an account id (its own key) sync.
        (None, WebhookScheme::Stripe) => match at("/account") {
            Some(account) => vec![account],
            None => return Some(String::new()),
        },
        (None, WebhookScheme::Strava { .. }) => at("/owner_id").into_iter().collect(),
        (None, WebhookScheme::Shopify) => headers
            .get("x-shopify-shop-domain")
            .map(|domain| domain.trim().to_ascii_lowercase())
            .into_iter()
            .collect(),
        (None, WebhookScheme::Gitlab) => ["/project/id", "/project_id", "/user_id", "/user/id"]
            .iter()
            .filter_map(|pointer| at(pointer))
            .collect(),
        (None, WebhookScheme::Standard | WebhookScheme::Hmac(_)) => Vec::new(),
    };
    ids.retain(|id| !id.is_empty() && !id.chars().any(|c| c.is_whitespace() || c.is_control()));
    ids.dedup();
    let joined = ids.join(" ");
    // Longer than the column: no account this side could have stored.
    Some(joined).filter(|joined| !joined.is_empty() && joined.len() <= MAX_DELIVERY_ID_LEN)
}

/// The event's type when the delivery names one, cut to the column's length.
fn event_type(
    scheme: &WebhookScheme,
    headers: &Headers,
    json: &serde_json::Value,
) -> Option<String> {
    let header = |name: &str| headers.get(name).cloned();
    let named = match scheme {
        WebhookScheme::Github => header("x-github-event"),
        WebhookScheme::Shopify => header("x-shopify-topic"),
        WebhookScheme::Gitlab => header("x-gitlab-event"),
        WebhookScheme::Stripe | WebhookScheme::Standard | WebhookScheme::Hmac(_) => json
            .get("type")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string),
        WebhookScheme::Strava { .. } => {
            let field = |name: &str| json.get(name).and_then(serde_json::Value::as_str);
            Some(format!(
                "{}.{}",
                field("object_type")?,
                field("aspect_type")?
            ))
        }
    }?;
    let mut cut = named.trim().to_string();
    while cut.len() > MAX_DELIVERY_ID_LEN {
        cut.pop();
    }
    Some(cut).filter(|cut| !cut.is_empty() && !cut.chars().any(char::is_control))
}

#[cfg(test)]
mod tests;
