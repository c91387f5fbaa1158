//! Request budgets shared through the database (`[providers.NAME.budget]`): the mock API
//! answers 429 past its limit, so a request the budget should have held back shows up as
//! a refused request and a run that did not end `deferred`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, Statement};
use tributary::config::Settings;
use tributary::entities::sync_run::RunStatus;
use tributary::pipeline::{NoProgress, RunOptions, RunOutcome};
use tributary::sync::{sync_matching, SyncFilter};
use wiremock::matchers::{method, path};
use wiremock::{Mock, Request, Respond, ResponseTemplate};

use crate::helpers::{cursor_provider, items, run, spawn_app, tributary, TestApp};

/// Records per page of the mock listing.
const PER_PAGE: usize = 2;

/// Which rate-limit headers the mock API sends with each answer.
#[derive(Clone, Copy)]
enum Headers {
    None,
    /// `X-RateLimit-Limit` and `X-RateLimit-Remaining`: the token had `left` requests
    /// left before our first.
    Github {
        left: usize,
    },
    /// `X-RateLimit-Limit: 100,1000` and `X-RateLimit-Usage`, the 15-minute window
    /// already `used` (by another application of ours) before our first request.
    Strava {
        used: usize,
    },
}

/// What the mock API has seen: requests per user, and the requests it refused with 429.
#[derive(Default)]
struct Seen {
    per_user: HashMap<String, usize>,
    total: usize,
    refused: usize,
}

/// A cursor listing of `pages` pages per user (`Bearer token-<user>`) that answers 429
/// once more than `limit` requests came (per user with `per_user`, else in all).
#[derive(Clone)]
struct LimitedApi {
    pages: usize,
    limit: usize,
    per_user: bool,
    headers: Headers,
    seen: Arc<Mutex<Seen>>,
}

impl LimitedApi {
    fn new(pages: usize, limit: usize) -> LimitedApi {
        LimitedApi {
            pages,
            limit,
            per_user: false,
            headers: Headers::None,
            seen: Arc::default(),
        }
    }

    async fn mount(&self, app: &TestApp) {
        Mock::given(method("GET"))
            .and(path("/v1/items"))
            .respond_with(self.clone())
            .mount(&app.api)
            .await;
    }

    fn total(&self) -> usize {
        self.seen.lock().unwrap().total
    }

    fn refused(&self) -> usize {
        self.seen.lock().unwrap().refused
    }

    fn of(&self, user: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .per_user
            .get(user)
            .copied()
            .unwrap_or(0)
    }
}

impl Respond for LimitedApi {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let user = request
            .headers
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer token-"))
            .unwrap_or("nobody")
            .to_string();
        let mut seen = self.seen.lock().unwrap();
        seen.total += 1;
        let count = {
            let of_user = seen.per_user.entry(user.clone()).or_default();
            *of_user += 1;
            *of_user
        };
        let counted = if self.per_user { count } else { seen.total };
        if counted > self.limit {
            seen.refused += 1;
            return ResponseTemplate::new(429);
        }
        let page = request
            .url
            .query_pairs()
            .find(|(name, _)| name == "cursor")
            .and_then(|(_, value)| value.strip_prefix('p')?.parse::<usize>().ok())
            .unwrap_or(0);
        let next = (page + 1 < self.pages).then(|| format!("p{}", page + 1));
        let start = page * PER_PAGE;
        let body = serde_json::json!({
            "data": items("r", &user, start..start + PER_PAGE),
            "next_cursor": next,
        });
        let answer = ResponseTemplate::new(200).set_body_json(body);
        match self.headers {
            Headers::None => answer,
            Headers::Github { left } => answer
                .insert_header("x-ratelimit-limit", "5000")
                .insert_header(
                    "x-ratelimit-remaining",
                    left.saturating_sub(counted).to_string().as_str(),
                )
                .insert_header("x-ratelimit-reset", "4102444800"),
            Headers::Strava { used } => answer
                .insert_header("x-ratelimit-limit", "100,1000")
                .insert_header(
                    "x-ratelimit-usage",
                    format!("{},{}", used + counted, used + counted).as_str(),
                ),
        }
    }
}

/// `acme`, a cursor provider on the mock API with `users`, a budget table, and
/// `max_rate_limit_wait`.
fn provider(app: &TestApp, users: &[&str], budget: &str, max_wait: &str) -> String {
    let text = cursor_provider("acme", &app.api.uri(), users).replace(
        "retry_max_delay = \"5ms\"",
        &format!("retry_max_delay = \"5ms\"\nmax_rate_limit_wait = \"{max_wait}\""),
    );
    format!("{text}\n[providers.acme.budget]\n{budget}\n")
}

