//! The operator page (docs/decisions/operator-page.md), served on `[operator] listen`:
//! read-only, server-rendered HTML with no script and no outside asset, behind an API key
//! with the `admin` scope (as `Authorization: Bearer` or posted once for a session
//! cookie). Every page reads through `ops`; errors are pages in plain words.

use axum::body::Bytes;
use axum::extract::{FromRequestParts, Path, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use chrono::{DateTime, Utc};
use maud::{html, Markup, PreEscaped, DOCTYPE};
use secrecy::{ExposeSecret, SecretString};

use super::state::ApiState;
use crate::entities::sync_run::RunStatus;
use crate::ops::operator::{self as access, AccessError};
use crate::ops::OpsError;

/// The session cookie.
const COOKIE: &str = "tributary_operator";
/// Rows per page of a list.
const PAGE_SIZE: u64 = 50;
/// Errors shown per run page.
const ERRORS_PER_PAGE: u64 = 100;
/// A payload longer than this, pretty-printed, is folded in `<details>`.
const FOLD_CHARS: usize = 600;
/// The longest filter value taken: a provider name or a user id.
const MAX_FILTER_CHARS: usize = 255;
/// The largest login form body: a key and its field name, percent-encoded.
const MAX_FORM_BYTES: usize = 1024;
/// The page's one stylesheet, allowed by its hash. Tables scroll inside their own box, so
/// that a phone shows the page and scrolls the table alone.
const CSS: &str = "body{font-family:system-ui,sans-serif;margin:0;color:#1a1a1a;background:#f6f6f6}header{background:#1f2937;color:#fff;padding:.6rem 1rem;display:flex;flex-wrap:wrap;gap:.5rem 1.5rem;align-items:center}header a{color:#fff}header form{margin:0 0 0 auto}nav ul{list-style:none;margin:0;padding:0;display:flex;flex-wrap:wrap;gap:1rem}main{padding:1rem;max-width:80rem;margin:0 auto}h1{font-size:1.4rem}h2{font-size:1.15rem;margin-top:1.5rem}.scroll{overflow-x:auto;background:#fff;border:1px solid #ccc;border-radius:.3rem}table{border-collapse:collapse;width:100%;font-size:.9rem}th,td{text-align:left;padding:.4rem .6rem;border-bottom:1px solid #e5e5e5;white-space:nowrap;vertical-align:top}td.wrap{white-space:normal;min-width:16rem}a{color:#0b4fb3}a:focus,button:focus,input:focus,select:focus,.scroll:focus{outline:3px solid #0a58ca;outline-offset:2px}.skip{position:absolute;left:-999px}.skip:focus{left:1rem;top:1rem;background:#fff;color:#0b4fb3;padding:.4rem;z-index:1}form.filters{display:flex;flex-wrap:wrap;gap:.6rem 1rem;align-items:end;margin:.5rem 0 1rem}label{display:block;font-weight:600;font-size:.9rem}input,select,button{font-size:1rem;padding:.35rem .5rem}button{border:1px solid #333;border-radius:.3rem;background:#fff;color:#1a1a1a;cursor:pointer}pre{white-space:pre-wrap;word-break:break-word;background:#f3f3f3;padding:.5rem;margin:.3rem 0;font-size:.85rem}.error{color:#9b1c1c;background:#fdecec;padding:.6rem;border-radius:.3rem}.note{color:#444}dl{display:grid;grid-template-columns:max-content 1fr;gap:.3rem 1rem}dt{font-weight:600}dd{margin:0}";

/// The page's routes, served on their own listener.
pub(crate) fn pages() -> Router<ApiState> {
    use axum::routing::{get, post};
    Router::new()
        .route("/", get(overview))
        .route("/connections", get(connections))
        .route("/runs", get(runs))
        .route("/runs/{id}", get(run))
        .route("/webhooks", get(webhooks))
        .route("/login", get(login_page).post(sign_in))
        .route("/logout", post(sign_out))
        .fallback(not_found)
        .layer(axum::middleware::map_response(page_headers))
}

/// An admin caller: by its key (`Authorization: Bearer`) or its session's cookie. A
/// refused caller gets the login page (401), or a page saying why (403, 503), never data.
struct Admin {
    /// Whether the caller came by a session, so that the page offers to sign out.
    by_session: bool,
}

impl FromRequestParts<ApiState> for Admin {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Response> {
        let bearer = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, key)| key.trim().to_string());
        let checked = match (bearer, cookie_of(&parts.headers)) {
            (Some(key), _) => access::admin_by_key(state.db.main(), &key)
                .await
                .map(|_| false),
            (None, Some(token)) => access::admin_by_session(state.db.main(), &token)
                .await
                .map(|_| true),
            (None, None) => Err(AccessError::Missing),
        };
        match checked {
            Ok(by_session) => Ok(Admin { by_session }),
            Err(error) => Err(refused(state, &error)),
        }
    }
}

