//! `spawn_app()`: a fresh migrated database and a wiremock server per test.

use std::path::PathBuf;
use std::sync::Once;

use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Statement,
};
use tempfile::TempDir;
use tributary::config::{DatabaseSettings, Settings};
use tributary::entities::sync_run::Trigger;
use tributary::entities::{
    change_batch, connection, connection_stream, record, run_error, sync_run,
};
use tributary::pipeline::changes::{self, Cursor, FeedChange, FeedQuery};
use tributary::pipeline::{NoProgress, RunOptions, RunOutcome};
use tributary::sync::{sync_matching, SyncFilter};
use wiremock::MockServer;

static TRACING: Once = Once::new();

/// One test's world: a database, a mock API, a folder for files, and a secrets key
/// (`key_file`, mode 0600) that the pools and the configs written here use.
pub struct TestApp {
    pub db: tributary::db::DatabasePools,
    pub database_url: String,
    pub api: MockServer,
    pub dir: TempDir,
    pub key_file: PathBuf,
}

#[path = "../common/scratch.rs"]
mod scratch;
pub use scratch::{backend, scratch_database_url, Backend};

/// Starts a wiremock server and opens a fresh, migrated database (see [`backend`]).
/// The primary stream of `connection`, a `kind = "rest"` connection: `records`, whose
/// records keep the provider's name.
pub fn records_stream(connection: &connection::Model) -> tributary::config::StreamSettings {
    tributary::config::StreamSettings {
        name: "records".to_string(),
        namespace: connection.provider.clone(),
        parent: None,
    }
}

/// Opens a manual run of `connection`'s primary stream (see [`records_stream`]) without a
/// lease.
pub async fn open_run<'a>(
    db: &'a tributary::db::DatabasePools,
    connection: &'a connection::Model,
) -> tributary::pipeline::Run<'a> {
    tributary::pipeline::Run::open(
        db,
        connection,
        &records_stream(connection),
        Trigger::Manual,
        None,
    )
    .await
    .expect("run started")
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|url| url).await
}

