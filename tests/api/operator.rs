//! The operator page over HTTP, on a real `tributary daemon` with `[operator]`: who is let
//! in (an admin key, as a bearer or through a session), how a session ends (sign-out, its
//! key revoked), and the pages of bad input.

use chrono::{TimeDelta, Utc};
use reqwest::StatusCode;
use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, Set, Statement,
};
use serde_json::json;
use tributary::entities::notification_delivery::{self, DeliveryStatus};
use tributary::entities::sync_job::{self, JobKind, JobStatus};
use tributary::entities::sync_run::{self, RunStatus};
use tributary::entities::{connection, connection_stream};

use crate::daemon::free_port;
use crate::helpers::{
    cursor_provider, mount_cursor_pages, read_feed, run, spawn_app, tributary, TestApp,
};
use crate::http::Served;

/// A long field, so that the failed record's payload is folded on its run's page.
pub(crate) const LONG_NOTE: usize = 800;

/// A daemon with `[operator]` over seeded data: alice's connection at `acme` with a run
/// whose record `poison` was refused, a webhook delivery in and one out, a deferred job.
pub(crate) struct Seeded {
    pub app: TestApp,
    pub served: Served,
    /// The operator page's base URL.
    pub page: String,
    pub admin: String,
    pub run_id: i64,
    pub delivery_in: String,
    pub delivery_out: String,
    /// Keys that read the change feed: `exporter` up to date, `laggard` set back to the
    /// feed's start as though it last read 40 days ago.
    pub exporter: String,
    pub laggard: String,
}

pub(crate) async fn seeded() -> Seeded {
    let app = spawn_app().await;
    app.refuse_inserts_of("poison", "poison refused").await;
    mount_cursor_pages(
        &app.api,
        vec![(
            json!([{"id": "a"}, {"id": "poison", "note": "n".repeat(LONG_NOTE)}]),
            None,
        )],
    )
    .await;
    let providers = cursor_provider("acme", &app.api.uri(), &["alice"]);
    let settings = app.settings(&providers).await;
    let failed = app.sync_one(&settings).await;
    assert_eq!(
        (failed.status, failed.counts.failed),
        (RunStatus::Partial, 1)
    );
    let alice = connection::Entity::find()
        .one(&app.db)
        .await
        .expect("connections")
        .expect("alice");
    let delivery_out = "00000000-0000-0000-0000-00000000beef".to_string();
    notification_delivery::ActiveModel {
        delivery_id: Set(delivery_out.clone()),
        run_id: Set(Some(failed.run_id)),
        event: Set(notification_delivery::DeliveryEvent::Run),
        user_id: Set("alice".to_string()),
        provider: Set("acme".to_string()),
        body: Set("{}".to_string()),
        status: Set(DeliveryStatus::Delivered),
        attempts: Set(1),
        last_error: Set(None),
        next_attempt_at: Set(Utc::now()),
        created_at: Set(Utc::now()),
        delivered_at: Set(Some(Utc::now())),
        ..Default::default()
    }
    .insert(&*app.db)
    .await
    .expect("delivery out");
    crate::retention::webhook_at(&app, "failed", Utc::now()).await;
    let delivery_in: String = app
        .db
        .query_one_raw(Statement::from_string(
            app.db.get_database_backend(),
            "SELECT delivery_id FROM webhook_deliveries",
        ))
        .await
        .expect("query")
        .expect("a delivery")
        .try_get_by_index(0)
        .expect("delivery_id");
    sync_job::ActiveModel {
        connection_id: Set(alice.id),
        provider: Set("acme".to_string()),
        stream: Set(String::new()),
        kind: Set(JobKind::Manual),
        not_before: Set(Some(Utc::now() + TimeDelta::hours(1))),
        status: Set(JobStatus::Queued),
        created_at: Set(Utc::now()),
        ..Default::default()
    }
    .insert(&*app.db)
    .await
    .expect("job");
    let port = free_port();
    let served = Served::start_with(&app, &providers, "daemon", |text| {
        format!("{text}\n[operator]\nlisten = \"127.0.0.1:{port}\"\n")
    })
    .await;
    let admin = served.create_key("admin", &["admin"]);
    let exporter = served.create_key("exporter", &["records:read"]);
    let laggard = served.create_key("laggard", &["records:read"]);
    // On PostgreSQL the run's batch is readable once no older transaction is open.
    read_feed(&app.db, tributary::pipeline::changes::Cursor::START, 100).await;
    for key in [&exporter, &laggard] {
        let (status, page) = served.get("/v1/changes", key).await;
        assert_eq!(status, StatusCode::OK, "{page}");
    }
    let laggard_id = crate::http_feed::key_id(&app, "laggard").await;
    let set_back = Query::update()
        .table(Alias::new("feed_readers"))
        .values([
            (Alias::new("seq"), 0i64.into()),
            (Alias::new("ordinal"), 0i64.into()),
            (
                Alias::new("read_at"),
                (Utc::now() - TimeDelta::days(40)).into(),
            ),
        ])
        .and_where(Expr::col(Alias::new("key_id")).eq(laggard_id))
        .to_owned();
    app.db.execute(&set_back).await.expect("set back");
    Seeded {
        app,
        served,
        page: format!("http://127.0.0.1:{port}"),
        admin,
        run_id: failed.run_id,
        delivery_in,
        delivery_out,
        exporter,
        laggard,
    }
}