/// Syncs the connections of `settings` (of `user` only, if given).
async fn sync_of(app: &TestApp, settings: &Settings, user: Option<&str>) -> Vec<RunOutcome> {
    let filter = SyncFilter {
        user_id: user.map(str::to_string),
        ..SyncFilter::default()
    };
    sync_matching(
        &app.db,
        settings,
        &filter,
        &RunOptions::manual(),
        &NoProgress,
    )
    .await
    .expect("runs recorded")
    .outcomes
}

/// The scopes of the rows in `rate_budgets`.
async fn budget_scopes(app: &TestApp) -> Vec<String> {
    let backend = app.db.get_database_backend();
    let statement =
        Statement::from_string(backend, "SELECT scope FROM rate_budgets ORDER BY scope");
    app.db
        .query_all_raw(statement)
        .await
        .expect("rate_budgets read")
        .iter()
        .map(|row| row.try_get::<String>("", "scope").expect("scope"))
        .collect()
}

/// The end of the window of `period` seconds that holds `at`.
fn window_end(at: DateTime<Utc>, period: i64) -> DateTime<Utc> {
    let start = at.timestamp().div_euclid(period) * period;
    DateTime::from_timestamp(start + period, 0).unwrap()
}

/// Waits out the last seconds of a window of `period`, so a test's requests fall in one.
async fn away_from_a_window_end(period: i64) {
    let now = Utc::now();
    let left = window_end(now, period) - now;
    if left < chrono::Duration::seconds(3) {
        tokio::time::sleep(left.to_std().unwrap() + Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn two_concurrent_syncs_sharing_an_app_budget_send_no_more_than_it_between_them() {
    let app = spawn_app().await;
    let api = LimitedApi::new(10, 5);
    api.mount(&app).await;
    let budget = "app = [{ requests = 5, per = \"1h\" }]";
    let settings = app
        .settings(&provider(&app, &["alice", "bob"], budget, "0s"))
        .await;
    away_from_a_window_end(3600).await;

    // Two syncs at once, as two instances would run them, one connection each.
    let (alice, bob) = tokio::join!(
        sync_of(&app, &settings, Some("alice")),
        sync_of(&app, &settings, Some("bob"))
    );

    assert_eq!(api.refused(), 0, "no request was answered 429");
    assert_eq!(api.total(), 5, "the budget's five requests, between them");
    for outcome in alice.iter().chain(&bob) {
        assert_eq!(outcome.status, RunStatus::Deferred, "{outcome:?}");
    }
    let pages: u64 = alice
        .iter()
        .chain(&bob)
        .map(|outcome| outcome.counts.pages_fetched)
        .sum();
    assert_eq!(pages, 5);
    assert_eq!(app.records().await.len(), 5 * PER_PAGE);
}

#[tokio::test]
async fn a_connection_budget_holds_for_each_token_on_its_own() {
    let app = spawn_app().await;
    let mut api = LimitedApi::new(10, 3);
    api.per_user = true;
    api.mount(&app).await;
    let budget = "connection = [{ requests = 3, per = \"1h\" }]";
    let settings = app
        .settings(&provider(&app, &["alice", "bob"], budget, "0s"))
        .await;
    away_from_a_window_end(3600).await;

    let outcomes = app.sync(&settings).await;

    assert_eq!(api.refused(), 0, "no request was answered 429");
    assert_eq!((api.of("alice"), api.of("bob")), (3, 3));
    for outcome in &outcomes {
        assert_eq!(outcome.status, RunStatus::Deferred, "{outcome:?}");
        assert_eq!(outcome.counts.pages_fetched, 3, "{outcome:?}");
    }
}

#[tokio::test]
async fn a_spent_budget_defers_the_run_to_the_windows_end_keeping_what_it_stored() {
    let app = spawn_app().await;
    let api = LimitedApi::new(5, 3);
    api.mount(&app).await;
    let budget = "app = [{ requests = 3, per = \"1h\" }]";
    let settings = app
        .settings(&provider(&app, &["alice"], budget, "0s"))
        .await;
    away_from_a_window_end(3600).await;
    let before = Utc::now();

    let outcome = app.sync_one(&settings).await;

    assert_eq!(outcome.status, RunStatus::Deferred, "{outcome:?}");
    assert_eq!(
        api.refused(),
        0,
        "the request that would be a 429 was never sent"
    );
    assert_eq!(api.total(), 3);
    let resume_at = outcome
        .resume_at
        .expect("a deferred run says when it resumes");
    assert_eq!(resume_at, window_end(before, 3600));
    let row = app.run_row(outcome.run_id).await;
    assert_eq!(row.status, RunStatus::Deferred);
    assert_eq!(row.resume_at, Some(resume_at));
    let error = row.error.unwrap_or_default();
    assert!(
        error.contains("request budget") && error.contains("spent until"),
        "{error}"
    );
    assert_eq!(
        app.records().await.len(),
        3 * PER_PAGE,
        "the pages before it are kept"
    );
    assert!(
        app.stream_checkpoint().await.is_some(),
        "the checkpoint is kept"
    );
}

#[tokio::test]
async fn a_deferred_run_resumes_from_its_checkpoint() {
    let app = spawn_app().await;
    let api = LimitedApi::new(5, 100);
    api.mount(&app).await;
    away_from_a_window_end(3600).await;
    let spent = app
        .settings(&provider(
            &app,
            &["alice"],
            "app = [{ requests = 3, per = \"1h\" }]",
            "0s",
        ))
        .await;
    let first = app.sync_one(&spent).await;
    assert_eq!(first.status, RunStatus::Deferred, "{first:?}");

    // The window reopened (here: a larger budget on the same table).
    let reopened = app
        .settings(&provider(
            &app,
            &["alice"],
            "app = [{ requests = 10, per = \"1h\" }]",
            "0s",
        ))
        .await;
    let second = app.sync_one(&reopened).await;

    assert_eq!(second.status, RunStatus::Succeeded, "{second:?}");
    assert_eq!(second.counts.pages_fetched, 2, "pages four and five only");
    assert_eq!(api.total(), 5, "no page fetched twice");
    assert_eq!(app.records().await.len(), 5 * PER_PAGE);
    assert_eq!(second.resume_at, None);
}

#[tokio::test]
async fn a_window_that_reopens_within_max_rate_limit_wait_is_waited_for() {
    let app = spawn_app().await;
    let api = LimitedApi::new(5, 100);
    api.mount(&app).await;
    let budget = "app = [{ requests = 2, per = \"1s\" }]";
    let settings = app
        .settings(&provider(&app, &["alice"], budget, "5s"))
        .await;
    let started = std::time::Instant::now();

    let outcome = app.sync_one(&settings).await;

    assert_eq!(outcome.status, RunStatus::Succeeded, "{outcome:?}");
    assert_eq!(api.total(), 5);
    // Five requests at two a second span at least three windows.
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn github_style_headers_saying_few_remain_lower_what_is_sent() {
    let app = spawn_app().await;
    // The token has four requests left this hour; our own count knows of none spent.
    let mut api = LimitedApi::new(10, 4);
    api.headers = Headers::Github { left: 4 };
    api.mount(&app).await;
    let budget = "connection = [{ requests = 5000, per = \"1h\" }]\nlearn_from_headers = true";
    let settings = app
        .settings(&provider(&app, &["alice"], budget, "0s"))
        .await;
    away_from_a_window_end(3600).await;

    let outcome = app.sync_one(&settings).await;

    assert_eq!(api.refused(), 0, "no request was answered 429");
    assert_eq!(api.total(), 4);
    assert_eq!(outcome.status, RunStatus::Deferred, "{outcome:?}");
    assert_eq!(outcome.counts.pages_fetched, 4);
}

#[tokio::test]
async fn strava_style_headers_saying_the_app_used_more_lower_what_is_sent() {
    let app = spawn_app().await;
    // Another instance of the application spent 96 of the quarter hour's 100 requests.
    let mut api = LimitedApi::new(10, 4);
    api.headers = Headers::Strava { used: 96 };
    api.mount(&app).await;
    let budget = "app = [{ requests = 100, per = \"15m\" }, { requests = 1000, per = \"1d\" }]\n\
                  learn_from_headers = true";
    let settings = app
        .settings(&provider(&app, &["alice"], budget, "0s"))
        .await;
    away_from_a_window_end(900).await;
    let before = Utc::now();

    let outcome = app.sync_one(&settings).await;

    assert_eq!(api.refused(), 0, "no request was answered 429");
    assert_eq!(api.total(), 4);
    assert_eq!(outcome.status, RunStatus::Deferred, "{outcome:?}");
    assert_eq!(outcome.resume_at, Some(window_end(before, 900)));
}

#[tokio::test]
async fn headers_are_not_learnt_unless_asked() {
    let app = spawn_app().await;
    // The headers say two requests remain, which a budget that does not learn ignores.
    let mut api = LimitedApi::new(6, 100);
    api.headers = Headers::Github { left: 2 };
    api.mount(&app).await;
    let settings = app
        .settings(&provider(
            &app,
            &["alice"],
            "connection = [{ requests = 6, per = \"1h\" }]",
            "0s",
        ))
        .await;
    away_from_a_window_end(3600).await;

    let outcome = app.sync_one(&settings).await;

    assert_eq!(outcome.status, RunStatus::Succeeded, "{outcome:?}");
    assert_eq!(api.total(), 6);
}

#[tokio::test]
async fn without_a_budget_no_request_touches_the_budget_table() {
    let app = spawn_app().await;
    let api = LimitedApi::new(3, 100);
    api.mount(&app).await;
    let settings = app
        .settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;

    let outcome = app.sync_one(&settings).await;

    assert_eq!(outcome.status, RunStatus::Succeeded, "{outcome:?}");
    assert_eq!(api.total(), 3);
    assert_eq!(budget_scopes(&app).await, Vec::<String>::new());
}

#[tokio::test]
async fn windows_that_ended_are_swept_when_a_new_one_opens() {
    let app = spawn_app().await;
    let api = LimitedApi::new(1, 100);
    api.mount(&app).await;
    let settings = app
        .settings(&provider(
            &app,
            &["alice"],
            "app = [{ requests = 5, per = \"1h\" }]",
            "0s",
        ))
        .await;
    // A window of an hour that ended long ago, of a connection since removed.
    app.execute(
        "INSERT INTO rate_budgets (scope, period_seconds, window_start, window_end, used) \
         VALUES ('connection:999', 3600, 0, 3600, 7)",
    )
    .await;

    let outcome = app.sync_one(&settings).await;

    assert_eq!(outcome.status, RunStatus::Succeeded, "{outcome:?}");
    assert_eq!(budget_scopes(&app).await, ["provider:acme"]);
}

#[tokio::test]
async fn the_cli_shows_a_deferred_run_and_when_it_resumes_and_exits_zero() {
    let app = spawn_app().await;
    let api = LimitedApi::new(5, 2);
    api.mount(&app).await;
    away_from_a_window_end(3600).await;
    let budget = "app = [{ requests = 2, per = \"1h\" }]";
    let config = app.write_config(&provider(&app, &["alice"], budget, "0s"));
    let resume_at = window_end(Utc::now(), 3600);

    let sync = run(tributary(&config).args(["sync", "--quiet"]));

    assert_eq!(
        sync.code, 0,
        "a deferred run is no failure: {}",
        sync.stderr
    );
    let stamp = resume_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    assert!(
        sync.stdout.contains("alice@acme deferred")
            && sync.stdout.contains(&format!("resume_at={stamp}")),
        "{}",
        sync.stdout
    );
    let runs = run(tributary(&config).args(["runs", "--wide"]));
    assert_eq!(runs.code, 0, "{}", runs.stderr);
    let shown = resume_at.format("%Y-%m-%d %H:%M:%S").to_string();
    assert!(
        runs.stdout.contains("resume at (UTC)")
            && runs.stdout.contains("deferred")
            && runs.stdout.contains(&shown),
        "{}",
        runs.stdout
    );
    let json = run(tributary(&config).args(["runs", "--json"]));
    let rows: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(rows[0]["status"], "deferred", "{rows}");
    assert_eq!(api.refused(), 0);
}

#[tokio::test]
async fn a_daemons_deferred_run_goes_on_as_a_queued_job_when_its_window_reopens() {
    use crate::daemon::{daemon_table, eventually, Daemon};
    use sea_orm::{EntityTrait, QueryOrder};
    use std::time::Duration;
    use tributary::entities::sync_job::{self, JobKind, JobStatus};
    let app = spawn_app().await;
    // The API itself would refuse past 100; the budget lets 2 requests through per 2 s.
    let api = LimitedApi::new(4, 100);
    api.mount(&app).await;
    let providers = provider(
        &app,
        &["alice"],
        "app = [{ requests = 2, per = \"2s\" }]",
        "0s",
    )
    .replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 0 0 1 1 *\"",
    );
    let config = app.write_config(&format!("{}{providers}", daemon_table(None)));
    app.settings(&providers).await;
    let queued = crate::helpers::run(
        crate::helpers::tributary(&config).args(["sync", "--queue", "--user", "alice"]),
    );
    assert_eq!(queued.code, 0, "{}", queued.stderr);
    let mut daemon = Daemon::start(&config, app.dir.path().join("daemon.log"));
    eventually(Duration::from_secs(30), "alice synced whole", || async {
        app.records().await.len() == 4 * PER_PAGE
    })
    .await;
    eventually(Duration::from_secs(10), "every job done", || async {
        sync_job::Entity::find()
            .all(&app.db)
            .await
            .unwrap()
            .iter()
            .all(|job| job.status == JobStatus::Done)
    })
    .await;
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait(Duration::from_secs(15)), 0, "{}", daemon.log());
    assert_eq!(api.refused(), 0, "no request past the budget was sent");
    assert_eq!(api.total(), 4, "each page fetched once");
    let runs = crate::daemon::runs_of(&app, "alice").await;
    let (last, deferred) = runs.split_last().expect("runs");
    assert_eq!(last.status, RunStatus::Succeeded, "{runs:?}");
    assert!(!deferred.is_empty(), "{runs:?}");
    assert!(
        deferred.iter().all(|run| run.status == RunStatus::Deferred),
        "{runs:?}"
    );
    let jobs = sync_job::Entity::find()
        .order_by_asc(sync_job::Column::Id)
        .all(&app.db)
        .await
        .unwrap();
    assert_eq!(jobs.len(), runs.len(), "{jobs:?}");
    for ((job, run), next) in jobs.iter().zip(&runs).zip(jobs.iter().skip(1)) {
        let resume_at = run.resume_at.expect("a deferred run says when it resumes");
        let outcome = job.outcome.as_deref().unwrap_or_default();
        assert!(
            outcome.ends_with(&format!(
                "; deferred: the request budget is spent, the rest queued for {resume_at}"
            )),
            "{outcome}"
        );
        assert_eq!(next.kind, JobKind::Resume);
        assert!(next.not_before >= Some(resume_at), "{next:?}");
    }
}

#[tokio::test]
async fn a_sync_whose_clock_is_30_s_ahead_counts_in_the_databases_window_and_stamps_its_time() {
    use crate::helpers::{backend, Backend};
    if backend() == Backend::Sqlite {
        // SQLite's clock is this machine's: there is no other clock to follow.
        return;
    }
    let libfaketime = crate::queue_faults::libfaketime();
    let app = spawn_app().await;
    let api = LimitedApi::new(2, 100);
    api.mount(&app).await;
    let budget = "app = [{ requests = 100, per = \"10s\" }]";
    let config = app.write_config(&provider(&app, &["alice"], budget, "0s"));

    let sync = run(tributary(&config)
        .args(["sync", "--quiet"])
        .env("LD_PRELOAD", &libfaketime)
        .env("FAKETIME", "+30s"));
    let end = Utc::now();

    assert_eq!(sync.code, 0, "{}", sync.stderr);
    assert_eq!(api.total(), 2, "both pages fetched");
    let backend = app.db.get_database_backend();
    let windows = app
        .db
        .query_all_raw(Statement::from_string(
            backend,
            "SELECT window_start FROM rate_budgets",
        ))
        .await
        .expect("rate_budgets read");
    assert!(!windows.is_empty(), "the budget was taken from");
    for window in &windows {
        let start: i64 = window.try_get("", "window_start").expect("window_start");
        // A request in a window's last half second counts in the next one too, which
        // starts within a second of now; 30 s ahead would start 20 s later at least.
        assert!(
            start <= end.timestamp() + 1,
            "the window is the database's, not 30 s ahead: starts {start}, now {}",
            end.timestamp()
        );
    }
    let runs = crate::daemon::runs_of(&app, "alice").await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(
        runs[0].started_at <= end && runs[0].finished_at.is_some_and(|at| at <= end),
        "the run is stamped by the database's clock: {:?}, now {end}",
        runs[0]
    );
}

#[tokio::test]
async fn a_sync_queued_by_a_clock_30_s_ahead_is_due_by_the_databases_clock() {
    use crate::helpers::{backend, Backend};
    use sea_orm::EntityTrait;
    use tributary::entities::sync_job;
    if backend() == Backend::Sqlite {
        return;
    }
    let libfaketime = crate::queue_faults::libfaketime();
    let app = spawn_app().await;
    let config = app.write_config(&provider(&app, &["alice"], "", "0s"));

    let queued = run(tributary(&config)
        .args(["sync", "--queue"])
        .env("LD_PRELOAD", &libfaketime)
        .env("FAKETIME", "+30s"));
    let end = Utc::now();

    assert_eq!(queued.code, 0, "{}", queued.stderr);
    let jobs = sync_job::Entity::find().all(&app.db).await.unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert!(
        jobs[0].not_before.is_some_and(|due| due <= end),
        "due now by the database's clock, not in 30 s: {:?}, now {end}",
        jobs[0]
    );
}
