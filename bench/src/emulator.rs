//! The benchmark's emulated Stripe: `GET /v1/charges` shaped as Stripe's list API, serving
//! `users` x `records` charges generated on the fly.
//!
//! - Each user is chosen by the bearer token `sk_test_bench_<n>` (n from 1).
//! - Pages are `{"object":"list","url":"/v1/charges","has_more":bool,"data":[...]}`, newest
//!   first, continued with `starting_after` = the last charge's id, at most `limit` (1 to
//!   100, default 10, as Stripe) charges each; `created[gte]` filters as Stripe does.
//! - Charge ids are the same for every user (`ch_3…` with the index encoded in it), so the
//!   key has to keep users apart; the content differs per user.
//! - Every charge is computed from (seed, user, index, generation) when its page is
//!   served: nothing is held in memory, so the emulator adds only its page buffers to the
//!   process's RSS. Generation 0 is the original data; in generation 1 a fixed ~10 % of
//!   the charges (chosen by a hash) were refunded, which changes their content.
//! - `latency` delays every answer, to stand for a remote API.
//! - An optional [`GlobalLimit`] answers 429 past `requests` per window across all
//!   tokens, as an API's per-application limit does; windows are aligned to the Unix
//!   epoch, as tributary's budget windows are.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;

/// The bearer token of user `n` is this prefix followed by `n` (1-based).
pub const TOKEN_PREFIX: &str = "sk_test_bench_";
/// `created` of the newest charge; each next charge is `CREATED_STEP` seconds older.
const NEWEST_CREATED: i64 = 1_780_000_000;
const CREATED_STEP: i64 = 7;
const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
/// The base62 digits of a charge id that encode its index (62^6 > 56 billion).
const INDEX_DIGITS: usize = 6;

/// What the emulator serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dataset {
    pub users: u32,
    pub records_per_user: u64,
    pub seed: u64,
}

impl Dataset {
    /// Whether charge `index` of `user` (1-based) has different content in generation 1.
    pub fn changes(&self, user: u32, index: u64) -> bool {
        mix(self.seed ^ 0xC4A5_6E00, u64::from(user), index).is_multiple_of(10)
    }

    /// How many charges differ between generation 0 and generation 1, over all users.
    pub fn changed_total(&self) -> u64 {
        (1..=self.users)
            .map(|user| {
                (0..self.records_per_user)
                    .filter(|index| self.changes(user, *index))
                    .count() as u64
            })
            .sum()
    }

    /// The id of charge `index`: the same for every user.
    pub fn charge_id(&self, index: u64) -> String {
        let mut id = String::with_capacity(27);
        id.push_str("ch_3");
        push_base62(&mut id, index, INDEX_DIGITS);
        push_base62(&mut id, mix(self.seed, 0, index), 11);
        push_base62(&mut id, mix(self.seed, 1, index), 6);
        id
    }

    /// The index a charge id encodes, if it is one of ours.
    fn index_of(&self, id: &str) -> Option<u64> {
        let digits = id.strip_prefix("ch_3")?.get(..INDEX_DIGITS)?;
        let index = digits.bytes().try_fold(0u64, |value, byte| {
            let digit = BASE62.iter().position(|b| *b == byte)? as u64;
            value.checked_mul(62)?.checked_add(digit)
        })?;
        (index < self.records_per_user && self.charge_id(index) == id).then_some(index)
    }

