//! Config files, fuzzed: random mutations of a config that sets nearly every key, and a
//! sweep of every key through extreme values. `Settings::parse` returns the settings or
//! an error naming the file (and the key, for a bad key); it never panics, and whatever
//! it accepts also builds its providers, as `sync` and the daemon do at start.
//!
//! No database is involved, so this is a test target of its own rather than part of the
//! `api` suite, which runs once per database backend.

use proptest::prelude::*;
use proptest::test_runner::{RngSeed, TestCaseError, TestRunner};
use tributary::config::Settings;

/// A fixed seed unless `PROPTEST_RNG_SEED` is set, so a run is repeatable; no regression
/// files (a failure prints the seed and the shrunk case instead).
fn proptest_config(cases: u32, seed: u64) -> proptest::test_runner::Config {
    let mut config = proptest::test_runner::Config::with_cases(cases);
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = RngSeed::Fixed(seed);
    }
    config.failure_persistence = None;
    config
}

/// A config that sets nearly every key there is.
fn full_config() -> String {
    // The client secret the `tasks` provider's OAuth2 client-credentials grant names.
    std::env::set_var("TASKS_SECRET", "secret");
    r#"[database]
url = "sqlite:///tmp/never.db?mode=rwc"
max_connections = 4

[daemon]
listen = "127.0.0.1:9464"
lease_ttl = "60s"
shutdown_grace = "30s"
key_sweep_schedule = "0 */10 * * * *"
keep_jobs = "7days"
max_concurrent_runs = 16
retries = 3
retry_delay = "1m"

[changes]
retention = "30d"
sweep_schedule = "0 */10 * * * *"

[retention]
runs = "90d"
resolved_errors = "30d"
open_errors = "1year"
deliveries = "30d"
audit = "90d"
webhooks = "7d"
batch_size = 1000
sweep_schedule = "0 37 * * * *"

[providers.acme]
kind = "rest"
base_url = "https://api.example.com/v2"
path = "/items"
schedule = "0 */15 * * * *"
records_path = "data.items"
id_field = "id"
auth = { header = "X-Api-Key" }
enabled = true
max_pages = 1000
max_records_per_page = 5000
max_concurrent_connections = 2
requests_per_second = 5.0
run_timeout = "10m"
max_run_duration = "5m"

[providers.acme.query]
team = "core"

[providers.acme.headers]
x-trace = "on"

[providers.acme.pagination]
type = "cursor"
cursor_path = "meta.next"
cursor_param = "after"
page_size_param = "limit"
page_size = 50

[providers.acme.http]
timeout = "30s"
connect_timeout = "10s"
max_retries = 4
retry_initial_delay = "500ms"
retry_max_delay = "30s"
max_rate_limit_wait = "5m"
max_body_bytes = 1048576
user_agent = "tributary-test"

[providers.acme.budget]
app = [{ requests = 1000, per = "1d" }, { requests = 100, per = "15m" }]
connection = [{ requests = 5000, per = "1h" }]
learn_from_headers = true

[[providers.acme.connections]]
user_id = "alice"
token = "secret"
enabled = true

[[providers.acme.connections]]
user_id = "bob"
token_env = "BOB_TOKEN"

[providers.gh]
kind = "github"
schedule = "0 0 * * * *"
per_page = 50

[[providers.gh.connections]]
user_id = "alice"
token = "ghp"

[providers.tasks]
kind = "rest"
base_url = "https://api.tasks.example"
path = "/v1/projects"
schedule = "0 */5 * * * *"
records_path = "data.groups[].items"
id_field = "id"
fields = ["owner.login"]
records_filter = { field = "status", not_in = ["deleted"] }
incremental = { cursor_field = "updated_at", param = "updated_since", format = "rfc3339", inclusive = true, lookback = "5m", start = "2024-01-01T00:00:00Z" }

[providers.tasks.auth]
oauth2 = "client_credentials"
token_url = "https://auth.tasks.example/oauth/token"
client_id = "tributary"
client_secret_env = "TASKS_SECRET"
scope = "tasks:read"

[providers.tasks.pagination]
type = "page"
page_param = "page"
first_page = 1
max_page = 300
page_size_param = "per_page"
page_size = 100

[providers.tasks.resources.tasks]
parent = "records"
path = "/v1/projects/{parent.id}/tasks"
query = { owner = "{parent.owner.login}" }
pagination = { type = "has_more", after_param = "starting_after" }

[[providers.tasks.connections]]
user_id = "alice"

[providers.desk]
preset = "freshdesk_tickets"
base_url = "https://example.freshdesk.com"
schedule = "0 */15 * * * *"
query = { include = "requester" }

[[providers.desk.connections]]
user_id = "alice"
token = "key:X"

[api]
listen = "127.0.0.1:8080"
max_body_bytes = 1048576
request_timeout = "30s"
rate_limit = "600/minute"
tls_cert = "tls/cert.pem"
tls_key = "tls/key.pem"
"#
    .to_string()
}

