//! A `tributary sync` killed with SIGKILL mid-run resumes from its last committed page, and
//! the records table then equals that of a run that was never interrupted.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sea_orm::{EntityTrait, PaginatorTrait};
use serde_json::json;
use tributary::entities::{connection, record};
use wiremock::matchers::{method, path, query_param, query_param_is_missing};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{cursor_provider, items, spawn_app, TestApp};

const PAGES: usize = 6;
const PER_PAGE: usize = 20;

/// A six-page cursor listing whose pages each take `delay` to answer.
async fn mount_slow_listing(server: &MockServer, delay: Duration) {
    for page in 0..PAGES {
        let start = page * PER_PAGE;
        let next = (page + 1 < PAGES).then(|| format!("p{}", page + 1));
        let body =
            json!({"data": items("k", "alice", start..start + PER_PAGE), "next_cursor": next});
        let mock = Mock::given(method("GET")).and(path("/v1/items"));
        let mock = if page == 0 {
            mock.and(query_param_is_missing("cursor"))
        } else {
            mock.and(query_param("cursor", format!("p{page}").as_str()))
        };
        mock.respond_with(
            ResponseTemplate::new(200)
                .set_body_json(body)
                .set_delay(delay),
        )
        .mount(server)
        .await;
    }
}

fn sync_command(config: &std::path::Path) -> Command {
    let mut command = Command::new(assert_cmd::cargo::cargo_bin("tributary"));
    command
        .arg("--config")
        .arg(config)
        .args(["sync", "--quiet"])
        .env_remove("TRIBUTARY_DATABASE_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// (external_id, payload, content_hash) of every record, in key order.
async fn content(app: &TestApp) -> Vec<(String, String, String)> {
    app.records()
        .await
        .into_iter()
        .map(|r| (r.external_id, r.payload, r.content_hash))
        .collect()
}

#[tokio::test]
async fn a_sync_killed_mid_run_resumes_from_its_checkpoint_and_ends_identical() {
    // The reference: the same listing synced without interruption.
    let reference = spawn_app().await;
    mount_slow_listing(&reference.api, Duration::ZERO).await;
    let settings = reference
        .settings(&cursor_provider("acme", &reference.api.uri(), &["alice"]))
        .await;
    reference.sync_one(&settings).await;
    let expected = content(&reference).await;
    assert_eq!(expected.len(), PAGES * PER_PAGE);

    let app = spawn_app().await;
    mount_slow_listing(&app.api, Duration::from_millis(400)).await;
    let config = app.write_config(&cursor_provider("acme", &app.api.uri(), &["alice"]));
    let mut child = sync_command(&config).spawn().expect("tributary starts");

    // Kill it once at least two pages have committed, in the middle of a later page.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stored = record::Entity::find().count(&app.db).await.unwrap_or(0);
        if stored >= (2 * PER_PAGE) as u64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sync never committed two pages"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the sync ended before it was killed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");

    let committed = record::Entity::find().count(&app.db).await.unwrap() as usize;
    assert!(
        committed < PAGES * PER_PAGE,
        "the kill came too late to test anything"
    );
    assert_eq!(committed % PER_PAGE, 0, "only whole pages are committed");
    let connection = connection::Entity::find()
        .one(&app.db)
        .await
        .unwrap()
        .unwrap();
    let checkpoint: serde_json::Value =
        serde_json::from_str(connection.checkpoint.as_deref().expect("a checkpoint")).unwrap();
    assert_eq!(
        checkpoint["position"]["cursor"],
        json!(format!("p{}", committed / PER_PAGE)),
        "the checkpoint points at the first page not committed"
    );

    // The rerun fetches only the remaining pages and ends with the reference table.
    let rerun = sync_command(&config).status().expect("tributary runs");
    assert!(rerun.success());
    assert_eq!(content(&app).await, expected);
    let runs = tributary::entities::sync_run::Entity::find()
        .all(&app.db)
        .await
        .unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(
        runs[0].status, "interrupted",
        "the killed run is not left running"
    );
    assert!(runs[0].error.as_deref().unwrap_or("").contains("stopped"));
    let last = runs.last().unwrap();
    assert_eq!(last.status, "succeeded");
    assert_eq!(last.pages_fetched as usize, PAGES - committed / PER_PAGE);
    assert_eq!(last.records_inserted as usize, PAGES * PER_PAGE - committed);
}
