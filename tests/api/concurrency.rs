//! A provider's connections sync concurrently up to `max_concurrent_connections`, and
//! share its `requests_per_second` budget.

use std::time::{Duration, Instant};

use sea_orm::EntityTrait;
use serde_json::json;
use tributary::entities::sync_run;
use wiremock::matchers::{header, method};
use wiremock::{Mock, ResponseTemplate};

use crate::helpers::{cursor_provider, items, spawn_app, TestApp};

pub(crate) const USERS: [&str; 4] = ["u1", "u2", "u3", "u4"];

pub(crate) async fn mount_slow_pages(app: &TestApp, delay: Duration) {
    for user in USERS {
        Mock::given(method("GET"))
            .and(header(
                "authorization",
                format!("Bearer token-{user}").as_str(),
            ))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(json!({"data": items(user, user, 0..2), "next_cursor": null}))
                    .set_delay(delay),
            )
            .mount(&app.api)
            .await;
    }
}

/// The most runs that were open at the same instant.
pub(crate) async fn peak_overlap(app: &TestApp) -> usize {
    let runs = sync_run::Entity::find().all(&app.db).await.unwrap();
    runs.iter()
        .map(|run| {
            runs.iter()
                .filter(|other| {
                    other.started_at <= run.started_at
                        && other.finished_at.is_some_and(|end| end > run.started_at)
                })
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[tokio::test]
async fn connections_run_concurrently_up_to_the_providers_limit() {
    for (limit, expected_peak) in [(2, 2), (4, 4)] {
        let app = spawn_app().await;
        mount_slow_pages(&app, Duration::from_millis(600)).await;
        let providers = cursor_provider("acme", &app.api.uri(), &USERS).replace(
            "schedule = \"0 */15 * * * *\"",
            &format!("schedule = \"0 */15 * * * *\"\nmax_concurrent_connections = {limit}"),
        );
        let settings = app.settings(&providers).await;
        let outcomes = app.sync(&settings).await;
        assert_eq!(outcomes.len(), 4);
        assert_eq!(app.records().await.len(), 8);
        assert_eq!(peak_overlap(&app).await, expected_peak, "limit {limit}");
    }
}

#[tokio::test]
async fn requests_per_second_is_one_budget_for_all_of_a_providers_connections() {
    let app = spawn_app().await;
    mount_slow_pages(&app, Duration::ZERO).await;
    let providers = cursor_provider("acme", &app.api.uri(), &USERS).replace(
        "schedule = \"0 */15 * * * *\"",
        "schedule = \"0 */15 * * * *\"\nrequests_per_second = 4.0",
    );
    let settings = app.settings(&providers).await;
    let started = Instant::now();
    let outcomes = app.sync(&settings).await;
    // Four requests at four a second, the first free: at least three quarters of a second,
    // though the four connections run at once.
    assert!(
        started.elapsed() >= Duration::from_millis(700),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(outcomes.len(), 4);
    assert_eq!(app.received_requests().await, 4);
}