/// The answer to a refused caller.
fn refused(state: &ApiState, error: &AccessError) -> Response {
    match error {
        _ if error.is_database() => {
            tracing::error!(%error, "Checking an operator page's caller failed.");
            message_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Try again",
                "The key could not be checked just now; try again in a moment.",
            )
        }
        AccessError::NotAdmin(_) => message_page(
            StatusCode::FORBIDDEN,
            "Not allowed",
            &sentence(&error.to_string()),
        ),
        AccessError::Missing => login(StatusCode::UNAUTHORIZED, None),
        _ => {
            let mut response = login(StatusCode::UNAUTHORIZED, Some(sentence(&error.to_string())));
            // A cookie the server no longer knows is of no use to the browser.
            clear_cookie(state, &mut response);
            response
        }
    }
}

/// The session token the request's cookie carries.
fn cookie_of(headers: &HeaderMap) -> Option<SecretString> {
    super::connect::cookie_of(headers, COOKIE).map(SecretString::from)
}

/// Whether the listener serves https, so that the cookie must be `Secure`.
fn secure(state: &ApiState) -> bool {
    state
        .settings
        .api
        .as_ref()
        .is_some_and(|api| api.tls.is_some())
}

fn set_cookie(state: &ApiState, response: &mut Response, value: &str, max_age: i64) {
    let cookie = format!(
        "{COOKIE}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{}",
        if secure(state) { "; Secure" } else { "" }
    );
    if let Ok(cookie) = HeaderValue::from_str(&cookie) {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
}

fn clear_cookie(state: &ApiState, response: &mut Response) {
    set_cookie(state, response, "", 0);
}

/// The login page, with `message` above the form when there is one.
fn login(status: StatusCode, message: Option<String>) -> Response {
    let body = html! {
        h1 { "Sign in" }
        @if let Some(message) = &message {
            p class="error" role="alert" { (message) }
        }
        p { "The operator page needs an API key with the admin scope (" code { "tributary api-keys create --scope admin" } ")." }
        form method="post" action="/login" {
            label for="key" { "Admin API key" }
            input type="password" id="key" name="key" required autocomplete="off";
            " "
            button type="submit" { "Sign in" }
        }
    };
    let mut response = (status, page("Sign in", false, body)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"tributary operator\""),
        );
    }
    response
}

async fn login_page() -> Response {
    login(StatusCode::OK, None)
}

/// The key posted: a session made and the browser sent to the overview, or the form
/// again saying why not.
async fn sign_in(State(state): State<ApiState>, headers: HeaderMap, body: Bytes) -> Response {
    let key = match read_key(&headers, &body) {
        Ok(key) => key,
        Err(message) => return login(StatusCode::BAD_REQUEST, Some(message)),
    };
    match access::sign_in(state.db.main(), key.expose_secret()).await {
        Ok(session) => {
            let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
            let max_age = access::SESSION_TTL.num_seconds();
            set_cookie(&state, &mut response, session.expose_secret(), max_age);
            response
        }
        Err(error) if error.is_database() => refused(&state, &error),
        Err(error @ AccessError::NotAdmin(_)) => refused(&state, &error),
        Err(error) => login(StatusCode::UNAUTHORIZED, Some(sentence(&error.to_string()))),
    }
}

