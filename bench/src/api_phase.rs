//! The API phase: the records the sync phases stored, read through `GET /v1/records` of a
//! real daemon (`daemon::run` with `[api]`) by a real HTTP client in pages of 1,000, and
//! the same rows with the same SQL straight from the database, in turns in one process,
//! so that the ratio of the two is the API's own cost on that machine that day. Then 50
//! clients at once read connections, their sync status and records, and none may get an
//! error.

use std::borrow::Cow;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use sea_orm::{ConnectionTrait, Statement, Value};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::report::{self, PhaseReport};
use super::verify::Check;
use super::PROVIDER;
use tributary::config::Settings;
use tributary::db::DatabasePools;

/// Records a page of either reader holds.
pub const PAGE: u64 = 1_000;
/// Clients reading at once in the concurrency check (connections, their sync status and
/// record pages, in turns).
const CLIENTS: usize = 50;
/// Requests each of those clients makes.
const REQUESTS_PER_CLIENT: usize = 10;
/// Readings of each reader, in turns (SQL, API, SQL, API, ...); the best of each counts.
const ROUNDS: usize = 2;
/// The key the phase writes for itself: `trb_<prefix>_<secret>`, its row holding the
/// prefix and the SHA-256 of the secret as `tributary api-keys create` would.
const KEY_PREFIX: &str = "0be0c4be0c40";
const KEY_SECRET: &str = "bench-secret-of-the-api-phase-only";

/// A page as the client reads it: enough of each record to check the walk, borrowed from
/// the body as a typed client would (a string with escapes is copied).
#[derive(Deserialize)]
struct ApiPage<'a> {
    #[serde(borrow)]
    items: Vec<ApiRecord<'a>>,
    next: Option<String>,
}

#[derive(Deserialize)]
struct ApiRecord<'a> {
    #[serde(borrow)]
    user_id: Cow<'a, str>,
    #[serde(borrow)]
    external_id: Cow<'a, str>,
    #[serde(borrow)]
    payload: &'a serde_json::value::RawValue,
}

/// Reads the `total` live records of provider [`PROVIDER`] both ways and the concurrent
/// check; returns the phases `direct_sql` and `api_records`.
pub async fn run_api_phase(
    db: &DatabasePools,
    config_text: &str,
    total: u64,
) -> anyhow::Result<Vec<PhaseReport>> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let settings = Settings::parse(
        Path::new("(bench config)"),
        &format!(
            "{config_text}\n[api]\nlisten = \"127.0.0.1:{port}\"\nrequest_timeout = \"120s\"\n\
             # Counted as in production, but high enough for the phase's ~1,000 requests.\n\
             rate_limit = \"100000/minute\"\n"
        ),
        None,
        &|_| true,
    )?;
    insert_key(db).await?;
    if db.get_database_backend() == sea_orm::DatabaseBackend::Postgres {
        // Right after the bulk load the statistics still say the table is empty, and
        // PostgreSQL then sorts the stream's rest for every page of both readers;
        // autovacuum would have analyzed a table this size by the time an app reads it.
        db.execute_unprepared("ANALYZE records").await?;
    }
    let key = format!("trb_{KEY_PREFIX}_{KEY_SECRET}");
    let shutdown = CancellationToken::new();
    let daemon = {
        let (db, stop) = (db.clone(), shutdown.clone());
        tokio::spawn(async move {
            tributary::daemon::run(&settings, db, async move { stop.cancelled().await }).await
        })
    };
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let result = async {
        wait_until_served(&client, &base).await?;
        measure(db, &client, &base, &key, total).await
    }
    .await;
    shutdown.cancel();
    match daemon.await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => anyhow::bail!("the daemon serving the API failed: {error}"),
        Err(error) => anyhow::bail!("the daemon serving the API panicked: {error}"),
    }
    result
}

