//! `sync_jobs` becomes a queue: jobs wait `queued` until `not_before`, the most urgent
//! first (`priority`), and are claimed by whichever instance is free. `provider` is the
//! connection's, copied so that a claim filters on the jobs table alone (the rows a
//! claim locks are the jobs' and nothing else). `attempt` counts retries and re-queues;
//! `full` asks a job's runs for a full pass.
//!
//! The slot key gains the kind: a full pass and a scheduled slot may fall on one second.

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::instant;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261204_000023_job_queue"
    }
}

#[derive(DeriveIden)]
enum SyncJobs {
    Table,
    ConnectionId,
    Stream,
    Kind,
    SlotAt,
    Status,
    Provider,
    Priority,
    NotBefore,
    Attempt,
    Full,
}

#[derive(DeriveIden)]
enum Connections {
    Table,
    Id,
    Provider,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use SyncJobs as T;
        let backend = manager.get_database_backend();
        // One column per statement: SQLite alters one at a time. MySQL's DDL is not
        // transactional, so a stopped run of this migration is re-run: each step checks.
        let columns = [
            ColumnDef::new(T::Provider)
                .string_len(64)
                .not_null()
                .default("")
                .to_owned(),
            ColumnDef::new(T::Priority)
                .integer()
                .not_null()
                .default(0)
                .to_owned(),
            instant(backend, T::NotBefore).null().to_owned(),
            ColumnDef::new(T::Attempt)
                .integer()
                .not_null()
                .default(0)
                .to_owned(),
            ColumnDef::new(T::Full)
                .boolean()
                .not_null()
                .default(false)
                .to_owned(),
        ];
        for mut column in columns {
            let name = column.get_column_name();
            if manager.has_column("sync_jobs", &name).await? {
                continue;
            }
            manager
                .alter_table(
                    Table::alter()
                        .table(T::Table)
                        .add_column(&mut column)
                        .to_owned(),
                )
                .await?;
        }
        let provider_of_connection = Query::select()
            .column((Connections::Table, Connections::Provider))
            .from(Connections::Table)
            .and_where(
                Expr::col((Connections::Table, Connections::Id))
                    .equals((T::Table, T::ConnectionId)),
            )
            .to_owned();
        manager
            .exec_stmt(
                Query::update()
                    .table(T::Table)
                    .value(
                        T::Provider,
                        SimpleExpr::SubQuery(
                            None,
                            Box::new(provider_of_connection.into_sub_query_statement()),
                        ),
                    )
                    .and_where(Expr::col(T::Provider).eq(""))
                    .to_owned(),
            )
            .await?;
        // Created before the old key is dropped: MySQL's foreign key on `connection_id`
        // needs an index that starts with it at every moment.
        manager
            .create_index(
                Index::create()
                    .name("sync_jobs_slot_kind_key")
                    .table(T::Table)
                    .col(T::ConnectionId)
                    .col(T::Stream)
                    .col(T::Kind)
                    .col(T::SlotAt)
                    .unique()
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;
        if manager.has_index("sync_jobs", "sync_jobs_slot_key").await? {
            manager
                .drop_index(
                    Index::drop()
                        .name("sync_jobs_slot_key")
                        .table(T::Table)
                        .to_owned(),
                )
                .await?;
        }
        // A claim reads the queued jobs of a provider, most urgent first.
        manager
            .create_index(
                Index::create()
                    .name("sync_jobs_queue_idx")
                    .table(T::Table)
                    .col(T::Status)
                    .col(T::Provider)
                    .col(T::Priority)
                    .col(T::NotBefore)
                    .if_not_exists()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use SyncJobs as T;
        manager
            .drop_index(
                Index::drop()
                    .name("sync_jobs_queue_idx")
                    .table(T::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("sync_jobs_slot_key")
                    .table(T::Table)
                    .col(T::ConnectionId)
                    .col(T::Stream)
                    .col(T::SlotAt)
                    .unique()
                    .if_not_exists()
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name("sync_jobs_slot_kind_key")
                    .table(T::Table)
                    .to_owned(),
            )
            .await?;
        for column in [T::Provider, T::Priority, T::NotBefore, T::Attempt, T::Full] {
            manager
                .alter_table(
                    Table::alter()
                        .table(T::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