/// A client that does not follow redirects, so that a test sees them.
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

/// GET `path` of the page with `key` as bearer or `cookie` as the session: its status,
/// headers and HTML.
pub(crate) async fn get(
    seeded: &Seeded,
    path: &str,
    key: Option<&str>,
    cookie: Option<&str>,
) -> (StatusCode, reqwest::header::HeaderMap, String) {
    let mut request = client().get(format!("{}{path}", seeded.page));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(cookie) = cookie {
        request = request.header("cookie", format!("tributary_operator={cookie}"));
    }
    let response = request.send().await.expect("the page answers");
    let status = response.status();
    let headers = response.headers().clone();
    (status, headers, response.text().await.expect("a body"))
}

/// Posts `key` to the login form: the status, and the session's `Set-Cookie`.
async fn sign_in(seeded: &Seeded, key: &str) -> (StatusCode, Option<String>, String) {
    let body = form_urlencoded::Serializer::new(String::new())
        .append_pair("key", key)
        .finish();
    let response = client()
        .post(format!("{}/login", seeded.page))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .expect("the page answers");
    let status = response.status();
    let cookie = response
        .headers()
        .get("set-cookie")
        .and_then(|value| value.to_str().ok())
        .map(str::to_string);
    (status, cookie, response.text().await.expect("a body"))
}

/// The token of a `Set-Cookie` of the session.
fn token_of(set_cookie: &str) -> String {
    set_cookie
        .split(';')
        .next()
        .and_then(|pair| pair.strip_prefix("tributary_operator="))
        .expect("the session cookie")
        .to_string()
}

async fn sessions(app: &TestApp) -> Vec<String> {
    app.db
        .query_all_raw(Statement::from_string(
            app.db.get_database_backend(),
            "SELECT token_hash FROM operator_sessions ORDER BY id",
        ))
        .await
        .expect("sessions")
        .iter()
        .map(|row| row.try_get_by_index(0).expect("token_hash"))
        .collect()
}

