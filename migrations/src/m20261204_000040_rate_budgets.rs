//! `rate_budgets`: the requests every instance has taken from a budget window, one row per
//! (scope, window), and `sync_runs.resume_at`: when a run a spent budget deferred may
//! resume.

use sea_orm_migration::prelude::*;

use crate::m20261129_000001_create_tables::instant;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261204_000040_rate_budgets"
    }
}

#[derive(DeriveIden)]
enum RateBudgets {
    Table,
    Scope,
    PeriodSeconds,
    WindowStart,
    WindowEnd,
    Used,
}

#[derive(DeriveIden)]
enum SyncRuns {
    Table,
    ResumeAt,
}

const WINDOW_END_INDEX: &str = "rate_budgets_window_end";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        manager
            .create_table(
                Table::create()
                    .table(RateBudgets::Table)
                    .if_not_exists()
                    .col(
                        ColumnDef::new(RateBudgets::Scope)
                            .string_len(128)
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(RateBudgets::PeriodSeconds)
                            .big_integer()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(RateBudgets::WindowStart)
                            .big_integer()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(RateBudgets::WindowEnd)
                            .big_integer()
                            .not_null(),
                    )
                    .col(
                        ColumnDef::new(RateBudgets::Used)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .primary_key(
                        Index::create()
                            .col(RateBudgets::Scope)
                            .col(RateBudgets::PeriodSeconds)
                            .col(RateBudgets::WindowStart),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name(WINDOW_END_INDEX)
                    .table(RateBudgets::Table)
                    .col(RateBudgets::WindowEnd)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(SyncRuns::Table)
                    .add_column(instant(backend, SyncRuns::ResumeAt).null().to_owned())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(SyncRuns::Table)
                    .drop_column(SyncRuns::ResumeAt)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table(RateBudgets::Table).to_owned())
            .await
    }
}