/// Reads the login form: urlencoded, small, its one field `key` once.
fn read_key(headers: &HeaderMap, body: &Bytes) -> Result<SecretString, String> {
    if !super::connect::urlencoded(headers) {
        return Err("The form must be sent as application/x-www-form-urlencoded.".to_string());
    }
    if body.len() > MAX_FORM_BYTES {
        return Err(format!("The form is larger than {MAX_FORM_BYTES} bytes."));
    }
    let mut key = None;
    for (name, value) in form_urlencoded::parse(body) {
        match name.as_ref() {
            "key" if key.is_none() => key = Some(SecretString::from(value.trim().to_string())),
            "key" => return Err("The form sent the key more than once.".to_string()),
            _ => return Err("The form has a field other than the key.".to_string()),
        }
    }
    key.filter(|key| !key.expose_secret().is_empty())
        .ok_or_else(|| "Enter the key.".to_string())
}

/// Ends the session and shows the login page.
async fn sign_out(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    if let Some(token) = cookie_of(&headers) {
        if let Err(error) = access::sign_out(state.db.main(), &token).await {
            return refused(&state, &error);
        }
    }
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/login")]).into_response();
    clear_cookie(&state, &mut response);
    response
}

/// A page's query: each parameter known to it, once.
struct Filters(Vec<(String, String)>);

impl Filters {
    fn parse(query: Option<&str>, known: &[&str]) -> Result<Filters, String> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            if !known.contains(&name.as_ref()) {
                return Err(format!(
                    "This page has no filter {:?}; it takes {}.",
                    tributary_providers::quote::truncated(&name, 32),
                    known.join(", ")
                ));
            }
            if pairs.iter().any(|(seen, _)| *seen == name) {
                return Err(format!("The filter {name} is given twice."));
            }
            if value.chars().count() > MAX_FILTER_CHARS {
                return Err(format!(
                    "The filter {name} is longer than {MAX_FILTER_CHARS} characters."
                ));
            }
            // An empty field of the filter form means no filter.
            if !value.is_empty() {
                pairs.push((name.into_owned(), value.into_owned()));
            }
        }
        Ok(Filters(pairs))
    }

    fn text(&self, name: &str) -> Option<String> {
        self.0
            .iter()
            .find(|(found, _)| found == name)
            .map(|(_, value)| value.clone())
    }

    fn id(&self, name: &str) -> Result<Option<i64>, String> {
        self.text(name)
            .map(|value| {
                value.parse::<i64>().map_err(|_| {
                    format!(
                        "The filter {name} must be a whole number, not {:?}.",
                        tributary_providers::quote::truncated(&value, 32)
                    )
                })
            })
            .transpose()
    }

    /// This query with `name` set to `value`, for a next page's link.
    fn with(&self, name: &str, value: i64) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        for (found, text) in self.0.iter().filter(|(found, _)| found != name) {
            query.append_pair(found, text);
        }
        query.append_pair(name, &value.to_string());
        query.finish()
    }
}