/// Values that are wrong somewhere: other types, zero, negative, huge, tiny, not a
/// number, bad durations, bad cron, bad URLs.
fn weird_value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "\"x\"",
            "-1",
            "0",
            "1",
            "1e-20",
            "1e-300",
            "1e300",
            "nan",
            "inf",
            "-inf",
            "true",
            "[]",
            "{}",
            "[1, \"a\"]",
            "{ header = 1 }",
            "\"\"",
            "\" \"",
            "\"not a url\"",
            "\"ftp://example.com\"",
            "\"http://\"",
            "\"https://h/p?q=1\"",
            "\"http://[::1\"",
            "\"* * *\"",
            "\"60 * * * * *\"",
            "\"0 */15 * * * * * *\"",
            "\"@hourly\"",
            "\"0 0 31 2 * *\"",
            "\"L W # ?\"",
            "\"0s\"",
            "\"-5s\"",
            "\"1000000000years\"",
            "\"18446744073709551615s\"",
            "\"5 parsecs\"",
            "18446744073709551615",
            "9223372036854775807",
            "-9223372036854775808",
            "\"cursor\"",
            "\"offset\"",
            "\"link\"",
            "\"soap\"",
            "\"bearer\"",
            "\"none\"",
            "\"a\\u0000b\"",
        ])
        .prop_map(str::to_string),
        "\"[ -~]{0,20}\"".prop_map(|s| s.replace('\\', "/")),
        "\"[0-9*/,L#?W -]{0,20}\"",
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
    ]
}

#[derive(Clone, Debug)]
enum Mutation {
    /// Replace the value of the n-th `key = value` line.
    Value(usize, String),
    /// Misspell the key of the n-th `key = value` line.
    Key(usize, String),
    /// Remove the n-th line.
    Delete(usize),
    /// Repeat the n-th line.
    Duplicate(usize),
    /// Insert a character at a position of the text.
    Insert(usize, char),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), weird_value()).prop_map(|(n, v)| Mutation::Value(n, v)),
        1 => (any::<usize>(), "[a-z_]{1,3}").prop_map(|(n, s)| Mutation::Key(n, s)),
        1 => any::<usize>().prop_map(Mutation::Delete),
        1 => any::<usize>().prop_map(Mutation::Duplicate),
        1 => (any::<usize>(), prop::sample::select(vec!['[', ']', '"', '=', '\n', '{', ',', '#', 'x']))
            .prop_map(|(n, c)| Mutation::Insert(n, c)),
    ]
}

