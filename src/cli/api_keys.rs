//! `tributary api-keys create | list | revoke`: the keys of the HTTP API. A key is shown
//! once, when it is created; the database keeps only its prefix and a hash.

use std::path::Path;
use std::process::ExitCode;

use clap::{ArgGroup, Subcommand};
use secrecy::ExposeSecret;

use crate::app::{Access, App};
use crate::config::Settings;
use crate::ops::api_keys::{self as ops, KeyRef, KeyView, KeysQuery, Scope};

#[derive(Debug, Subcommand)]
pub enum ApiKeysCommand {
    /// Create a key and print it once: store it then, it cannot be shown again.
    Create {
        /// A name for it, unique (who or what uses it).
        #[arg(long)]
        name: String,
        /// What it may do: connections:read, connections:write, syncs:write, records:read,
        /// notifications:read, notifications:write, webhooks:read or admin (everything).
        /// Repeat for several.
        #[arg(long = "scope", required = true, value_parser = parse_scope)]
        scopes: Vec<Scope>,
        /// Its own rate limit, replacing `[api] rate_limit` for it: "N/minute", "N/hour",
        /// "N/<duration>"...
        #[arg(long)]
        rate_limit: Option<String>,
    },
    /// List the keys: name, prefix, scopes, when created, last used and revoked. Never
    /// the key or its hash.
    List {
        /// Only keys after this one, oldest first (the `--after` a previous page printed).
        #[arg(long, value_name = "KEY_ID")]
        after: Option<i64>,
        /// How many keys to show (1 to 1000).
        #[arg(long, default_value_t = 100,
            value_parser = clap::value_parser!(u64).range(1..=ops::MAX_LIMIT))]
        limit: u64,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key: every instance refuses it from the next request on.
    #[command(group(ArgGroup::new("which").required(true).args(["name", "prefix"])))]
    Revoke {
        /// The key's name.
        #[arg(long)]
        name: Option<String>,
        /// The key's prefix (the part after `trb_`, as `list` shows it).
        #[arg(long)]
        prefix: Option<String>,
    },
}

fn parse_scope(name: &str) -> Result<Scope, String> {
    Scope::parse(name).map_err(|error| error.to_string())
}

pub async fn run(config: &Path, command: ApiKeysCommand) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(config)?;
    let access = match &command {
        ApiKeysCommand::List { .. } => Access::Read,
        _ => Access::Migrated,
    };
    let app = App::open(settings, access).await?;
    let db = app.db().main();
    match command {
        ApiKeysCommand::Create {
            name,
            scopes,
            rate_limit,
        } => {
            let created = ops::create(db, &name, &scopes, rate_limit.as_deref()).await?;
            let view = &created.view;
            println!(
                "Created API key {:?} (prefix {}, scopes: {}). It is shown once; store it now:",
                view.name,
                view.prefix,
                view.scopes.join(" ")
            );
            println!("{}", created.key.expose_secret());
        }
        ApiKeysCommand::List { after, limit, json } => {
            let page = ops::list(db, &KeysQuery { after, limit }).await?;
            print_keys(&page.items, json)?;
            if let (Some(next), false) = (page.next, json) {
                println!("More keys: add --after {next} for the next page.");
            }
        }
        ApiKeysCommand::Revoke { name, prefix } => {
            let which = match (name, prefix) {
                (Some(name), _) => KeyRef::Name(name),
                (None, Some(prefix)) => KeyRef::Prefix(prefix),
                (None, None) => anyhow::bail!("give --name or --prefix"),
            };
            let revoked = ops::revoke(db, &which).await?;
            match revoked.already {
                true => println!("API key {:?} was already revoked.", revoked.key.name),
                false => println!(
                    "Revoked API key {:?} (prefix {}).",
                    revoked.key.name, revoked.key.prefix
                ),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_keys(keys: &[KeyView], json: bool) -> anyhow::Result<()> {
    let header = [
        "name",
        "prefix",
        "scopes",
        "created (UTC)",
        "last used (UTC)",
        "revoked (UTC)",
        "rate limit",
    ];
    let at = |at: Option<chrono::DateTime<chrono::Utc>>| {
        at.map(|at| at.format("%Y-%m-%d %H:%M:%S").to_string())
            .unwrap_or_default()
    };
    super::history::print_rows(keys, json, Some("No API keys."), &header, |key| {
        vec![
            key.name.clone(),
            key.prefix.clone(),
            key.scopes.join(" "),
            at(Some(key.created_at)),
            at(key.last_used_at),
            at(key.revoked_at),
            key.rate_limit.clone().unwrap_or_default(),
        ]
    })
}
