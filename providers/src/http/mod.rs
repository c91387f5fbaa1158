//! The shared HTTP client every adapter talks to its API through.
//!
//! One [`HttpClient`] per provider wraps one pooled `reqwest` client (keep-alive, rustls).
//! [`HttpClient::get_json`] (and [`HttpClient::get_json_with`] /
//! [`HttpClient::post_form_with`], which take a provider's [`ResponsePolicy`]) add what
//! every adapter needs, and [`HttpClient::get_read`] adds it to an adapter's own reading
//! of the page, run where the body is read:
//! - bounded retries (`1 + max_retries` requests at most) with exponential backoff and
//!   jitter, for connection errors, timeouts, bodies cut short, 5xx, 429 and 2xx bodies that
//!   are not JSON;
//! - `Retry-After` on 429 and 503, waited exactly, or the fetch ends with
//!   [`FetchError::RateLimited`] when it asks for longer than `max_rate_limit_wait`;
//! - no retry for 401/403 ([`FetchError::Unauthorized`]) and other 4xx;
//! - a cap on the body size, checked against `Content-Length` and while streaming;
//! - redirects followed only within the same origin, so headers that carry credentials never
//!   reach another host.
//!
//! A provider whose API says more than the status (a 403 that is a rate limit, a header that
//! forbids a retry, a JSON error body) changes these rules for its own requests with a
//! [`ResponsePolicy`] rather than a retry loop of its own.

mod budget;
mod error;
mod policy;
mod settings;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE, LOCATION};
use reqwest::{Method, Response};
use secrecy::{ExposeSecret, SecretString};
use serde_json::value::RawValue;
use tracing::Instrument;
use url::Url;

pub use budget::{reported_windows, with_budget, BudgetRefusal, ReportedWindow, RequestBudget};
use error::excerpt;
pub(crate) use error::{cap_body, display_url, display_url_hiding, display_url_text};
pub use error::{
    error_chain, hide_query_values, is_secret_param, FetchError, MAX_ERROR_BODY_BYTES,
    MAX_MESSAGE_EXCERPT_CHARS,
};
pub(crate) use policy::asked_wait;
use policy::default_verdict;
#[cfg(test)]
use policy::retry_after;
pub use policy::{Answer, DefaultPolicy, ResponsePolicy, Verdict, MAX_ASKED_WAIT};
pub use settings::{HttpSettings, DEFAULT_MAX_RECORDS_PER_PAGE, MAX_RECORDS_PER_PAGE};

/// Redirects followed for one request (same origin only).
const MAX_REDIRECTS: usize = 10;

/// How much of an unsuccessful answer's body is read to quote in the error.
const ERROR_BODY_READ_LIMIT: usize = 16 * 1024;

/// A successful (2xx) answer whose body is JSON.
#[derive(Clone, Debug)]
pub struct JsonResponse {
    /// The URL that answered (after same-origin redirects); relative links resolve against it.
    pub url: Url,
    /// The HTTP status.
    pub status: u16,
    /// The response headers.
    pub headers: HeaderMap,
    /// The body: validated JSON, kept as text so records can be stored and hashed as
    /// received (see [`crate::raw`]).
    pub body: Box<RawValue>,
}

impl JsonResponse {
    /// The body parsed into a tree (for small bodies: errors, token answers).
    pub fn value(&self) -> serde_json::Value {
        crate::raw::to_value(&self.body)
    }
}