/// The overview: the job queue's depth, the deferred jobs and runs, the change feed.
async fn overview(admin: Admin, State(state): State<ApiState>) -> Response {
    let db = state.db.main();
    let depth = match crate::ops::jobs::depth(db).await {
        Ok(depth) => depth,
        Err(error) => return ops_error(&error),
    };
    let deferred = crate::ops::jobs::JobsQuery {
        state: Some(crate::ops::jobs::JobState::Deferred),
        limit: PAGE_SIZE,
        ..Default::default()
    };
    let deferred = match crate::ops::jobs::list(db, &deferred).await {
        Ok(page) => page.items,
        Err(error) => return ops_error(&error),
    };
    let retention = state.settings.changes.retention;
    let feed = match crate::ops::changes::readers(db, retention, None, PAGE_SIZE).await {
        Ok(feed) => feed,
        Err(error) => return ops_error(&error),
    };
    let (head, start) = (&feed.head, &feed.feed_start);
    let body = html! {
        h1 { "Overview" }
        h2 id="queue" { "Job queue" }
        (scroll("queue", html! {
            table {
                thead { tr { th scope="col" { "Status" } th scope="col" { "Jobs" } } }
                tbody {
                    @for (status, count) in &depth {
                        tr { td { (status) } td { (count) } }
                    }
                }
            }
        }))
        h2 id="deferred" { "Deferred jobs" }
        p class="note" { "Queued jobs not due yet: retries waiting out their backoff, runs waiting for a budget or a lease. Runs stopped by a spent budget are under " a href="/runs?status=deferred" { "deferred runs" } "." }
        @if deferred.is_empty() {
            p { "No job is deferred." }
        } @else {
            (scroll("deferred", html! {
                table {
                    thead { tr {
                        th scope="col" { "Job" } th scope="col" { "Connection" } th scope="col" { "Stream" }
                        th scope="col" { "Kind" } th scope="col" { "Not before" } th scope="col" { "Attempt" }
                    } }
                    tbody {
                        @for job in &deferred {
                            tr {
                                td { (job.id) }
                                td { a href=(runs_of(&job.provider, &job.user_id)) { (job.user_id) "@" (job.provider) } }
                                td { @if job.stream.is_empty() { "all" } @else { (job.stream) } }
                                td { (job.kind) }
                                td { (time(job.not_before)) }
                                td { (job.attempt) }
                            }
                        }
                    }
                }
            }))
        }
        h2 id="feed" { "Change feed" }
        dl {
            dt { "Head" } dd { code { (head) } " (batch " (head.position.seq) ")" }
            dt { "Oldest kept" } dd { code { (start.cursor) } " (batch " (start.cursor.position.seq) ", committed " (time(start.first_committed_at)) ")" }
        }
        h3 id="readers" { "Readers" }
        p class="note" { "Each API key that reads " code { "/v1/changes" } ", at the furthest cursor its reads returned (noted at most every 5 seconds). A reader whose cursor is older than the oldest kept change gets 410 Gone and must resync." }
        @if feed.readers.is_empty() {
            p { "No API key has read the feed." }
        } @else {
            (scroll("feed readers", html! {
                table {
                    thead { tr {
                        th scope="col" { "Reader" } th scope="col" { "Cursor" } th scope="col" { "Changes behind" }
                        th scope="col" { "Time behind" } th scope="col" { "Last read" } th scope="col" { "Status" }
                    } }
                    tbody {
                        @for reader in &feed.readers {
                            tr {
                                td { (reader.name) @if let Some(prefix) = &reader.key_prefix { " (" code { "trb_" (prefix) } ")" } }
                                td { code { (reader.cursor) } " (" (reader.cursor.position) ")" }
                                td { (reader.changes_behind) @if reader.changes_behind_capped { " or more" } }
                                td {
                                    @if let Some(at) = reader.oldest_unread_committed_at {
                                        (waited(reader.seconds_behind)) " (oldest unread committed " (time(Some(at))) ")"
                                    } @else { "up to date" }
                                }
                                td { (time(Some(reader.last_read_at))) }
                                td class="wrap" {
                                    @if reader.expired {
                                        strong class="error" { "Gone: changes after its cursor were swept; its next read gets 410 and it must resync." }
                                    } @else if reader.idle_past_retention {
                                        strong class="error" { "Idle longer than the retention (" (waited(i64::try_from(retention.as_secs()).unwrap_or(i64::MAX))) "): it will get 410 and must resync." }
                                    } @else { "reading" }
                                }
                            }
                        }
                    }
                }
            }))
            @if feed.next.is_some() {
                p class="note" { "The " (PAGE_SIZE) " readers furthest behind; " code { "GET /v1/changes/readers" } " pages through them all." }
            }
        }
    };
    page("Overview", admin.by_session, body).into_response()
}

