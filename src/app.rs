//! Start-up: [`App::open`] takes loaded settings to a database ready for what the caller
//! is about to do, so that the daemon, the CLI, the bench and the API all start the same
//! way. What each [`Access`] does is cumulative: reading connects (migrating only if a
//! migration is pending), and describing also tries the keys; the others migrate; `Keys`
//! loads the secrets keys; `Work` runs every step a syncing process needs and announces
//! the process in `instances`.

use sea_orm::{DatabaseConnection, DbErr};

use crate::config::{ConfigError, Settings};
use crate::connections::sealing::{self, Reseal, SealingError};
use crate::connections::ConnectionsError;
use crate::db::{DatabasePools, DbSetupError, Instance, OlderInstances, HEARTBEAT_EVERY};
use crate::secrets::{Keyring, SecretsError};

/// What the caller is about to do with the database, and so which start-up steps it needs.
#[derive(Clone, Copy, Debug)]
pub enum Access {
    /// Only reads: one pooled connection, no migration lock when nothing is pending, no
    /// keys.
    Read,
    /// Only reads, describing stored credentials: as `Read`, with the configured keys when
    /// they load. A missing or unreadable key is warned about, not refused, so that no
    /// command that only reads needs a secret; what is sealed is then described by its
    /// key id.
    Describe,
    /// Writes outside the pipeline's runs (reconcile, the demo's set-up): migrated, no keys.
    Migrated,
    /// Migrates and nothing else (`tributary migrate`): as `Migrated`, with `older` saying
    /// whether to go on while instances of an older schema are alive; the migrations
    /// applied are [`App::applied`].
    Migrate { older: OlderInstances },
    /// Reads or writes sealed credentials: migrated, with the configured keys. `storing`
    /// also refuses literal secrets in config.toml that could not be stored sealed.
    Keys { storing: bool },
    /// Syncs, replays, serves: every step (see [`App::open`]), and the process is announced
    /// in `instances` as running `command` until [`App::close`].
    Work {
        command: &'static str,
        older: OlderInstances,
    },
}

