//! `config.toml`: loading, validating and the settings types.
//!
//! Every problem is reported with the file, the key and what was expected, and nothing is
//! written before the whole file has been checked.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;
use tributary_providers::bounds::{count_in, duration_in};
use tributary_providers::http::DEFAULT_MAX_RECORDS_PER_PAGE;
use tributary_providers::{HttpSettings, ProviderConfig};

mod api;
mod budget;
mod connect;
mod notify;
mod operator;
mod redact;
mod retention;
mod secret_env;
mod streams;
mod telemetry;
#[cfg(test)]
mod tests;
mod tls;
mod webhooks;
pub(crate) use api::{parse_rate_limit, ApiSettings};
pub(crate) use budget::{BudgetSettings, BudgetWindow};
pub(crate) use connect::ConnectSettings;
pub use notify::NotifyRuns;
pub(crate) use notify::NotifySettings;
pub(crate) use operator::OperatorSettings;
pub use redact::redact_url;
pub use retention::RetentionSettings;
pub(crate) use streams::namespace;
pub use streams::StreamSettings;
pub(crate) use telemetry::TelemetrySettings;
pub(crate) use webhooks::{
    standard_key, HmacAlgorithm, HmacScheme, SignatureEncoding, WebhookScheme, WebhookSettings,
    DEFAULT_TOLERANCE as DEFAULT_WEBHOOK_TOLERANCE,
};

/// What `Debug` output shows in place of a secret.
pub(crate) const REDACTED: &str = "[REDACTED]";

/// The environment variable that overrides `database.url`.
pub(crate) const DATABASE_URL_ENV: &str = "TRIBUTARY_DATABASE_URL";

/// The longest provider name (it is stored in a 64-character column).
const MAX_PROVIDER_NAME_LEN: usize = 64;
/// The ranges of the durations and counts tributary itself reads; the adapters' and the
/// `http` table's are checked by their own config types.
pub(crate) mod limits {
    use std::time::Duration;

    const HOUR: u64 = 60 * 60;
    const DAY: u64 = 24 * HOUR;

    /// `database.max_connections`.
    pub const MAX_CONNECTIONS: (u32, u32) = (1, 1000);
    /// `daemon.lease_ttl`: renewed every third of it, so a long one only delays taking
    /// over a dead holder's connections.
    pub const LEASE_TTL: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(DAY));
    /// `daemon.keep_jobs`: at least an hour, so a job is seen after it ends; at most a year.
    pub const KEEP_JOBS: (Duration, Duration) =
        (Duration::from_secs(HOUR), Duration::from_secs(31_557_600));
    /// `daemon.max_concurrent_runs`.
    pub const MAX_CONCURRENT_RUNS: (usize, usize) = (1, 4096);
    /// `daemon.retries`.
    pub const RETRIES: (u32, u32) = (0, 20);
    /// `daemon.retry_delay` and `daemon.retry_max_delay`.
    pub const RETRY_DELAY: (Duration, Duration) =
        (Duration::from_secs(1), Duration::from_secs(DAY));
    /// `daemon.shutdown_grace`.
    pub const SHUTDOWN_GRACE: (Duration, Duration) = (Duration::ZERO, Duration::from_secs(HOUR));
    /// `max_pages`.
    pub const MAX_PAGES: (u64, u64) = (1, 100_000_000);
    /// `max_records_per_page`.
    pub const MAX_RECORDS_PER_PAGE: (usize, usize) =
        (1, tributary_providers::http::MAX_RECORDS_PER_PAGE);
    /// `max_concurrent_connections`.
    pub const MAX_CONCURRENT_CONNECTIONS: (usize, usize) = (1, 256);
    /// `max_run_duration`.
    pub const MAX_RUN_DURATION: (Duration, Duration) =
        (Duration::from_secs(1), Duration::from_secs(30 * DAY));
    /// `run_timeout`.
    pub const RUN_TIMEOUT: (Duration, Duration) =
        (Duration::from_secs(1), Duration::from_secs(30 * DAY));
    /// `retention` (a year of 365.25 days, as durations are written).
    pub const RETENTION: (Duration, Duration) = (
        Duration::from_secs(1),
        Duration::from_secs(100 * 31_557_600),
    );
    /// `changes.retention`: at least an hour, so that a reader polling now and then is not
    /// expired between two polls.
    pub const CHANGES_RETENTION: (Duration, Duration) = (
        Duration::from_secs(HOUR),
        Duration::from_secs(100 * 31_557_600),
    );
}
/// The longest user id (it is stored in a 255-character column).
const MAX_USER_ID_LEN: usize = 255;

/// A configuration problem, naming the file and the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config file {path}: key `{key}`: {message}")]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
}