async fn spawn_app_with(database_url: impl FnOnce(String) -> String) -> TestApp {
    TRACING.call_once(|| {
        if std::env::var_os("TEST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter("debug,sqlx=warn,hyper=warn")
                .with_test_writer()
                .try_init();
        }
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let database_url = database_url(scratch_database_url(dir.path()).await);
    let db = tributary::db::connect_and_migrate(&DatabaseSettings {
        url: database_url.clone(),
        max_connections: 4,
    })
    .await
    .expect("migrated test database");
    TestApp::new(db, database_url, dir).await
}

/// Writes a new key file `secrets.key` into `dir` and returns it with a keyring holding it.
pub fn test_key(dir: &std::path::Path) -> (PathBuf, tributary::secrets::Keyring) {
    let key_file = dir.join("secrets.key");
    tributary::secrets::Keyring::generate_key_file(&key_file).expect("test key written");
    let keyring = keyring_of(&key_file);
    (key_file, keyring)
}

/// A keyring whose current key is read from `key_file`.
pub fn keyring_of(key_file: &std::path::Path) -> tributary::secrets::Keyring {
    let settings = tributary::config::SecretsSettings {
        key_file: Some(key_file.to_path_buf()),
        ..Default::default()
    };
    tributary::secrets::Keyring::load(&settings, &|_| None).expect("test key read")
}

/// A `[providers.NAME]` table for a `rest` provider on `base_url` with cursor pagination,
/// fast retries, and one bearer-token connection per user (`token = "token-<user>"`).
pub fn cursor_provider(name: &str, base_url: &str, users: &[&str]) -> String {
    let mut text = format!(
        r#"
[providers.{name}]
kind = "rest"
base_url = "{base_url}"
path = "/v1/items"
schedule = "0 */15 * * * *"
records_path = "data"
id_field = "id"
auth = "bearer"

[providers.{name}.http]
max_retries = 2
retry_initial_delay = "1ms"
retry_max_delay = "5ms"

[providers.{name}.pagination]
type = "cursor"
cursor_path = "next_cursor"
cursor_param = "cursor"
page_size_param = "limit"
page_size = 100
"#
    );
    text.push_str(&connections(name, users));
    text
}

/// `[[providers.NAME.connections]]` entries with `token = "token-<user>"`.
pub fn connections(name: &str, users: &[&str]) -> String {
    users
        .iter()
        .map(|user| {
            format!(
                "\n[[providers.{name}.connections]]\nuser_id = \"{user}\"\ntoken = \"token-{user}\"\n"
            )
        })
        .collect()
}

impl TestApp {
    /// A test's world around an open database: a mock API and a new key in `dir`.
    pub async fn new(
        db: tributary::db::DatabasePools,
        database_url: String,
        dir: TempDir,
    ) -> TestApp {
        let (key_file, keyring) = test_key(dir.path());
        TestApp {
            db: db.with_keyring(keyring),
            database_url,
            api: MockServer::start().await,
            dir,
            key_file,
        }
    }

    /// Another keyring holding this app's key, for pools of a test's own.
    pub fn keyring(&self) -> tributary::secrets::Keyring {
        keyring_of(&self.key_file)
    }

    /// A whole config file: this app's database and key plus the given provider tables.
    pub fn config_text(&self, providers: &str) -> String {
        format!(
            "[database]\nurl = \"{}\"\n[secrets]\nkey_file = \"{}\"\n{providers}",
            self.database_url,
            self.key_file.display()
        )
    }

    /// A connection's stored credentials, opened with this app's key.
    pub async fn stored_credentials(
        &self,
        user_id: &str,
        provider: &str,
    ) -> tributary::credentials::StoredCredentials {
        use sea_orm::{ColumnTrait, QueryFilter};
        use tributary::entities::connection;
        let row = connection::Entity::find()
            .filter(connection::Column::UserId.eq(user_id))
            .filter(connection::Column::Provider.eq(provider))
            .one(&self.db)
            .await
            .expect("query")
            .expect("connection exists");
        tributary::credentials::StoredCredentials::from_column(
            self.db.secrets(),
            row.binding(),
            &row.credentials,
        )
        .expect("credentials open")
    }

    /// Writes the config file into the temp folder and returns its path.
    pub fn write_config(&self, providers: &str) -> PathBuf {
        let path = self.dir.path().join("config.toml");
        std::fs::write(&path, self.config_text(providers)).expect("write config");
        path
    }

    /// Parses the config and loads its connections into the database.
    pub async fn settings(&self, providers: &str) -> Settings {
        let settings = Settings::parse(
            &self.dir.path().join("config.toml"),
            &self.config_text(providers),
            None,
            &|_| true,
        )
        .expect("valid config");
        tributary::connections::upsert_configured(&self.db, &settings)
            .await
            .expect("connections stored");
        settings
    }

    /// Syncs every connection of `settings` once and returns the runs sorted by user.
    pub async fn sync(&self, settings: &Settings) -> Vec<RunOutcome> {
        let mut outcomes = sync_matching(
            &self.db,
            settings,
            &SyncFilter::default(),
            &RunOptions::manual(),
            &NoProgress,
        )
        .await
        .expect("runs recorded")
        .outcomes;
        outcomes.sort_by(|a, b| (&a.provider, &a.user_id).cmp(&(&b.provider, &b.user_id)));
        outcomes
    }

    /// Syncs and returns the only run.
    pub async fn sync_one(&self, settings: &Settings) -> RunOutcome {
        let mut outcomes = self.sync(settings).await;
        assert_eq!(outcomes.len(), 1, "expected exactly one run: {outcomes:?}");
        outcomes.remove(0)
    }

    /// Configures alice's connection at a cursor provider `acme` and returns it.
    pub async fn alice(&self) -> connection::Model {
        self.settings(&cursor_provider("acme", &self.api.uri(), &["alice"]))
            .await;
        connection::Entity::find()
            .one(&self.db)
            .await
            .expect("connections")
            .expect("one connection")
    }

    /// Configures alice's connection at a cursor provider `acme` and opens a manual run
    /// of it, for tests that drive the store directly.
    pub async fn alice_with_a_run(&self) -> (connection::Model, i64) {
        let connection = self.alice().await;
        let run_id = open_run(&self.db, &connection).await.id();
        (connection, run_id)
    }

    /// The state of the one stream that has run (cursor, checkpoint, last success), if
    /// one has.
    pub async fn only_stream(&self) -> Option<connection_stream::Model> {
        let mut states = connection_stream::Entity::find()
            .all(&self.db)
            .await
            .expect("connection_streams");
        assert!(states.len() <= 1, "more than one stream: {states:?}");
        states.pop()
    }

    /// The one stream's checkpoint column.
    pub async fn stream_checkpoint(&self) -> Option<String> {
        self.only_stream().await.and_then(|state| state.checkpoint)
    }

    /// The whole records table, ordered by key.
    pub async fn records(&self) -> Vec<record::Model> {
        record::Entity::find()
            .order_by_asc(record::Column::UserId)
            .order_by_asc(record::Column::Provider)
            .order_by_asc(record::Column::ExternalId)
            .all(&self.db)
            .await
            .expect("records")
    }

    /// The external ids of the whole records table, ordered by key.
    pub async fn record_ids(&self) -> Vec<String> {
        let records = self.records().await;
        records.into_iter().map(|r| r.external_id).collect()
    }

    /// Every column of every record as text lines, for diffing two states of the table.
    pub async fn dump_records(&self) -> Vec<String> {
        self.records()
            .await
            .into_iter()
            .map(|r| {
                format!(
                    "{}|{}|{}|{}|{}|{}|{}|{}|{}|{}",
                    r.id,
                    r.user_id,
                    r.provider,
                    r.external_id,
                    r.payload,
                    r.content_hash,
                    r.first_seen_run_id,
                    r.last_seen_run_id,
                    r.created_at.to_rfc3339(),
                    r.updated_at.to_rfc3339()
                )
            })
            .collect()
    }

    /// The error report of one run, oldest first.
    pub async fn run_errors(&self, run_id: i64) -> Vec<run_error::Model> {
        use sea_orm::{ColumnTrait, QueryFilter};
        run_error::Entity::find()
            .filter(run_error::Column::RunId.eq(run_id))
            .order_by_asc(run_error::Column::Id)
            .all(&self.db)
            .await
            .expect("run errors")
    }

    /// The stored `sync_runs` row.
    pub async fn run_row(&self, run_id: i64) -> sync_run::Model {
        sync_run::Entity::find_by_id(run_id)
            .one(&self.db)
            .await
            .expect("query")
            .expect("run row exists")
    }

    /// The seqs of the stamped change batches, in feed order. Where the clock ticks they
    /// run 1, 2, 3 ...; on PostgreSQL they are transaction ids, whose gaps are others'.
    pub async fn batch_seqs(&self) -> Vec<i64> {
        change_batch::Entity::find()
            .filter(change_batch::Column::Seq.is_not_null())
            .order_by_asc(change_batch::Column::Seq)
            .all(&self.db)
            .await
            .expect("change batches")
            .into_iter()
            .filter_map(|batch| batch.seq)
            .collect()
    }

    /// The columns of the unique index on `records` other than the primary key, in index
    /// order, read back from the database's own catalogue. One entry per unique index.
    pub async fn unique_indexes_on_records(&self) -> Vec<Vec<String>> {
        let sql = match backend() {
            Backend::Sqlite => {
                "SELECT il.name AS index_name, ii.name AS column_name \
                 FROM pragma_index_list('records') il, pragma_index_info(il.name) ii \
                 WHERE il.\"unique\" = 1 AND il.origin = 'c' ORDER BY il.name, ii.seqno"
            }
            Backend::Postgres => {
                "SELECT ic.relname AS index_name, a.attname AS column_name \
                 FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid \
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
                 WHERE i.indrelid = 'records'::regclass AND i.indisunique AND NOT i.indisprimary \
                 ORDER BY ic.relname, array_position(i.indkey::int2[], a.attnum)"
            }
            Backend::Mysql => {
                "SELECT INDEX_NAME AS index_name, COLUMN_NAME AS column_name \
                 FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() \
                 AND TABLE_NAME = 'records' AND NON_UNIQUE = 0 AND INDEX_NAME <> 'PRIMARY' \
                 ORDER BY INDEX_NAME, SEQ_IN_INDEX"
            }
        };
        let rows = self
            .db
            .query_all_raw(Statement::from_string(self.db.get_database_backend(), sql))
            .await
            .expect("index catalogue");
        let mut indexes: Vec<(String, Vec<String>)> = Vec::new();
        for row in rows {
            let index: String = row.try_get("", "index_name").expect("index_name");
            let column: String = row.try_get("", "column_name").expect("column_name");
            match indexes.last_mut() {
                Some((name, columns)) if *name == index => columns.push(column),
                _ => indexes.push((index, vec![column])),
            }
        }
        indexes.into_iter().map(|(_, columns)| columns).collect()
    }

    /// Makes the database itself refuse to insert a record with this external id, the
    /// way a real constraint or trigger would.
    pub async fn refuse_inserts_of(&self, external_id: &str, message: &str) {
        self.refuse_writes_of("INSERT", external_id, message).await
    }

    /// Makes the database fail any insert of a record with this external id with an
    /// error that is no refusal of the row (an internal error), as a broken trigger or a
    /// failing server would.
    pub async fn fail_inserts_of(&self, external_id: &str) {
        match backend() {
            Backend::Sqlite => {
                self.execute(&format!(
                    "CREATE TRIGGER fail_insert BEFORE INSERT ON records \
                     WHEN NEW.external_id = '{external_id}' \
                     BEGIN SELECT json('an internal error'); END"
                ))
                .await
            }
            Backend::Postgres => {
                self.execute(&format!(
                    "CREATE FUNCTION fail_insert() RETURNS trigger AS $$ BEGIN \
                     IF NEW.external_id = '{external_id}' THEN \
                     RAISE EXCEPTION 'an internal error' USING ERRCODE = 'XX000'; END IF; \
                     RETURN NEW; END $$ LANGUAGE plpgsql"
                ))
                .await;
                self.execute(
                    "CREATE TRIGGER fail_insert BEFORE INSERT ON records \
                     FOR EACH ROW EXECUTE FUNCTION fail_insert()",
                )
                .await
            }
            Backend::Mysql => {
                self.execute(&format!(
                    "CREATE TRIGGER fail_insert BEFORE INSERT ON records FOR EACH ROW \
                     BEGIN IF NEW.external_id = '{external_id}' THEN \
                     SIGNAL SQLSTATE 'HY000' SET MESSAGE_TEXT = 'an internal error', \
                     MYSQL_ERRNO = 1105; END IF; END"
                ))
                .await
            }
        }
    }

    /// Makes the database itself refuse to rewrite the record with this external id.
    pub async fn refuse_updates_of(&self, external_id: &str, message: &str) {
        self.refuse_writes_of("UPDATE", external_id, message).await
    }

    async fn refuse_writes_of(&self, event: &str, external_id: &str, message: &str) {
        let name = format!("refuse_{}", event.to_lowercase());
        match backend() {
            Backend::Sqlite => {
                self.execute(&format!(
                    "CREATE TRIGGER {name} BEFORE {event} ON records \
                     WHEN NEW.external_id = '{external_id}' \
                     BEGIN SELECT RAISE(ABORT, '{message}'); END"
                ))
                .await
            }
            Backend::Postgres => {
                self.execute(&format!(
                    "CREATE FUNCTION {name}() RETURNS trigger AS $$ BEGIN \
                     IF NEW.external_id = '{external_id}' THEN RAISE EXCEPTION '{message}'; END IF; \
                     RETURN NEW; END $$ LANGUAGE plpgsql"
                ))
                .await;
                self.execute(&format!(
                    "CREATE TRIGGER {name} BEFORE {event} ON records \
                     FOR EACH ROW EXECUTE FUNCTION {name}()"
                ))
                .await
            }
            Backend::Mysql => {
                self.execute(&format!(
                    "CREATE TRIGGER {name} BEFORE {event} ON records FOR EACH ROW \
                     BEGIN IF NEW.external_id = '{external_id}' THEN \
                     SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{message}'; END IF; END"
                ))
                .await
            }
        }
    }

    /// Sessions of this test's database waiting for a lock. On MySQL the count comes from
    /// a copy of `INNODB_TRX` that MariaDB refreshed after this call began (see
    /// [`TestApp::read_innodb_trx`]).
    pub async fn lock_waits(&self) -> i64 {
        let sql = match backend() {
            Backend::Sqlite => return 0,
            Backend::Postgres => {
                "SELECT count(*)::bigint AS n FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'"
            }
            Backend::Mysql => {
                "SELECT count(*) AS n FROM information_schema.INNODB_TRX t \
                 JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id \
                 WHERE p.DB = DATABASE() AND t.trx_state = 'LOCK WAIT'"
            }
        };
        let rows = match backend() {
            Backend::Mysql => self.read_innodb_trx(sql).await,
            _ => self.query_rows(sql).await,
        };
        rows.first().expect("a count").try_get("", "n").expect("n")
    }

    /// What each session of this test's database is doing, one line each, for failure
    /// messages: its command, state and statement, and on MySQL its transaction's state;
    /// on PostgreSQL what it waits for.
    pub async fn sessions(&self) -> String {
        let sql = match backend() {
            Backend::Sqlite => return "(SQLite has no sessions to show)".to_string(),
            Backend::Postgres => {
                "SELECT concat_ws(' ', 'pid=' || pid, state, \
                 'wait=' || coalesce(wait_event_type || ':' || wait_event, 'none'), \
                 'for=' || (now() - query_start)::text, 'query=' || left(query, 160)) AS line \
                 FROM pg_stat_activity WHERE datname = current_database() ORDER BY pid"
            }
            // Those of other databases that wait for a lock too, in case they wait for ours.
            Backend::Mysql => {
                "SELECT CAST(CONCAT_WS(' ', CONCAT('id=', p.ID), \
                 CONCAT('db=', IFNULL(p.DB, 'NULL')), p.COMMAND, CONCAT('for=', p.TIME, 's'), \
                 CONCAT('state=', IFNULL(p.STATE, '')), CONCAT('trx=', IFNULL(t.trx_state, 'none')), \
                 IF(p.ID = CONNECTION_ID(), '(this report)', ''), \
                 CONCAT('query=', LEFT(IFNULL(p.INFO, ''), 160))) AS CHAR) AS line \
                 FROM information_schema.PROCESSLIST p \
                 LEFT JOIN information_schema.INNODB_TRX t ON t.trx_mysql_thread_id = p.ID \
                 WHERE p.DB = DATABASE() OR t.trx_state = 'LOCK WAIT' ORDER BY p.ID"
            }
        };
        let rows = match backend() {
            Backend::Mysql => self.read_innodb_trx(sql).await,
            _ => self.query_rows(sql).await,
        };
        let lines: Vec<String> = rows
            .iter()
            .map(|row| row.try_get("", "line").expect("line"))
            .collect();
        lines.join("\n")
    }

    /// The rows of `sql` on the app's pool.
    async fn query_rows(&self, sql: &str) -> Vec<sea_orm::QueryResult> {
        self.db
            .query_all_raw(Statement::from_string(self.db.get_database_backend(), sql))
            .await
            .expect("session query")
    }

    /// Runs `sql`, a read of `information_schema.INNODB_TRX`, on a copy of it taken after
    /// this call began. MariaDB refreshes that copy only once no session has read it for
    /// 100 ms, so tests polling at once could keep it stale for good: this process's reads
    /// take turns [`LOCK_WAITS_POLL`] apart, and a copy that does not show the reading
    /// transaction itself is older than the call and is read again.
    async fn read_innodb_trx(&self, sql: &str) -> Vec<sea_orm::QueryResult> {
        use sea_orm::TransactionTrait;
        static LAST_READ: tokio::sync::Mutex<Option<std::time::Instant>> =
            tokio::sync::Mutex::const_new(None);
        let mut last_read = LAST_READ.lock().await;
        let statement = |sql: &str| Statement::from_string(self.db.get_database_backend(), sql);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            if let Some(last) = *last_read {
                tokio::time::sleep(
                    (last + LOCK_WAITS_POLL).saturating_duration_since(std::time::Instant::now()),
                )
                .await;
            }
            let txn = self.db.begin().await.expect("INNODB_TRX transaction");
            txn.query_one_raw(statement("SELECT 1 FROM seaql_migrations LIMIT 1"))
                .await
                .expect("transaction begun in InnoDB");
            let shown: i64 = txn
                .query_one_raw(statement(
                    "SELECT count(*) AS n FROM information_schema.INNODB_TRX \
                     WHERE trx_mysql_thread_id = CONNECTION_ID()",
                ))
                .await
                .expect("INNODB_TRX")
                .expect("a count")
                .try_get("", "n")
                .expect("n");
            let rows = txn.query_all_raw(statement(sql)).await.expect("INNODB_TRX");
            txn.commit().await.expect("INNODB_TRX transaction");
            *last_read = Some(std::time::Instant::now());
            if shown == 1 {
                return rows;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "MariaDB has not refreshed INNODB_TRX for 30 s: something else reads it \
                 more often than every 100 ms"
            );
            // Another process reading it in step with this one would keep it stale: a
            // varying delay before the next try breaks the step.
            let jitter = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970")
                .subsec_nanos()
                % 100;
            tokio::time::sleep(std::time::Duration::from_millis(jitter.into())).await;
        }
    }

    /// How many requests the mock API has received.
    pub async fn received_requests(&self) -> usize {
        self.api
            .received_requests()
            .await
            .map(|requests| requests.len())
            .unwrap_or(0)
    }

    /// Runs a raw SQL statement (for test fixtures such as triggers).
    pub async fn execute(&self, sql: &str) {
        self.db
            .execute_raw(Statement::from_string(self.db.get_database_backend(), sql))
            .await
            .expect("statement");
    }
}

/// How often to ask [`TestApp::lock_waits`], and the least time between two reads of
/// MariaDB's `INNODB_TRX` from this process.
pub const LOCK_WAITS_POLL: std::time::Duration = std::time::Duration::from_millis(150);

/// Every change after `since` up to the newest batch committed when it is called, read
/// `limit` at a time, and the cursor after them. On PostgreSQL a committed batch becomes
/// readable once every transaction of the server that began writing before it has ended,
/// other tests' among them, so it reads on for at most 30 s until it has passed that batch.
pub async fn read_feed(
    db: &sea_orm::DatabaseConnection,
    since: Cursor,
    limit: u64,
) -> (Vec<FeedChange>, Cursor) {
    let newest: Option<i64> = change_batch::Entity::find()
        .select_only()
        .column_as(change_batch::Column::Seq.max(), "seq")
        .into_tuple::<Option<i64>>()
        .one(db)
        .await
        .expect("the newest batch")
        .flatten();
    let target = newest.map_or(since, Cursor::after_batch);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut cursor = since;
    let mut all = Vec::new();
    loop {
        let query = FeedQuery {
            since: Some(cursor),
            provider: None,
            user_id: None,
            limit,
        };
        let page = changes::read_changes(db, &query).await.expect("feed read");
        assert!(page.next >= cursor, "the cursor never goes back");
        let done = page.changes.is_empty();
        cursor = page.next;
        all.extend(page.changes);
        if done {
            if cursor >= target {
                return (all, cursor);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the feed never reached {target:?}: it stopped at {cursor:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

/// The newest migration the binary knows: the schema version it announces.
pub fn newest_schema() -> String {
    use tributary_migrations::{Migrator, MigratorTrait};
    Migrator::migrations()
        .last()
        .map(|migration| migration.name().to_string())
        .expect("migrations")
}

/// `tributary --config PATH ARGS...` with a clean environment for the variables it reads.
pub fn tributary(config: &std::path::Path) -> assert_cmd::Command {
    let mut command = assert_cmd::Command::cargo_bin("tributary").expect("binary built");
    command
        .arg("--config")
        .arg(config)
        .env_remove("TRIBUTARY_DATABASE_URL")
        .env_remove("TRIBUTARY_CONFIG")
        .env_remove("TRIBUTARY_SECRETS_KEY")
        .env_remove("CREDENTIALS_DIRECTORY")
        .env_remove("RUST_LOG");
    command
}

/// A finished command's exit code and output.
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `command` to the end.
pub fn run(command: &mut assert_cmd::Command) -> Output {
    let output = command.output().expect("binary runs");
    Output {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `n` records `{"id": "<prefix><i>", "owner": owner, "n": i}` for i in `range`.
pub fn items(prefix: &str, owner: &str, range: std::ops::Range<usize>) -> Vec<serde_json::Value> {
    range
        .map(|i| serde_json::json!({ "id": format!("{prefix}{i}"), "owner": owner, "n": i }))
        .collect()
}

/// proptest settings for the suite's property tests: `cases` cases, a fixed seed (so a
/// run is repeatable) unless `PROPTEST_RNG_SEED` is set, and no regression files (a
/// failure prints the seed and the shrunk case instead).
pub fn proptest_config(cases: u32, seed: u64) -> proptest::test_runner::Config {
    let mut config = proptest::test_runner::Config::with_cases(cases);
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(seed);
    }
    config.failure_persistence = None;
    config
}

/// A runtime for property tests, whose cases are plain closures.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Mounts `user`'s cursor listing: `pages` pages of `per_page` records with ids
/// `<prefix><n>`, for requests with `Bearer token-<user>`, each answered after `delay`.
pub async fn mount_cursor_listing(
    server: &MockServer,
    user: &str,
    prefix: &str,
    pages: usize,
    per_page: usize,
    delay: std::time::Duration,
) {
    use wiremock::matchers::{header, method, path, query_param, query_param_is_missing};
    for page in 0..pages {
        let start = page * per_page;
        let next = (page + 1 < pages).then(|| format!("p{}", page + 1));
        let body = serde_json::json!({
            "data": items(prefix, user, start..start + per_page),
            "next_cursor": next,
        });
        let mock = wiremock::Mock::given(method("GET"))
            .and(path("/v1/items"))
            .and(header(
                "authorization",
                format!("Bearer token-{user}").as_str(),
            ));
        let mock = if page == 0 {
            mock.and(query_param_is_missing("cursor"))
        } else {
            mock.and(query_param("cursor", format!("p{page}").as_str()))
        };
        mock.respond_with(
            wiremock::ResponseTemplate::new(200)
                .set_body_json(body)
                .set_delay(delay),
        )
        .mount(server)
        .await;
    }
}

/// Mounts a cursor listing of these pages, each `(data, next_cursor)`: the first page for a
/// request without a cursor, page `n` for cursor `p{n+1}`, as the pages name them.
pub async fn mount_cursor_pages(
    server: &MockServer,
    pages: Vec<(serde_json::Value, Option<&str>)>,
) {
    use wiremock::matchers::{method, path, query_param, query_param_is_missing};
    for (index, (data, next)) in pages.into_iter().enumerate() {
        let mock = wiremock::Mock::given(method("GET")).and(path("/v1/items"));
        let mock = match index {
            0 => mock.and(query_param_is_missing("cursor")),
            n => mock.and(query_param("cursor", format!("p{}", n + 1).as_str())),
        };
        mock.respond_with(
            wiremock::ResponseTemplate::new(200)
                .set_body_json(serde_json::json!({"data": data, "next_cursor": next})),
        )
        .mount(server)
        .await;
    }
}

/// The checkpoint of `stream` (JSON), once it has one.
pub async fn stream_checkpoint_json(app: &TestApp, stream: &str) -> Option<serde_json::Value> {
    let state = connection_stream::Entity::find()
        .filter(connection_stream::Column::Stream.eq(stream))
        .one(&app.db)
        .await
        .expect("connection_streams")?;
    serde_json::from_str(state.checkpoint.as_deref()?).ok()
}

/// Starts `tributary sync --quiet` on `config`, waits until `stream`'s checkpoint names
/// parent `parent` (its listing's first page committed), then kills the process with
/// SIGKILL; returns that checkpoint.
pub async fn kill_sync_at_parent(
    app: &TestApp,
    config: &std::path::Path,
    stream: &str,
    parent: &str,
) -> serde_json::Value {
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("tributary"))
        .arg("--config")
        .arg(config)
        .args(["sync", "--quiet"])
        .env_remove("TRIBUTARY_DATABASE_URL")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("tributary starts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let reached = stream_checkpoint_json(app, stream).await;
        if reached
            .as_ref()
            .is_some_and(|checkpoint| checkpoint["parent"] == parent)
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the process never reached parent {parent}: {reached:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    stream_checkpoint_json(app, stream)
        .await
        .expect("a checkpoint")
}

/// Where `.ci/run` installs the tools the tests run under Node.js (`tests/tools/package.json`,
/// pinned): html-validate, axe-core and Stripe's library. Fails, never skips, when they are missing.
pub fn test_tool(path: &str) -> std::path::PathBuf {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tools/node_modules")
        .join(path);
    assert!(
        file.exists(),
        "{} is missing: run `npm ci --prefix tests/tools` (Node.js 20 or later)",
        file.display()
    );
    file
}
