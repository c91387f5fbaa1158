//! `sync_runs.watermark_anomalies`: how many records of a run carried a watermark beyond
//! the clock (plus the allowed skew), whose cursor was clamped to the fetch time.

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261201_000001_watermark_anomalies"
    }
}

#[derive(DeriveIden)]
enum SyncRuns {
    Table,
    WatermarkAnomalies,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(SyncRuns::Table)
                    .add_column(
                        ColumnDef::new(SyncRuns::WatermarkAnomalies)
                            .big_integer()
                            .not_null()
                            .default(0),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(SyncRuns::Table)
                    .drop_column(SyncRuns::WatermarkAnomalies)
                    .to_owned(),
            )
            .await
    }
}