/// The whole configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The file it was read from.
    pub path: PathBuf,
    pub database: DatabaseSettings,
    /// `[daemon]`.
    pub(crate) daemon: DaemonSettings,
    /// `[secrets]`: where the key for stored credentials comes from.
    pub secrets: SecretsSettings,
    /// `[notify]`: the webhook after runs; `None` when the table is absent.
    pub notify: Option<NotifySettings>,
    /// `[changes]`: the change feed's retention.
    pub(crate) changes: ChangesSettings,
    /// `[retention]`: how long the history tables keep their rows.
    pub retention: RetentionSettings,
    /// `[api]`: the HTTP API; `None` when the table is absent.
    pub(crate) api: Option<ApiSettings>,
    /// `[connect]`: the hosted page where users connect their accounts; `None` when the
    /// table is absent.
    pub(crate) connect: Option<ConnectSettings>,
    /// `[telemetry]`: where traces are exported; `None` (off) when the table is absent.
    pub(crate) telemetry: Option<TelemetrySettings>,
    /// `[operator]`: the operator page; `None` when the table is absent.
    pub(crate) operator: Option<OperatorSettings>,
    /// Providers by name, in name order.
    pub providers: BTreeMap<String, ProviderSettings>,
}

/// `[secrets]`: where the key that encrypts stored credentials comes from.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecretsSettings {
    /// The current key: a file holding 32 random bytes in base64 (mode 0600). New and
    /// rotated secrets are sealed with it. `TRIBUTARY_SECRETS_KEY` overrides it.
    pub key_file: Option<PathBuf>,
    /// Keys that still open secrets sealed before a rotation; `tributary secrets rotate`
    /// re-seals those under the current key.
    pub previous_key_files: Vec<PathBuf>,
    /// Unsafe: store literal secrets in clear when no key is configured. Warned about at
    /// every start.
    pub allow_plaintext: bool,
}

/// `[changes]`: how long the change feed keeps its changes.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ChangesSettings {
    /// How long a change is kept after it committed. A reader whose cursor is older is
    /// told to resync from `records`.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
    /// When the daemon deletes the changes older than the retention: cron with seconds.
    pub sweep_schedule: String,
}

impl Default for ChangesSettings {
    fn default() -> Self {
        ChangesSettings {
            retention: Duration::from_secs(30 * 24 * 60 * 60),
            sweep_schedule: "0 */10 * * * *".to_string(),
        }
    }
}

/// How a provider's records are written (`mode` in its config).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WriteMode {
    /// Insert new keys, update changed content, skip unchanged records.
    #[default]
    Upsert,
    /// An event log: records are never updated in place. A key written within
    /// `retention` (tracked in `processed_keys`) is a duplicate, whatever its content.
    Append { retention: std::time::Duration },
}

/// `[database]`. Its `Debug` shows the URL redacted ([`redact_url`]).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// `sqlite://FILE?mode=rwc`, `postgres://...` or `mysql://...`. The environment variable
    /// `TRIBUTARY_DATABASE_URL` overrides it.
    pub url: String,
    /// Largest number of pooled database connections (SQLite always uses one writer).
    #[serde(default = "default_max_db_connections")]
    pub max_connections: u32,
}

impl std::fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &redact_url(&self.url))
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

/// `[daemon]`: how `tributary daemon` runs, and the leases every sync takes.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct DaemonSettings {
    /// Address of the `/healthz` and `/metrics` endpoints, e.g. "127.0.0.1:9464".
    /// Off when omitted.
    pub listen: Option<std::net::SocketAddr>,
    /// How long a run's claim on its connection lasts without renewal (renewed every
    /// third of it). A crashed holder's connection is taken over once it expires.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// On SIGTERM/SIGINT, how long in-flight pages get to commit before the process exits.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// When the daemon deletes the `processed_keys` of append-only providers whose
    /// retention has passed: cron with seconds. Only scheduled when such a provider exists.
    pub key_sweep_schedule: String,
    /// How long finished sync jobs stay in `sync_jobs` (the runs stay in `sync_runs`);
    /// swept with the history, as `RetentionSettings::jobs`.
    #[serde(with = "humantime_serde")]
    pub keep_jobs: Duration,
    /// How many jobs this instance runs at once, over all providers (each provider's
    /// `max_concurrent_connections` bounds its own).
    pub max_concurrent_runs: usize,
    /// How many times a job whose run failed is tried again (0: never), each after a
    /// backoff: `retry_delay` doubled per attempt up to `retry_max_delay`, jittered.
    pub retries: u32,
    #[serde(with = "humantime_serde")]
    pub retry_delay: Duration,
    #[serde(with = "humantime_serde")]
    pub retry_max_delay: Duration,
}

impl Default for DaemonSettings {
    fn default() -> Self {
        DaemonSettings {
            listen: None,
            lease_ttl: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(30),
            key_sweep_schedule: "0 */10 * * * *".to_string(),
            keep_jobs: Duration::from_secs(7 * 24 * 60 * 60),
            max_concurrent_runs: 16,
            retries: 3,
            retry_delay: Duration::from_secs(60),
            retry_max_delay: Duration::from_secs(30 * 60),
        }
    }
}

