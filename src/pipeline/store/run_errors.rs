//! Writing `run_errors`: the records a page set aside, and the page-level errors of bodies
//! that could not be read as records. Rows go in chunked like every other multi-row write
//! ([`INSERT_CHUNK`]), so a page of thousands of bad records stays below every backend's
//! limit on bound parameters.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbErr, EntityTrait, Set};
use tributary_providers::{Record, RecordStage, RejectedRecord};

use super::backend::{begin_page_transaction, INSERT_CHUNK};
use super::PageContext;
use crate::db::DatabasePools;
use crate::entities::run_error;
use crate::pipeline::fence;

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
    let now = Utc::now();
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
pub(crate) fn persist_failure(record: Record, error: &DbErr) -> RejectedRecord {
    RejectedRecord {
        external_id: Some(record.external_id),
        stage: RecordStage::Persist,
        message: format!("writing the record failed: {error}").into(),
        payload: record.payload,
    }
}

/// Inserts one row per rejected record, [`INSERT_CHUNK`] rows a statement.
pub(crate) async fn insert_run_errors(
    db: &impl ConnectionTrait,
    context: &PageContext<'_>,
    rejected: &[RejectedRecord],
    scope: ErrorScope,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    for chunk in rejected.chunks(INSERT_CHUNK) {
        let rows = chunk.iter().map(|reject| run_error::ActiveModel {
            run_id: Set(context.run_id),
            user_id: Set(context.connection.user_id.clone()),
            provider: Set(context.connection.provider.clone()),
            external_id: Set(reject.external_id.clone()),
            stage: Set(reject.stage.into()),
            message: Set(reject.message.to_string()),
            payload: Set(reject.payload.clone()),
            created_at: Set(now),
            resolved_by_run_id: Set(None),
            scope: Set(scope),
            ..Default::default()
        });
        run_error::Entity::insert_many(rows)
            .exec_without_returning(db)
            .await?;
    }
    Ok(())
}