fn mutate(text: &str, mutation: &Mutation) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let assignments: Vec<usize> = (0..lines.len())
        .filter(|i| lines[*i].contains(" = "))
        .collect();
    match mutation {
        Mutation::Value(n, value) => {
            let i = assignments[n % assignments.len()];
            let key = lines[i].split(" = ").next().unwrap().to_string();
            lines[i] = format!("{key} = {value}");
        }
        Mutation::Key(n, suffix) => {
            let i = assignments[n % assignments.len()];
            lines[i] = lines[i].replacen(" = ", &format!("{suffix} = "), 1);
        }
        Mutation::Delete(n) => {
            lines.remove(n % lines.len());
        }
        Mutation::Duplicate(n) => {
            let i = n % lines.len();
            lines.insert(i, lines[i].clone());
        }
        Mutation::Insert(n, c) => {
            let text = lines.join("\n");
            let mut chars: Vec<char> = text.chars().collect();
            chars.insert(n % (chars.len() + 1), *c);
            return chars.into_iter().collect();
        }
    }
    lines.join("\n")
}

const CONFIG_PATH: &str = "/etc/tributary/config.toml";

/// The settings of the unmutated config's providers, as text: a provider whose settings
/// are these built fine already and need not be built again (building costs far more than
/// parsing).
fn base_providers() -> &'static std::collections::HashSet<String> {
    static BASE: std::sync::OnceLock<std::collections::HashSet<String>> =
        std::sync::OnceLock::new();
    BASE.get_or_init(|| {
        let settings = Settings::parse(
            std::path::Path::new(CONFIG_PATH),
            &full_config(),
            None,
            &|_| true,
        )
        .expect("the base is valid");
        settings
            .providers
            .values()
            .map(|provider| {
                tributary::sync::build(provider).expect("the base builds");
                format!("{provider:?}")
            })
            .collect()
    })
}

/// A config text parses, and then every provider builds (as `sync` and the daemon do at
/// start), or it fails with a message naming the file and, for a bad key, the key.
fn check_config(text: &str) -> Result<(), TestCaseError> {
    match Settings::parse(std::path::Path::new(CONFIG_PATH), text, None, &|_| true) {
        Ok(settings) => {
            let changed = settings
                .providers
                .values()
                .filter(|provider| !base_providers().contains(&format!("{provider:?}")));
            for provider in changed {
                if let Err(error) = tributary::sync::build(provider) {
                    prop_assert!(error.to_string().contains(&provider.name), "{}", error);
                }
            }
        }
        Err(error) => {
            let message = error.to_string();
            prop_assert!(
                message.contains(CONFIG_PATH),
                "the message names the file: {}",
                message
            );
            if let tributary::config::ConfigError::Invalid { key, .. } = &error {
                prop_assert!(!key.is_empty());
                prop_assert!(message.contains(&format!("key `{key}`")), "{}", message);
            }
        }
    }
    Ok(())
}

#[test]
fn mutated_configs_parse_or_name_the_file_and_key_and_never_panic() {
    let base = full_config();
    let settings = Settings::parse(std::path::Path::new(CONFIG_PATH), &base, None, &|_| true)
        .expect("the base is valid");
    assert_eq!(settings.providers.len(), 4);
    let mut runner = TestRunner::new(proptest_config(400, 0x636f_6e66));
    runner
        .run(&prop::collection::vec(mutation(), 1..4), |mutations| {
            check_config(
                &mutations
                    .iter()
                    .fold(base.clone(), |text, m| mutate(&text, m)),
            )
        })
        .unwrap();
}

/// Every key given every extreme number and duration, one at a time.
#[test]
fn every_key_given_an_extreme_value_parses_or_names_the_key_and_never_panics() {
    let base = full_config();
    let keys = base.lines().filter(|line| line.contains(" = ")).count();
    for n in 0..keys {
        for value in [
            "0",
            "-1",
            "1e-20",
            "1e-300",
            "1e300",
            "nan",
            "inf",
            "18446744073709551615",
            "\"0s\"",
            "\"1000000000years\"",
            "\"18446744073709551615s\"",
            "\"x\"",
        ] {
            let text = mutate(&base, &Mutation::Value(n, value.to_string()));
            if let Err(failure) = check_config(&text) {
                panic!("{failure}\n{text}");
            }
        }
    }
}