/// One `[providers.NAME]` table.
#[derive(Clone, Debug)]
pub struct ProviderSettings {
    /// The table's name, stored in the `provider` column.
    pub name: String,
    /// When the daemon syncs it: cron with seconds (`sec min hour day month weekday`).
    pub schedule: String,
    /// Whether the provider is synced at all.
    pub enabled: bool,
    /// The most pages one run fetches before it stops as failed (a guard against cursors
    /// that never end).
    pub max_pages: u64,
    /// How many of the provider's connections sync at once.
    pub max_concurrent_connections: usize,
    /// The longest one run may take.
    pub run_timeout: Duration,
    /// How long a run of the job queue goes on before it yields between pages, its
    /// checkpoint kept and the rest queued behind the jobs already due.
    pub max_run_duration: Duration,
    /// `mode` and `retention`: how records are written.
    pub write_mode: WriteMode,
    /// `[providers.NAME.http]`.
    pub http: HttpSettings,
    /// `[[providers.NAME.connections]]`.
    pub connections: Vec<ConnectionSettings>,
    /// The adapter's own keys, chosen by `kind`.
    pub adapter: ProviderConfig,
    /// `streams`: what each connection syncs, in the order its runs go (parents first).
    pub streams: Vec<StreamSettings>,
    /// Which of its runs write a notification (from `[notify]`).
    pub notify: NotifyRuns,
    /// `track_deletes` and `max_delete_fraction`: whether a complete full pass marks the
    /// records it no longer returned deleted.
    pub(crate) deletions: DeletionSettings,
    /// `full_sync_schedule`: the daemon's firings that also match this cron expression
    /// are full passes (the cursor ignored), which is when an incremental provider can
    /// see deletions.
    pub full_sync_schedule: Option<String>,
    /// `[providers.NAME.budget]`, shared by every instance; `None` when it sets no window.
    pub(crate) budget: Option<BudgetSettings>,
    /// `[providers.NAME.webhooks]`: inbound webhooks; `None` when the table is absent.
    pub(crate) webhooks: Option<WebhookSettings>,
}

impl ProviderSettings {
    /// The stream `name`, if the provider syncs it.
    pub fn stream(&self, name: &str) -> Option<&StreamSettings> {
        self.streams.iter().find(|stream| stream.name == name)
    }

    /// The kind's primary stream: the one whose records keep the provider's name, and
    /// which a run asked without a stream syncs.
    pub fn primary_stream(&self) -> StreamSettings {
        let name = self
            .adapter
            .streams()
            .into_iter()
            .next()
            .map(|spec| spec.name)
            .unwrap_or_default();
        StreamSettings {
            namespace: self.name.clone(),
            name,
            parent: None,
        }
    }
}

/// Deletion detection for one provider.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct DeletionSettings {
    /// Mark the records a complete full pass no longer returned deleted. Off by default:
    /// it costs a write per record seen on every full pass, unchanged or not.
    pub track: bool,
    /// The largest share of a connection's live records one run may mark deleted; a run
    /// that would mark more marks none and ends `partial`.
    pub max_fraction: f64,
}

impl Default for DeletionSettings {
    fn default() -> Self {
        DeletionSettings {
            track: false,
            max_fraction: DEFAULT_MAX_DELETE_FRACTION,
        }
    }
}

/// `max_delete_fraction` when not given: a listing that lost half the records is more
/// likely an API's bad day than half the records deleted.
pub(crate) const DEFAULT_MAX_DELETE_FRACTION: f64 = 0.5;

/// One `[[providers.NAME.connections]]` entry: a user's account at the provider.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionSettings {
    /// The app's user id the records belong to.
    pub user_id: String,
    /// The environment variable that holds the token (preferred: keeps it out of the file).
    pub token_env: Option<String>,
    /// The token itself.
    pub token: Option<SecretString>,
    /// OAuth2 providers: the environment variable that holds the refresh token.
    pub refresh_token_env: Option<String>,
    /// OAuth2 providers: the refresh token itself.
    pub refresh_token: Option<SecretString>,
    /// OAuth2 providers: when the access token expires (seconds since the Unix epoch);
    /// omitted means "refresh before the first request" when a refresh token is given.
    pub expires_at: Option<i64>,
    /// Whether the connection is synced.
    #[serde(default = "default_true")]
    pub enabled: bool,
}

