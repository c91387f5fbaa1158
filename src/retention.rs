//! Retention: deletes the history older than `[retention]` from `sync_runs`, `run_errors`,
//! `notification_deliveries`, `api_audit`, `webhook_deliveries` and `sync_jobs`, expired `connect_sessions`, and the sightings of runs that ended without removing
//! theirs (a run killed before it closed, of a connection that never ran again).
//!
//! A sweep deletes in batches of at most `batch_size` rows. Each batch is one `SELECT` of
//! ids by primary key, then one `DELETE ... WHERE id IN (those ids)` that re-checks the
//! conditions a concurrent writer could change: no statement holds a lock for longer
//! than one batch takes, none waits on a run's transaction for longer than one of its
//! pages, and no `LIMIT` sits in a subquery (MySQL refuses that). The walk goes up the
//! primary key and stops at the first row young enough to keep, found through an index
//! on the table's age column, so a sweep reads each old row once and no young one.
//!
//! What stays, whatever its age: a run still `running`; the last run of every connection
//! and stream (`user_id`, `provider`, `stream`); a run with errors in `run_errors` (its
//! errors go first, by their own retention, so none is left without its run); a replay
//! run that resolved an error still kept; a pending delivery; an inbound webhook not yet
//! applied, or failed; a job not finished.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use sea_orm::{
    ActiveEnum, ConnectionTrait, DbBackend, DbErr, QueryResult, Statement, TransactionTrait, Value,
};

use crate::config::RetentionSettings;
use crate::db::DatabasePools;
use crate::entities::notification_delivery::DeliveryStatus;
use crate::entities::sync_run::RunStatus;
use crate::entities::webhook_delivery::InboxStatus;

/// What one sweep deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Rows deleted from `sync_runs`.
    pub runs: u64,
    /// Resolved errors deleted from `run_errors`.
    pub resolved_errors: u64,
    /// Open errors deleted (only with `open_errors` set).
    pub open_errors: u64,
    /// Delivered and given-up rows deleted from `notification_deliveries`.
    pub deliveries: u64,
    /// Rows deleted from `run_sightings`.
    pub sightings: u64,
    /// Rows deleted from `api_audit`.
    pub audit: u64,
    /// Applied and unmatched rows deleted from `webhook_deliveries`.
    pub webhooks: u64,
    /// Expired rows deleted from `connect_sessions`.
    pub connect_sessions: u64,
    /// Finished jobs deleted from `sync_jobs`.
    pub jobs: u64,
    /// Delete statements sent, each its own transaction.
    pub batches: u64,
    /// The most rows one of them deleted: at most `batch_size`.
    pub largest_batch: u64,
    /// Statements sent, reads included.
    pub statements: u64,
    /// The longest of them.
    pub longest_statement: Duration,
}

impl Swept {
    /// Every row deleted.
    pub fn rows(&self) -> u64 {
        [
            self.runs,
            self.resolved_errors,
            self.open_errors,
            self.deliveries,
            self.sightings,
            self.audit,
            self.webhooks,
            self.connect_sessions,
            self.jobs,
        ]
        .iter()
        .fold(0u64, |total, rows| total.saturating_add(*rows))
    }
}