/// Why the app could not start. Each says what was wrong; the CLI maps the kinds to its
/// exit codes ([`OpenError::is_config`], [`OpenError::is_schema`]).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Keys(#[from] SecretsError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Database(#[from] DbSetupError),
    #[error("aligning the change feed's clock failed: {0}")]
    Clock(#[source] DbErr),
    #[error(transparent)]
    Sealing(#[from] SealingError),
    #[error("{step}: {source}")]
    Connections {
        step: &'static str,
        #[source]
        source: ConnectionsError,
    },
    #[error("counting the credentials stored in clear failed: {0}")]
    Status(#[source] DbErr),
    #[error("announcing this instance in the instances table failed: {0}")]
    Announce(#[source] DbErr),
}

impl OpenError {
    /// Whether the configuration or the keys it names are at fault.
    pub fn is_config(&self) -> bool {
        match self {
            OpenError::Config(_) => true,
            OpenError::Keys(error) => matches!(
                error,
                SecretsError::ReadKey { .. }
                    | SecretsError::KeyFileMode { .. }
                    | SecretsError::KeyEncoding { .. }
            ),
            _ => false,
        }
    }

    /// Whether the database's schema is newer than this release, or older instances
    /// still run against it.
    pub fn is_schema(&self) -> bool {
        matches!(
            self,
            OpenError::Database(
                DbSetupError::NewerSchema { .. } | DbSetupError::OlderInstancesAlive { .. }
            )
        )
    }
}

/// A started tributary: its settings and its database, ready for the operations.
pub struct App {
    settings: Settings,
    db: DatabasePools,
    applied: Vec<String>,
    announced: Option<Announced>,
}

impl App {
    /// Starts with `settings` for `access`. For [`Access::Work`]: loads the keys (refusing
    /// bad ones and literal secrets that could not be stored), connects and migrates,
    /// refuses a records table without the unique key index, aligns the change feed's
    /// clock, refuses configured connections sealed with a key not configured, loads the
    /// configured connections and retires those config.toml no longer lists, seals the
    /// credentials still stored in clear (warning of those it cannot), and announces the
    /// process. Nothing is written before every check that can refuse has passed.
    pub async fn open(settings: Settings, access: Access) -> Result<App, OpenError> {
        App::open_keyed(settings, access, None).await
    }

    /// [`App::open`] with `keyring` instead of the configured keys: the demo and the bench
    /// seal the tokens of their throwaway databases with a key that lives as long as the
    /// process.
    pub async fn open_with_keyring(
        settings: Settings,
        access: Access,
        keyring: Keyring,
    ) -> Result<App, OpenError> {
        App::open_keyed(settings, access, Some(keyring)).await
    }

    async fn open_keyed(
        settings: Settings,
        access: Access,
        keyring: Option<Keyring>,
    ) -> Result<App, OpenError> {
        let keys = |settings: &Settings| match keyring {
            Some(keyring) => Ok(keyring),
            None => load_keyring(settings),
        };
        let mut applied = Vec::new();
        let (db, announced) = match access {
            Access::Read => (
                crate::db::connect_for_reading(&settings.database).await?,
                None,
            ),
            Access::Describe => {
                let keyring = keys(&settings).unwrap_or_else(|error| {
                    tracing::warn!(
                        %error,
                        "The secrets keys could not be loaded; sealed credentials are described by their key id."
                    );
                    Keyring::none()
                });
                let db = crate::db::connect_for_reading(&settings.database).await?;
                (db.with_keyring(keyring), None)
            }
            Access::Migrated => (
                crate::db::connect_and_migrate(&settings.database).await?,
                None,
            ),
            Access::Migrate { older } => {
                let (db, migrations) =
                    crate::db::connect_and_migrate_with(&settings.database, older).await?;
                applied = migrations;
                (db, None)
            }
            Access::Keys { storing } => {
                let keyring = keys(&settings)?;
                if storing {
                    crate::credentials::check_storable(&settings, &keyring)?;
                }
                let db = crate::db::connect_and_migrate(&settings.database).await?;
                (db.with_keyring(keyring), None)
            }
            Access::Work { command, older } => {
                let db = start_working(&settings, keys(&settings)?, older).await?;
                let announced = announce(&db, command).await?;
                (db, Some(announced))
            }
        };
        Ok(App {
            settings,
            db,
            applied,
            announced,
        })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn db(&self) -> &DatabasePools {
        &self.db
    }

    /// The migrations this start applied, in the order they ran (only [`Access::Migrate`]
    /// reports them).
    pub fn applied(&self) -> &[String] {
        &self.applied
    }

    /// Ends the process's announcement (a process killed leaves it to go stale and be
    /// swept).
    pub async fn close(self) {
        if let Some(announced) = self.announced {
            announced.withdraw().await;
        }
    }
}

/// Loads `[secrets]` and the environment's keys; every key problem is an error here,
/// before anything is written. Storing secrets in clear is warned about at every start.
pub(crate) fn load_keyring(settings: &Settings) -> Result<Keyring, SecretsError> {
    let keyring = Keyring::load(&settings.secrets, &|name| std::env::var(name).ok())?;
    if keyring.allows_plaintext() {
        tracing::warn!("[secrets] allow_plaintext = true and no key is configured: tokens are stored in the database in clear. This is unsafe; configure a key (see `tributary secrets generate-key`).");
    }
    Ok(keyring)
}

/// Every start-up step of a process that syncs (see [`App::open`]).
async fn start_working(
    settings: &Settings,
    keyring: Keyring,
    older: OlderInstances,
) -> Result<DatabasePools, OpenError> {
    crate::credentials::check_storable(settings, &keyring)?;
    let (db, _) = crate::db::connect_and_migrate_with(&settings.database, older).await?;
    let db = db.with_keyring(keyring);
    crate::db::require_key_index(&db).await?;
    // Before anything stamps a run or takes from a request budget: both are compared
    // with other instances' by the database's clock.
    crate::db::follow_clock(db.main(), true).await;
    if crate::pipeline::changes::align_clock(db.main())
        .await
        .map_err(OpenError::Clock)?
    {
        tracing::warn!(
            "The change feed's seqs were moved past the stored batches: the database was \
             restored into another cluster. Readers must resync from the records table."
        );
    }
    sealing::check_configured_keys(&db, settings).await?;
    crate::connections::upsert_configured(&db, settings)
        .await
        .map_err(|source| OpenError::Connections {
            step: "loading the configured connections into the database",
            source,
        })?;
    crate::connections::retire_removed(&db, settings)
        .await
        .map_err(|source| OpenError::Connections {
            step: "disabling the connections removed from the config",
            source,
        })?;
    let sealed = sealing::reseal(&db, Reseal::InClear).await?;
    // Said at the default level: an operator upgrading from a release without a key
    // should see that the column changed, since that release cannot read it any more.
    if sealed.resealed > 0 {
        tracing::warn!(
            connections = sealed.resealed,
            "Credentials stored in clear were sealed under the current key."
        );
    }
    for failure in &sealed.failed {
        tracing::error!(error = %failure, "Stored credentials could not be sealed.");
    }
    warn_of_credentials_in_clear(&db).await?;
    Ok(db)
}

/// Warns, at every start, of connections whose credentials are still stored in clear
/// (written by an older release, or without a key) unless `allow_plaintext` asks for it,
/// which is warned about where the keys are loaded.
async fn warn_of_credentials_in_clear(db: &DatabasePools) -> Result<(), OpenError> {
    if db.secrets().allows_plaintext() {
        return Ok(());
    }
    let status = sealing::status(db).await.map_err(OpenError::Status)?;
    if status.in_clear > 0 {
        tracing::warn!(
            connections = status.in_clear,
            "Credentials are stored in the database in clear. This is unsafe; configure a key \
             (see `tributary secrets generate-key`) and start again to seal them."
        );
    }
    Ok(())
}

/// A working process's row in `instances` (see `db::Instance`) and the task refreshing it
/// every `HEARTBEAT_EVERY`.
struct Announced {
    db: DatabaseConnection,
    instance: Instance,
    heartbeat: tokio::task::JoinHandle<()>,
}

async fn announce(db: &DatabasePools, command: &str) -> Result<Announced, OpenError> {
    let holder = crate::lease::Holder::current();
    let host = crate::lease::hostname();
    let instance = Instance::announce(db.main(), holder.as_str(), &host, command)
        .await
        .map_err(OpenError::Announce)?;
    let db = db.main().clone();
    let mut beating = instance.clone();
    let connection = db.clone();
    let heartbeat = tokio::spawn(async move {
        let mut ticks = tokio::time::interval(HEARTBEAT_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate: the row was just written.
        ticks.tick().await;
        loop {
            ticks.tick().await;
            if let Err(error) = beating.heartbeat(&connection).await {
                tracing::warn!(%error, "The instance's heartbeat could not be written.");
            }
        }
    });
    Ok(Announced {
        db,
        instance,
        heartbeat,
    })
}

impl Announced {
    /// Stops the heartbeat and removes the row.
    async fn withdraw(self) {
        self.heartbeat.abort();
        let Announced {
            db,
            instance,
            heartbeat,
        } = self;
        // A heartbeat cut short mid-write must not write the row again after it is gone.
        let _ = heartbeat.await;
        if let Err(error) = instance.withdraw(&db).await {
            tracing::warn!(
                %error,
                "The instance's row could not be removed; it is swept once its heartbeat is stale."
            );
        }
    }
}
