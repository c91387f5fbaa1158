//! `connections.account_id`: the provider-side account a connection belongs to (a GitHub
//! user id, a Strava athlete id, a Stripe account), filled when a user connects on the
//! Connect page, so that the app sees which account was connected and one account
//! connected for two users shows. Indexed with `provider`: the Connect page looks the
//! account up before it stores a connection.

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261205_000098_connection_account_id"
    }
}

#[derive(DeriveIden)]
enum Connections {
    Table,
    Provider,
    AccountId,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // MySQL's DDL is not transactional: every step may run again after a stop.
        if !manager.has_column("connections", "account_id").await? {
            let column = ColumnDef::new(Connections::AccountId)
                .string_len(255)
                .null()
                .to_owned();
            let alter = Table::alter()
                .table(Connections::Table)
                .add_column(column)
                .to_owned();
            manager.alter_table(alter).await?;
        }
        let by_account = Index::create()
            .name("connections_provider_account_id")
            .table(Connections::Table)
            .col(Connections::Provider)
            .col(Connections::AccountId)
            .if_not_exists()
            .to_owned();
        manager.create_index(by_account).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let index = Index::drop()
            .name("connections_provider_account_id")
            .table(Connections::Table)
            .to_owned();
        manager.drop_index(index).await?;
        let alter = Table::alter()
            .table(Connections::Table)
            .drop_column(Connections::AccountId)
            .to_owned();
        manager.alter_table(alter).await
    }
}