    /// Appends charge `index` of `user` as Stripe would send it (fields in Stripe's order,
    /// not sorted).
    pub fn write_charge(&self, out: &mut String, user: u32, index: u64, generation: u32) {
        let h = mix(self.seed, u64::from(user) + 2, index);
        let amount = 500 + (h % 49_500);
        let refunded = generation > 0 && self.changes(user, index);
        let amount_refunded = if refunded { amount } else { 0 };
        let created = NEWEST_CREATED - index as i64 * CREATED_STEP;
        let (city, postal_code) = CITIES[(h >> 20) as usize % CITIES.len()];
        let (name, email) = NAMES[(h >> 28) as usize % NAMES.len()];
        let currency = ["eur", "usd", "gbp"][(h >> 36) as usize % 3];
        let _ = write!(
            out,
            r#"{{"id":"{id}","object":"charge","amount":{amount},"amount_refunded":{amount_refunded},"billing_details":{{"address":{{"city":"{city}","country":"DE","line1":"{street} Hauptstrasse","line2":null,"postal_code":"{postal_code}","state":null}},"email":"{email}@example.com","name":"{name}"}},"captured":true,"created":{created},"currency":"{currency}","customer":"cus_"#,
            id = self.charge_id(index),
            street = 1 + (h >> 44) % 200,
        );
        push_base62(out, mix(self.seed, u64::from(user), 0), 14);
        let _ = write!(
            out,
            r#"","description":"Order {order} for user {user}","metadata":{{"order_id":"{order}"}},"payment_method":"pm_"#,
            order = 100_000 + index,
        );
        push_base62(out, h.rotate_left(17), 14);
        out.push_str(r#"","receipt_url":"https://pay.stripe.com/receipts/acct_bench/ch_"#);
        push_base62(out, h.rotate_left(31), 16);
        let _ = write!(out, r#"","refunded":{refunded},"status":"succeeded"}}"#);
    }
}

const CITIES: [(&str, &str); 6] = [
    ("Berlin", "10115"),
    ("Hamburg", "20095"),
    ("Munich", "80331"),
    ("Cologne", "50667"),
    ("Leipzig", "04109"),
    ("Dresden", "01067"),
];
const NAMES: [(&str, &str); 6] = [
    ("Ada Lovelace", "ada.lovelace"),
    ("Grace Hopper", "grace.hopper"),
    ("Alan Turing", "alan.turing"),
    ("Edsger Dijkstra", "edsger.dijkstra"),
    ("Barbara Liskov", "barbara.liskov"),
    ("Donald Knuth", "donald.knuth"),
];

/// A 64-bit mix of three numbers (splitmix64 finaliser).
fn mix(seed: u64, a: u64, b: u64) -> u64 {
    let mut z = seed
        .wrapping_add(a.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(b.wrapping_mul(0xD1B5_4A32_D192_ED03))
        .wrapping_add(0x2545_F491_4F6C_DD1D);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Appends `digits` base62 digits of `value`, most significant first.
fn push_base62(out: &mut String, mut value: u64, digits: usize) {
    let mut buffer = [b'0'; 16];
    for slot in buffer[..digits].iter_mut().rev() {
        *slot = BASE62[(value % 62) as usize];
        value /= 62;
    }
    out.extend(buffer[..digits].iter().map(|byte| char::from(*byte)));
}

struct Shared {
    dataset: Dataset,
    latency: Duration,
    generation: AtomicU32,
    pages_served: AtomicU64,
    limit: Option<GlobalLimit>,
    /// The current window's start (Unix seconds) and the requests counted in it.
    window: std::sync::Mutex<(u64, u64)>,
    rate_limited: AtomicU64,
}

/// An application-wide request limit: `requests` per `window`, all tokens together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlobalLimit {
    pub requests: u64,
    pub window: Duration,
}

impl Shared {
    /// Counts one request; false when the window has no room left.
    fn admit(&self) -> bool {
        let Some(limit) = self.limit else {
            return true;
        };
        let seconds = limit.window.as_secs().max(1);
        // The database's clock, as the daemons' budgets count by it: the bench checks
        // that instances share one budget, not that two clocks agree to the millisecond
        // at a window's edge (a real provider's windows are its own; its 429 is retried).
        let now = u64::try_from(tributary::db::now().timestamp()).unwrap_or_default();
        let start = now - now % seconds;
        let mut window = match self.window.lock() {
            Ok(window) => window,
            Err(poisoned) => poisoned.into_inner(),
        };
        if window.0 != start {
            *window = (start, 0);
        }
        if window.1 >= limit.requests {
            return false;
        }
        window.1 += 1;
        true
    }
}

/// A running emulator.
pub struct Emulator {
    shared: Arc<Shared>,
    address: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Emulator {
    /// Binds an ephemeral loopback port and serves in the background.
    pub async fn start(dataset: Dataset, latency: Duration) -> std::io::Result<Emulator> {
        Emulator::start_limited(dataset, latency, None).await
    }

    /// As [`Emulator::start`], answering 429 past `limit`.
    pub async fn start_limited(
        dataset: Dataset,
        latency: Duration,
        limit: Option<GlobalLimit>,
    ) -> std::io::Result<Emulator> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared {
            dataset,
            latency,
            generation: AtomicU32::new(0),
            pages_served: AtomicU64::new(0),
            limit,
            window: std::sync::Mutex::new((0, 0)),
            rate_limited: AtomicU64::new(0),
        });
        let app = Router::new()
            .route("/v1/charges", get(list_charges))
            .route("/v1/events", get(list_events))
            .with_state(shared.clone());
        let server = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::error!(%error, "The benchmark's emulated API stopped.");
            }
        });
        Ok(Emulator {
            shared,
            address,
            server,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Switches the data served from now on (0: original, 1: ~10 % refunded).
    pub fn set_generation(&self, generation: u32) {
        self.shared.generation.store(generation, Ordering::SeqCst);
    }

    /// Successful list pages served so far.
    pub fn pages_served(&self) -> u64 {
        self.shared.pages_served.load(Ordering::Relaxed)
    }

    /// Requests answered 429 by the global limit so far.
    pub fn rate_limited(&self) -> u64 {
        self.shared.rate_limited.load(Ordering::Relaxed)
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.server.abort();
    }
}

#[derive(Deserialize)]
struct ListQuery {
    limit: Option<String>,
    starting_after: Option<String>,
    ending_before: Option<String>,
    #[serde(rename = "created[gte]")]
    created_gte: Option<String>,
}

async fn list_charges(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(query): Query<ListQuery>,
) -> Response {
    if !shared.latency.is_zero() {
        tokio::time::sleep(shared.latency).await;
    }
    let dataset = &shared.dataset;
    let user = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .and_then(|token| token.strip_prefix(TOKEN_PREFIX))
        .and_then(|number| number.parse::<u32>().ok())
        .filter(|user| (1..=dataset.users).contains(user));
    let Some(user) = user else {
        return stripe_error(StatusCode::UNAUTHORIZED, "Invalid API Key provided.");
    };
    if !shared.admit() {
        shared.rate_limited.fetch_add(1, Ordering::Relaxed);
        // Stripe's answer past its rate limit.
        return stripe_error(
            StatusCode::TOO_MANY_REQUESTS,
            "Too many requests hit the API too quickly.",
        );
    }
    if query.ending_before.is_some() {
        return stripe_error(StatusCode::BAD_REQUEST, "ending_before is not emulated.");
    }
    let limit = match query.limit.as_deref().map(str::parse::<u64>) {
        None => 10,
        Some(Ok(limit)) if (1..=100).contains(&limit) => limit,
        Some(_) => {
            return stripe_error(
                StatusCode::BAD_REQUEST,
                "Invalid integer: limit must be between 1 and 100.",
            )
        }
    };
    let start = match query.starting_after.as_deref() {
        None => 0,
        Some(id) => match dataset.index_of(id) {
            Some(index) => index + 1,
            None => return stripe_error(StatusCode::NOT_FOUND, "No such charge."),
        },
    };
    // Newest first: charge i was created at NEWEST_CREATED - i * CREATED_STEP.
    let listed = match query.created_gte.as_deref().map(str::parse::<i64>) {
        None => dataset.records_per_user,
        Some(Ok(gte)) if gte > NEWEST_CREATED => 0,
        Some(Ok(gte)) => {
            let newer = (NEWEST_CREATED - gte) / CREATED_STEP + 1;
            dataset.records_per_user.min(newer as u64)
        }
        Some(Err(_)) => return stripe_error(StatusCode::BAD_REQUEST, "Invalid created[gte]."),
    };
    let end = listed.min(start.saturating_add(limit));
    let generation = shared.generation.load(Ordering::SeqCst);
    let mut body = String::with_capacity(64 + (end.saturating_sub(start) as usize) * 700);
    body.push_str(r#"{"object":"list","url":"/v1/charges","has_more":"#);
    body.push_str(if end < listed { "true" } else { "false" });
    body.push_str(r#","data":["#);
    for index in start..end {
        if index > start {
            body.push(',');
        }
        dataset.write_charge(&mut body, user, index, generation);
    }
    body.push_str("]}");
    shared.pages_served.fetch_add(1, Ordering::Relaxed);
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// `GET /v1/events`, which an incremental run of the charges stream reads: no event
/// since any time (the charges do not change between generations' runs here), as an
/// empty Stripe list, under the same token check and global limit as the charges.
async fn list_events(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if !shared.latency.is_zero() {
        tokio::time::sleep(shared.latency).await;
    }
    let known = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .and_then(|token| token.strip_prefix(TOKEN_PREFIX))
        .and_then(|number| number.parse::<u32>().ok())
        .is_some_and(|user| (1..=shared.dataset.users).contains(&user));
    if !known {
        return stripe_error(StatusCode::UNAUTHORIZED, "Invalid API Key provided.");
    }
    if !shared.admit() {
        shared.rate_limited.fetch_add(1, Ordering::Relaxed);
        return stripe_error(
            StatusCode::TOO_MANY_REQUESTS,
            "Too many requests hit the API too quickly.",
        );
    }
    shared.pages_served.fetch_add(1, Ordering::Relaxed);
    (
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"object":"list","url":"/v1/events","has_more":false,"data":[]}"#,
    )
        .into_response()
}

fn stripe_error(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({
        "error": { "type": "invalid_request_error", "message": message }
    });
    (status, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATA: Dataset = Dataset {
        users: 3,
        records_per_user: 1000,
        seed: 42,
    };

    #[test]
    fn charges_are_realistic_json_of_about_600_bytes() {
        let mut text = String::new();
        DATA.write_charge(&mut text, 2, 17, 0);
        let charge: serde_json::Value = serde_json::from_str(&text).unwrap();
        let fields = charge.as_object().unwrap();
        assert!((15..=18).contains(&fields.len()), "{} fields", fields.len());
        assert!(
            (550..=700).contains(&text.len()),
            "{} bytes: {text}",
            text.len()
        );
        assert_eq!(charge["id"], DATA.charge_id(17).as_str());
        assert_eq!(charge["object"], "charge");
    }

    #[test]
    fn ids_are_shared_across_users_and_round_trip() {
        let mut a = String::new();
        let mut b = String::new();
        DATA.write_charge(&mut a, 1, 999, 0);
        DATA.write_charge(&mut b, 2, 999, 0);
        let (a, b): (serde_json::Value, serde_json::Value) = (
            serde_json::from_str(&a).unwrap(),
            serde_json::from_str(&b).unwrap(),
        );
        assert_eq!(a["id"], b["id"]);
        assert_ne!(a, b);
        for index in [0, 1, 61, 62, 999] {
            assert_eq!(DATA.index_of(&DATA.charge_id(index)), Some(index));
        }
        assert_eq!(DATA.index_of("ch_3nope"), None);
        assert_eq!(DATA.index_of(&DATA.charge_id(1000)), None);
    }

    #[test]
    fn generation_one_changes_about_a_tenth_and_nothing_else() {
        let changed = DATA.changed_total();
        assert!((240..=360).contains(&changed), "{changed}");
        for index in 0..200 {
            let (mut old, mut new) = (String::new(), String::new());
            DATA.write_charge(&mut old, 3, index, 0);
            DATA.write_charge(&mut new, 3, index, 1);
            assert_eq!(old != new, DATA.changes(3, index));
        }
    }

    /// Past its limit the emulator answers Stripe's 429 to every token, and counts it.
    #[tokio::test]
    async fn the_global_limit_answers_429_past_it_for_every_token() {
        let limit = GlobalLimit {
            requests: 3,
            // Epoch-aligned windows of ~31.7 years: this one runs from 2001 to 2033.
            window: Duration::from_secs(1_000_000_000),
        };
        let emulator = Emulator::start_limited(DATA, Duration::ZERO, Some(limit))
            .await
            .expect("started");
        let client = reqwest::Client::new();
        let mut statuses = Vec::new();
        for user in [1, 2, 3, 1, 2] {
            let answer = client
                .get(format!("{}/v1/charges?limit=1", emulator.base_url()))
                .bearer_auth(format!("{TOKEN_PREFIX}{user}"))
                .send()
                .await
                .expect("answered");
            statuses.push(answer.status().as_u16());
        }
        assert_eq!(statuses, [200, 200, 200, 429, 429]);
        assert_eq!(emulator.rate_limited(), 2);
        assert_eq!(emulator.pages_served(), 3);
    }
}