/// The keys tributary itself reads from a provider table; every other key belongs to the
/// adapter and is checked by its own config type.
#[derive(Deserialize)]
struct RawProviderSettings {
    schedule: Option<String>,
    #[serde(default = "default_true")]
    enabled: bool,
    #[serde(default = "default_max_pages")]
    max_pages: u64,
    #[serde(default = "default_max_concurrent_connections")]
    max_concurrent_connections: usize,
    #[serde(default = "default_run_timeout", with = "humantime_serde")]
    run_timeout: Duration,
    #[serde(default = "default_max_run_duration", with = "humantime_serde")]
    max_run_duration: Duration,
    requests_per_second: Option<f64>,
    #[serde(default = "default_max_records_per_page")]
    max_records_per_page: usize,
    mode: Option<String>,
    #[serde(default, with = "humantime_serde")]
    retention: Option<Duration>,
    #[serde(default)]
    track_deletes: bool,
    max_delete_fraction: Option<f64>,
    full_sync_schedule: Option<String>,
    streams: Option<toml::Value>,
    http: Option<toml::Value>,
    budget: Option<toml::Value>,
    webhooks: Option<toml::Value>,
    #[serde(default)]
    connections: Vec<toml::Value>,
    #[serde(flatten)]
    adapter: toml::Table,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    database: DatabaseSettings,
    #[serde(default)]
    daemon: DaemonSettings,
    #[serde(default)]
    secrets: SecretsSettings,
    notify: Option<toml::Value>,
    #[serde(default)]
    changes: ChangesSettings,
    retention: Option<toml::Value>,
    api: Option<toml::Value>,
    connect: Option<toml::Value>,
    telemetry: Option<toml::Value>,
    operator: Option<toml::Value>,
    #[serde(default)]
    providers: BTreeMap<String, toml::Value>,
}

fn default_true() -> bool {
    true
}
fn default_max_db_connections() -> u32 {
    10
}
fn default_max_pages() -> u64 {
    100_000
}
fn default_max_records_per_page() -> usize {
    DEFAULT_MAX_RECORDS_PER_PAGE
}
fn default_max_concurrent_connections() -> usize {
    4
}
fn default_run_timeout() -> Duration {
    Duration::from_secs(60 * 60)
}
fn default_max_run_duration() -> Duration {
    Duration::from_secs(10 * 60)
}

impl Settings {
    /// Whether `[[providers.PROVIDER.connections]]` lists `user_id`.
    pub fn lists_connection(&self, provider: &str, user_id: &str) -> bool {
        self.providers
            .get(provider)
            .is_some_and(|p| p.connections.iter().any(|c| c.user_id == user_id))
    }

    /// The `[notify]` signing secret, read from its variable (`None` without `[notify]`).
    /// Refused, naming the key and never the value, when unset or too short.
    pub fn notify_secret(&self) -> Result<Option<SecretString>, ConfigError> {
        let Some(notify) = &self.notify else {
            return Ok(None);
        };
        notify
            .signing_secret()
            .map(Some)
            .map_err(|message| ConfigError::Invalid {
                path: self.path.clone(),
                key: "notify.secret_env".to_string(),
                message,
            })
    }

    /// The inbound webhook secrets of every provider with a `webhooks` table, by provider:
    /// read from their variables, and `secret`'s opened by `open(provider, written)`.
    /// Refused, naming the key and the variable or entry and never the value, when one is
    /// unset, empty or does not open.
    pub(crate) fn webhook_secrets(
        &self,
        open: &dyn Fn(&str, &SecretString) -> Result<SecretString, String>,
    ) -> Result<BTreeMap<String, Vec<SecretString>>, ConfigError> {
        let mut secrets = BTreeMap::new();
        for (name, provider) in &self.providers {
            let Some(webhooks) = &provider.webhooks else {
                continue;
            };
            let resolved = webhooks::resolve_secrets(webhooks, &|written| open(name, written))
                .map_err(|(key, message)| ConfigError::Invalid {
                    path: self.path.clone(),
                    key: format!("providers.{name}.webhooks.{key}"),
                    message,
                })?;
            secrets.insert(name.clone(), resolved);
        }
        Ok(secrets)
    }

    /// The API's TLS configuration from `[api] tls_cert` and `tls_key` (`None` without
    /// them or without `[api]`). A file that cannot be read, is not PEM, or a key that is
    /// not the certificate's is refused naming the key and the file, never the key's text.
    pub(crate) fn api_tls(&self) -> Result<Option<Arc<rustls::ServerConfig>>, ConfigError> {
        let Some(files) = self.api.as_ref().and_then(|api| api.tls.as_ref()) else {
            return Ok(None);
        };
        tls::server_config(files)
            .map(Some)
            .map_err(|(key, message)| ConfigError::Invalid {
                path: self.path.clone(),
                key,
                message,
            })
    }

    /// Reads and validates the file, applying `TRIBUTARY_DATABASE_URL`. The environment
    /// variables that hold secrets are not checked: a run resolves them when it starts.
    pub fn load(path: &Path) -> Result<Settings, ConfigError> {
        Settings::load_checking(path, &|_| true)
    }

    /// [`Settings::load`], also refusing a config whose enabled connections or providers
    /// name environment variables that are not set (`check-config`, `sync`, `daemon`).
    pub fn load_checking_environment(path: &Path) -> Result<Settings, ConfigError> {
        Settings::load_checking(path, &|name| std::env::var_os(name).is_some())
    }

