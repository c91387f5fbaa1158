//! `connect_sessions.state_hash` and `oauth_provider`: a session that sent its browser to
//! a provider's authorization endpoint keeps SHA-256 of the `state` it sent and which
//! provider it was, so that the one callback path finds the session by the `state` the
//! provider hands back. The PKCE verifier is derived from the browser's cookie and
//! `state`, so it is never stored (docs/decisions/connect.md).

use sea_orm_migration::prelude::*;

pub struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "m20261205_000097_connect_oauth"
    }
}

#[derive(DeriveIden)]
enum ConnectSessions {
    Table,
    StateHash,
    OauthProvider,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // MySQL's DDL is not transactional: every step may run again after a stop.
        // SQLite adds one column per statement.
        let state_hash = ColumnDef::new(ConnectSessions::StateHash)
            .string_len(64)
            .null()
            .to_owned();
        let provider = ColumnDef::new(ConnectSessions::OauthProvider)
            .string_len(255)
            .null()
            .to_owned();
        for (name, column) in [("state_hash", state_hash), ("oauth_provider", provider)] {
            if !manager.has_column("connect_sessions", name).await? {
                let alter = Table::alter()
                    .table(ConnectSessions::Table)
                    .add_column(column)
                    .to_owned();
                manager.alter_table(alter).await?;
            }
        }
        // The callback finds its session by this; NULLs (no authorization begun) repeat.
        let by_state = Index::create()
            .name("connect_sessions_state_hash")
            .table(ConnectSessions::Table)
            .col(ConnectSessions::StateHash)
            .unique()
            .if_not_exists()
            .to_owned();
        manager.create_index(by_state).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("connect_sessions_state_hash")
                    .table(ConnectSessions::Table)
                    .to_owned(),
            )
            .await?;
        for column in [ConnectSessions::StateHash, ConnectSessions::OauthProvider] {
            manager
                .alter_table(
                    Table::alter()
                        .table(ConnectSessions::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
