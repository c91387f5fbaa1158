//! `tributary secrets generate-key | rotate | status`: the key that seals stored
//! credentials, and which rows use which key.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use crate::app::{Access, App};
use crate::config::Settings;
use crate::connections::sealing;
use crate::secrets::SecretsError;

#[derive(Debug, Subcommand)]
pub enum SecretsCommand {
    /// Write a new random key (32 bytes, base64) to FILE with mode 0600. Refuses to
    /// overwrite an existing file.
    GenerateKey {
        /// Where to write the key.
        #[arg(long)]
        out: PathBuf,
    },
    /// Re-seal every stored secret under the current key; `previous_key_files` still
    /// open what was sealed before. Each row is rewritten on its own, so an interrupted
    /// rotation is safe to run again.
    Rotate {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// How many connections hold credentials sealed with each key id, and how many in
    /// clear. Needs no key: without one, sealed rows are counted by the key id they carry.
    Status {
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Seal the webhook signing secret of PROVIDER, read from standard input, under the
    /// current key, and print it for `[providers.PROVIDER.webhooks] secret = "..."`: the
    /// secret then stays out of config.toml in clear.
    SealWebhook {
        /// The provider's name in config.toml.
        provider: String,
    },
}

pub async fn run(config: &std::path::Path, command: SecretsCommand) -> anyhow::Result<ExitCode> {
    match command {
        SecretsCommand::GenerateKey { out } => {
            let id = crate::secrets::Keyring::generate_key_file(&out)?;
            println!(
                "Wrote a new key to {} (mode 0600), key id {id}. Name it in config.toml: [secrets] key_file = \"{}\".",
                out.display(),
                out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        SecretsCommand::Rotate { json } => {
            let settings = Settings::load(config)?;
            let app = App::open(settings, Access::Keys { storing: false }).await?;
            let rotated = crate::ops::secrets::rotate(app.db()).await?;
            let (key_id, report) = (rotated.key_id.clone(), &rotated.report);
            if json {
                println!("{}", serde_json::to_string_pretty(&rotated)?);
            } else {
                println!(
                    "Re-sealed {} connection(s) under key {}.",
                    report.resealed,
                    key_id.unwrap_or_default()
                );
                for failure in &report.failed {
                    println!("not re-sealed: {failure}");
                }
            }
            Ok(if report.failed.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        SecretsCommand::SealWebhook { provider } => {
            let settings = Settings::load(config)?;
            if !settings.providers.contains_key(&provider) {
                anyhow::bail!(
                    "{}: there is no [providers.{provider}] table",
                    settings.path.display()
                );
            }
            let keyring =
                crate::secrets::Keyring::load(&settings.secrets, &|name| std::env::var(name).ok())?;
            let mut secret = zeroize::Zeroizing::new(String::new());
            std::io::stdin().read_line(&mut secret)?;
            let trimmed = secret.trim_end_matches(['\r', '\n']);
            if trimmed.is_empty() {
                anyhow::bail!("expected the secret on standard input, got an empty line");
            }
            let sealed = crate::ops::webhooks::seal_secret(&keyring, &provider, trimmed)?;
            println!("{sealed}");
            Ok(ExitCode::SUCCESS)
        }
        SecretsCommand::Status { json } => {
            let settings = Settings::load(config)?;
            let app = App::open(settings, Access::Describe).await?;
            let status = crate::ops::secrets::status(app.db()).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print_status(&status);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn print_status(status: &sealing::SealingStatus) {
    match &status.current_key_id {
        Some(id) => println!("current key: {id}"),
        None => println!("current key: none loaded"),
    }
    for (id, rows) in &status.sealed_by_key_id {
        let current = if status.current_key_id.as_deref() == Some(id.as_str()) {
            " (current)"
        } else {
            ""
        };
        println!("sealed with key {id}{current}: {rows} connection(s)");
    }
    println!("in clear: {} connection(s)", status.in_clear);
    println!(
        "without secrets (token_env): {} connection(s)",
        status.without_secrets
    );
    if status.unreadable > 0 {
        println!("unreadable: {} connection(s)", status.unreadable);
    }
}

/// Whether an error is a key problem (a config mistake, exit code 2).
pub fn is_key_error(error: &anyhow::Error) -> bool {
    error.downcast_ref::<SecretsError>().is_some_and(|error| {
        matches!(
            error,
            SecretsError::ReadKey { .. }
                | SecretsError::KeyFileMode { .. }
                | SecretsError::KeyEncoding { .. }
        )
    })
}