    fn load_checking(
        path: &Path,
        env_is_set: &dyn Fn(&str) -> bool,
    ) -> Result<Settings, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let database_url_override = std::env::var(DATABASE_URL_ENV).ok();
        Settings::parse(path, &text, database_url_override, env_is_set)
    }

    /// Parses and validates `text`. `env_is_set` answers whether an environment variable
    /// exists, so tests need not touch the process environment.
    pub fn parse(
        path: &Path,
        text: &str,
        database_url_override: Option<String>,
        env_is_set: &dyn Fn(&str) -> bool,
    ) -> Result<Settings, ConfigError> {
        let path_buf = path.to_path_buf();
        let raw: RawSettings = toml::from_str(text).map_err(|error| ConfigError::Parse {
            path: path_buf.clone(),
            message: error.to_string(),
        })?;
        let invalid = |key: String, message: String| ConfigError::Invalid {
            path: path_buf.clone(),
            key,
            message,
        };

        let mut database = raw.database;
        if let Some(url) = database_url_override.filter(|url| !url.trim().is_empty()) {
            database.url = url;
        }
        validate_database_url(&database.url)
            .map_err(|message| invalid("database.url".into(), message))?;
        let (min, max) = limits::MAX_CONNECTIONS;
        count_in(database.max_connections, min, max)
            .map_err(|message| invalid("database.max_connections".into(), message))?;

        let notify = match raw.notify {
            Some(value) => Some(
                deserialize_at("notify", value)
                    .and_then(|raw| notify::parse(raw, env_is_set))
                    .map_err(|(key, message)| invalid(key, message))?,
            ),
            None => None,
        };
        let api = match raw.api {
            Some(value) => Some(
                deserialize_at("api", value)
                    .and_then(|raw| api::parse(raw, path.parent().unwrap_or(Path::new(""))))
                    .map_err(|(key, message)| invalid(key, message))?,
            ),
            None => None,
        };
        let connect = match raw.connect {
            Some(_) if api.is_none() => {
                return Err(invalid(
                    "connect".into(),
                    "the Connect page is served by the API: add an [api] table".into(),
                ))
            }
            Some(value) => Some(
                deserialize_at("connect", value)
                    .and_then(connect::parse)
                    .map_err(|(key, message)| invalid(key, message))?,
            ),
            None => None,
        };
        let telemetry = match raw.telemetry {
            Some(value) => Some(
                deserialize_at("telemetry", value)
                    .and_then(|raw| telemetry::parse(raw, env_is_set))
                    .map_err(|(key, message)| invalid(key, message))?,
            ),
            None => None,
        };
        let operator = match raw.operator {
            Some(_) if api.is_none() => {
                return Err(invalid(
                    "operator".into(),
                    "the operator page shares the API's server: add an [api] table".into(),
                ))
            }
            Some(value) => Some(
                deserialize_at("operator", value)
                    .and_then(operator::parse)
                    .map_err(|(key, message)| invalid(key, message))?,
            ),
            None => None,
        };
        let notify_runs = notify
            .as_ref()
            .map_or(NotifyRuns::None, NotifySettings::runs);
        let mut providers = BTreeMap::new();
        for (name, value) in raw.providers {
            let mut settings = parse_provider(&name, value, env_is_set)
                .map_err(|(key, message)| invalid(key, message))?;
            settings.notify = notify_runs;
            // A receiver nothing serves would leave the provider's deliveries unanswered.
            if settings.webhooks.is_some() && api.is_none() {
                return Err(invalid(
                    format!("providers.{name}.webhooks"),
                    "inbound webhooks are received by the API: add an [api] table".into(),
                ));
            }
            let literal = settings.webhooks.as_ref().is_some_and(|webhooks| {
                webhooks.secret.iter().any(|secret| {
                    !secrecy::ExposeSecret::expose_secret(secret)
                        .starts_with(webhooks::SEALED_PREFIX)
                })
            });
            if literal && !raw.secrets.allow_plaintext {
                return Err(invalid(
                    format!("providers.{name}.webhooks.secret"),
                    format!("a literal secret in config.toml: seal it with `tributary secrets seal-webhook {name}` (which needs [secrets] key_file), or name its environment variable in secret_env; only [secrets] allow_plaintext = true accepts it as written"),
                ));
            }
            providers.insert(name, settings);
        }
        let (min, max) = limits::LEASE_TTL;
        duration_in(raw.daemon.lease_ttl, min, max)
            .map_err(|message| invalid("daemon.lease_ttl".into(), message))?;
        let (min, max) = limits::KEEP_JOBS;
        duration_in(raw.daemon.keep_jobs, min, max)
            .map_err(|message| invalid("daemon.keep_jobs".into(), message))?;
        let (min, max) = limits::MAX_CONCURRENT_RUNS;
        count_in(raw.daemon.max_concurrent_runs, min, max)
            .map_err(|message| invalid("daemon.max_concurrent_runs".into(), message))?;
        let (min, max) = limits::RETRIES;
        count_in(raw.daemon.retries, min, max)
            .map_err(|message| invalid("daemon.retries".into(), message))?;
        let (min, max) = limits::RETRY_DELAY;
        duration_in(raw.daemon.retry_delay, min, max)
            .map_err(|message| invalid("daemon.retry_delay".into(), message))?;
        duration_in(
            raw.daemon.retry_max_delay,
            raw.daemon.retry_delay.max(min),
            max,
        )
        .map_err(|message| {
            invalid(
                "daemon.retry_max_delay".into(),
                format!("{message} (at least retry_delay)"),
            )
        })?;
        let (min, max) = limits::SHUTDOWN_GRACE;
        duration_in(raw.daemon.shutdown_grace, min, max)
            .map_err(|message| invalid("daemon.shutdown_grace".into(), message))?;
        validate_cron(&raw.daemon.key_sweep_schedule)
            .map_err(|message| invalid("daemon.key_sweep_schedule".into(), message))?;
        let (min, max) = limits::CHANGES_RETENTION;
        duration_in(raw.changes.retention, min, max)
            .map_err(|message| invalid("changes.retention".into(), message))?;
        validate_cron(&raw.changes.sweep_schedule)
            .map_err(|message| invalid("changes.sweep_schedule".into(), message))?;
        let raw_retention = match raw.retention {
            Some(value) => deserialize_at("retention", value),
            None => Ok(retention::RawRetentionSettings::default()),
        };
        let keep_delivered = notify.as_ref().and_then(|notify| notify.keep_delivered);
        let retention = raw_retention
            .and_then(|raw| retention::parse(raw, keep_delivered, validate_cron))
            .map_err(|(key, message)| invalid(key, message))?;
        let retention = RetentionSettings {
            jobs: raw.daemon.keep_jobs,
            ..retention
        };
        Ok(Settings {
            path: path_buf,
            database,
            daemon: raw.daemon,
            secrets: raw.secrets,
            notify,
            changes: raw.changes,
            retention,
            api,
            connect,
            telemetry,
            operator,
            providers,
        })
    }
}

