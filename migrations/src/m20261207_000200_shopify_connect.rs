//! Shopify's per-shop flow on the Connect page (docs/decisions/connect-shopify.md):
//! `connections.base_url`, the origin a connection's requests go to in place of its
//! provider's `base_url` (a shop's own host), and `connect_sessions.oauth_shop`, the shop
//! the user named, kept beside the `state` so that the callback's `shop` must equal it.

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261207_000200_shopify_connect"
    }
}

#[derive(DeriveIden)]
enum Connections {
    Table,
    BaseUrl,
}

#[derive(DeriveIden)]
enum ConnectSessions {
    Table,
    OauthShop,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // MySQL's DDL is not transactional: each step may run again after a stop.
        if !manager.has_column("connections", "base_url").await? {
            manager
                .alter_table(
                    Table::alter()
                        .table(Connections::Table)
                        .add_column(ColumnDef::new(Connections::BaseUrl).string_len(255).null())
                        .to_owned(),
                )
                .await?;
        }
        if !manager.has_column("connect_sessions", "oauth_shop").await? {
            manager
                .alter_table(
                    Table::alter()
                        .table(ConnectSessions::Table)
                        .add_column(
                            ColumnDef::new(ConnectSessions::OauthShop)
                                .string_len(255)
                                .null(),
                        )
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(ConnectSessions::Table)
                    .drop_column(ConnectSessions::OauthShop)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Connections::Table)
                    .drop_column(Connections::BaseUrl)
                    .to_owned(),
            )
            .await
    }
}
