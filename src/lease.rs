//! Leases: at most one run of a connection at a time, across processes and machines.
//!
//! A lease is two columns on the connection's row, `lease_holder` and `lease_expires_at`.
//! It is claimed with one conditional `UPDATE` (atomic on every backend), renewed while
//! the run works, and released when it ends. A lease whose holder stopped renewing (a
//! crash, a SIGKILL) is taken over once it expires, or at once when the holder was a
//! process on this host that no longer exists.
//!
//! Every claim also increases `lease_generation`. The holder and the generation it claimed
//! are the run's [`Fence`]: each of its writes is conditional on the connection's row still
//! naming both, so a process that stalled past its lease's expiry writes nothing once
//! another process has claimed the lease.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, ExprTrait, Value};
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter,
    QuerySelect,
};

use crate::entities::sync_run::RunStatus;
use crate::entities::{connection, sync_run};

/// The reason written on runs found `running` whose holder is gone.
const ABANDONED: &str = "the process running it stopped (crash or kill) before it finished; committed pages are kept and the next run resumes from the checkpoint";

/// Who this process is, as written in `lease_holder`: `host:pid:nonce`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder(String);

impl Holder {
    /// This process's identity (the nonce tells apart two processes that reuse a pid).
    pub fn current() -> Holder {
        let host = hostname();
        let nonce: u32 = rand::random();
        Holder(format!("{host}:{}:{nonce:08x}", std::process::id()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The fencing token of one claim of a connection's lease: who claimed it and the
/// generation the claim set. A run's writes are conditional on the connection's row still
/// holding both (`pipeline::fence`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub holder: String,
    pub generation: i64,
}

/// Someone else holds the connection's lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Busy {
    pub holder: String,
    pub until: Option<DateTime<Utc>>,
}

/// Claims the connection's lease for `ttl`, increasing its generation, and returns the
/// claim's [`Fence`]. Returns `Err(Busy)` when a live holder has it, this process
/// included: a second run of a connection never starts while one is going. On success,
/// runs of this connection still marked `running` belong to a holder that is gone, and are
/// marked `interrupted`.
pub async fn claim(
    db: &DatabaseConnection,
    connection: &connection::Model,
    holder: &Holder,
    ttl: Duration,
) -> Result<Result<Fence, Busy>, DbErr> {
    let claim = match claim_in(db, connection, holder, ttl).await? {
        Ok(claim) => claim,
        Err(busy) => return Ok(Err(busy)),
    };
    mark_abandoned_runs(db, connection, claim.abandoned).await?;
    Ok(Ok(claim.fence))
}

/// A claim of a connection's lease that has not yet dealt with the runs its last holder
/// left (see [`claim_in`]).
#[derive(Debug)]
pub(crate) struct Claim {
    pub fence: Fence,
    /// The connection's runs still marked `running` as the claim saw them: their holder
    /// is gone, and [`mark_abandoned_runs`] marks them `interrupted`.
    pub abandoned: Vec<i64>,
}

/// [`claim`] as statements of `db`, which may be a transaction the caller goes on with
/// (the run's opening): the lease and the ids of the runs left `running`, which it does
/// not mark. The connection's row stays locked until the caller's transaction ends.
pub(crate) async fn claim_in(
    db: &impl ConnectionTrait,
    connection: &connection::Model,
    holder: &Holder,
    ttl: Duration,
) -> Result<Result<Claim, Busy>, DbErr> {
    // The database's clock: the lease's other holders compare theirs with it.
    let now = crate::db::now();
    let mut free = Condition::any()
        .add(connection::Column::LeaseHolder.is_null())
        .add(connection::Column::LeaseExpiresAt.lt(now));
    if let Some(dead) = dead_local_holder(connection.lease_holder.as_deref()) {
        // Only if the row still names that same dead holder.
        free = free.add(connection::Column::LeaseHolder.eq(dead));
    }
    let claim = connection::Entity::update_many()
        .col_expr(
            connection::Column::LeaseHolder,
            Expr::value(holder.as_str()),
        )
        .col_expr(
            connection::Column::LeaseExpiresAt,
            Expr::value(expiry(now, ttl)),
        )
        .col_expr(
            connection::Column::LeaseGeneration,
            Expr::col(connection::Column::LeaseGeneration).add(1),
        )
        .filter(connection::Column::Id.eq(connection.id))
        .filter(free);
    // Where the backend returns the updated row, the claim learns its generation in its
    // own statement; elsewhere a read after it does.
    let (claimed, row) = if db.support_returning() {
        let mut rows = claim.exec_with_returning(db).await?;
        let claimed = rows.len();
        (claimed, rows.pop())
    } else {
        let claimed = claim.exec(db).await?.rows_affected;
        let claimed = usize::try_from(claimed).unwrap_or(usize::MAX);
        (claimed, None)
    };
    let row = match row {
        Some(row) => Some(row),
        None => {
            connection::Entity::find_by_id(connection.id)
                .one(db)
                .await?
        }
    };
    let fence = row.as_ref().and_then(|row| {
        (claimed == 1 && row.lease_holder.as_deref() == Some(holder.as_str())).then(|| Fence {
            holder: holder.as_str().to_string(),
            generation: row.lease_generation,
        })
    });
    let Some(fence) = fence else {
        // Not claimed, or claimed and taken over already by another process.
        return Ok(Err(Busy {
            holder: row
                .as_ref()
                .and_then(|r| r.lease_holder.clone())
                .unwrap_or_default(),
            until: row.and_then(|r| r.lease_expires_at),
        }));
    };
    let abandoned = running_runs_of(db, connection).await?;
    Ok(Ok(Claim { fence, abandoned }))
}

/// Extends the lease and the running run's heartbeat. `Ok(false)` means the lease was
/// lost (taken over after it expired): the run must stop.
pub async fn renew(
    db: &DatabaseConnection,
    connection: &connection::Model,
    fence: &Fence,
    ttl: Duration,
) -> Result<bool, DbErr> {
    // The database's clock: the lease's other holders compare theirs with it.
    let now = crate::db::now();
    let renewed = connection::Entity::update_many()
        .col_expr(
            connection::Column::LeaseExpiresAt,
            Expr::value(expiry(now, ttl)),
        )
        .filter(connection::Column::Id.eq(connection.id))
        .filter(connection::Column::LeaseHolder.eq(fence.holder.as_str()))
        .filter(connection::Column::LeaseGeneration.eq(fence.generation))
        .exec(db)
        .await?
        .rows_affected;
    if renewed == 0 {
        return Ok(false);
    }
    let running = running_runs_of(db, connection).await?;
    if !running.is_empty() {
        sync_run::Entity::update_many()
            .col_expr(sync_run::Column::HeartbeatAt, Expr::value(now))
            .filter(sync_run::Column::Id.is_in(running))
            .filter(sync_run::Column::Status.eq(RunStatus::Running))
            .exec(db)
            .await?;
    }
    Ok(true)
}

/// Runs `work` while renewing the lease every third of `ttl`. When a renewal finds the
/// lease lost it cancels `lost` and goes on waiting: `work` sees the cancellation between
/// its writes, or the fence at its next commit, and ends first.
pub(crate) async fn renewing<T>(
    db: &DatabaseConnection,
    connection: &connection::Model,
    fence: &Fence,
    ttl: Duration,
    lost: &tokio_util::sync::CancellationToken,
    work: impl std::future::Future<Output = T>,
) -> T {
    let renewal = async {
        let mut ticks = tokio::time::interval(ttl / 3);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            match renew(db, connection, fence, ttl).await {
                Ok(true) => {}
                Ok(false) => {
                    // A job's end releases the lease as its run closes, just before `work`
                    // returns: only a lease taken over is worth a warning.
                    if !released(db, connection, fence).await {
                        tracing::warn!(
                            user_id = %connection.user_id,
                            provider = %connection.provider,
                            "The connection's lease was lost; stopping the run."
                        );
                    }
                    lost.cancel();
                    return std::future::pending::<std::convert::Infallible>().await;
                }
                Err(error) => tracing::warn!(%error, "Renewing the lease failed; retrying."),
            }
        }
    };
    tokio::select! {
        done = work => done,
        never = renewal => match never {},
    }
}

/// Whether the connection's lease was released after `fence`'s claim, none claiming it
/// since (`false` also when the row cannot be read).
async fn released(db: &DatabaseConnection, connection: &connection::Model, fence: &Fence) -> bool {
    connection::Entity::find_by_id(connection.id)
        .one(db)
        .await
        .ok()
        .flatten()
        .is_some_and(|row| row.lease_holder.is_none() && row.lease_generation == fence.generation)
}

/// Gives the lease up (only if this holder still has it).
pub async fn release(
    db: &impl ConnectionTrait,
    connection: &connection::Model,
    holder: &Holder,
) -> Result<(), DbErr> {
    connection::Entity::update_many()
        .col_expr(
            connection::Column::LeaseHolder,
            Expr::value(Value::String(None)),
        )
        .col_expr(
            connection::Column::LeaseExpiresAt,
            Expr::value(Value::ChronoDateTimeUtc(None)),
        )
        .filter(connection::Column::Id.eq(connection.id))
        .filter(connection::Column::LeaseHolder.eq(holder.as_str()))
        .exec(db)
        .await?;
    Ok(())
}

/// Marks `interrupted` the runs of every connection this holder still leases, and frees
/// those leases (used when a shutdown's grace runs out).
pub async fn interrupt_runs_of(db: &DatabaseConnection, holder: &Holder) -> Result<u64, DbErr> {
    let held = connection::Entity::find()
        .filter(connection::Column::LeaseHolder.eq(holder.as_str()))
        .all(db)
        .await?;
    let mut marked = 0;
    for connection in held {
        let running = running_runs_of(db, &connection).await?;
        marked += mark_abandoned_runs(db, &connection, running).await?;
        release(db, &connection, holder).await?;
    }
    Ok(marked)
}

/// Marks `interrupted` every run still `running` whose connection's lease is free or
/// expired: their processes are gone. Returns how many were marked.
pub async fn sweep_abandoned_runs(db: &DatabaseConnection) -> Result<u64, DbErr> {
    // The database's clock: the lease's other holders compare theirs with it.
    let now = crate::db::now();
    let connections = connection::Entity::find().all(db).await?;
    let mut marked = 0;
    for connection in connections {
        let holder_gone = match (&connection.lease_holder, connection.lease_expires_at) {
            (None, _) => true,
            (Some(_), Some(until)) if until < now => true,
            (Some(holder), _) => dead_local_holder(Some(holder)).is_some(),
        };
        if holder_gone {
            let running = running_runs_of(db, &connection).await?;
            marked += mark_abandoned_runs(db, &connection, running).await?;
        }
    }
    Ok(marked)
}

/// Marks `interrupted` those of `running` (the connection's runs [`running_runs_of`]
/// read) still `running`. Returns how many were marked.
pub(crate) async fn mark_abandoned_runs(
    db: &impl ConnectionTrait,
    connection: &connection::Model,
    running: Vec<i64>,
) -> Result<u64, DbErr> {
    if running.is_empty() {
        return Ok(0);
    }
    // The database's clock: the lease's other holders compare theirs with it.
    let now = crate::db::now();
    let result = sync_run::Entity::update_many()
        .col_expr(
            sync_run::Column::Status,
            Expr::value(RunStatus::Interrupted),
        )
        .col_expr(sync_run::Column::FinishedAt, Expr::value(now))
        .col_expr(sync_run::Column::Error, Expr::value(ABANDONED))
        .filter(sync_run::Column::Id.is_in(running))
        .filter(sync_run::Column::Status.eq(RunStatus::Running))
        .exec(db)
        .await?;
    if result.rows_affected > 0 {
        tracing::warn!(
            user_id = %connection.user_id,
            provider = %connection.provider,
            runs = result.rows_affected,
            "Runs left running by a stopped process were marked interrupted."
        );
    }
    Ok(result.rows_affected)
}

/// The ids of the connection's runs marked `running`, read without locking. The writes
/// that follow name these rows by primary key: an `UPDATE` filtered on the user, the
/// provider and the status walks an index over every connection's running runs, and
/// InnoDB locks each row it walks, so it deadlocked with other connections' runs ending
/// at the same moment (MariaDB error 1213).
async fn running_runs_of(
    db: &impl ConnectionTrait,
    connection: &connection::Model,
) -> Result<Vec<i64>, DbErr> {
    sync_run::Entity::find()
        .select_only()
        .column(sync_run::Column::Id)
        .filter(sync_run::Column::UserId.eq(connection.user_id.as_str()))
        .filter(sync_run::Column::Provider.eq(connection.provider.as_str()))
        .filter(sync_run::Column::Status.eq(RunStatus::Running))
        .into_tuple()
        .all(db)
        .await
}

/// When a lease claimed at `now` for `ttl` expires. Config validation bounds `ttl`; past
/// the end of chrono's range the lease would never expire, so it lasts a minute instead.
fn expiry(now: DateTime<Utc>, ttl: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(ttl)
        .ok()
        .and_then(|ttl| now.checked_add_signed(ttl))
        .or_else(|| now.checked_add_signed(chrono::Duration::seconds(60)))
        .unwrap_or(now)
}

/// The holder string when it names a process on this host that no longer exists.
fn dead_local_holder(holder: Option<&str>) -> Option<&str> {
    let holder = holder?;
    let mut parts = holder.split(':');
    let (host, pid) = (parts.next()?, parts.next()?.parse::<u32>().ok()?);
    if host != hostname() || pid == std::process::id() {
        return None;
    }
    let proc_root = std::path::Path::new("/proc");
    if !proc_root.join("self").exists() {
        return None; // No procfs: wait for the lease to expire instead.
    }
    (!proc_root.join(pid.to_string()).exists()).then_some(holder)
}

/// This host's name from gethostname(2), which a sandbox cannot hide the way it can hide
/// `/proc` (`ProtectProc=invisible`); `:` would break the holder's format.
pub(crate) fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .map(|name| name.trim().replace(':', "_"))
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_name_the_host_gethostname_returns() {
        let name = nix::unistd::gethostname().unwrap().into_string().unwrap();
        let holder = Holder::current();
        assert!(
            holder.as_str().starts_with(&format!(
                "{}:{}:",
                name.replace(':', "_"),
                std::process::id()
            )),
            "{}",
            holder.as_str()
        );
    }

    #[test]
    fn an_expiry_is_now_plus_the_ttl_and_never_overflows() {
        let now = Utc::now();
        assert_eq!(
            expiry(now, Duration::from_secs(60)),
            now + chrono::Duration::seconds(60)
        );
        let end = DateTime::<Utc>::MAX_UTC;
        assert_eq!(expiry(end, Duration::from_secs(86_400)), end);
        assert_eq!(
            expiry(now, Duration::MAX),
            now + chrono::Duration::seconds(60)
        );
    }
}