/// The key an adapter's validation message is about: `prefix` and the dotted key the
/// message starts with, when that names a key of the provider's table
/// (`pagination.max_page must be ...` is about `providers.NAME.pagination.max_page`), else
/// `prefix` alone.
fn key_of_message(prefix: &str, table_keys: &[String], message: &str) -> String {
    let head = message
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .trim_end_matches([':', ',']);
    let dotted = !head.is_empty()
        && head
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    let first = head.split('.').next().unwrap_or_default();
    if dotted && table_keys.iter().any(|key| key == first) {
        format!("{prefix}.{head}")
    } else {
        prefix.to_string()
    }
}

/// Parses one provider table; errors are `(key, message)`.
fn parse_provider(
    name: &str,
    value: toml::Value,
    env_is_set: &dyn Fn(&str) -> bool,
) -> Result<ProviderSettings, (String, String)> {
    let prefix = format!("providers.{name}");
    if name.is_empty()
        || name.len() > MAX_PROVIDER_NAME_LEN
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err((
            prefix,
            format!(
                "a provider name must be 1 to {MAX_PROVIDER_NAME_LEN} letters, digits, '_' or '-'"
            ),
        ));
    }
    let raw: RawProviderSettings = deserialize_at(&prefix, value)?;

    let schedule = raw.schedule.ok_or_else(|| {
        (
            format!("{prefix}.schedule"),
            "missing: expected a cron expression with seconds, e.g. \"0 */15 * * * *\"".into(),
        )
    })?;
    validate_cron(&schedule).map_err(|message| (format!("{prefix}.schedule"), message))?;
    let prefix_text = prefix.as_str();
    let at = move |key: &'static str| move |message| (format!("{prefix_text}.{key}"), message);
    let (min, max) = limits::MAX_PAGES;
    count_in(raw.max_pages, min, max).map_err(at("max_pages"))?;
    let (min, max) = limits::MAX_RECORDS_PER_PAGE;
    count_in(raw.max_records_per_page, min, max).map_err(at("max_records_per_page"))?;
    let (min, max) = limits::MAX_CONCURRENT_CONNECTIONS;
    count_in(raw.max_concurrent_connections, min, max).map_err(at("max_concurrent_connections"))?;
    let (min, max) = limits::RUN_TIMEOUT;
    duration_in(raw.run_timeout, min, max).map_err(at("run_timeout"))?;
    let (min, max) = limits::MAX_RUN_DURATION;
    duration_in(raw.max_run_duration, min, max).map_err(at("max_run_duration"))?;

    let write_mode = match (raw.mode.as_deref(), raw.retention) {
        (None | Some("upsert"), None) => WriteMode::Upsert,
        (None | Some("upsert"), Some(_)) => {
            return Err((
                format!("{prefix}.retention"),
                "only applies with mode = \"append\"".into(),
            ))
        }
        (Some("append"), Some(retention)) if !retention.is_zero() => {
            let (min, max) = limits::RETENTION;
            duration_in(retention, min, max).map_err(at("retention"))?;
            WriteMode::Append { retention }
        }
        (Some("append"), _) => {
            return Err((
                format!("{prefix}.retention"),
                "mode = \"append\" needs a retention longer than 0, e.g. retention = \"30d\""
                    .into(),
            ))
        }
        (Some(other), _) => {
            return Err((
                format!("{prefix}.mode"),
                format!("expected \"upsert\" or \"append\", got {other:?}"),
            ))
        }
    };
    let deletions = parse_deletions(
        &prefix,
        raw.track_deletes,
        raw.max_delete_fraction,
        write_mode,
    )?;
    if let Some(full) = &raw.full_sync_schedule {
        validate_cron(full).map_err(at("full_sync_schedule"))?;
    }
    let mut http: HttpSettings = match raw.http {
        Some(value) => deserialize_at(&format!("{prefix}.http"), value)?,
        None => HttpSettings::default(),
    };
    http.requests_per_second = raw.requests_per_second;
    http.max_records_per_page = raw.max_records_per_page;
    http.metrics_label = name.to_string();
    http.validate()
        .map_err(|message| (key_of_message(&prefix, &["http".into()], &message), message))?;
    let budget = match raw.budget {
        Some(value) => {
            let budget = deserialize_at(&format!("{prefix}.budget"), value)?;
            let budget = budget::checked(budget)
                .map_err(|(key, message)| (format!("{prefix}.{key}"), message))?;
            Some(budget).filter(|budget| !budget.is_empty())
        }
        None => None,
    };

    let mut adapter_table = raw.adapter;
    // `preset = "NAME"` expands into the preset's keys, the table's own keys winning.
    // A message that starts with one of the table's own keys is about that key.
    let own_keys: Vec<String> = adapter_table.keys().cloned().collect();
    tributary_providers::presets::apply(&mut adapter_table).map_err(|message| {
        let key = key_of_message(&prefix, &own_keys, &message);
        let key = if key == prefix {
            format!("{prefix}.preset")
        } else {
            key
        };
        (key, message)
    })?;
    let kind = match adapter_table.remove("kind") {
        Some(toml::Value::String(kind)) => kind,
        Some(other) => {
            return Err((
                format!("{prefix}.kind"),
                format!(
                    "expected a string such as \"rest\", got {}",
                    other.type_str()
                ),
            ))
        }
        None => {
            return Err((
                format!("{prefix}.kind"),
                format!(
                    "missing: expected the provider kind, one of: {}",
                    ProviderConfig::KINDS.join(", ")
                ),
            ))
        }
    };
    let adapter_keys: Vec<String> = adapter_table.keys().cloned().collect();
    // Keys the adapter does not know are reported by its own `deny_unknown_fields`.
    let adapter = deserialize_with_path(&prefix, toml::Value::Table(adapter_table), |de| {
        ProviderConfig::deserialize_kind(&kind, de)
    })?;
    adapter
        .validate()
        .map_err(|message| (key_of_message(&prefix, &adapter_keys, &message), message))?;
    let streams = streams::parse(name, &adapter, raw.streams).map_err(at("streams"))?;
    let webhooks = match raw.webhooks {
        Some(value) => {
            let key = format!("{prefix}.webhooks");
            let raw = deserialize_at(&key, value)?;
            Some(
                webhooks::parse(raw, adapter.kind(), env_is_set)
                    .map_err(|(inner, message)| (format!("{key}.{inner}"), message))?,
            )
        }
        None => None,
    };
    for (key, var) in adapter.required_env_vars() {
        if !env_is_set(&var) {
            return Err((
                format!("{prefix}.{key}"),
                format!("environment variable {var} is not set"),
            ));
        }
    }

    let mut connections: Vec<ConnectionSettings> = Vec::new();
    for (index, value) in raw.connections.into_iter().enumerate() {
        let key = format!("{prefix}.connections[{index}]");
        let connection: ConnectionSettings = deserialize_at(&key, value)?;
        validate_connection(&connection, adapter.needs_token(), env_is_set)
            .map_err(|(field, message)| (format!("{key}.{field}"), message))?;
        if connections.iter().any(|c| c.user_id == connection.user_id) {
            return Err((
                format!("{key}.user_id"),
                format!(
                    "user {:?} is listed twice for this provider: one connection per user and provider",
                    connection.user_id
                ),
            ));
        }
        connections.push(connection);
    }

    Ok(ProviderSettings {
        name: name.to_string(),
        schedule,
        enabled: raw.enabled,
        max_pages: raw.max_pages,
        max_concurrent_connections: raw.max_concurrent_connections,
        run_timeout: raw.run_timeout,
        max_run_duration: raw.max_run_duration,
        write_mode,
        http,
        connections,
        adapter,
        streams,
        notify: NotifyRuns::None,
        deletions,
        full_sync_schedule: raw.full_sync_schedule,
        budget,
        webhooks,
    })
}