async fn measure(
    db: &DatabasePools,
    client: &reqwest::Client,
    base: &str,
    key: &str,
    total: u64,
) -> anyhow::Result<Vec<PhaseReport>> {
    let mut sql_best = f64::MAX;
    let mut api_best = f64::MAX;
    let (mut sql_read, mut api_read) = (Read::default(), Read::default());
    let (mut sql_peak, mut api_peak) = (0, 0);
    for _ in 0..ROUNDS {
        // Each reader's peak alone: the process's high-water mark is reset to what it
        // holds now, so that it grows only by what the reader holds (a page, not the
        // table).
        reset_peak_rss();
        let started = Instant::now();
        sql_read = read_direct(db).await?;
        sql_best = sql_best.min(started.elapsed().as_secs_f64());
        sql_peak = sql_peak.max(report::peak_rss().unwrap_or(0));
        reset_peak_rss();
        let started = Instant::now();
        api_read = read_api(client, base, key).await?;
        api_best = api_best.min(started.elapsed().as_secs_f64());
        api_peak = api_peak.max(report::peak_rss().unwrap_or(0));
    }
    let errors = concurrent_clients(client, base, key).await;
    let ratio = sql_best / api_best.max(1e-9);
    eprintln!(
        "api_records: {} records in {api_best:.2} s; direct_sql in {sql_best:.2} s; \
         API / SQL speed = {ratio:.2} (target at least 0.5); {CLIENTS} clients: {errors} errors",
        api_read.records
    );
    let phase = |name: &str, seconds: f64, read: &Read, peak: Option<u64>, checks| PhaseReport {
        name: name.to_string(),
        seconds,
        records: read.records,
        records_per_sec: read.records as f64 / seconds.max(1e-9),
        pages: read.pages,
        inserted: 0,
        updated: 0,
        unchanged: 0,
        failed: 0,
        records_rows_written: None,
        sequential_latency_seconds: 0.0,
        latency_floor_seconds: 0.0,
        peak_rss_bytes: peak,
        checks,
    };
    let sql_checks = vec![Check::equal("records read", sql_read.records, total)];
    let api_checks = vec![
        Check::equal("records read", api_read.records, total),
        Check::equal("the same records", api_read.keys == sql_read.keys, true),
        Check::equal(
            "payload bytes",
            api_read.payload_bytes,
            sql_read.payload_bytes,
        ),
        Check::equal("errors of 50 concurrent clients", errors, 0),
    ];
    Ok(vec![
        phase(
            "direct_sql",
            sql_best,
            &sql_read,
            Some(sql_peak),
            sql_checks,
        ),
        phase(
            "api_records",
            api_best,
            &api_read,
            Some(api_peak),
            api_checks,
        ),
    ])
}

/// What a reader read: records, pages, the payloads' size and a sum over the keys that
/// does not depend on their order (a set of keys would grow with the table, and the phase
/// measures memory).
#[derive(Default)]
struct Read {
    records: u64,
    pages: u64,
    keys: u64,
    payload_bytes: u64,
}

impl Read {
    fn add(&mut self, user_id: &str, external_id: &str, payload_bytes: usize) {
        self.records += 1;
        self.payload_bytes += payload_bytes as u64;
        let mut hasher = DefaultHasher::new();
        (user_id, external_id).hash(&mut hasher);
        self.keys = self.keys.wrapping_add(hasher.finish());
    }
}

/// The statement the records list runs for `provider=bench`, without and with a position,
/// with its settled bound (`settled`: no run of the provider is running, so it is now).
fn page_statement(
    db: &DatabasePools,
    settled: chrono::DateTime<chrono::Utc>,
    after: Option<(Value, i64)>,
) -> Statement {
    let backend = db.get_database_backend();
    let mut values = vec![
        Value::from(PROVIDER),
        Value::from(PROVIDER),
        Value::from(settled),
    ];
    let mut next = 0;
    let mut parameter = || {
        next += 1;
        match backend {
            sea_orm::DatabaseBackend::Postgres => format!("${next}"),
            _ => "?".to_string(),
        }
    };
    let (own, p, s) = (parameter(), parameter(), parameter());
    let position = match after {
        None => String::new(),
        Some((at, id)) => {
            let (a, b, c) = (parameter(), parameter(), parameter());
            values.extend([at.clone(), at, Value::from(id)]);
            format!("AND updated_at >= {a} AND (updated_at > {b} OR id > {c}) ")
        }
    };
    let limit = parameter();
    values.push(Value::from(PAGE as i64 + 1));
    let sql = format!(
        "SELECT \"id\", \"user_id\", \"external_id\", \"payload\", \"created_at\", \"updated_at\", \"deleted_at\", \
         (SELECT \"connections\".\"id\" FROM \"connections\" WHERE \"connections\".\"user_id\" = \"records\".\"user_id\" \
         AND \"connections\".\"provider\" = {own}) AS \"connection_id\" \
         FROM \"records\" WHERE \"provider\" = {p} AND \"deleted_at\" IS NULL AND \"updated_at\" < {s} {position}\
         ORDER BY \"updated_at\" ASC, \"id\" ASC LIMIT {limit}"
    );
    let sql = match backend {
        sea_orm::DatabaseBackend::MySql => sql.replace('"', "`"),
        _ => sql,
    };
    Statement::from_sql_and_values(backend, sql, values)
}

