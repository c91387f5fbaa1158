//! Fencing a run's writes by its lease: every transaction a run commits locks the run's
//! row and its connection's row first, and only while the run is still `running` and the
//! connection's row still holds the run's [`Fence`] (the lease's holder and the generation
//! its claim set). A process that stalled past its lease's expiry (SIGSTOP, a long pause,
//! a lost network) may wake up with a page in hand after another process took the lease
//! over and stored newer content: its transaction then finds the rows unheld and writes
//! nothing, and the run closes `interrupted` with [`LEASE_LOST`].
//!
//! The page transactions make the check part of their first statement
//! (`StoreBackend::lock_and_lookup`, the backends' all-new statements); this module has
//! the check for the other transactions of a run and the reason a check failed. Holding
//! the connection's row locked until the commit is what makes it a fence: a claim is an
//! `UPDATE` of that row, so it waits for the commit, and a commit after a claim fails the
//! check.

use chrono::{DateTime, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter};

use crate::entities::sync_run::RunStatus;
use crate::entities::{connection, sync_run};
use crate::lease::Fence;

/// The reason a run that lost its lease ends with.
pub(crate) const LEASE_LOST: &str = "interrupted: the connection's lease was taken over by another process after it expired (this process stalled or could not renew it); nothing more of this run was committed, and the next run resumes from the checkpoint";

/// The reason a leased run whose connection was removed while it went ends with.
pub(crate) const CONNECTION_GONE: &str = "interrupted: the connection was removed while the run was going; nothing more of this run was committed";

/// Why a run may not write any more.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Unheld {
    /// The run's row is gone.
    RunGone,
    /// The connection's row is gone.
    ConnectionGone,
    /// Another claim of the lease followed the run's (or the lease was released).
    LeaseTaken {
        holder: Option<String>,
        generation: i64,
    },
    /// The run's row was closed by someone else (marked `interrupted` by a process that
    /// found it abandoned): it stays as they left it.
    RunClosed { status: RunStatus },
}

impl Unheld {
    /// The error a page's write fails with: a gone row is [`DbErr::RecordNotUpdated`], as
    /// it always was; anything else says why the run may not write.
    pub(crate) fn into_error(self, run_id: i64, fence: Option<&Fence>) -> DbErr {
        match self {
            Unheld::RunGone | Unheld::ConnectionGone => DbErr::RecordNotUpdated,
            Unheld::LeaseTaken { holder, generation } => DbErr::Custom(format!(
                "run {run_id} no longer holds its connection's lease (claimed as generation {} \
                 by {}; it is now generation {generation}, held by {}); nothing more of the run \
                 is written",
                fence.map_or(0, |fence| fence.generation),
                fence.map_or("?", |fence| fence.holder.as_str()),
                holder.as_deref().unwrap_or("no one"),
            )),
            Unheld::RunClosed { status } => DbErr::Custom(format!(
                "run {run_id} was marked {status} by another process; nothing more of the run \
                 is written"
            )),
        }
    }

    /// The reason the run ends `interrupted` with when it lost its lease (taken over, or
    /// gone with its connection); `None` when it did not.
    pub(crate) fn lost_lease_reason(&self) -> Option<&'static str> {
        match self {
            Unheld::LeaseTaken { .. } => Some(LEASE_LOST),
            Unheld::ConnectionGone => Some(CONNECTION_GONE),
            Unheld::RunGone | Unheld::RunClosed { .. } => None,
        }
    }
}

/// Locks the run's row and then the connection's, as a page's first statement does, only
/// while the run is `running` and (with a fence) the connection's row holds `fence`.
/// Without a fence (a run `sync_connection` was asked for directly, with no lease) the
/// connection's row is not locked here. `Ok(Err(_))` says why the rows are not held.
pub(crate) async fn hold(
    txn: &impl ConnectionTrait,
    run_id: i64,
    connection_id: i64,
    fence: Option<&Fence>,
    now: DateTime<Utc>,
) -> Result<Result<(), Unheld>, DbErr> {
    // Locked by its id alone, and its status read after: a condition on the status lets
    // MariaDB lock gaps of `sync_runs`' status index, which other runs' closings insert into.
    let lock = sync_run::Entity::update_many()
        .col_expr(sync_run::Column::HeartbeatAt, Expr::value(now))
        .filter(sync_run::Column::Id.eq(run_id));
    // Where the backend returns the updated row, the lock reads the status too.
    let running = if txn.support_returning() {
        lock.exec_with_returning(txn)
            .await?
            .first()
            .is_some_and(|run| run.status == RunStatus::Running)
    } else {
        lock.exec(txn).await?.rows_affected == 1
            && sync_run::Entity::find_by_id(run_id)
                .one(txn)
                .await?
                .is_some_and(|run| run.status == RunStatus::Running)
    };
    let run = u64::from(running);
    let connection = match (run, fence) {
        (0, _) => 0,
        (_, None) => 1,
        (_, Some(fence)) => {
            connection::Entity::update_many()
                .col_expr(connection::Column::UpdatedAt, Expr::value(now))
                .filter(connection::Column::Id.eq(connection_id))
                .filter(connection::Column::LeaseHolder.eq(fence.holder.as_str()))
                .filter(connection::Column::LeaseGeneration.eq(fence.generation))
                .exec(txn)
                .await?
                .rows_affected
        }
    };
    if run == 1 && connection == 1 {
        return Ok(Ok(()));
    }
    Ok(Err(why_unheld(txn, run_id, connection_id, fence).await?))
}

/// Why the run's rows could not be locked for it: read after a page's lock found them
/// unheld, so it costs a round trip only then.
pub(crate) async fn why_unheld(
    db: &impl ConnectionTrait,
    run_id: i64,
    connection_id: i64,
    fence: Option<&Fence>,
) -> Result<Unheld, DbErr> {
    let Some(connection) = connection::Entity::find_by_id(connection_id)
        .one(db)
        .await?
    else {
        return Ok(Unheld::ConnectionGone);
    };
    if let Some(fence) = fence {
        let ours = connection.lease_holder.as_deref() == Some(fence.holder.as_str())
            && connection.lease_generation == fence.generation;
        if !ours {
            return Ok(Unheld::LeaseTaken {
                holder: connection.lease_holder,
                generation: connection.lease_generation,
            });
        }
    }
    match sync_run::Entity::find_by_id(run_id).one(db).await? {
        Some(run) if run.status != RunStatus::Running => {
            Ok(Unheld::RunClosed { status: run.status })
        }
        // Gone, or changed back since the lock looked: report it as a gone row, which the
        // page's caller handles as it always did.
        _ => Ok(Unheld::RunGone),
    }
}