/// Deletes the history `settings` no longer keeps as of `now`, a batch at a time.
pub async fn sweep(
    db: &DatabasePools,
    settings: &RetentionSettings,
    now: DateTime<Utc>,
) -> Result<Swept, DbErr> {
    let mut sweeper = Sweeper {
        db,
        backend: db.get_database_backend(),
        batch_size: settings.batch_size.max(1),
        swept: Swept::default(),
    };
    sweeper.swept.sightings = sweeper.sightings_of_ended_runs().await?;
    if let Some(cutoff) = before(now, settings.resolved_errors) {
        sweeper.swept.resolved_errors = sweeper
            .walk(&Walk {
                table: "run_errors",
                age_column: "created_at",
                cutoff,
                select: "t.resolved_by_run_id IS NOT NULL",
                select_values: Vec::new(),
                delete: "created_at < ? AND resolved_by_run_id IS NOT NULL",
                delete_values: vec![cutoff.into()],
            })
            .await?;
    }
    if let Some(cutoff) = settings.open_errors.and_then(|keep| before(now, keep)) {
        sweeper.swept.open_errors = sweeper
            .walk(&Walk {
                table: "run_errors",
                age_column: "created_at",
                cutoff,
                select: "t.resolved_by_run_id IS NULL",
                select_values: Vec::new(),
                // A replay may have resolved it since: then the resolved retention holds.
                delete: "created_at < ? AND resolved_by_run_id IS NULL",
                delete_values: vec![cutoff.into()],
            })
            .await?;
    }
    if let Some(cutoff) = before(now, settings.runs) {
        let running: Value = RunStatus::Running.to_value().into();
        sweeper.swept.runs = sweeper
            .walk(&Walk {
                table: "sync_runs",
                age_column: "started_at",
                cutoff,
                select: RUNS_SELECT,
                select_values: vec![running.clone()],
                delete: RUNS_DELETE,
                delete_values: vec![cutoff.into(), running],
            })
            .await?;
    }
    if let Some(cutoff) = before(now, settings.deliveries) {
        let delivered: Value = DeliveryStatus::Delivered.to_value().into();
        let failed: Value = DeliveryStatus::Failed.to_value().into();
        let values = vec![delivered, cutoff.into(), failed, cutoff.into()];
        sweeper.swept.deliveries = sweeper
            .walk(&Walk {
                table: "notification_deliveries",
                age_column: "created_at",
                cutoff,
                select: "((t.status = ? AND t.delivered_at < ?) \
                    OR (t.status = ? AND t.next_attempt_at < ?))",
                select_values: values.clone(),
                delete: "((status = ? AND delivered_at < ?) \
                    OR (status = ? AND next_attempt_at < ?))",
                delete_values: values,
            })
            .await?;
    }
    if let Some(cutoff) = before(now, settings.audit) {
        sweeper.swept.audit = sweeper
            .walk(&Walk {
                table: "api_audit",
                age_column: "at",
                cutoff,
                // Every row up to the first young one; a younger row among them (an
                // instance whose clock lags) is kept by the delete's own check.
                select: "1 = 1",
                select_values: Vec::new(),
                delete: "at < ?",
                delete_values: vec![cutoff.into()],
            })
            .await?;
    }
    if let Some(cutoff) = before(now, settings.webhooks) {
        let applied: Value = InboxStatus::Applied.to_value().into();
        let unmatched: Value = InboxStatus::Unmatched.to_value().into();
        sweeper.swept.webhooks = sweeper
            .walk(&Walk {
                table: "webhook_deliveries",
                age_column: "received_at",
                cutoff,
                select: "t.status IN (?, ?)",
                select_values: vec![applied.clone(), unmatched.clone()],
                // Only what was done with: a received or failed delivery stays.
                delete: "received_at < ? AND status IN (?, ?)",
                delete_values: vec![cutoff.into(), applied, unmatched],
            })
            .await?;
    }
    // An expired session connects nothing: it goes as soon as it expires.
    sweeper.swept.connect_sessions = sweeper
        .walk(&Walk {
            table: "connect_sessions",
            age_column: "expires_at",
            cutoff: now,
            select: "1 = 1",
            select_values: Vec::new(),
            delete: "expires_at < ?",
            delete_values: vec![now.into()],
        })
        .await?;
    if let Some(cutoff) = before(now, settings.jobs) {
        sweeper.swept.jobs = sweeper
            .walk(&Walk {
                table: "sync_jobs",
                age_column: "finished_at",
                cutoff,
                // A job finishes out of id order (a retry waits, a run is long): a young
                // one below the walk's end is kept by the delete's check, an old one above
                // it goes in a later sweep.
                select: "t.finished_at IS NOT NULL",
                select_values: Vec::new(),
                delete: "finished_at < ?",
                delete_values: vec![cutoff.into()],
            })
            .await?;
    }
    Ok(sweeper.swept)
}