/// The connections, a page at a time, each stream with its health, last and next run
/// and cursor.
async fn connections(
    admin: Admin,
    State(state): State<ApiState>,
    RawQuery(query): RawQuery,
) -> Response {
    let filters = match Filters::parse(query.as_deref(), &["provider", "after"]) {
        Ok(filters) => filters,
        Err(message) => return bad_request(&message),
    };
    let after = match filters.id("after") {
        Ok(after) => after,
        Err(message) => return bad_request(&message),
    };
    let query = crate::ops::connections::ConnectionsQuery {
        provider: filters.text("provider"),
        after,
        limit: PAGE_SIZE,
        ..Default::default()
    };
    let listed = match crate::ops::connections::list(&state.db, &state.settings, &query).await {
        Ok(page) => page,
        Err(error) => return ops_error(&error),
    };
    let mut ids: Vec<i64> = listed.items.iter().map(|view| view.id).collect();
    ids.dedup();
    let mut statuses = Vec::with_capacity(ids.len());
    for id in ids {
        match crate::ops::sync_status::status(&state.db, &state.settings, id).await {
            Ok(status) => statuses.push(status),
            Err(error) => return ops_error(&error),
        }
    }
    let body = html! {
        h1 { "Connections" }
        form class="filters" method="get" action="/connections" {
            div {
                label for="provider" { "Provider" }
                input id="provider" name="provider" value=(filters.text("provider").unwrap_or_default());
            }
            button type="submit" { "Filter" }
        }
        @if statuses.is_empty() {
            p { "No connection matches." }
        } @else {
            (scroll("connections", html! {
                table {
                    thead { tr {
                        th scope="col" { "Connection" } th scope="col" { "Stream" } th scope="col" { "Health" }
                        th scope="col" { "Last run" } th scope="col" { "Next run" } th scope="col" { "Cursor" }
                    } }
                    tbody {
                        @for status in &statuses {
                            @for stream in &status.streams {
                                tr {
                                    td { a href=(runs_of(&status.provider, &status.user_id)) { (status.user_id) "@" (status.provider) } }
                                    td { (stream.stream.as_deref().unwrap_or("-")) }
                                    td { (stream.health) }
                                    td {
                                        @if let Some(last) = &stream.last_run {
                                            a href=(format!("/runs/{}", last.id)) { "Run " (last.id) } ", " (last.status) ", " (time(last.finished_at))
                                        } @else { "none yet" }
                                    }
                                    td { (time(stream.next_slot)) }
                                    td class="wrap" { code { (stream.cursor.as_deref().unwrap_or("-")) } }
                                }
                            }
                        }
                    }
                }
            }))
        }
        @if let Some(next) = listed.next {
            p { a href=(format!("/connections?{}", filters.with("after", next))) { "Next page" } }
        }
    };
    page("Connections", admin.by_session, body).into_response()
}

/// The runs, newest first, filtered by connection, provider and status.
async fn runs(admin: Admin, State(state): State<ApiState>, RawQuery(query): RawQuery) -> Response {
    let filters = match Filters::parse(
        query.as_deref(),
        &["provider", "user_id", "status", "before"],
    ) {
        Ok(filters) => filters,
        Err(message) => return bad_request(&message),
    };
    let before = match filters.id("before") {
        Ok(before) => before,
        Err(message) => return bad_request(&message),
    };
    let status = match filters.text("status") {
        None => None,
        Some(text) => match run_status(&text) {
            Some(status) => Some(status),
            None => {
                return bad_request(&format!(
                    "The filter status must be one of {}, not {:?}.",
                    run_statuses().join(", "),
                    tributary_providers::quote::truncated(&text, 32)
                ))
            }
        },
    };
    let query = crate::ops::runs::RunsQuery {
        provider: filters.text("provider"),
        user_id: filters.text("user_id"),
        status,
        before,
        limit: PAGE_SIZE,
        ..Default::default()
    };
    let listed = match crate::ops::runs::list(state.db.main(), &query).await {
        Ok(page) => page,
        Err(error) => return ops_error(&error),
    };
    let chosen = filters.text("status").unwrap_or_default();
    let body = html! {
        h1 { "Runs" }
        form class="filters" method="get" action="/runs" {
            div {
                label for="provider" { "Provider" }
                input id="provider" name="provider" value=(filters.text("provider").unwrap_or_default());
            }
            div {
                label for="user_id" { "User id" }
                input id="user_id" name="user_id" value=(filters.text("user_id").unwrap_or_default());
            }
            div {
                label for="status" { "Status" }
                select id="status" name="status" {
                    option value="" selected[chosen.is_empty()] { "any" }
                    @for name in run_statuses() {
                        option value=(name) selected[chosen == name] { (name) }
                    }
                }
            }
            button type="submit" { "Filter" }
        }
        @if listed.items.is_empty() {
            p { "No run matches." }
        } @else {
            (scroll("runs", html! {
                table {
                    thead { tr {
                        th scope="col" { "Run" } th scope="col" { "Connection" } th scope="col" { "Stream" }
                        th scope="col" { "Trigger" } th scope="col" { "Status" } th scope="col" { "Started" }
                        th scope="col" { "Duration" } th scope="col" { "Fetched" } th scope="col" { "Inserted" }
                        th scope="col" { "Updated" } th scope="col" { "Failed" }
                    } }
                    tbody {
                        @for run in &listed.items {
                            tr {
                                td { a href=(format!("/runs/{}", run.id)) { "Run " (run.id) } }
                                td { a href=(runs_of(&run.provider, &run.user_id)) { (run.user_id) "@" (run.provider) } }
                                td { (run.stream.as_deref().unwrap_or("all")) }
                                td { (run.trigger) }
                                td { (run.status) }
                                td { (time(Some(run.started_at))) }
                                td { (duration(run.started_at, run.finished_at)) }
                                td { (run.records_fetched) }
                                td { (run.records_inserted) }
                                td { (run.records_updated) }
                                td {
                                    @if run.records_failed > 0 {
                                        a href=(format!("/runs/{}#errors", run.id)) { (run.records_failed) " errors" }
                                    } @else { "0" }
                                }
                            }
                        }
                    }
                }
            }))
        }
        @if let Some(next) = listed.next {
            p { a href=(format!("/runs?{}", filters.with("before", next))) { "Older runs" } }
        }
    };
    page("Runs", admin.by_session, body).into_response()
}

