//! Writing `run_errors`: the records a page set aside, and the page-level errors of bodies
//! that could not be read as records. Rows go in chunked like every other multi-row write
//! ([`RUN_ERROR`]), so a page of thousands of bad records stays below every backend's
//! limit on bound parameters.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbErr, EntityTrait, Set};

use super::backend::StoreError;
use tributary_providers::{Record, RecordStage, RejectedRecord};

use super::context::PageContext;
use crate::db::parameters::Binds;
use crate::db::DatabasePools;
use crate::entities::run_error;
use crate::pipeline::fence;
use crate::pipeline::ground::begin_page_transaction;

/// What a write of error rows binds: a row's ten columns.
const RUN_ERROR: Binds = Binds::new(10, 0);

pub use crate::entities::run_error::Scope as ErrorScope;

/// Records one page-level error (a body that could not be read as records) outside any
/// page transaction, with the raw body as its payload, fenced like a page.
pub async fn record_page_error(
    db: &DatabasePools,
    context: &PageContext<'_>,
    stage: RecordStage,
    message: &str,
    body: &str,
) -> Result<(), DbErr> {
    let rejected = [RejectedRecord {
        external_id: None,
        stage,
        message: message.into(),
        payload: body.to_string(),
    }];
    let now = crate::db::now();
    let txn = begin_page_transaction(db).await?;
    let (run_id, fence) = (context.run_id, context.lease);
    if let Err(unheld) = fence::hold(&txn, run_id, context.connection.id, fence, now).await? {
        txn.rollback().await?;
        return Err(unheld.into_error(run_id, fence));
    }
    insert_run_errors(&txn, context, &rejected, ErrorScope::Page, now).await?;
    txn.commit().await
}

/// The error row of a record the database refused to write.
pub(crate) fn persist_failure(record: Record, error: &StoreError) -> RejectedRecord {
    RejectedRecord {
        external_id: Some(record.external_id),
        stage: RecordStage::Persist,
        message: format!("writing the record failed: {error}").into(),
        payload: record.payload,
    }
}

/// Inserts one row per rejected record, [`RUN_ERROR`]'s rows a statement.
pub(crate) async fn insert_run_errors(
    db: &impl ConnectionTrait,
    context: &PageContext<'_>,
    rejected: &[RejectedRecord],
    scope: ErrorScope,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    for reject in rejected {
        // On the page's span in traces; the record itself stays in `run_errors`.
        tracing::debug!(
            external_id = reject.external_id.as_deref().unwrap_or(""),
            stage = ?reject.stage,
            error = %reject.message,
            "Record set aside."
        );
    }
    for chunk in rejected.chunks(RUN_ERROR.rows(db.get_database_backend())) {
        let rows = chunk.iter().map(|reject| {
            error_row(
                context.run_id,
                &context.connection.user_id,
                &context.connection.provider,
                reject,
                scope,
                now,
            )
        });
        run_error::Entity::insert_many(rows)
            .exec_without_returning(db)
            .await?;
    }
    Ok(())
}

/// The error row of `reject` in run `run_id` of `user_id`'s connection to `provider`.
fn error_row(
    run_id: i64,
    user_id: &str,
    provider: &str,
    reject: &RejectedRecord,
    scope: ErrorScope,
    now: DateTime<Utc>,
) -> run_error::ActiveModel {
    run_error::ActiveModel {
        run_id: Set(run_id),
        user_id: Set(user_id.to_string()),
        provider: Set(provider.to_string()),
        external_id: Set(reject.external_id.clone()),
        stage: Set(reject.stage.into()),
        message: Set(reject.message.to_string()),
        payload: Set(reject.payload.clone()),
        created_at: Set(now),
        resolved_by_run_id: Set(None),
        scope: Set(scope),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use sea_orm::QueryTrait;

    use super::*;
    use crate::db::parameters::{max_parameters, BACKENDS};

    #[test]
    fn a_write_of_error_rows_binds_what_its_chunk_allows_for() {
        let reject = RejectedRecord {
            external_id: Some("r".into()),
            stage: RecordStage::Validate,
            message: "bad".into(),
            payload: "{}".into(),
        };
        for backend in BACKENDS {
            for count in [
                RUN_ERROR.rows(backend),
                RUN_ERROR.rows_within_limit(backend),
            ] {
                let rows = (0..count).map(|_| {
                    error_row(1, "alice", "acme", &reject, ErrorScope::Record, Utc::now())
                });
                let statement = run_error::Entity::insert_many(rows).build(backend);
                let values = statement.values.map_or(0, |values| values.0.len());
                assert_eq!(values, RUN_ERROR.values(count), "{backend:?}");
                assert!(values <= max_parameters(backend), "{backend:?}: {values}");
            }
        }
    }
}