#[tokio::test]
async fn only_an_admin_key_or_its_live_session_opens_the_operator_page() {
    let seeded = seeded().await;
    let reader = seeded
        .served
        .create_key("reader", &["connections:read", "records:read"]);
    let run_link = format!("/runs/{}", seeded.run_id);

    // Without a key: the login page, 401, and no data.
    for path in ["/", "/runs", run_link.as_str(), "/webhooks", "/nowhere"] {
        let (status, headers, html) = get(&seeded, path, None, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {html}");
        assert!(
            html.contains("<form method=\"post\" action=\"/login\">"),
            "{html}"
        );
        assert!(!html.contains("poison"), "{path} shows data: {html}");
        assert!(headers["content-security-policy"]
            .to_str()
            .expect("policy")
            .starts_with("default-src 'none'; style-src 'sha256-"));
    }
    // A key without the admin scope: refused, saying why.
    let (status, _, html) = get(&seeded, &run_link, Some(&reader), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{html}");
    assert!(html.contains("lacks the admin scope"), "{html}");
    assert!(!html.contains("poison"), "{html}");
    let (status, cookie, html) = sign_in(&seeded, &reader).await;
    assert_eq!((status, cookie), (StatusCode::FORBIDDEN, None), "{html}");
    let (status, cookie, html) = sign_in(&seeded, "trb_0123456789ab_nope").await;
    assert_eq!((status, cookie), (StatusCode::UNAUTHORIZED, None), "{html}");
    assert!(html.contains("The API key is not known."), "{html}");
    assert!(sessions(&seeded.app).await.is_empty());

    // The admin key as a bearer.
    let (status, _, html) = get(&seeded, &run_link, Some(&seeded.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(html.contains("poison refused"), "{html}");

    // Posted once: a session in an HttpOnly, SameSite=Strict cookie; the row keeps a hash.
    let (status, cookie, html) = sign_in(&seeded, &seeded.admin).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{html}");
    let cookie = cookie.expect("a session cookie");
    assert!(cookie.contains("; HttpOnly; SameSite=Strict"), "{cookie}");
    assert!(cookie.contains("Max-Age=28800"), "{cookie}");
    assert!(!cookie.contains("Secure"), "plain http: {cookie}");
    let token = token_of(&cookie);
    let stored = sessions(&seeded.app).await;
    assert_eq!(stored.len(), 1);
    assert!(!stored[0].contains(&token), "only a hash is kept");
    let (status, _, html) = get(&seeded, &run_link, None, Some(&token)).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(
        html.contains("poison refused") && html.contains("Sign out"),
        "{html}"
    );

    // Sign-out deletes the row; the cookie then opens nothing.
    let response = client()
        .post(format!("{}/logout", seeded.page))
        .header("cookie", format!("tributary_operator={token}"))
        .send()
        .await
        .expect("answer");
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(response.headers()["location"], "/login");
    assert!(sessions(&seeded.app).await.is_empty());
    let (status, _, html) = get(&seeded, "/", None, Some(&token)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{html}");
    assert!(html.contains("The session has ended"), "{html}");

    // A revoked key ends its session at the next request.
    let (_, cookie, _) = sign_in(&seeded, &seeded.admin).await;
    let token = token_of(&cookie.expect("a session cookie"));
    let revoked =
        run(tributary(&seeded.served.config).args(["api-keys", "revoke", "--name", "admin"]));
    assert_eq!(revoked.code, 0, "{}", revoked.stderr);
    let (status, _, html) = get(&seeded, "/", None, Some(&token)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{html}");
    assert!(html.contains("The API key has been revoked."), "{html}");
    assert!(!html.contains("Job queue"), "{html}");
    assert!(
        sessions(&seeded.app).await.is_empty(),
        "the session is deleted"
    );
}

/// The `<td>` that names the reader whose key is `key`: its name and prefix.
fn reader_cell(name: &str, key: &str) -> String {
    let prefix = key
        .strip_prefix("trb_")
        .and_then(|rest| rest.split('_').next())
        .expect("a key's prefix");
    format!("<td>{name} (<code>trb_{prefix}</code>)</td>")
}

#[tokio::test]
async fn the_overview_shows_each_feed_reader_with_its_lag_and_flags_the_idle_one() {
    let seeded = seeded().await;
    let (status, _, html) = get(&seeded, "/", Some(&seeded.admin), None).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    let rows: Vec<&str> = html
        .split("<tr>")
        .filter(|row| row.contains("(<code>trb_"))
        .collect();
    assert_eq!(rows.len(), 2, "one row a reader: {html}");
    // The furthest behind first: the laggard, one change behind (alice's record `a`),
    // idle longer than the 30 days' retention.
    let (laggard, exporter) = (rows[0], rows[1]);
    assert!(
        laggard.starts_with(&reader_cell("laggard", &seeded.laggard)),
        "{laggard}"
    );
    assert!(laggard.contains("<td>1</td>"), "{laggard}");
    assert!(laggard.contains("(oldest unread committed "), "{laggard}");
    assert!(
        laggard.contains("Idle longer than the retention (30 d 0 h): it will get 410"),
        "{laggard}"
    );
    assert!(
        exporter.starts_with(&reader_cell("exporter", &seeded.exporter)),
        "{exporter}"
    );
    assert!(
        exporter.contains("<td>0</td><td>up to date</td>"),
        "{exporter}"
    );
    assert!(
        exporter.contains("<td class=\"wrap\">reading</td>"),
        "{exporter}"
    );
    for key in [&seeded.exporter, &seeded.laggard, &seeded.admin] {
        assert!(!html.contains(key.as_str()), "never a key: {html}");
    }
}

#[tokio::test]
async fn bad_input_on_the_operator_page_is_a_page_that_names_it() {
    let seeded = seeded().await;
    let admin = Some(seeded.admin.as_str());
    for (path, status, says) in [
        (
            "/runs/999999999",
            StatusCode::NOT_FOUND,
            "There is no run with id 999999999.",
        ),
        (
            "/runs/abc",
            StatusCode::BAD_REQUEST,
            "is a whole number, not &quot;abc&quot;",
        ),
        (
            "/runs?status=bogus",
            StatusCode::BAD_REQUEST,
            "The filter status must be one of running, succeeded",
        ),
        (
            "/runs?colour=red",
            StatusCode::BAD_REQUEST,
            "This page has no filter &quot;colour&quot;",
        ),
        (
            "/runs?before=soon",
            StatusCode::BAD_REQUEST,
            "The filter before must be a whole number",
        ),
        (
            "/runs?provider=a&provider=b",
            StatusCode::BAD_REQUEST,
            "The filter provider is given twice.",
        ),
        (
            "/connections?after=x",
            StatusCode::BAD_REQUEST,
            "The filter after must be a whole number",
        ),
        ("/nowhere", StatusCode::NOT_FOUND, "There is no such page"),
    ] {
        let (got, headers, html) = get(&seeded, path, admin, None).await;
        assert_eq!(got, status, "{path}: {html}");
        assert!(html.contains(says), "{path}: {html}");
        assert!(
            headers["content-type"]
                .to_str()
                .expect("type")
                .starts_with("text/html"),
            "{path}"
        );
    }
    // The filters that exist narrow the runs.
    let (status, _, html) = get(
        &seeded,
        "/runs?status=partial&provider=acme&user_id=alice",
        admin,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(html.contains(&format!("Run {}", seeded.run_id)), "{html}");
    let (status, _, html) = get(&seeded, "/runs?status=failed", admin, None).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(html.contains("No run matches."), "{html}");
    let (status, _, html) = get(&seeded, "/connections?provider=other", admin, None).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(html.contains("No connection matches."), "{html}");
}

#[tokio::test]
async fn a_non_loopback_operator_address_needs_public_and_the_error_names_file_and_key() {
    let app = spawn_app().await;
    let config = app.write_config(&format!(
        "[api]\nlisten = \"127.0.0.1:{}\"\n\n[operator]\nlisten = \"0.0.0.0:7171\"\n",
        free_port()
    ));
    let checked = run(tributary(&config).arg("check-config"));
    assert_ne!(checked.code, 0, "{}", checked.stdout);
    assert!(
        checked.stderr.contains("operator.listen"),
        "{}",
        checked.stderr
    );
    assert!(
        checked.stderr.contains(&config.display().to_string()),
        "{}",
        checked.stderr
    );
    assert!(
        checked.stderr.contains("public = true"),
        "{}",
        checked.stderr
    );
}

/// The next slot of `0 */15 * * * *` after `now`, as the page writes it.
fn next_quarter_hour(now: chrono::DateTime<Utc>) -> String {
    let seconds = now.timestamp();
    let next = (seconds / 900 + 1) * 900;
    chrono::DateTime::from_timestamp(next, 0)
        .expect("a time")
        .format("%Y-%m-%d %H:%M:%S UTC")
        .to_string()
}

#[tokio::test]
async fn the_tables_show_each_runs_times_counters_and_cursor_and_the_overview_the_feed_head() {
    let seeded = seeded().await;
    // Known times and a known cursor, so that the page's values can be read back exactly.
    let started = chrono::DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
        .expect("a time")
        .with_timezone(&Utc);
    sync_run::Entity::update_many()
        .col_expr(sync_run::Column::StartedAt, Expr::value(started))
        .col_expr(
            sync_run::Column::FinishedAt,
            Expr::value(started + TimeDelta::seconds(75)),
        )
        .filter(sync_run::Column::Id.eq(seeded.run_id))
        .exec(&*seeded.app.db)
        .await
        .expect("the run's times");
    // The provider's one stream, `records`, keeps its cursor in its own row.
    connection_stream::Entity::update_many()
        .col_expr(connection_stream::Column::Cursor, Expr::value("cursor-7q"))
        .exec(&*seeded.app.db)
        .await
        .expect("the cursor");

    // Signed in by the form: the session's pages carry the policy as the login page does.
    let (status, cookie, html) = sign_in(&seeded, &seeded.admin).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{html}");
    let token = token_of(&cookie.expect("a session cookie"));
    let run = seeded.run_id;

    let before = next_quarter_hour(Utc::now());
    let (status, headers, html) = get(&seeded, "/connections", None, Some(&token)).await;
    let after = next_quarter_hour(Utc::now());
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(headers["content-security-policy"]
        .to_str()
        .expect("policy")
        .starts_with("default-src 'none'; style-src 'sha256-"));
    let last =
        format!("<td><a href=\"/runs/{run}\">Run {run}</a>, partial, 2026-01-02 03:05:20 UTC</td>");
    let cursor = "<td class=\"wrap\"><code>cursor-7q</code></td>";
    assert!(
        [&before, &after]
            .iter()
            .any(|next| html.contains(&format!("{last}<td>{next}</td>{cursor}"))),
        "last run, next run {before} and cursor: {html}"
    );

    let (status, headers, html) = get(&seeded, "/runs", None, Some(&token)).await;
    assert_eq!(status, StatusCode::OK, "{html}");
    assert!(headers.contains_key("content-security-policy"));
    // Started, duration, fetched, inserted, updated, failed.
    let row = format!(
        "<td>2026-01-02 03:04:05 UTC</td><td>1 min 15 s</td><td>2</td><td>1</td><td>0</td><td><a href=\"/runs/{run}#errors\">1 errors</a></td>"
    );
    assert!(html.contains(&row), "{row} in {html}");

    // On PostgreSQL the head holds back while any older transaction is open (other tests'
    // too), so one read may lag another: ask again until the page shows the head just read.
    let head_now = || {
        let printed =
            crate::helpers::run(tributary(&seeded.served.config).args(["changes", "--head"]));
        assert_eq!(printed.code, 0, "{}", printed.stderr);
        printed
            .stdout
            .trim()
            .parse::<tributary::pipeline::changes::FeedCursor>()
            .expect("a cursor")
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let head = head_now();
        let (status, headers, html) = get(&seeded, "/", None, Some(&token)).await;
        assert_eq!(status, StatusCode::OK, "{html}");
        assert!(headers.contains_key("content-security-policy"));
        assert!(head.position.seq > 0, "the run committed a batch");
        let shown = format!(
            "<dt>Head</dt><dd><code>{head}</code> (batch {})</dd>",
            head.position.seq
        );
        if html.contains(&shown) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{shown} in {html}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
