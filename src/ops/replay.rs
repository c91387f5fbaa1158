//! Replaying a run's failed records from their stored payloads.

use super::OpsError;
use crate::config::Settings;
use crate::db::DatabasePools;
use crate::pipeline::replay::ReplayError;

pub(crate) use crate::pipeline::replay::ReplayReport;

/// Replays the open record-level errors of run `run_id` as a new run.
pub async fn replay(
    db: &DatabasePools,
    settings: &Settings,
    run_id: i64,
) -> Result<ReplayReport, OpsError> {
    crate::pipeline::replay::replay_run(db, settings, run_id)
        .await
        .map_err(|error| match error {
            ReplayError::NoSuchRun(id) => OpsError::NotFound {
                what: format!("run with id {id}"),
                hint: "; `tributary runs` lists them",
            },
            ReplayError::Busy { .. } => OpsError::Conflict(error.to_string()),
            ReplayError::Database(error) => OpsError::Database(error),
            other => OpsError::Replay(other),
        })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use chrono::Utc;
    use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter, Set};

    use super::replay;
    use crate::entities::sync_run::RunStatus;
    use crate::entities::{connection, record, run_error, sync_run};
    use crate::testing::{open_run, TestDb};

    const LEASE_LOST: &str = "the connection's lease was taken over by another process";

    /// Settings of alice's `acme` (a `rest` provider whose API replay never calls) with a
    /// lease of `lease_ttl`.
    fn settings(test: &TestDb, lease_ttl: &str) -> std::sync::Arc<crate::config::Settings> {
        test.settings(&format!(
            r#"
[daemon]
lease_ttl = "{lease_ttl}"

[providers.acme]
kind = "rest"
base_url = "http://127.0.0.1:9"
path = "/v1/items"
schedule = "0 */15 * * * *"
records_path = "data"
id_field = "id"
auth = "bearer"

[[providers.acme.connections]]
user_id = "alice"
token = "token-alice"
"#
        ))
    }

    /// A partial run of alice's `acme` with `count` open record errors whose payloads
    /// now store.
    async fn failed_run_with_errors(test: &TestDb, count: usize) -> (connection::Model, i64) {
        let connection = test.alice().await;
        let run_id = open_run(&test.db, &connection).await.id();
        sync_run::Entity::update_many()
            .col_expr(
                sync_run::Column::Status,
                sea_orm::sea_query::Expr::value(RunStatus::Partial),
            )
            .filter(sync_run::Column::Id.eq(run_id))
            .exec(test.main())
            .await
            .expect("closed");
        let rows: Vec<run_error::ActiveModel> = (0..count)
            .map(|i| run_error::ActiveModel {
                run_id: Set(run_id),
                user_id: Set("alice".to_string()),
                provider: Set("acme".to_string()),
                external_id: Set(Some(format!("e{i:05}"))),
                stage: Set(run_error::Stage::Persist),
                message: Set("refused".to_string()),
                payload: Set(format!(r#"{{"id":"e{i:05}"}}"#)),
                created_at: Set(Utc::now()),
                resolved_by_run_id: Set(None),
                scope: Set(run_error::Scope::Record),
                ..Default::default()
            })
            .collect();
        for chunk in rows.chunks(500) {
            run_error::Entity::insert_many(chunk.to_vec())
                .exec_without_returning(test.main())
                .await
                .expect("errors written");
        }
        (connection, run_id)
    }

    async fn open_errors(test: &TestDb, run_id: i64) -> u64 {
        run_error::Entity::find()
            .filter(run_error::Column::RunId.eq(run_id))
            .filter(run_error::Column::ResolvedByRunId.is_null())
            .count(test.main())
            .await
            .expect("errors")
    }

    async fn records(test: &TestDb) -> u64 {
        record::Entity::find()
            .count(test.main())
            .await
            .expect("records")
    }

    async fn run_row(test: &TestDb, run_id: i64) -> sync_run::Model {
        sync_run::Entity::find_by_id(run_id)
            .one(test.main())
            .await
            .expect("query")
            .expect("the run")
    }

    async fn alice(test: &TestDb) -> connection::Model {
        connection::Entity::find()
            .one(test.main())
            .await
            .expect("query")
            .expect("alice")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replay_longer_than_its_lease_renews_it() {
        let test = TestDb::new().await;
        let settings = settings(&test, "2s");
        let count = 3000;
        let (_, failed) = failed_run_with_errors(&test, count).await;
        let started = Instant::now();
        let replayed = replay(&test.db, &settings, failed);
        let watch = async {
            // Until the replay ends: once it has taken the lease, the lease never lapses.
            let mut lapsed = 0u32;
            loop {
                let row = alice(&test).await;
                if let Some(until) = row.lease_expires_at {
                    if until < Utc::now() {
                        lapsed += 1;
                    }
                }
                if row.lease_holder.is_none() && open_errors(&test, failed).await == 0 {
                    return lapsed;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let (report, lapsed) = tokio::join!(replayed, watch);
        let report = report.expect("replayed");
        let took = started.elapsed();
        assert!(
            took > Duration::from_secs(3),
            "the replay outlasts its lease ({took:?}), or this proves nothing"
        );
        assert_eq!(
            lapsed, 0,
            "times the lease was seen lapsed during the replay"
        );
        assert_eq!((report.resolved.len(), report.stopped), (count, None));
        let row = run_row(&test, report.replay_run_id.expect("replay run")).await;
        assert_eq!(row.status, RunStatus::Succeeded);
        assert_eq!(records(&test).await, count as u64);
    }

    #[tokio::test]
    async fn a_replay_that_loses_its_lease_stops_and_ends_interrupted() {
        let test = TestDb::new().await;
        let settings = settings(&test, "1day");
        let count = 600;
        let (_, failed) = failed_run_with_errors(&test, count).await;
        let replayed = replay(&test.db, &settings, failed);
        let take_over = async {
            let deadline = Instant::now() + Duration::from_secs(60);
            while open_errors(&test, failed).await >= count as u64 {
                assert!(Instant::now() < deadline, "the replay never got under way");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let row = alice(&test).await;
            let generation = row.lease_generation + 1;
            let mut leased: connection::ActiveModel = row.into();
            leased.lease_holder = Set(Some("other-host:202:0000cafe".to_string()));
            leased.lease_expires_at = Set(Some(Utc::now() + chrono::Duration::seconds(60)));
            leased.lease_generation = Set(generation);
            leased.update(test.main()).await.expect("leased");
        };
        let (report, ()) = tokio::join!(replayed, take_over);
        let report = report.expect("the replay reports");
        let stopped = report.stopped.clone().unwrap_or_default();
        assert!(stopped.contains(LEASE_LOST), "{report:?}");
        let resolved = report.resolved.len();
        assert!(resolved > 0 && resolved < count, "{resolved} of {count}");
        assert_eq!(report.still_failing.len(), count - resolved);
        assert_eq!(open_errors(&test, failed).await, (count - resolved) as u64);
        assert_eq!(
            records(&test).await,
            resolved as u64,
            "nothing after the takeover"
        );
        let row = run_row(&test, report.replay_run_id.expect("replay run")).await;
        assert_eq!(row.status, RunStatus::Interrupted);
        assert!(row.error.unwrap_or_default().contains(LEASE_LOST));
    }
}