/// One run and its errors, payloads pretty-printed and long ones folded.
async fn run(
    admin: Admin,
    State(state): State<ApiState>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let Ok(run_id) = id.parse::<i64>() else {
        return bad_request(&format!(
            "A run's id is a whole number, not {:?}.",
            tributary_providers::quote::truncated(&id, 32)
        ));
    };
    let filters = match Filters::parse(query.as_deref(), &["after"]) {
        Ok(filters) => filters,
        Err(message) => return bad_request(&message),
    };
    let after = match filters.id("after") {
        Ok(after) => after,
        Err(message) => return bad_request(&message),
    };
    let query = crate::ops::errors::RunErrorsQuery {
        run_id,
        after,
        limit: ERRORS_PER_PAGE,
    };
    let found = match crate::ops::errors::of_run(state.db.main(), &query).await {
        Ok(found) => found,
        Err(error) => return ops_error(&error),
    };
    let run = &found.run;
    let title = format!("Run {}", run.id);
    let body = html! {
        h1 { (title) }
        dl {
            dt { "Connection" } dd { a href=(runs_of(&run.provider, &run.user_id)) { (run.user_id) "@" (run.provider) } }
            dt { "Stream" } dd { (run.stream.as_deref().unwrap_or("all")) }
            dt { "Trigger" } dd { (run.trigger) }
            dt { "Status" } dd { (run.status) }
            dt { "Started" } dd { (time(Some(run.started_at))) }
            dt { "Duration" } dd { (duration(run.started_at, run.finished_at)) }
            dt { "Records" } dd {
                (run.records_fetched) " fetched, " (run.records_inserted) " inserted, "
                (run.records_updated) " updated, " (run.records_unchanged) " unchanged, "
                (run.records_deleted) " deleted, " (run.records_failed) " failed"
            }
            @if let Some(error) = &run.error {
                dt { "Error" } dd { (error) }
            }
        }
        h2 id="errors" { "Errors" }
        @if found.errors.items.is_empty() {
            p { "This run stored every record it fetched." }
        } @else {
            (scroll("run errors", html! {
                table {
                    thead { tr {
                        th scope="col" { "Error" } th scope="col" { "Record" } th scope="col" { "Stage" }
                        th scope="col" { "Message" } th scope="col" { "Payload" }
                    } }
                    tbody {
                        @for error in &found.errors.items {
                            tr {
                                td { (error.id) }
                                td { (error.external_id.as_deref().unwrap_or("-")) }
                                td { (error.stage) }
                                td class="wrap" { (error.message) }
                                td class="wrap" { (payload(&error.payload)) }
                            }
                        }
                    }
                }
            }))
        }
        @if let Some(next) = found.errors.next {
            p { a href=(format!("/runs/{run_id}?{}", filters.with("after", next))) { "More errors" } }
        }
    };
    page(&title, admin.by_session, body).into_response()
}

