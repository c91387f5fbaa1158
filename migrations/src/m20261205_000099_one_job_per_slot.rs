//! `one_job_per_slot`: a slot of a connection's stream is one job whatever its kind. The
//! key had the kind in it (`sync_jobs_slot_kind_key`), from when full passes fired on a
//! schedule of their own; now a firing is a full pass or not by each instance's reckoning
//! of `full_sync_schedule`, so two instances that reckon differently (one started since
//! the last full time) queued one slot twice, as `full` and as `scheduled`, and both ran.
//! The pass owed is recorded in `connection_streams` either way, so the kind is a label.
//!
//! Duplicates already queued are deleted first (the oldest row of a slot is kept). The
//! old key stays: instances of the release before this one name it in their
//! `ON CONFLICT`, and PostgreSQL refuses an `ON CONFLICT` whose columns no unique index
//! has. It can go once no such instance is left.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, Statement};

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261205_000099_one_job_per_slot"
    }
}

const TABLE: &str = "sync_jobs";
const INDEX: &str = "sync_jobs_slot_once_key";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        // The inner select is wrapped in a derived table: MySQL refuses a DELETE whose
        // subquery reads the table it deletes from.
        db.execute_raw(Statement::from_string(
            db.get_database_backend(),
            "DELETE FROM sync_jobs WHERE slot_at IS NOT NULL AND id NOT IN (\
             SELECT id FROM (SELECT MIN(id) AS id FROM sync_jobs WHERE slot_at IS NOT NULL \
             GROUP BY connection_id, stream, slot_at) AS kept)",
        ))
        .await?;
        // MySQL's DDL is not transactional and has no `IF NOT EXISTS` for indexes: the
        // step may run again after a stop.
        if !manager.has_index(TABLE, INDEX).await? {
            manager
                .create_index(
                    Index::create()
                        .name(INDEX)
                        .table(Alias::new(TABLE))
                        .col(Alias::new("connection_id"))
                        .col(Alias::new("stream"))
                        .col(Alias::new("slot_at"))
                        .unique()
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        crate::m20261204_000081_api_audit_at::drop_index_once(manager, TABLE, INDEX).await
    }
}
