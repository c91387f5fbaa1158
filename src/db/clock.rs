//! The database's clock: the one clock every instance sharing a database agrees on.
//!
//! Leases, heartbeats and due times are compared across instances, so an instance whose
//! own clock is off (a daemon half a minute ahead) would take a lease it thinks expired
//! while its holder still renews it, or claim jobs before they are due. A process that syncs
//! measures its offset from the database's clock ([`sync_clock`]) when it starts, and a
//! daemon again every [`SYNC_CLOCK_EVERY`]; [`now`] is this machine's clock corrected by it. SQLite needs no
//! correction: its file is on this machine, whose clock every process opening it shares.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use sea_orm::{ConnectionTrait, DatabaseBackend, DatabaseConnection, DbErr, Statement};

/// How often a daemon measures its offset from the database's clock again.
pub(crate) const SYNC_CLOCK_EVERY: Duration = Duration::from_secs(30);

/// The database's clock minus this machine's, in microseconds, as last measured.
static OFFSET_MICROS: AtomicI64 = AtomicI64::new(0);

/// Now by the database's clock, as far as this process last measured it (this machine's
/// clock until [`sync_clock`] is called).
pub fn now() -> DateTime<Utc> {
    let local = Utc::now();
    local
        .checked_add_signed(TimeDelta::microseconds(
            OFFSET_MICROS.load(Ordering::Relaxed),
        ))
        .unwrap_or(local)
}

/// Reads the database's clock and keeps this process's offset from it for [`now`];
/// returns the offset (the database's clock minus this machine's).
pub async fn sync_clock(db: &DatabaseConnection) -> Result<TimeDelta, DbErr> {
    let sql = match db.get_database_backend() {
        DatabaseBackend::Sqlite => return Ok(TimeDelta::zero()),
        DatabaseBackend::Postgres => {
            "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT) AS micros"
        }
        // NOW(6) and UNIX_TIMESTAMP read the same session time zone, so they cancel out.
        _ => "SELECT CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED) AS micros",
    };
    let before = Utc::now();
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await?
        .ok_or_else(|| DbErr::Custom("the database did not say what time it is".into()))?;
    let after = Utc::now();
    let database: i64 = row.try_get("", "micros")?;
    // The database read its clock somewhere in the round trip: its middle is the best
    // guess.
    let local = before.timestamp_micros().saturating_add(
        after
            .timestamp_micros()
            .saturating_sub(before.timestamp_micros())
            / 2,
    );
    let offset = database.saturating_sub(local);
    OFFSET_MICROS.store(offset, Ordering::Relaxed);
    Ok(TimeDelta::microseconds(offset))
}

/// Measures this machine's clock against the database's, which leases, heartbeats and
/// due times follow (`db::clock`); `warn`: says so when they are a second or more apart.
pub(crate) async fn follow_clock(db: &DatabaseConnection, warn: bool) {
    match sync_clock(db).await {
        Ok(offset) if warn && offset.abs() >= TimeDelta::seconds(1) => tracing::warn!(
            offset_ms = offset.num_milliseconds(),
            "This machine's clock is off the database's; leases, heartbeats and due times follow the database's."
        ),
        Ok(offset) => tracing::debug!(offset_ms = offset.num_milliseconds(), "Database clock read."),
        Err(error) => {
            tracing::warn!(%error, "Reading the database's clock failed; keeping the last offset.")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestDb;

    /// The database's clock is read on every backend; this machine's and the server's
    /// agree.
    #[tokio::test]
    async fn the_offset_from_the_database_clock_is_measured_on_every_backend() {
        let test = TestDb::new().await;
        let offset = sync_clock(test.main())
            .await
            .expect("the database's clock read");
        assert!(
            offset.abs() < TimeDelta::seconds(1),
            "the test database runs on this machine: {offset}"
        );
        let skew = now() - Utc::now();
        assert!(skew.abs() < TimeDelta::seconds(1), "{skew}");
    }
}