/// `track_deletes` and `max_delete_fraction`, which must lie in (0, 1]; errors are
/// `(key, message)`.
fn parse_deletions(
    prefix: &str,
    track_deletes: bool,
    max_delete_fraction: Option<f64>,
    write_mode: WriteMode,
) -> Result<DeletionSettings, (String, String)> {
    let max_fraction = max_delete_fraction.unwrap_or(DEFAULT_MAX_DELETE_FRACTION);
    if !(max_fraction > 0.0 && max_fraction <= 1.0) {
        return Err((
            format!("{prefix}.max_delete_fraction"),
            format!(
                "expected a fraction greater than 0 and at most 1 (e.g. 0.5: a run may mark at most half the live records deleted), got {max_fraction}"
            ),
        ));
    }
    if track_deletes && write_mode != WriteMode::Upsert {
        return Err((
            format!("{prefix}.track_deletes"),
            "only applies with mode = \"upsert\": an append-only provider's events are never deleted"
                .into(),
        ));
    }
    Ok(DeletionSettings {
        track: track_deletes,
        max_fraction,
    })
}

/// Deserializes a TOML value, reporting the failing key under `prefix`.
fn deserialize_at<T: serde::de::DeserializeOwned>(
    prefix: &str,
    value: toml::Value,
) -> Result<T, (String, String)> {
    deserialize_with_path(prefix, value, |de| T::deserialize(de))
}

