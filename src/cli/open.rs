//! Opening the database as a command needs it: with the keys, and for commands that
//! write, with the configured connections loaded first.

use anyhow::Context;

use crate::config::Settings;
use crate::connections::sealing::{self, Reseal};
use crate::db::{DatabasePools, OlderInstances};

/// For commands that sync or replay: loads the keys, connects and migrates, refuses a
/// table without the unique index, aligns the change feed's clock (PostgreSQL), loads
/// the configured connections, retires those config.toml no longer lists, seals in
/// place the credentials a database still holds in clear, and warns of those it cannot. A bad key, a literal secret without one, or a configured connection
/// sealed with a key not configured stop it before anything is written. Commands that
/// only read leave connections as they are.
pub async fn open_for_writing(settings: &Settings) -> anyhow::Result<DatabasePools> {
    open_for_writing_with(settings, OlderInstances::Refuse).await
}

/// [`open_for_writing`], with `older` saying whether to migrate while instances of an
/// older schema are alive (the daemon's `--while-others-run`).
pub async fn open_for_writing_with(
    settings: &Settings,
    older: OlderInstances,
) -> anyhow::Result<DatabasePools> {
    let db = connect_with_keys_migrating(settings, older).await?;
    crate::db::require_key_index(&db).await?;
    if crate::pipeline::changes::align_clock(db.main())
        .await
        .context("aligning the change feed's clock")?
    {
        tracing::warn!(
            "The change feed's seqs were moved past the stored batches: the database was \
             restored into another cluster. Readers must resync from the records table."
        );
    }
    sealing::check_configured_keys(&db, settings).await?;
    crate::connections::upsert_configured(&db, settings)
        .await
        .context("loading the configured connections into the database")?;
    crate::connections::retire_removed(&db, settings)
        .await
        .context("disabling the connections removed from the config")?;
    let sealed = sealing::reseal(&db, Reseal::InClear)
        .await
        .context("sealing the credentials stored in clear")?;
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
async fn warn_of_credentials_in_clear(db: &DatabasePools) -> anyhow::Result<()> {
    if db.secrets().allows_plaintext() {
        return Ok(());
    }
    let status = sealing::status(db)
        .await
        .context("counting the credentials stored in clear")?;
    if status.in_clear > 0 {
        tracing::warn!(
            connections = status.in_clear,
            "Credentials are stored in the database in clear. This is unsafe; configure a key \
             (see `tributary secrets generate-key`) and start again to seal them."
        );
    }
    Ok(())
}

/// Loads the keys (refusing bad ones and literal secrets that could not be stored), then
/// connects and migrates.
pub async fn connect_with_keys(settings: &Settings) -> anyhow::Result<DatabasePools> {
    connect_with_keys_migrating(settings, OlderInstances::Refuse).await
}

async fn connect_with_keys_migrating(
    settings: &Settings,
    older: OlderInstances,
) -> anyhow::Result<DatabasePools> {
    let keyring = super::secrets::load_keyring(settings)?;
    crate::credentials::check_storable(settings, &keyring)?;
    let (db, _) = crate::db::connect_and_migrate_with(&settings.database, older).await?;
    Ok(db.with_keyring(keyring))
}
