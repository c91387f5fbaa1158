//! A page's bookkeeping (the run's counters and the connection's checkpoint), written by
//! the backend's store in one round trip where it allows: both rows, or an error when
//! either is gone.

use sea_orm::{DbErr, EntityTrait, TransactionTrait};
use tributary::entities::connection;
use tributary::pipeline::store::{backend_for, PageBookkeeping};
use tributary::pipeline::CheckpointMove;
use tributary::pipeline::{Checkpoint, RunCounts};
use tributary_providers::PagePosition;

use crate::helpers::{cursor_provider, open_run, spawn_app, TestApp};

async fn the_connection(app: &TestApp) -> connection::Model {
    connection::Entity::find()
        .one(&app.db)
        .await
        .expect("connections")
        .expect("one connection")
}

async fn save(app: &TestApp, page: &PageBookkeeping<'_>) -> Result<(), DbErr> {
    let txn = app.db.begin().await.expect("begin");
    let saved = backend_for(&app.db).save_bookkeeping(&txn, page).await;
    match saved {
        Ok(()) => txn.commit().await.expect("commit"),
        Err(_) => txn.rollback().await.expect("rollback"),
    }
    // The store's public error, as its entry points return it.
    saved.map_err(DbErr::from)
}

#[tokio::test]
async fn counters_and_checkpoint_are_saved_together_or_not_at_all() {
    let app = spawn_app().await;
    // Parsing the settings stores the connection.
    app.settings(&cursor_provider("acme", &app.api.uri(), &["alice"]))
        .await;
    let connection = the_connection(&app).await;
    let run = open_run(&app.db, &connection).await;
    let (run_id, stream) = (run.id(), run.stream());
    let counts = RunCounts {
        pages_fetched: 3,
        fetched: 7,
        inserted: 5,
        failed: 2,
        ..RunCounts::default()
    };
    // Quotes and backslashes travel as values, never as SQL text.
    let checkpoint = Checkpoint {
        position: Some(PagePosition::Cursor {
            cursor: r#"c'3\"; --"#.to_string(),
        }),
        parent: None,
        walk_started: None,
        since: None,
        watermark: None,
    };
    let page = PageBookkeeping {
        run_id,
        counts: &counts,
        connection_id: connection.id,
        stream_id: stream.state.id,
        checkpoint: CheckpointMove::Write(Some(&checkpoint)),
        now: chrono::Utc::now(),
        lease: None,
    };
    save(&app, &page).await.expect("saved");
    let row = app.run_row(run_id).await;
    assert_eq!(
        (
            row.pages_fetched,
            row.records_fetched,
            row.records_inserted,
            row.records_failed
        ),
        (3, 7, 5, 2)
    );
    let stored = app.stream_checkpoint().await;
    assert_eq!(stored, Some(checkpoint.to_column().expect("json")));

    // A run row that is gone: an error, and the checkpoint is not cleared.
    let gone_run = PageBookkeeping {
        run_id: run_id + 1000,
        checkpoint: CheckpointMove::Write(None),
        ..page
    };
    assert!(matches!(
        save(&app, &gone_run).await,
        Err(DbErr::RecordNotUpdated)
    ));
    assert_eq!(app.stream_checkpoint().await, stored);

    // A stream that is gone: an error, and the counters are left as they were.
    let more = RunCounts {
        pages_fetched: 4,
        ..counts
    };
    // (The connection's removal deletes its streams' rows with it.)
    let gone_stream = PageBookkeeping {
        counts: &more,
        stream_id: stream.state.id + 1000,
        ..page
    };
    assert!(matches!(
        save(&app, &gone_stream).await,
        Err(DbErr::RecordNotUpdated)
    ));
    assert_eq!(app.run_row(run_id).await.pages_fetched, 3);
}
