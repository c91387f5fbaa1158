//! `tributary check-config` and `tributary migrate`: validating the config, and applying
//! the migrations.

use std::path::Path;
use std::process::ExitCode;

use crate::app::{Access, App};
use crate::config::{redact_url, Settings};
use crate::db::OlderInstances;

/// `tributary check-config`: the config and the keys, without touching the database.
pub fn check_config(config: &Path) -> anyhow::Result<ExitCode> {
    let settings = Settings::load_checking_environment(config)?;
    let keyring = crate::app::load_keyring(&settings)?;
    crate::credentials::check_storable(&settings, &keyring)?;
    settings.notify_secret()?;
    let api_tls = settings.api_tls()?;
    let connections: usize = settings
        .providers
        .values()
        .map(|p| p.connections.len())
        .sum();
    println!(
        "{} is valid: {} provider(s), {} connection(s), database {}",
        settings.path.display(),
        settings.providers.len(),
        connections,
        redact_url(&settings.database.url)
    );
    if let Some(notify) = &settings.notify {
        println!(
            "Notifications to {}, signed with the secret in {}.",
            redact_url(notify.url.as_str()),
            notify.secret_env
        );
    }
    if let (Some(api), Some(_)) = (&settings.api, api_tls) {
        println!("The API serves HTTPS on {}.", api.listen);
    }
    match keyring.current() {
        Some((id, source)) => println!("Secrets key {id} from {source}."),
        None if keyring.allows_plaintext() => {
            println!("No secrets key: literal secrets are stored in clear (allow_plaintext).")
        }
        None => println!("No secrets key: only token_env connections can be stored."),
    }
    Ok(ExitCode::SUCCESS)
}

/// `tributary migrate`.
pub async fn migrate(config: &Path, older: OlderInstances) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(config)?;
    let app = App::open(settings, Access::Migrate { older }).await?;
    let applied = app.applied();
    let url = redact_url(&app.settings().database.url);
    let schema = crate::db::schema_version();
    if applied.is_empty() {
        println!("Nothing to migrate: {url} is at schema {schema}, the newest this release knows.");
    } else {
        println!(
            "Applied {} migration(s) to {url}, now at schema {schema}:",
            applied.len()
        );
        for migration in applied {
            println!("  {migration}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