/// The daemon's job: a sweep on `settings.sweep_schedule`, logging what it deleted. A
/// sweep still going when the next falls due makes that one a no-op.
pub(crate) fn scheduled(
    db: DatabasePools,
    settings: RetentionSettings,
) -> Result<tokio_cron_scheduler::Job, tokio_cron_scheduler::JobSchedulerError> {
    let settings = Arc::new(settings);
    let sweeping = Arc::new(tokio::sync::Mutex::new(()));
    let schedule = settings.sweep_schedule.clone();
    tokio_cron_scheduler::Job::new_async(schedule.as_str(), move |_, _| {
        let (db, settings, sweeping) = (db.clone(), Arc::clone(&settings), Arc::clone(&sweeping));
        Box::pin(async move {
            let Ok(_alone) = sweeping.try_lock() else {
                tracing::info!("The previous retention sweep is still going; skipping this one.");
                return;
            };
            let started = Instant::now();
            match sweep(&db, &settings, Utc::now()).await {
                Ok(swept) if swept.rows() == 0 => {
                    tracing::debug!(
                        statements = swept.statements,
                        "Retention sweep found nothing to delete."
                    )
                }
                Ok(swept) => tracing::info!(
                    runs = swept.runs,
                    resolved_errors = swept.resolved_errors,
                    open_errors = swept.open_errors,
                    deliveries = swept.deliveries,
                    sightings = swept.sightings,
                    audit = swept.audit,
                    webhooks = swept.webhooks,
                    connect_sessions = swept.connect_sessions,
                    jobs = swept.jobs,
                    batches = swept.batches,
                    longest_statement_ms = swept.longest_statement.as_millis() as u64,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "Retention sweep deleted old history."
                ),
                Err(error) => {
                    tracing::warn!(%error, "Retention sweep failed; the next one goes on from where it stopped.")
                }
            }
        })
    })
}

/// The runs to delete: old, ended, not the last of their connection and stream (a null
/// stream, from before streams, is a stream of its own), without errors, and not the
/// replay that resolved an error. Each check is a scalar subquery of one index lookup,
/// which no planner turns into a join over the whole table (as `EXISTS` may become).
const RUNS_SELECT: &str = "t.status <> ? \
    AND t.id < CASE WHEN t.stream IS NULL \
        THEN (SELECT l.id FROM sync_runs l WHERE l.user_id = t.user_id \
            AND l.provider = t.provider AND l.stream IS NULL ORDER BY l.id DESC LIMIT 1) \
        ELSE (SELECT l.id FROM sync_runs l WHERE l.user_id = t.user_id \
            AND l.provider = t.provider AND l.stream = t.stream ORDER BY l.id DESC LIMIT 1) \
        END \
    AND (SELECT e.id FROM run_errors e WHERE e.run_id = t.id LIMIT 1) IS NULL \
    AND (SELECT e.id FROM run_errors e WHERE e.resolved_by_run_id = t.id LIMIT 1) IS NULL";

/// What a selected run is checked for again as it is deleted: a later run never goes
/// away (the last one is never selected), but a run could have gained a reference
/// since. MySQL refuses a subquery on the table being deleted from, so the later-run
/// check is the select's alone.
const RUNS_DELETE: &str = "started_at < ? AND status <> ? \
    AND (SELECT e.id FROM run_errors e WHERE e.run_id = sync_runs.id LIMIT 1) IS NULL \
    AND (SELECT e.id FROM run_errors e WHERE e.resolved_by_run_id = sync_runs.id LIMIT 1) \
        IS NULL";

/// `now` less `keep`; `None` when that is before the calendar starts (nothing is that old).
fn before(now: DateTime<Utc>, keep: Duration) -> Option<DateTime<Utc>> {
    TimeDelta::from_std(keep)
        .ok()
        .and_then(|keep| now.checked_sub_signed(keep))
}