/// The webhook deliveries: the providers' in (the inbox), the app's out.
async fn webhooks(admin: Admin, State(state): State<ApiState>) -> Response {
    let db = state.db.main();
    let inbox = crate::ops::webhooks::InboxQuery {
        provider: None,
        status: None,
        before: None,
        limit: PAGE_SIZE,
    };
    let inbox = match crate::ops::webhooks::inbox(db, &inbox).await {
        Ok(page) => page.items,
        Err(error) => return ops_error(&error),
    };
    let out = crate::ops::notifications::DeliveriesQuery {
        limit: PAGE_SIZE,
        ..Default::default()
    };
    let out = match crate::ops::notifications::list(db, &out).await {
        Ok(page) => page.items,
        Err(error) => return ops_error(&error),
    };
    let body = html! {
        h1 { "Webhook deliveries" }
        h2 id="in" { "In: from providers" }
        @if inbox.is_empty() {
            p { "No provider has sent a webhook." }
        } @else {
            (scroll("deliveries in", html! {
                table {
                    thead { tr {
                        th scope="col" { "Provider" } th scope="col" { "Delivery" } th scope="col" { "Event" }
                        th scope="col" { "Received" } th scope="col" { "Status" } th scope="col" { "Attempts" } th scope="col" { "Error" }
                    } }
                    tbody {
                        @for delivery in &inbox {
                            tr {
                                td { (delivery.provider) }
                                td { (delivery.delivery_id) }
                                td { (delivery.event_type.as_deref().unwrap_or("-")) }
                                td { (time(Some(delivery.received_at))) }
                                td { (delivery.status) }
                                td { (delivery.attempts) }
                                td class="wrap" { (delivery.error.as_deref().unwrap_or("")) }
                            }
                        }
                    }
                }
            }))
        }
        h2 id="out" { "Out: to the app" }
        @if out.is_empty() {
            p { "No notification has been sent." }
        } @else {
            (scroll("deliveries out", html! {
                table {
                    thead { tr {
                        th scope="col" { "Delivery" } th scope="col" { "Event" } th scope="col" { "Connection" }
                        th scope="col" { "Created" } th scope="col" { "Status" } th scope="col" { "Attempts" } th scope="col" { "Last error" }
                    } }
                    tbody {
                        @for delivery in &out {
                            tr {
                                td { (delivery.delivery_id) }
                                td {
                                    @match delivery.run_id {
                                        Some(run_id) => a href=(format!("/runs/{run_id}")) { "Run " (run_id) },
                                        None => (delivery.event),
                                    }
                                }
                                td { (delivery.user_id) "@" (delivery.provider) }
                                td { (time(Some(delivery.created_at))) }
                                td { (delivery.status) }
                                td { (delivery.attempts) }
                                td class="wrap" { (delivery.last_error.as_deref().unwrap_or("")) }
                            }
                        }
                    }
                }
            }))
        }
    };
    page("Webhook deliveries", admin.by_session, body).into_response()
}

async fn not_found(_admin: Admin) -> Response {
    message_page(
        StatusCode::NOT_FOUND,
        "Not found",
        "There is no such page; the links above lead to every page.",
    )
}

/// The runs of connection `user_id@provider`.
fn runs_of(provider: &str, user_id: &str) -> String {
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("provider", provider)
        .append_pair("user_id", user_id)
        .finish();
    format!("/runs?{query}")
}

fn run_statuses() -> Vec<String> {
    crate::ops::runs::statuses()
        .iter()
        .map(RunStatus::to_string)
        .collect()
}

fn run_status(text: &str) -> Option<RunStatus> {
    crate::ops::runs::statuses()
        .into_iter()
        .find(|status| status.to_string() == text)
}

/// A table in a box of its own that scrolls sideways, focusable so that a keyboard
/// scrolls it too.
fn scroll(label: &str, table: Markup) -> Markup {
    html! {
        section class="scroll" aria-label=(label) tabindex="0" { (table) }
    }
}

