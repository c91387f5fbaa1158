//! `job_claim_order`: the queue's index in the claim's own order (priority descending,
//! then the longest due, then the oldest), so that a claim reads its few jobs off the
//! front of the index instead of sorting every queued job of the provider. The index it
//! replaces had `priority` ascending: a claim on a backed-up queue of 10,000 jobs sorted
//! them all, and PostgreSQL spent most of a fleet's CPU doing it.

use sea_orm_migration::prelude::*;

use crate::m20261204_000081_api_audit_at::drop_index_once;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261205_000096_job_claim_order"
    }
}

const TABLE: &str = "sync_jobs";
const INDEX: &str = "sync_jobs_claim_idx";
const REPLACED: &str = "sync_jobs_queue_idx";

fn claim_index() -> IndexCreateStatement {
    Index::create()
        .name(INDEX)
        .table(Alias::new(TABLE))
        .col(Alias::new("status"))
        .col(Alias::new("provider"))
        .col((Alias::new("priority"), IndexOrder::Desc))
        .col((Alias::new("not_before"), IndexOrder::Asc))
        .col((Alias::new("id"), IndexOrder::Asc))
        .to_owned()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // MySQL's DDL is not transactional and has no `IF NOT EXISTS` for indexes: each
        // step may run again after a stop. The new index comes first, so that claims of
        // an instance still running meanwhile always have one.
        if !manager.has_index(TABLE, INDEX).await? {
            manager.create_index(claim_index()).await?;
        }
        drop_index_once(manager, TABLE, REPLACED).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if !manager.has_index(TABLE, REPLACED).await? {
            manager
                .create_index(
                    Index::create()
                        .name(REPLACED)
                        .table(Alias::new(TABLE))
                        .col(Alias::new("status"))
                        .col(Alias::new("provider"))
                        .col(Alias::new("priority"))
                        .col(Alias::new("not_before"))
                        .to_owned(),
                )
                .await?;
        }
        drop_index_once(manager, TABLE, INDEX).await
    }
}