/// Every live record of the provider, a page of [`PAGE`] at a time, straight from SQL.
async fn read_direct(db: &DatabasePools) -> anyhow::Result<Read> {
    let mut read = Read::default();
    let mut after = None;
    loop {
        let settled = tributary::db::now();
        let rows = db
            .query_all_raw(page_statement(db, settled, after.clone()))
            .await?;
        read.pages += 1;
        let more = rows.len() as u64 > PAGE;
        for row in rows.iter().take(PAGE as usize) {
            let id: i64 = row.try_get("", "id")?;
            let user_id: String = row.try_get("", "user_id")?;
            let external_id: String = row.try_get("", "external_id")?;
            let payload: String = row.try_get("", "payload")?;
            let _: chrono::DateTime<chrono::Utc> = row.try_get("", "created_at")?;
            let updated_at: chrono::DateTime<chrono::Utc> = row.try_get("", "updated_at")?;
            let _: Option<chrono::DateTime<chrono::Utc>> = row.try_get("", "deleted_at")?;
            let _: Option<i64> = row.try_get("", "connection_id")?;
            read.add(&user_id, &external_id, payload.len());
            after = Some((Value::from(updated_at), id));
        }
        if !more {
            return Ok(read);
        }
    }
}

/// Every live record of the provider through the API, a page of [`PAGE`] at a time. As
/// soon as a page's headers arrive its `Link` header's next page is asked for, so that the
/// server reads that page while this client parses the one before: at most two pages are
/// in flight. The body's `next` must agree with the header.
async fn read_api(client: &reqwest::Client, base: &str, key: &str) -> anyhow::Result<Read> {
    let mut read = Read::default();
    let mut url = reqwest::Url::parse(&format!(
        "{base}/v1/records?provider={PROVIDER}&limit={PAGE}"
    ))?;
    let mut pending = Some(ask(client, url.clone(), key));
    while let Some(asked) = pending.take() {
        let response = asked.await.context("the request's task")??;
        let status = response.status();
        if !status.is_success() {
            let body = response.bytes().await?;
            anyhow::bail!("GET {url}: {status} {}", String::from_utf8_lossy(&body));
        }
        let next = next_link(&url, response.headers())?;
        if let Some(next) = &next {
            pending = Some(ask(client, next.clone(), key));
        }
        let body = response.bytes().await?;
        let page: ApiPage = serde_json::from_slice(&body).context("a page of records")?;
        read.pages += 1;
        for record in page.items {
            read.add(
                &record.user_id,
                &record.external_id,
                record.payload.get().len(),
            );
        }
        anyhow::ensure!(
            page.next.is_some() == next.is_some(),
            "GET {url}: the Link header and the body's next disagree"
        );
        if let Some(next) = next {
            url = next;
        }
    }
    Ok(read)
}

/// `GET url` with the key, sent at once on the runtime.
fn ask(
    client: &reqwest::Client,
    url: reqwest::Url,
    key: &str,
) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    let request = client.get(url).bearer_auth(key);
    tokio::spawn(async move { request.send().await })
}

/// The page a response's `Link: <REFERENCE>; rel="next"` names, resolved against `url`.
fn next_link(
    url: &reqwest::Url,
    headers: &reqwest::header::HeaderMap,
) -> anyhow::Result<Option<reqwest::Url>> {
    let Some(link) = headers.get(reqwest::header::LINK) else {
        return Ok(None);
    };
    let link = link.to_str().context("the Link header")?;
    let reference = link
        .strip_prefix('<')
        .and_then(|rest| rest.split_once('>'))
        .filter(|(_, params)| params.contains("rel=\"next\""))
        .map(|(reference, _)| reference)
        .with_context(|| format!("a Link header that names no next page: {link}"))?;
    Ok(Some(url.join(reference)?))
}