/// One table's walk: the rows matching `select` (on alias `t`), deleted in batches by
/// id, each delete also requiring `delete`. The age goes in `delete` where an index on
/// it exists: below the walk's end nearly every row is old, and a filter on an indexed
/// age tempts PostgreSQL into reading every old row through that index and sorting them.
struct Walk<'a> {
    table: &'a str,
    /// The indexed column whose first value at or after `cutoff` ends the walk.
    age_column: &'a str,
    cutoff: DateTime<Utc>,
    select: &'a str,
    select_values: Vec<Value>,
    delete: &'a str,
    delete_values: Vec<Value>,
}

struct Sweeper<'a> {
    db: &'a DatabasePools,
    backend: DbBackend,
    batch_size: usize,
    swept: Swept,
}

impl Sweeper<'_> {
    /// Deletes `walk`'s rows; returns how many.
    async fn walk(&mut self, walk: &Walk<'_>) -> Result<u64, DbErr> {
        let (table, age) = (walk.table, walk.age_column);
        let first_young = self
            .query_one_i64(
                &format!("SELECT id FROM {table} WHERE {age} >= ? ORDER BY {age} LIMIT 1"),
                vec![walk.cutoff.into()],
            )
            .await?;
        let end = first_young.unwrap_or(i64::MAX);
        let select = format!(
            "SELECT t.id FROM {table} t WHERE t.id > ? AND t.id < ? AND {} ORDER BY t.id LIMIT {}",
            walk.select, self.batch_size
        );
        let mut after = i64::MIN;
        let mut deleted = 0u64;
        loop {
            let mut values: Vec<Value> = vec![after.into(), end.into()];
            values.extend(walk.select_values.iter().cloned());
            let ids = self.query_i64s(&select, values).await?;
            let Some(&last) = ids.last() else {
                break;
            };
            let placeholders = vec!["?"; ids.len()].join(", ");
            let delete = format!(
                "DELETE FROM {table} WHERE id IN ({placeholders}) AND {}",
                walk.delete
            );
            let full = ids.len() == self.batch_size;
            let mut values: Vec<Value> = ids.into_iter().map(Value::from).collect();
            values.extend(walk.delete_values.iter().cloned());
            deleted = deleted.saturating_add(self.execute(&delete, values).await?);
            if !full {
                break;
            }
            after = last;
            // Let a page waiting for the connection (SQLite has one writer) go first.
            tokio::task::yield_now().await;
        }
        Ok(deleted)
    }

    /// Deletes the sightings of every run that is no longer `running` (or is gone): a run
    /// removes its own as it closes, so these are a killed run's. A run at a time, a
    /// batch of keys at a time.
    async fn sightings_of_ended_runs(&mut self) -> Result<u64, DbErr> {
        let running = RunStatus::Running.to_value();
        let mut after = i64::MIN;
        let mut deleted = 0u64;
        while let Some(run_id) = self
            .query_one_i64(
                "SELECT run_id FROM run_sightings WHERE run_id > ? ORDER BY run_id LIMIT 1",
                vec![after.into()],
            )
            .await?
        {
            after = run_id;
            let status = self
                .query_one_string(
                    "SELECT status FROM sync_runs WHERE id = ?",
                    vec![run_id.into()],
                )
                .await?;
            if status.as_deref() == Some(running.as_str()) {
                continue;
            }
            let nth = format!(
                "SELECT external_id FROM run_sightings WHERE run_id = ? \
                 ORDER BY external_id LIMIT 1 OFFSET {}",
                self.batch_size.saturating_sub(1)
            );
            loop {
                let last = self.query_one_string(&nth, vec![run_id.into()]).await?;
                let rows = match last {
                    Some(last) => {
                        self.execute(
                            "DELETE FROM run_sightings WHERE run_id = ? AND external_id <= ?",
                            vec![run_id.into(), last.into()],
                        )
                        .await?
                    }
                    None => {
                        self.execute(
                            "DELETE FROM run_sightings WHERE run_id = ?",
                            vec![run_id.into()],
                        )
                        .await?
                    }
                };
                deleted = deleted.saturating_add(rows);
                if rows < u64::try_from(self.batch_size).unwrap_or(u64::MAX) {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        Ok(deleted)
    }

    fn statement(&self, sql: &str, values: Vec<Value>) -> Statement {
        Statement::from_sql_and_values(self.backend, placeholders(self.backend, sql), values)
    }

    fn timed(&mut self, started: Instant) {
        self.swept.statements = self.swept.statements.saturating_add(1);
        self.swept.longest_statement = self.swept.longest_statement.max(started.elapsed());
    }

    async fn query_i64s(&mut self, sql: &str, values: Vec<Value>) -> Result<Vec<i64>, DbErr> {
        let statement = self.statement(sql, values);
        let started = Instant::now();
        let rows = self.read(statement).await;
        self.timed(started);
        rows?
            .iter()
            .map(|row| row.try_get_by_index::<i64>(0))
            .collect()
    }

    /// Runs a read. On PostgreSQL without JIT: a walk's select over a large table is
    /// estimated dear (it cannot know how soon the `LIMIT` is reached), and compiling it
    /// takes seconds where running it takes milliseconds.
    async fn read(&self, statement: Statement) -> Result<Vec<QueryResult>, DbErr> {
        if self.backend != DbBackend::Postgres {
            return self.db.main().query_all_raw(statement).await;
        }
        let txn = self.db.main().begin().await?;
        txn.execute_unprepared("SET LOCAL jit = off").await?;
        let rows = txn.query_all_raw(statement).await?;
        txn.commit().await?;
        Ok(rows)
    }

    async fn query_one_i64(&mut self, sql: &str, values: Vec<Value>) -> Result<Option<i64>, DbErr> {
        Ok(self.query_i64s(sql, values).await?.into_iter().next())
    }

    async fn query_one_string(
        &mut self,
        sql: &str,
        values: Vec<Value>,
    ) -> Result<Option<String>, DbErr> {
        let statement = self.statement(sql, values);
        let started = Instant::now();
        let rows = self.read(statement).await;
        self.timed(started);
        rows?
            .first()
            .map(|row| row.try_get_by_index::<String>(0))
            .transpose()
    }

    async fn execute(&mut self, sql: &str, values: Vec<Value>) -> Result<u64, DbErr> {
        let statement = self.statement(sql, values);
        let started = Instant::now();
        let result = self.db.main().execute_raw(statement).await;
        self.timed(started);
        let rows = result?.rows_affected();
        self.swept.batches = self.swept.batches.saturating_add(1);
        self.swept.largest_batch = self.swept.largest_batch.max(rows);
        if rows > 0 {
            self.db.wal_written();
        }
        Ok(rows)
    }
}

/// `sql` with its `?` placeholders numbered for PostgreSQL. The statements here hold no
/// `?` other than placeholders.
fn placeholders(backend: DbBackend, sql: &str) -> String {
    if backend != DbBackend::Postgres {
        return sql.to_string();
    }
    let mut numbered = String::with_capacity(sql.len().saturating_add(16));
    let mut next = 0u32;
    for c in sql.chars() {
        if c == '?' {
            next = next.saturating_add(1);
            numbered.push('$');
            numbered.push_str(&next.to_string());
        } else {
            numbered.push(c);
        }
    }
    numbered
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_placeholders_are_numbered_in_order() {
        assert_eq!(
            placeholders(DbBackend::Postgres, "a = ? AND b IN (?, ?)"),
            "a = $1 AND b IN ($2, $3)"
        );
        assert_eq!(placeholders(DbBackend::MySql, "a = ?"), "a = ?");
    }

    #[test]
    fn a_retention_past_the_calendar_keeps_everything() {
        assert_eq!(
            before(DateTime::<Utc>::MIN_UTC, Duration::from_secs(60)),
            None
        );
    }
}