/// Runs `deserialize` on a TOML value while tracking the path, so the error names the key.
fn deserialize_with_path<T>(
    prefix: &str,
    value: toml::Value,
    deserialize: impl FnOnce(
        serde_path_to_error::Deserializer<'_, '_, toml::Value>,
    ) -> Result<T, toml::de::Error>,
) -> Result<T, (String, String)> {
    let mut track = serde_path_to_error::Track::new();
    let result = deserialize(serde_path_to_error::Deserializer::new(value, &mut track));
    result.map_err(|error| {
        let inner = track.path().to_string();
        let key = if inner == "." || inner.is_empty() {
            prefix.to_string()
        } else {
            format!("{prefix}.{inner}")
        };
        (key, error.to_string())
    })
}

fn validate_connection(
    connection: &ConnectionSettings,
    needs_token: bool,
    env_is_set: &dyn Fn(&str) -> bool,
) -> Result<(), (&'static str, String)> {
    let user_id = connection.user_id.trim();
    if user_id.is_empty() || connection.user_id.len() > MAX_USER_ID_LEN {
        return Err((
            "user_id",
            format!("expected a non-empty user id of at most {MAX_USER_ID_LEN} bytes"),
        ));
    }
    if connection.user_id.chars().any(char::is_control) {
        return Err((
            "user_id",
            "a user id must not contain control characters (NUL, newlines, ...)".into(),
        ));
    }
    match (&connection.token_env, &connection.token) {
        (Some(_), Some(_)) => Err((
            "token",
            "give either token_env or token, not both".into(),
        )),
        (None, None) if needs_token => Err((
            "token_env",
            "missing: this provider's auth needs a token; set token_env = \"VAR\" (or token = \"...\")"
                .into(),
        )),
        (Some(var), None) if connection.enabled && !env_is_set(var) => Err((
            "token_env",
            format!("environment variable {var} is not set"),
        )),
        _ => Ok(()),
    }?;
    match (&connection.refresh_token_env, &connection.refresh_token) {
        (Some(_), Some(_)) => Err((
            "refresh_token",
            "give either refresh_token_env or refresh_token, not both".into(),
        )),
        (Some(var), None) if connection.enabled && !env_is_set(var) => Err((
            "refresh_token_env",
            format!("environment variable {var} is not set"),
        )),
        _ => Ok(()),
    }
}

/// Checks a cron expression exactly as the daemon's scheduler parses it (seconds required).
fn validate_cron(expression: &str) -> Result<(), String> {
    parse_cron(expression).map(|_| ())
}

/// Parses a cron expression with seconds, as the daemon's scheduler does.
pub(crate) fn parse_cron(expression: &str) -> Result<croner::Cron, String> {
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Required)
        .build()
        .parse(expression)
        .map_err(|error| {
            format!(
                "{expression:?} is not a valid cron expression ({error}); expected six fields with seconds, e.g. \"0 */15 * * * *\""
            )
        })
}

fn validate_database_url(url: &str) -> Result<(), String> {
    let scheme = url.split_once(':').map(|(scheme, _)| scheme).unwrap_or("");
    match scheme {
        "sqlite" | "postgres" | "postgresql" | "mysql" | "mariadb" => Ok(()),
        _ => Err(format!(
            "expected a sqlite://, postgres:// or mysql:// URL, got {:?}",
            redact_url(url)
        )),
    }
}