/// 50 clients at once, each reading connections and records pages in turn; the number of
/// answers that were not 200.
async fn concurrent_clients(client: &reqwest::Client, base: &str, key: &str) -> usize {
    let clients = (0..CLIENTS).map(|index| {
        let client = client.clone();
        async move {
            let mut errors = 0;
            let mut cursor: Option<String> = None;
            // A connection the list named, whose sync status the client reads next.
            let mut connection: Option<i64> = None;
            let mut statuses = 0;
            for request in 0..REQUESTS_PER_CLIENT {
                let url = match ((request + index) % 3, connection) {
                    (1, _) => match &cursor {
                        Some(cursor) => {
                            format!("{base}/v1/records?provider={PROVIDER}&limit=100&cursor={cursor}")
                        }
                        None => format!("{base}/v1/records?provider={PROVIDER}&limit=100"),
                    },
                    (2, Some(id)) => {
                        statuses += 1;
                        format!("{base}/v1/connections/{id}/syncs")
                    }
                    _ => format!("{base}/v1/connections?provider={PROVIDER}"),
                };
                let answer = client.get(&url).bearer_auth(key).send().await;
                match answer {
                    Ok(response) if response.status().is_success() => {
                        let body = response.bytes().await.ok();
                        let read = match url.contains("/v1/records") {
                            true => body
                                .as_deref()
                                .and_then(|body| serde_json::from_slice::<ApiPage>(body).ok())
                                .map(|page| cursor = page.next),
                            false => body
                                .as_deref()
                                .and_then(|body| {
                                    serde_json::from_slice::<serde_json::Value>(body).ok()
                                })
                                .map(|json| {
                                    if let Some(id) = json["items"][index % 10]["id"]
                                        .as_i64()
                                        .or_else(|| json["items"][0]["id"].as_i64())
                                    {
                                        connection = Some(id);
                                    }
                                }),
                        };
                        if read.is_none() {
                            eprintln!("concurrent client: GET {url}: a body that is not the API's");
                            errors += 1;
                        }
                    }
                    Ok(response) => {
                        eprintln!("concurrent client: GET {url}: {}", response.status());
                        errors += 1;
                    }
                    Err(error) => {
                        eprintln!("concurrent client: GET {url}: {error}");
                        errors += 1;
                    }
                }
            }
            if statuses == 0 {
                eprintln!("concurrent client {index}: no connection's sync status was read");
                errors += 1;
            }
            errors
        }
    });
    futures::future::join_all(clients).await.into_iter().sum()
}

/// The phase's key, written as `api-keys create` writes one.
async fn insert_key(db: &DatabasePools) -> anyhow::Result<()> {
    use sha2::Digest;
    let hash = const_hex::encode(sha2::Sha256::digest(KEY_SECRET.as_bytes()));
    let backend = db.get_database_backend();
    let sql = match backend {
        sea_orm::DatabaseBackend::Postgres => {
            "INSERT INTO api_keys (name, prefix, secret_hash, scopes, created_at) VALUES ($1, $2, $3, $4, $5)"
        }
        _ => "INSERT INTO api_keys (name, prefix, secret_hash, scopes, created_at) VALUES (?, ?, ?, ?, ?)",
    };
    db.execute_raw(Statement::from_sql_and_values(
        backend,
        sql,
        [
            Value::from("bench"),
            Value::from(KEY_PREFIX),
            Value::from(hash),
            Value::from("records:read connections:read"),
            Value::from(chrono::Utc::now()),
        ],
    ))
    .await
    .context("writing the API phase's key")?;
    Ok(())
}

async fn wait_until_served(client: &reqwest::Client, base: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = client.get(format!("{base}/v1/openapi.json")).send().await;
        if matches!(&answer, Ok(response) if response.status().is_success()) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the API did not answer on {base}: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Resets the process's peak resident set (`VmHWM`) to its current size (Linux 4.0 and
/// later); elsewhere the peak stays the process's.
fn reset_peak_rss() {
    if let Err(error) = std::fs::write("/proc/self/clear_refs", "5") {
        tracing::warn!(%error, "Resetting the peak RSS failed; the API phase reports the process's.");
    }
}