/// `tributary check-config` on `text`: its exit code and standard error.
fn check_config_command(text: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("config.toml");
    std::fs::write(&path, text).expect("config written");
    // `[api] tls_cert` and `tls_key`, which check-config reads, beside the config.
    let identity = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])
        .expect("a self-signed certificate");
    std::fs::create_dir(dir.path().join("tls")).expect("tls folder");
    std::fs::write(dir.path().join("tls/cert.pem"), identity.cert.pem()).expect("cert");
    std::fs::write(
        dir.path().join("tls/key.pem"),
        identity.signing_key.serialize_pem(),
    )
    .expect("key");
    let output = assert_cmd::Command::cargo_bin("tributary")
        .expect("binary built")
        .arg("--config")
        .arg(&path)
        .arg("check-config")
        .env_remove("TRIBUTARY_DATABASE_URL")
        .env("BOB_TOKEN", "token")
        .env("STRAVA_CLIENT_SECRET", "secret")
        .env("TASKS_SECRET", "secret")
        // The literal tokens of `full_config` need a key to be storable: 32 zero bytes.
        .env(
            "TRIBUTARY_SECRETS_KEY",
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
        )
        .env_remove("CREDENTIALS_DIRECTORY")
        .output()
        .expect("binary runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `full_config` with its first line that sets `name` replaced by `line`.
fn with_line(name: &str, line: &str) -> String {
    let mut replaced = false;
    full_config()
        .lines()
        .map(|original| {
            if !replaced && original.starts_with(&format!("{name} = ")) {
                replaced = true;
                line.to_string()
            } else {
                original.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

const STRAVA: &str = "\n[providers.strava]\nkind = \"strava\"\nschedule = \"0 0 * * * *\"\n\
                      client_id = \"4242\"\nclient_secret_env = \"STRAVA_CLIENT_SECRET\"\n";
const STRIPE: &str = "\n[providers.pay]\nkind = \"stripe\"\nschedule = \"0 0 * * * *\"\n";

/// Every bounded duration, count and size, given a value past its range: `check-config`
/// refuses it, naming the key and stating the range.
#[test]
fn every_bounded_key_past_its_range_is_refused_with_the_range() {
    let append = |retention: &str| {
        with_line(
            "run_timeout",
            &format!("run_timeout = \"10m\"\nmode = \"append\"\nretention = \"{retention}\""),
        )
    };
    // `[api]`'s line, not `[providers.acme.http]`'s of the same name.
    let api_body_limit = |value: &str| {
        full_config().replace(
            "max_body_bytes = 1048576\nrequest_timeout",
            &format!("max_body_bytes = {value}\nrequest_timeout"),
        )
    };
    let cases: Vec<(String, &str, &str)> = vec![
        (
            with_line("max_connections", "max_connections = 0"),
            "database.max_connections",
            "between 1 and 1000, got 0",
        ),
        (
            with_line("max_connections", "max_connections = 5000"),
            "database.max_connections",
            "between 1 and 1000, got 5000",
        ),
        (
            with_line("lease_ttl", "lease_ttl = \"0s\""),
            "daemon.lease_ttl",
            "between 1s and 1day, got 0s",
        ),
        (
            with_line("lease_ttl", "lease_ttl = \"300000y\""),
            "daemon.lease_ttl",
            "between 1s and 1day",
        ),
        (
            with_line("shutdown_grace", "shutdown_grace = \"2h\""),
            "daemon.shutdown_grace",
            "between 0s and 1h, got 2h",
        ),
        (
            with_line("keep_jobs", "keep_jobs = \"10m\""),
            "daemon.keep_jobs",
            "between 1h and 1year, got 10m",
        ),
        (
            with_line("max_concurrent_runs", "max_concurrent_runs = 0"),
            "daemon.max_concurrent_runs",
            "between 1 and 4096, got 0",
        ),
        (
            with_line("retries", "retries = 21"),
            "daemon.retries",
            "between 0 and 20, got 21",
        ),
        (
            with_line("retry_delay", "retry_delay = \"0s\""),
            "daemon.retry_delay",
            "between 1s and 1day, got 0s",
        ),
        (
            with_line(
                "retry_delay",
                "retry_delay = \"1m\"\nretry_max_delay = \"30s\"",
            ),
            "daemon.retry_max_delay",
            "between 1m and 1day, got 30s (at least retry_delay)",
        ),
        (
            with_line("max_pages", "max_pages = 0"),
            "providers.acme.max_pages",
            "between 1 and 100000000, got 0",
        ),
        (
            with_line("max_pages", "max_pages = 1000000000"),
            "providers.acme.max_pages",
            "between 1 and 100000000",
        ),
        (
            with_line("max_records_per_page", "max_records_per_page = 0"),
            "providers.acme.max_records_per_page",
            "between 1 and 1000000, got 0",
        ),
        (
            with_line("max_records_per_page", "max_records_per_page = 1000001"),
            "providers.acme.max_records_per_page",
            "between 1 and 1000000, got 1000001",
        ),
        (
            with_line(
                "max_concurrent_connections",
                "max_concurrent_connections = 0",
            ),
            "providers.acme.max_concurrent_connections",
            "between 1 and 256, got 0",
        ),
        (
            with_line(
                "max_concurrent_connections",
                "max_concurrent_connections = 100000",
            ),
            "providers.acme.max_concurrent_connections",
            "between 1 and 256",
        ),
        (
            with_line("max_run_duration", "max_run_duration = \"0s\""),
            "providers.acme.max_run_duration",
            "between 1s and 30days, got 0s",
        ),
        (
            with_line("run_timeout", "run_timeout = \"0s\""),
            "providers.acme.run_timeout",
            "between 1s and 30days, got 0s",
        ),
        (
            with_line("run_timeout", "run_timeout = \"300000y\""),
            "providers.acme.run_timeout",
            "between 1s and 30days",
        ),
        (
            append("300000y"),
            "providers.acme.retention",
            "between 1s and 100years",
        ),
        (
            with_line("retention", "retention = \"10m\""),
            "changes.retention",
            "between 1h and 100years, got 10m",
        ),
        (
            with_line("retention", "retention = \"300000y\""),
            "changes.retention",
            "between 1h and 100years",
        ),
        (
            api_body_limit("10"),
            "api.max_body_bytes",
            "between 1024 and 67108864, got 10",
        ),
        (
            api_body_limit("100000000"),
            "api.max_body_bytes",
            "between 1024 and 67108864, got 100000000",
        ),
        (
            with_line("request_timeout", "request_timeout = \"0s\""),
            "api.request_timeout",
            "between 100ms and 10m, got 0s",
        ),
        (
            with_line("request_timeout", "request_timeout = \"1h\""),
            "api.request_timeout",
            "between 100ms and 10m, got 1h",
        ),
        (
            with_line("rate_limit", "rate_limit = \"0/minute\""),
            "api.rate_limit",
            "requests must be between 1 and 1000000000, got 0",
        ),
        (
            with_line("rate_limit", "rate_limit = \"5/2days\""),
            "api.rate_limit",
            "window must be between 1s and 1day, got 2days",
        ),
        (
            with_line("rate_limit", "rate_limit = \"many\""),
            "api.rate_limit",
            "expected \"N/second\"",
        ),
        (
            with_line("request_timeout", "request_timeout = \"30s\"\nport = 8080"),
            "api.port",
            "unknown field `port`",
        ),
        (
            full_config().replace("listen = \"127.0.0.1:8080\"\n", ""),
            "api.listen",
            "missing: expected a socket address",
        ),
        (
            full_config().replace("listen = \"127.0.0.1:8080\"", "listen = \"localhost\""),
            "api.listen",
            "invalid socket address",
        ),
        (
            with_line("sweep_schedule", "sweep_schedule = \"every day\""),
            "changes.sweep_schedule",
            "not a valid cron expression",
        ),
        (
            with_line("runs", "runs = \"10m\""),
            "retention.runs",
            "between 1h and 100years, got 10m",
        ),
        (
            with_line("resolved_errors", "resolved_errors = \"300000y\""),
            "retention.resolved_errors",
            "between 1h and 100years",
        ),
        (
            with_line("open_errors", "open_errors = \"0s\""),
            "retention.open_errors",
            "between 1h and 100years, got 0s",
        ),
        (
            with_line("deliveries", "deliveries = \"59m\""),
            "retention.deliveries",
            "between 1h and 100years, got 59m",
        ),
        (
            with_line("audit", "audit = \"30m\""),
            "retention.audit",
            "between 1h and 100years, got 30m",
        ),
        (
            with_line("webhooks", "webhooks = \"1m\""),
            "retention.webhooks",
            "between 1h and 100years, got 1m",
        ),
        (
            with_line("batch_size", "batch_size = 0"),
            "retention.batch_size",
            "between 1 and 10000, got 0",
        ),
        (
            with_line("batch_size", "batch_size = 10001"),
            "retention.batch_size",
            "between 1 and 10000, got 10001",
        ),
        (
            full_config().replace("0 37 * * * *", "hourly"),
            "retention.sweep_schedule",
            "not a valid cron expression",
        ),
        (
            with_line("runs", "runs = \"90d\"\nkeep = \"1d\""),
            "retention.keep",
            "unknown field `keep`",
        ),
        (
            with_line("requests_per_second", "requests_per_second = 1e9"),
            "providers.acme",
            "requests_per_second must be between",
        ),
        (
            with_line("requests_per_second", "requests_per_second = 1e-9"),
            "providers.acme",
            "(one request a day) and 10000",
        ),
        (
            with_line("timeout", "timeout = \"0s\""),
            "providers.acme.http.timeout",
            "http.timeout must be between 1ms and 1h, got 0s",
        ),
        (
            with_line("timeout", "timeout = \"300000y\""),
            "providers.acme.http.timeout",
            "http.timeout must be between 1ms and 1h",
        ),
        (
            with_line("connect_timeout", "connect_timeout = \"2h\""),
            "providers.acme.http.connect_timeout",
            "http.connect_timeout must be between 1ms and 1h",
        ),
        (
            with_line("max_retries", "max_retries = 1000"),
            "providers.acme.http.max_retries",
            "http.max_retries must be between 0 and 100, got 1000",
        ),
        (
            with_line("retry_initial_delay", "retry_initial_delay = \"2h\""),
            "providers.acme.http.retry_initial_delay",
            "http.retry_initial_delay must be between 0s and 1h",
        ),
        (
            with_line("retry_max_delay", "retry_max_delay = \"300000y\""),
            "providers.acme.http.retry_max_delay",
            "http.retry_max_delay must be between 0s and 1h",
        ),
        (
            with_line("max_rate_limit_wait", "max_rate_limit_wait = \"2days\""),
            "providers.acme.http.max_rate_limit_wait",
            "http.max_rate_limit_wait must be between 0s and 1day",
        ),
        (
            with_line("max_body_bytes", "max_body_bytes = 0"),
            "providers.acme.http.max_body_bytes",
            "http.max_body_bytes must be between 1 and 1073741824, got 0",
        ),
        (
            with_line("max_body_bytes", "max_body_bytes = 2147483648"),
            "providers.acme.http.max_body_bytes",
            "http.max_body_bytes must be between 1 and 1073741824",
        ),
        (
            with_line("page_size", "page_size = 0"),
            "providers.acme.pagination.page_size",
            "pagination.page_size must be between 1 and 100000, got 0",
        ),
        (
            with_line("page_size", "page_size = 1000000"),
            "providers.acme.pagination.page_size",
            "pagination.page_size must be between 1 and 100000",
        ),
        (
            with_line("type", "type = \"page\"\nfirst_page = 2000000"),
            "providers.acme.pagination.first_page",
            "pagination.first_page must be between 0 and 1000000",
        ),
        (
            with_line("per_page", "per_page = 101"),
            "providers.gh.per_page",
            "per_page must be between 1 and 100",
        ),
        (
            format!("{}{STRIPE}limit = 0\n", full_config()),
            "providers.pay.limit",
            "limit must be between 1 and 100",
        ),
        (
            format!("{}{STRAVA}per_page = 201\n", full_config()),
            "providers.strava.per_page",
            "per_page must be between 1 and 200",
        ),
        (
            format!("{}{STRAVA}rate_limit_reserve = 1000\n", full_config()),
            "providers.strava.rate_limit_reserve",
            "rate_limit_reserve must be between 0 and 100, got 1000",
        ),
    ];
    assert!(
        check_config_command(&append("30d")).0 == Some(0),
        "the base config with an append-only provider is valid"
    );
    for (text, key, range) in &cases {
        let (code, stderr) = check_config_command(text);
        assert_eq!(code, Some(2), "{key}: {stderr}");
        assert!(
            stderr.contains(&format!("key `{key}`")) && stderr.contains(range),
            "{key}: expected {range:?} in {stderr}"
        );
    }
}

#[test]
fn preset_requirements_match_header_names_in_any_case_and_refuse_empty_values() {
    let with_preset = |name: &str, preset: &str, own: &str| {
        format!(
            "{}\n[providers.{name}]\npreset = \"{preset}\"\nschedule = \"0 */15 * * * *\"\n{own}\n\
             connections = [{{ user_id = \"ops\", token_env = \"BOB_TOKEN\" }}]\n",
            full_config()
        )
    };
    let (code, stderr) = check_config_command(&with_preset(
        "harvest",
        "harvest_time_entries",
        "headers = { \"harvest-account-id\" = \"123456\" }",
    ));
    assert_eq!(
        code,
        Some(0),
        "a header name in lower case is the same header: {stderr}"
    );
    for (text, key) in [
        (
            with_preset(
                "harvest",
                "harvest_time_entries",
                "headers = { \"Harvest-Account-Id\" = \"\" }",
            ),
            "providers.harvest.headers.Harvest-Account-Id",
        ),
        (
            with_preset("asana", "asana_tasks", "query = { project = \"\" }"),
            "providers.asana.query.project",
        ),
    ] {
        let (code, stderr) = check_config_command(&text);
        assert_eq!(code, Some(2), "{key}: {stderr}");
        assert!(
            stderr.contains("config.toml")
                && stderr.contains(&format!("key `{key}`"))
                && stderr.contains("is empty"),
            "{key}: {stderr}"
        );
    }
}

/// A request budget of zero, a window out of range or given twice, or a key the table
/// does not have: `check-config` refuses it, naming the key.
#[test]
fn bad_request_budgets_are_refused_naming_the_key() {
    let app = |windows: &str| with_line("app", &format!("app = [{windows}]"));
    let cases: Vec<(String, &str, &str)> = vec![
        (
            app("{ requests = 0, per = \"15m\" }"),
            "providers.acme.budget.app[0].requests",
            "between 1 and 1000000000, got 0",
        ),
        (
            app("{ requests = 100, per = \"15m\" }, { requests = 10, per = \"0s\" }"),
            "providers.acme.budget.app[1].per",
            "between 1s and 7days, got 0s",
        ),
        (
            app("{ requests = 100, per = \"30days\" }"),
            "providers.acme.budget.app[0].per",
            "between 1s and 7days",
        ),
        (
            app("{ requests = 100, per = \"1500ms\" }"),
            "providers.acme.budget.app[0].per",
            "must be whole seconds",
        ),
        (
            app("{ requests = 100, per = \"15m\" }, { requests = 50, per = \"900s\" }"),
            "providers.acme.budget.app",
            "two windows per 900s",
        ),
        (
            app("{ requests = -1, per = \"15m\" }"),
            "providers.acme.budget.app[0].requests",
            "invalid value",
        ),
        (
            with_line(
                "connection",
                "connection = [{ requests = 5000, per = \"1h\", burst = 10 }]",
            ),
            "providers.acme.budget.connection[0].burst",
            "unknown field `burst`",
        ),
        (
            with_line("learn_from_headers", "learn_headers = true"),
            "providers.acme.budget.learn_headers",
            "unknown field `learn_headers`",
        ),
    ];
    for (text, key, message) in &cases {
        let (code, stderr) = check_config_command(text);
        assert_eq!(code, Some(2), "{key}: {stderr}");
        assert!(
            stderr.contains(&format!("key `{key}`")) && stderr.contains(message),
            "{key}: expected {message:?} in {stderr}"
        );
    }
}

#[test]
fn max_records_per_page_is_read_from_the_provider_table_with_its_default() {
    let parse = |text: &str| Settings::parse(std::path::Path::new("c.toml"), text, None, &|_| true);
    let settings = parse(&full_config()).unwrap();
    assert_eq!(settings.providers["acme"].http.max_records_per_page, 5000);
    assert_eq!(settings.providers["gh"].http.max_records_per_page, 10_000);
}

/// The shipped config.toml with every commented example table uncommented: a block of
/// lines from a `# [` table header to the next blank line, each losing its leading "# ".
fn shipped_config_with_examples() -> (String, usize) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml");
    let text = std::fs::read_to_string(path).expect("config.toml");
    let mut in_example = false;
    let mut examples = 0;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.starts_with("# [") && !line.starts_with("# [[") {
            in_example = true;
            examples += 1;
        } else if line.trim().is_empty() {
            in_example = false;
        }
        match line.strip_prefix("# ") {
            Some(uncommented) if in_example => lines.push(uncommented),
            _ => lines.push(line),
        }
    }
    (lines.join("\n"), examples)
}

#[test]
fn the_shipped_configs_commented_examples_are_valid_once_uncommented() {
    let (text, examples) = shipped_config_with_examples();
    assert_eq!(examples, 4, "[secrets], github, stripe and strava:\n{text}");
    let settings = Settings::parse(std::path::Path::new("config.toml"), &text, None, &|_| true)
        .unwrap_or_else(|error| panic!("{error}\n{text}"));
    let kinds: Vec<&str> = settings
        .providers
        .values()
        .map(|provider| provider.adapter.kind())
        .collect();
    assert_eq!(kinds, ["rest", "github", "strava", "stripe"]);
    assert!(settings
        .providers
        .values()
        .all(|p| p.connections.len() == 1));
    assert_eq!(
        settings.secrets.key_file.as_deref(),
        Some(std::path::Path::new("/etc/tributary/secrets.key"))
    );
}

/// The ```toml blocks of the README and docs/ that are whole config files (they start
/// with `[database]`), with the file each comes from.
fn documented_configs() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut configs = Vec::new();
    for doc in ["README.md", "docs/configuration.md"] {
        let text = std::fs::read_to_string(root.join(doc)).expect(doc);
        for block in text.split("```toml\n").skip(1) {
            let body = block.split("```").next().unwrap_or_default();
            if body.starts_with("[database]") {
                configs.push((doc.to_string(), body.to_string()));
            }
        }
    }
    configs
}

#[test]
fn the_documented_config_examples_are_valid() {
    let configs = documented_configs();
    for doc in ["README.md", "docs/configuration.md"] {
        assert!(
            configs.iter().any(|(from, _)| from == doc),
            "{doc} has no whole example (a ```toml block from [database] on)"
        );
    }
    for (doc, text) in configs {
        let settings = Settings::parse(std::path::Path::new(&doc), &text, None, &|_| true)
            .unwrap_or_else(|error| panic!("{doc}: {error}\n{text}"));
        assert!(!settings.providers.is_empty(), "{doc}: no provider\n{text}");
        if let Some(acme) = settings.providers.get("acme") {
            assert_eq!(acme.connections.len(), 1, "{doc}");
        }
    }
}
