//! What the library's own database tests share (compiled for `cargo test --lib` only): a
//! fresh, migrated scratch database on the server `TRIBUTARY_TEST_DB` names, as the
//! integration suite uses, so that tests of crate-private steps run on all three
//! databases without those steps being public.

use std::sync::Arc;

use sea_orm::{ActiveModelTrait, DatabaseConnection};
use tempfile::TempDir;

use crate::config::{DatabaseSettings, Settings, StreamSettings, WriteMode};
use crate::db::DatabasePools;
use crate::entities::connection;
use crate::entities::sync_run::Trigger;
use crate::pipeline::{PageExpectation, Run, RunPage};
use crate::secrets::Keyring;
use tributary_providers::record::sha256_hex;
use tributary_providers::{PageItem, Record};

#[path = "../tests/common/scratch.rs"]
mod scratch;
pub(crate) use scratch::{backend, scratch_database_url, Backend};

/// A test's database, and the folder its SQLite file lives in while the test runs.
pub(crate) struct TestDb {
    pub db: DatabasePools,
    pub url: String,
    _dir: TempDir,
}

impl TestDb {
    /// A fresh database, migrated.
    pub async fn new() -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = scratch::scratch_database_url(dir.path()).await;
        let db = crate::db::connect_and_migrate(&DatabaseSettings {
            url: url.clone(),
            max_connections: 4,
        })
        .await
        .expect("migrated test database")
        // A key of its own seals the tokens a test stores, as a deployment's would.
        .with_keyring(Keyring::ephemeral());
        TestDb { db, url, _dir: dir }
    }

    /// Settings for this database from config.toml's text after `[database]`.
    pub fn settings(&self, rest: &str) -> Arc<Settings> {
        let text = format!("[database]\nurl = \"{}\"\n{rest}", self.url);
        let settings = Settings::parse(std::path::Path::new("config.toml"), &text, None, &|_| true)
            .expect("settings");
        Arc::new(settings)
    }

    /// A pool of the test's own on this database (on SQLite, another connection to the
    /// file, so that it reads while another pool's one writer is inside a transaction),
    /// without the key.
    pub async fn pool(&self, connections: u32) -> DatabasePools {
        crate::db::connect(&DatabaseSettings {
            url: self.url.clone(),
            max_connections: connections,
        })
        .await
        .expect("pool")
    }

    /// Alice's connection at provider `acme`, with no credentials (nothing here calls the
    /// provider).
    pub async fn alice(&self) -> connection::Model {
        connection::ActiveModel::new_connection("alice", "acme", true, "{}".to_string())
            .insert(self.db.main())
            .await
            .expect("alice's connection")
    }

    /// Alice's connection and a manual run of its `records` stream, left open.
    pub async fn alice_with_a_run(&self) -> (connection::Model, i64) {
        let connection = self.alice().await;
        let run_id = open_run(&self.db, &connection).await.id();
        (connection, run_id)
    }

    /// The database the pools write to.
    pub fn main(&self) -> &DatabaseConnection {
        self.db.main()
    }
}

/// The `records` stream of a `rest` connection, whose records keep the provider's name.
pub(crate) fn records_stream(connection: &connection::Model) -> StreamSettings {
    StreamSettings {
        name: "records".to_string(),
        namespace: connection.provider.clone(),
        parent: None,
    }
}

/// A manual run of `connection`'s `records` stream, without a lease.
pub(crate) async fn open_run<'a>(
    db: &'a DatabasePools,
    connection: &'a connection::Model,
) -> Run<'a> {
    Run::open(
        db,
        connection,
        &records_stream(connection),
        Trigger::Manual,
        None,
    )
    .await
    .expect("run started")
}

/// A page of new records `{"id": id}`, upserted.
pub(crate) fn page_of(names: &[&str]) -> RunPage<'static> {
    let items = names
        .iter()
        .map(|id| {
            let payload = format!(r#"{{"id":"{id}"}}"#);
            PageItem::Record(Record {
                external_id: id.to_string(),
                content_hash: sha256_hex(payload.as_bytes()),
                payload,
            })
        })
        .collect();
    RunPage {
        items,
        mode: WriteMode::Upsert,
        expect: PageExpectation::Unknown,
        ..RunPage::default()
    }
}