/// The HTTP client of one provider. Cloning is cheap and shares the connection pool.
#[derive(Clone)]
pub struct HttpClient {
    client: reqwest::Client,
    settings: Arc<HttpSettings>,
    /// The provider-wide request budget, shared by every clone.
    budget: Option<Arc<DefaultDirectRateLimiter>>,
    /// Query parameters that carry a secret besides those whose names say so (a provider's
    /// `auth = { query = NAME }`), hidden wherever the client quotes a URL.
    secret_params: Arc<[String]>,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// HTTP requests by provider and status code (`error` when no answer came).
pub const HTTP_REQUESTS_TOTAL: &str = "tributary_http_requests_total";
/// Retries by provider.
pub const HTTP_RETRIES_TOTAL: &str = "tributary_http_retries_total";
/// Waits an API's rate limit asked for, by provider.
pub const RATE_LIMIT_WAITS_TOTAL: &str = "tributary_rate_limit_waits_total";

impl HttpClient {
    /// Builds the client once; its connections are pooled and kept alive between requests.
    pub fn new(settings: HttpSettings) -> Result<HttpClient, FetchError> {
        settings
            .validate()
            .map_err(|message| FetchError::Client { message })?;
        let client = reqwest::Client::builder()
            .user_agent(settings.user_agent.clone())
            .timeout(settings.timeout)
            .connect_timeout(settings.connect_timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_keepalive(Duration::from_secs(60))
            .redirect(same_origin_redirects())
            .build()
            .map_err(|err| FetchError::Client {
                message: error_chain(&err),
            })?;
        let budget = match settings.requests_per_second {
            Some(rate) => {
                let period = Duration::from_secs_f64(1.0 / rate);
                let quota = Quota::with_period(period).ok_or_else(|| FetchError::Client {
                    message: format!("requests_per_second = {rate} is out of range"),
                })?;
                Some(Arc::new(RateLimiter::direct(quota)))
            }
            None => None,
        };
        Ok(HttpClient {
            client,
            settings: Arc::new(settings),
            budget,
            secret_params: Arc::from(Vec::new()),
        })
    }

    /// The same client sending through `client`: a test reaches an emulated host over TLS
    /// (a resolver override and its own trust root) with no switch in production code.
    /// Outside the crate's own tests it exists only with the `test-client` feature, which
    /// only `[dev-dependencies]` enable (docs/decisions/connect-shopify.md).
    #[cfg(any(test, feature = "test-client"))]
    pub fn with_reqwest(mut self, client: reqwest::Client) -> HttpClient {
        self.client = client;
        self
    }

    /// The same client, also hiding `name`'s value wherever it quotes a URL.
    pub fn hiding_query_param(mut self, name: &str) -> HttpClient {
        let mut names = self.secret_params.to_vec();
        names.push(name.to_string());
        self.secret_params = Arc::from(names);
        self
    }

    /// Counts one wait that an API's rate limit asked for.
    pub fn record_rate_limit_wait(&self) {
        let provider = self.settings.metrics_label.clone();
        metrics::counter!(RATE_LIMIT_WAITS_TOTAL, "provider" => provider).increment(1);
    }

    /// The settings the client was built with.
    pub fn settings(&self) -> &HttpSettings {
        &self.settings
    }

    /// GETs `url` with `headers` and parses the body as JSON, retrying as the module
    /// documentation describes. `headers` are never logged.
    pub async fn get_json(&self, url: Url, headers: HeaderMap) -> Result<JsonResponse, FetchError> {
        self.get_json_with(url, headers, &DefaultPolicy).await
    }

    /// Like [`HttpClient::get_json`], with `policy` seeing every answer and deciding what an
    /// unsuccessful one means (see [`ResponsePolicy`]).
    pub async fn get_json_with(
        &self,
        url: Url,
        headers: HeaderMap,
        policy: &dyn ResponsePolicy,
    ) -> Result<JsonResponse, FetchError> {
        self.get_read(url, headers, policy, JsonResponse::read)
            .await
    }

    /// Like [`HttpClient::get_json_with`], with `read` turning the answer into what the
    /// caller wants (a page) on the same thread, in the same step, as the body is read:
    /// for a page, one hand-off to the blocking pool instead of two. `read` must read
    /// the whole text with serde_json, as [`crate::raw::RawList::parse_text`] does, so
    /// that what it accepts is JSON. When `read` fails and the body is not JSON, the
    /// attempt is retried as any body that is not JSON is
    /// ([`FetchError::InvalidJson`]); when the body is JSON, `read`'s error ends the
    /// fetch.
    pub async fn get_read<T: Send + 'static>(
        &self,
        url: Url,
        headers: HeaderMap,
        policy: &dyn ResponsePolicy,
        read: impl Fn(&Answered<'_>) -> Result<T, FetchError> + Send + Sync + 'static,
    ) -> Result<T, FetchError> {
        let request = Request {
            method: Method::GET,
            url: &url,
            headers: &headers,
            form: None,
        };
        self.send_read(request, policy, Arc::new(read)).await
    }

    /// POSTs `form` as `application/x-www-form-urlencoded` (e.g. to an OAuth token endpoint)
    /// and parses the answer as JSON. Retried only when the connection could not be made:
    /// after a timeout, a reset or any answer the server may have acted on it. The form and `headers` are
    /// never logged: the form may hold secrets.
    pub async fn post_form_with(
        &self,
        url: Url,
        headers: HeaderMap,
        form: &[(&str, &str)],
        policy: &dyn ResponsePolicy,
    ) -> Result<JsonResponse, FetchError> {
        let body = SecretString::from(
            url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(form)
                .finish(),
        );
        let request = Request {
            method: Method::POST,
            url: &url,
            headers: &headers,
            form: Some(&body),
        };
        self.send_read(request, policy, Arc::new(JsonResponse::read))
            .await
    }

    /// Sends `request` until it succeeds, fails for good or runs out of attempts.
    async fn send_read<T: Send + 'static>(
        &self,
        request: Request<'_>,
        policy: &dyn ResponsePolicy,
        read: BodyReader<T>,
    ) -> Result<T, FetchError> {
        let shown = display_url_hiding(request.url, &self.secret_params);
        // One span per request, its retries included, named as OpenTelemetry's HTTP
        // conventions name a client's; the URL is the one logs show, secrets hidden.
        let span = tracing::debug_span!(
            "http.request",
            "otel.name" = request.method.as_str(),
            "otel.kind" = "client",
            "http.request.method" = request.method.as_str(),
            "url.full" = shown.as_str(),
            "http.response.status_code" = tracing::field::Empty,
            "http.request.resend_count" = tracing::field::Empty,
            "tributary.rate_limit_wait_ms" = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
            "otel.status_code" = tracing::field::Empty,
            "otel.status_description" = tracing::field::Empty,
        );
        let waited_ms = AtomicU64::new(0);
        // The last answer's status (0: none yet), recorded once the retries are over.
        let last_status = AtomicU16::new(0);
        let attempts = AtomicU32::new(0);
        let max_delay = self.settings.retry_max_delay;
        let backoff = ExponentialBuilder::default()
            .with_min_delay(self.settings.retry_initial_delay)
            .with_max_delay(max_delay)
            .with_max_times(usize::try_from(self.settings.max_retries).unwrap_or(usize::MAX))
            .with_jitter();
        let (request, shown_ref, attempts_ref, waited_ref, status_ref) = (
            &request,
            shown.as_str(),
            &attempts,
            &waited_ms,
            &last_status,
        );
        let read = &read;
        let attempt = move || async move {
            let attempt = attempts_ref.fetch_add(1, Ordering::Relaxed) + 1;
            self.attempt(request, policy, shown_ref, attempt, read, status_ref)
                .await
                .map_err(|failure| failure.for_method(&request.method))
        };
        let outcome = attempt
            .retry(backoff)
            .when(|failure: &Failure| failure.retryable)
            // The backoff decides whether there is another attempt; the wait the API asked
            // for, when given, decides how long to wait for it.
            .adjust(|failure, delay| {
                delay.map(|delay| failure.retry_after.unwrap_or(delay.min(max_delay)))
            })
            .notify(|failure, delay| {
                failure.log_retry(attempts_ref.load(Ordering::Relaxed), shown_ref, delay);
                let provider = self.settings.metrics_label.clone();
                metrics::counter!(HTTP_RETRIES_TOTAL, "provider" => provider).increment(1);
                if failure.retry_after.is_some() {
                    self.record_rate_limit_wait();
                    let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                    waited_ref.fetch_add(ms, Ordering::Relaxed);
                }
            })
            .instrument(span.clone())
            .await
            .map_err(|failure| failure.error);
        let resent = attempts.load(Ordering::Relaxed).saturating_sub(1);
        // As i64: the trace layer would export unsigned values as text.
        span.record("http.request.resend_count", i64::from(resent));
        let waited = i64::try_from(waited_ms.load(Ordering::Relaxed)).unwrap_or(i64::MAX);
        span.record("tributary.rate_limit_wait_ms", waited);
        match last_status.load(Ordering::Relaxed) {
            0 => {}
            status => {
                span.record("http.response.status_code", i64::from(status));
            }
        }
        if let Err(error) = &outcome {
            span.record("error.type", error.kind())
                .record("otel.status_code", "ERROR")
                .record("otel.status_description", error.to_string());
        }
        outcome
    }

