//! A panic in a run is caught at the run's boundary: the run ends `failed` with the
//! panic's message, its lease is released, and the daemon goes on firing and reports it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sea_orm::EntityTrait;
use tributary::entities::connection;
use tributary::entities::sync_run::RunStatus;
use tributary_providers::{FetchContext, FetchError, Page, PagePosition, Provider};

use crate::daemon::{daemon_table, eventually, every_second, free_port, runs_of};
use crate::helpers::{cursor_provider, spawn_app};

/// An adapter whose first fetch panics and whose later fetches find an empty listing.
struct PanicsOnce {
    calls: Arc<AtomicU32>,
}

#[async_trait::async_trait]
impl Provider for PanicsOnce {
    async fn fetch_page(
        &self,
        _context: &FetchContext<'_>,
        _position: Option<&PagePosition>,
    ) -> Result<Page, FetchError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("injected panic in the adapter");
        }
        Ok(Page::default())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_run_fails_releases_its_lease_and_the_daemon_fires_on_and_reports_it() {
    let app = spawn_app().await;
    let port = free_port();
    let providers = format!(
        "{}{}",
        daemon_table(Some(port)),
        every_second(cursor_provider("boom", &app.api.uri(), &["alice"]))
    );
    let settings = app.settings(&providers).await;
    let calls = Arc::new(AtomicU32::new(0));
    let adapter_calls = calls.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let daemon = tributary::daemon::run_with(
        &settings,
        app.db.clone(),
        async {
            let _ = stopped.await;
        },
        move |_| {
            let adapter: Box<dyn Provider> = Box::new(PanicsOnce {
                calls: adapter_calls.clone(),
            });
            Ok(adapter)
        },
    );
    let checks = async {
        eventually(Duration::from_secs(30), "a run after the panic", || async {
            runs_of(&app, "alice")
                .await
                .iter()
                .any(|run| run.status == RunStatus::Succeeded)
        })
        .await;
        let runs = runs_of(&app, "alice").await;
        assert_eq!(runs[0].status, RunStatus::Failed, "{runs:?}");
        let error = runs[0].error.as_deref().unwrap_or_default();
        assert!(
            error.contains("panicked") && error.contains("injected panic in the adapter"),
            "{error}"
        );
        assert!(runs[0].finished_at.is_some(), "{runs:?}");
        assert_eq!(
            runs[1].status,
            RunStatus::Succeeded,
            "the next firing ran: {runs:?}"
        );
        // A lease still held would keep the next run out until it expired (lease_ttl 5s).
        let gap = runs[1].started_at - runs[0].finished_at.unwrap_or(runs[0].started_at);
        assert!(
            gap < chrono::TimeDelta::seconds(4),
            "the panicked run's lease was released at once: {runs:?}"
        );

        let healthz = reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
            .await
            .expect("healthz answers");
        assert_eq!(healthz.status(), 200);
        let body = healthz.text().await.expect("body");
        assert!(
            body.starts_with("ok\n")
                && body.contains("runs ended by a panic: 1")
                && body.contains("injected panic in the adapter"),
            "{body}"
        );
        let metrics = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
            .await
            .expect("metrics answer")
            .text()
            .await
            .expect("body");
        assert!(
            metrics.contains("tributary_run_panics_total{provider=\"boom\",stream=\"records\"} 1"),
            "{metrics}"
        );
        let _ = stop.send(());
    };
    let (result, ()) = tokio::join!(daemon, checks);
    result.expect("the daemon stops cleanly");
    let row = connection::Entity::find()
        .one(&app.db)
        .await
        .expect("query")
        .expect("alice's connection");
    assert_eq!(row.lease_holder, None, "every lease is released");
    assert!(calls.load(Ordering::SeqCst) >= 2);
}