fn time(at: Option<DateTime<Utc>>) -> String {
    match at {
        Some(at) => at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        None => "-".to_string(),
    }
}

fn duration(started: DateTime<Utc>, finished: Option<DateTime<Utc>>) -> String {
    let Some(finished) = finished else {
        return "running".to_string();
    };
    waited((finished - started).num_seconds())
}

/// A wait in seconds, as its largest two units.
fn waited(seconds: i64) -> String {
    let seconds = seconds.max(0);
    match seconds {
        0..60 => format!("{seconds} s"),
        60..3600 => format!("{} min {} s", seconds / 60, seconds % 60),
        3600..86400 => format!("{} h {} min", seconds / 3600, seconds % 3600 / 60),
        _ => format!("{} d {} h", seconds / 86400, seconds % 86400 / 3600),
    }
}

/// A payload as indented JSON (as stored, if it is not JSON), folded when long.
fn payload(text: &str) -> Markup {
    let pretty = serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|value| serde_json::to_string_pretty(&value).ok())
        .unwrap_or_else(|| text.to_string());
    let chars = pretty.chars().count();
    html! {
        @if chars > FOLD_CHARS {
            details {
                summary { "Payload (" (chars) " characters)" }
                pre { (pretty) }
            }
        } @else {
            pre { (pretty) }
        }
    }
}

/// `text` as a sentence: a capital first and a full stop last.
fn sentence(text: &str) -> String {
    let mut chars = text.chars();
    let Some(first) = chars.next() else {
        return String::new();
    };
    let rest = chars.as_str().trim_end_matches('.');
    format!("{}{rest}.", first.to_uppercase())
}

fn bad_request(message: &str) -> Response {
    message_page(StatusCode::BAD_REQUEST, "This did not work", message)
}

/// An operation's error as a page: what was not found or is wrong, or that the server
/// failed (logged, never shown).
fn ops_error(error: &OpsError) -> Response {
    match error {
        OpsError::NotFound { what, .. } => message_page(
            StatusCode::NOT_FOUND,
            "Not found",
            &format!("There is no {what}."),
        ),
        OpsError::Invalid { .. } | OpsError::Feed(_) => message_page(
            StatusCode::BAD_REQUEST,
            "This did not work",
            &sentence(&error.to_string()),
        ),
        error => {
            tracing::error!(%error, "An operator page failed.");
            message_page(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Something went wrong",
                "The page could not be read from the database; try again in a moment.",
            )
        }
    }
}

/// A page that says one thing, with its status.
fn message_page(status: StatusCode, title: &str, message: &str) -> Response {
    let body = html! {
        h1 { (title) }
        p class="error" role="alert" { (message) }
    };
    (status, page(title, false, body)).into_response()
}

/// A whole page around `body`: a skip link, the navigation and the main landmark.
fn page(title: &str, signed_in: bool, body: Markup) -> axum::response::Html<String> {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · tributary operator" }
                style { (PreEscaped(CSS)) }
            }
            body {
                a class="skip" href="#main" { "Skip to the content" }
                header {
                    strong { "tributary" }
                    nav aria-label="Pages" {
                        ul {
                            li { a href="/" { "Overview" } }
                            li { a href="/connections" { "Connections" } }
                            li { a href="/runs" { "Runs" } }
                            li { a href="/webhooks" { "Webhooks" } }
                        }
                    }
                    @if signed_in {
                        form method="post" action="/logout" {
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main id="main" { (body) }
            }
        }
    };
    axum::response::Html(markup.into_string())
}

/// The headers every answer of the page carries: a policy that allows its one
/// stylesheet and its own forms, nothing else.
async fn page_headers(mut response: Response) -> Response {
    use base64::Engine;
    use sha2::Digest;
    let style = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(CSS));
    let policy = format!(
        "default-src 'none'; style-src 'sha256-{style}'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    );
    if let Ok(policy) = HeaderValue::from_str(&policy) {
        response
            .headers_mut()
            .insert(header::CONTENT_SECURITY_POLICY, policy);
    }
    super::connect::page_headers(response).await
}