    /// One request: the answer, or a failure saying whether it is worth another attempt.
    async fn attempt<T: Send + 'static>(
        &self,
        request: &Request<'_>,
        policy: &dyn ResponsePolicy,
        shown: &str,
        attempt: u32,
        read: &BodyReader<T>,
        last_status: &AtomicU16,
    ) -> Result<T, Failure> {
        let transport = |what: &str, err: reqwest::Error| {
            // A redirect loop or a request that cannot be built fails the same way again.
            let retryable = !(err.is_redirect() || err.is_builder());
            let unsent = err.is_connect();
            let error = FetchError::Transport {
                url: shown.to_string(),
                attempts: attempt,
                message: format!("{what}: {}", error_chain(&err.without_url())),
            };
            Failure {
                error,
                retryable,
                retry_after: None,
                unsent,
            }
        };
        let mut builder = self
            .client
            .request(request.method.clone(), request.url.clone())
            .headers(request.headers.clone());
        if let Some(form) = request.form {
            builder = builder
                .header(
                    CONTENT_TYPE,
                    HeaderValue::from_static("application/x-www-form-urlencoded"),
                )
                .body(form.expose_secret().to_string());
        }
        let shared_budget = budget::current();
        if let Some(shared) = &shared_budget {
            self.take_from(shared.as_ref()).await?;
        }
        if let Some(budget) = &self.budget {
            budget.until_ready().await;
        }
        let sent = builder.send().await;
        let status_label = match &sent {
            Ok(response) => response.status().as_u16().to_string(),
            Err(_) => "error".to_string(),
        };
        let provider = self.settings.metrics_label.clone();
        metrics::counter!(HTTP_REQUESTS_TOTAL, "provider" => provider, "status" => status_label)
            .increment(1);
        let mut response = sent.map_err(|err| transport("sending the request failed", err))?;
        last_status.store(response.status().as_u16(), Ordering::Relaxed);
        policy.observe(response.status(), response.headers());
        if let Some(shared) = &shared_budget {
            let reported = reported_windows(response.headers());
            if !reported.is_empty() {
                shared.learn(&reported).await;
            }
        }
        if !response.status().is_success() {
            return Err(self.status_failure(response, policy, shown, attempt).await);
        }
        let limit = self.settings.max_body_bytes;
        let too_large = || {
            Failure::fatal(FetchError::BodyTooLarge {
                url: shown.to_string(),
                limit,
            })
        };
        if response
            .content_length()
            .is_some_and(|length| length > limit)
        {
            return Err(too_large());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|err| transport("reading the response body failed", err))?
        {
            if u64::try_from(body.len().saturating_add(chunk.len())).unwrap_or(u64::MAX) > limit {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        let body_len = body.len();
        let url = response.url().clone();
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let read = Arc::clone(read);
        let max_records = self.settings.max_records_per_page;
        let read_body = move || read_body(body, &url, status, &headers, max_records, &*read);
        let outcome = if body_len < PARSE_OFF_THREAD_BYTES {
            read_body()
        } else {
            off_thread(read_body).await.ok_or_else(|| {
                Failure::fatal(FetchError::Transport {
                    url: shown.to_string(),
                    attempts: attempt,
                    message: "the runtime is shutting down".to_string(),
                })
            })?
        };
        outcome.map_err(|unread| match unread {
            Unread::NotJson { message, body } => Failure::retry(FetchError::InvalidJson {
                url: shown.to_string(),
                attempts: attempt,
                message,
                body: cap_body(&body),
            }),
            Unread::Refused(error) => Failure::fatal(error),
        })
    }

    /// Takes one request from the shared budget, waiting for a spent window that reopens
    /// within `max_rate_limit_wait`; a later one ends the fetch unsent
    /// ([`FetchError::BudgetSpent`]), as does a budget that cannot be read.
    async fn take_from(&self, shared: &dyn RequestBudget) -> Result<(), Failure> {
        let max_wait = self.settings.max_rate_limit_wait;
        let deadline = chrono::Utc::now()
            + chrono::Duration::from_std(max_wait).unwrap_or(chrono::Duration::MAX);
        loop {
            match shared.take().await {
                Ok(()) => return Ok(()),
                Err(BudgetRefusal::Spent { scope, reopens_at }) if reopens_at > deadline => {
                    return Err(Failure::fatal(FetchError::BudgetSpent {
                        scope,
                        reopens_at,
                    }));
                }
                Err(BudgetRefusal::Spent { scope, reopens_at }) => {
                    let wait = (reopens_at - chrono::Utc::now())
                        .to_std()
                        .unwrap_or(Duration::ZERO);
                    let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
                    tracing::info!(
                        scope,
                        wait_ms,
                        "Request budget spent; waiting for its window to reopen."
                    );
                    self.record_rate_limit_wait();
                    tokio::time::sleep(wait).await;
                }
                Err(BudgetRefusal::Unavailable { message }) => {
                    return Err(Failure::fatal(FetchError::BudgetUnavailable { message }));
                }
            }
        }
    }

    /// The failure for an unsuccessful status: the client's verdict, as `policy` amends it,
    /// with waits beyond `max_rate_limit_wait` turned into [`FetchError::RateLimited`].
    async fn status_failure(
        &self,
        mut response: Response,
        policy: &dyn ResponsePolicy,
        shown: &str,
        attempt: u32,
    ) -> Failure {
        let status = response.status();
        let (body, message) = if status.is_redirection() {
            let location = response
                .headers()
                .get(LOCATION)
                .and_then(|value| value.to_str().ok())
                .map_or_else(|| "nowhere".to_string(), display_url_text);
            let message = format!(
                "the redirect to {location} was not followed: only redirects within the same \
                 origin are, so credentials never reach another host"
            );
            (Vec::new(), message)
        } else {
            let body = read_prefix(&mut response, ERROR_BODY_READ_LIMIT).await;
            let message = excerpt(&body);
            (body, message)
        };
        let answer = Answer {
            url: shown,
            status,
            headers: response.headers(),
            body: &body,
            attempt,
        };
        let verdict = policy.classify(&answer, default_verdict(&answer, message));
        match verdict {
            Verdict::Retry {
                wait: Some(wait), ..
            } if wait > self.settings.max_rate_limit_wait => {
                Failure::fatal(FetchError::RateLimited {
                    retry_after: wait,
                    limit: self.settings.max_rate_limit_wait,
                })
            }
            Verdict::Retry { error, wait } => Failure {
                error,
                retryable: true,
                retry_after: wait,
                unsent: false,
            },
            Verdict::Fail(error) => Failure::fatal(error),
        }
    }
}

/// Bodies at least this large are parsed on tokio's blocking pool.
const PARSE_OFF_THREAD_BYTES: usize = 16 * 1024;

/// A successful (2xx) answer, for a caller's reader to turn into what it wants.
pub struct Answered<'a> {
    /// The URL that answered (after same-origin redirects).
    pub url: &'a Url,
    pub status: u16,
    pub headers: &'a HeaderMap,
    /// The body, which is UTF-8 but not yet known to be JSON.
    pub text: &'a str,
    /// The most records a page may hold (`max_records_per_page`).
    pub max_records: usize,
}

/// What a fetch turns a successful answer into, on the thread that read its body.
type BodyReader<T> = Arc<dyn Fn(&Answered<'_>) -> Result<T, FetchError> + Send + Sync>;

/// Why a successful answer's body was not read.
enum Unread {
    /// It is not UTF-8 or not JSON: the bytes are kept for the report.
    NotJson { message: String, body: Vec<u8> },
    /// It is JSON, and the reader refused it.
    Refused(FetchError),
}

/// Reads `body` with `read`. A body `read` refuses is checked for being JSON, so that a
/// body cut short or garbled is retried while a JSON body of the wrong shape is not.
fn read_body<T>(
    body: Vec<u8>,
    url: &Url,
    status: u16,
    headers: &HeaderMap,
    max_records: usize,
    read: &(dyn Fn(&Answered<'_>) -> Result<T, FetchError> + Send + Sync),
) -> Result<T, Unread> {
    let text = match String::from_utf8(body) {
        Ok(text) => text,
        Err(error) => {
            let message = format!("the body is not UTF-8: {}", error.utf8_error());
            return Err(Unread::NotJson {
                message,
                body: error.into_bytes(),
            });
        }
    };
    let answered = Answered {
        url,
        status,
        headers,
        text: &text,
        max_records,
    };
    let refused = match read(&answered) {
        Ok(value) => return Ok(value),
        Err(error) => error,
    };
    match serde_json::from_str::<serde::de::IgnoredAny>(&text) {
        Ok(_) => Err(Unread::Refused(refused)),
        Err(error) => Err(Unread::NotJson {
            message: error.to_string(),
            body: text.into_bytes(),
        }),
    }
}

impl JsonResponse {
    /// The answer with its body kept as checked JSON: the reader of
    /// [`HttpClient::get_json`], and of adapters that need the whole response.
    pub fn read(answered: &Answered<'_>) -> Result<JsonResponse, FetchError> {
        // Never surfaced: text serde_json cannot read is not JSON, and `read_body`
        // reports it as such (and retries).
        let body = serde_json::from_str::<Box<RawValue>>(answered.text).map_err(|error| {
            FetchError::Client {
                message: error.to_string(),
            }
        })?;
        Ok(JsonResponse {
            url: answered.url.clone(),
            status: answered.status,
            headers: answered.headers.clone(),
            body,
        })
    }
}

/// Runs CPU-bound work (parsing a page, hashing its records) on tokio's blocking pool.
/// A provider's connections are polled by one task, so work done inline would keep them
/// all on one thread while the database waits; a page is worth the hand-off. A panic in
/// `work` is resumed here; `None` means the runtime is shutting down.
pub async fn off_thread<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => Some(value),
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(_) => None,
    }
}

/// One request to send, perhaps several times.
struct Request<'a> {
    method: Method,
    url: &'a Url,
    headers: &'a HeaderMap,
    /// The url-encoded form body of a POST; it may hold secrets.
    form: Option<&'a SecretString>,
}

/// One failed attempt.
struct Failure {
    error: FetchError,
    retryable: bool,
    /// The wait the API asked for (`Retry-After`), used instead of the backoff delay.
    retry_after: Option<Duration>,
    /// The request provably never reached the server: the connection could not be made.
    unsent: bool,
}

impl Failure {
    fn retry(error: FetchError) -> Failure {
        Failure {
            error,
            retryable: true,
            retry_after: None,
            unsent: false,
        }
    }

