//! The enum columns (`sync_runs.trigger` and `status`, `run_errors.stage` and `scope`,
//! `connections.defined_in`) hold the text they always held: rows written as text read
//! back as the enums, and the enums are stored as that text, on every backend.

use chrono::Utc;
use sea_orm::sea_query::Expr;
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QuerySelect, Set};
use tributary::entities::connection::DefinedIn;
use tributary::entities::run_error::{Scope, Stage};
use tributary::entities::sync_run::{RunStatus, Trigger};
use tributary::entities::{connection, run_error, sync_run};

use crate::helpers::{spawn_app, TestApp};

const TRIGGERS: [(Trigger, &str); 3] = [
    (Trigger::Manual, "manual"),
    (Trigger::Schedule, "schedule"),
    (Trigger::Replay, "replay"),
];

const STATUSES: [(RunStatus, &str); 6] = [
    (RunStatus::Running, "running"),
    (RunStatus::Succeeded, "succeeded"),
    (RunStatus::Partial, "partial"),
    (RunStatus::Failed, "failed"),
    (RunStatus::Interrupted, "interrupted"),
    (RunStatus::Deferred, "deferred"),
];

const STAGES: [(Stage, &str); 4] = [
    (Stage::Fetch, "fetch"),
    (Stage::Parse, "parse"),
    (Stage::Validate, "validate"),
    (Stage::Persist, "persist"),
];

const SCOPES: [(Scope, &str); 2] = [(Scope::Record, "record"), (Scope::Page, "page")];

async fn a_run(app: &TestApp) -> (connection::Model, i64) {
    app.alice_with_a_run().await
}

/// The run's `trigger` and `status` as the text stored.
async fn run_text(app: &TestApp, run_id: i64) -> (String, String) {
    sync_run::Entity::find_by_id(run_id)
        .select_only()
        .columns([sync_run::Column::Trigger, sync_run::Column::Status])
        .into_tuple()
        .one(&app.db)
        .await
        .expect("read as text")
        .expect("the run")
}

#[tokio::test]
async fn run_triggers_and_statuses_are_stored_as_their_names() {
    let app = spawn_app().await;
    let (_, run_id) = a_run(&app).await;
    let pairs: Vec<_> = (0..STATUSES.len())
        .map(|index| (TRIGGERS[index % TRIGGERS.len()], STATUSES[index]))
        .collect();
    // Each pair differs from the one before, so no step finds its values there already.
    for (index, &((trigger, trigger_text), (status, status_text))) in pairs.iter().enumerate() {
        sync_run::ActiveModel {
            id: Set(run_id),
            trigger: Set(trigger),
            status: Set(status),
            ..Default::default()
        }
        .update(&app.db)
        .await
        .expect("written as enums");
        assert_eq!(
            run_text(&app, run_id).await,
            (trigger_text.to_string(), status_text.to_string())
        );
        assert_eq!(
            (trigger.to_string(), status.to_string()),
            (trigger_text.to_string(), status_text.to_string())
        );

        let ((trigger, trigger_text), (status, status_text)) = pairs[(index + 1) % pairs.len()];
        sync_run::Entity::update_many()
            .col_expr(sync_run::Column::Trigger, Expr::value(trigger_text))
            .col_expr(sync_run::Column::Status, Expr::value(status_text))
            .filter(sync_run::Column::Id.eq(run_id))
            .exec(&app.db)
            .await
            .expect("written as text");
        let row = app.run_row(run_id).await;
        assert_eq!((row.trigger, row.status), (trigger, status));
    }
}

#[tokio::test]
async fn error_stages_and_scopes_are_stored_as_their_names() {
    let app = spawn_app().await;
    let (connection, run_id) = a_run(&app).await;
    let error = run_error::ActiveModel {
        run_id: Set(run_id),
        user_id: Set(connection.user_id.clone()),
        provider: Set(connection.provider.clone()),
        external_id: Set(None),
        stage: Set(Stage::Persist),
        message: Set("a message".to_string()),
        payload: Set("{}".to_string()),
        created_at: Set(Utc::now()),
        resolved_by_run_id: Set(None),
        scope: Set(Scope::Page),
        ..Default::default()
    }
    .insert(&app.db)
    .await
    .expect("an error row");
    let pairs: Vec<_> = (0..STAGES.len())
        .map(|index| (STAGES[index], SCOPES[index % SCOPES.len()]))
        .collect();
    for (index, &((stage, stage_text), (scope, scope_text))) in pairs.iter().enumerate() {
        run_error::ActiveModel {
            id: Set(error.id),
            stage: Set(stage),
            scope: Set(scope),
            ..Default::default()
        }
        .update(&app.db)
        .await
        .expect("written as enums");
        let stored: (String, String) = run_error::Entity::find_by_id(error.id)
            .select_only()
            .columns([run_error::Column::Stage, run_error::Column::Scope])
            .into_tuple()
            .one(&app.db)
            .await
            .expect("read as text")
            .expect("the error row");
        assert_eq!(stored, (stage_text.to_string(), scope_text.to_string()));
        assert_eq!(
            (stage.to_string(), scope.to_string()),
            (stage_text.to_string(), scope_text.to_string())
        );

        let ((stage, stage_text), (scope, scope_text)) = pairs[(index + 1) % pairs.len()];
        run_error::Entity::update_many()
            .col_expr(run_error::Column::Stage, Expr::value(stage_text))
            .col_expr(run_error::Column::Scope, Expr::value(scope_text))
            .filter(run_error::Column::Id.eq(error.id))
            .exec(&app.db)
            .await
            .expect("written as text");
        let row = app.run_errors(run_id).await.remove(0);
        assert_eq!((row.stage, row.scope), (stage, scope));
    }
}

#[tokio::test]
async fn connection_origins_are_stored_as_their_names() {
    let app = spawn_app().await;
    let (connection, _) = a_run(&app).await;
    let origins = [
        (DefinedIn::Config, "config"),
        (DefinedIn::Cli, "cli"),
        (DefinedIn::Removed, "removed"),
    ];
    for (index, &(origin, origin_text)) in origins.iter().enumerate() {
        connection::ActiveModel {
            id: Set(connection.id),
            defined_in: Set(origin),
            ..Default::default()
        }
        .update(&app.db)
        .await
        .expect("written as an enum");
        let stored: Option<String> = connection::Entity::find_by_id(connection.id)
            .select_only()
            .column(connection::Column::DefinedIn)
            .into_tuple()
            .one(&app.db)
            .await
            .expect("read as text");
        assert_eq!(stored.as_deref(), Some(origin_text));
        assert_eq!(origin.to_string(), origin_text);

        let (origin, origin_text) = origins[(index + 1) % origins.len()];
        connection::Entity::update_many()
            .col_expr(connection::Column::DefinedIn, Expr::value(origin_text))
            .filter(connection::Column::Id.eq(connection.id))
            .exec(&app.db)
            .await
            .expect("written as text");
        let row = connection::Entity::find_by_id(connection.id)
            .one(&app.db)
            .await
            .expect("read")
            .expect("the connection");
        assert_eq!(row.defined_in, origin);
    }
}