    fn fatal(error: FetchError) -> Failure {
        Failure {
            error,
            retryable: false,
            retry_after: None,
            unsent: false,
        }
    }

    /// A POST may have had its effect once it reached the server (an OAuth refresh token
    /// spent), whatever came back or did not: only one that was never sent is tried again.
    fn for_method(mut self, method: &Method) -> Failure {
        if *method == Method::POST && !self.unsent {
            self.retryable = false;
        }
        self
    }

    /// One warning per retry: the URL and what went wrong, never headers or the body.
    fn log_retry(&self, attempt: u32, url: &str, delay: Duration) {
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        match &self.error {
            FetchError::Status { status, .. } => {
                tracing::warn!(attempt, url, status, delay_ms, "Request failed, retrying.");
            }
            FetchError::Transport { message, .. } => {
                tracing::warn!(attempt, url, error = %message, delay_ms, "Request failed, retrying.");
            }
            FetchError::InvalidJson { message, .. } => {
                let error = format!("the response body is not valid JSON: {message}");
                tracing::warn!(attempt, url, error, delay_ms, "Request failed, retrying.");
            }
            other => {
                tracing::warn!(attempt, url, error = %other, delay_ms, "Request failed, retrying.");
            }
        }
    }
}

/// Up to `limit` bytes of the body; a read error ends it early (it is only quoted).
async fn read_prefix(response: &mut Response, limit: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let take = chunk.len().min(limit - body.len());
                body.extend_from_slice(&chunk[..take]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    body
}

/// Follows up to [`MAX_REDIRECTS`] redirects within the origin of the first URL; a redirect
/// elsewhere is returned as is (and becomes a [`FetchError::Status`]).
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else if same_origin {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}
