//! A syncing command's row in `instances` (see `db::Instance`): written once the
//! database is open and migrated, refreshed every `HEARTBEAT_EVERY` while the command
//! runs, removed when it ends. A process killed leaves its row to go stale and be swept.

use anyhow::Context;
use sea_orm::DatabaseConnection;

use crate::db::{DatabasePools, Instance, HEARTBEAT_EVERY};

/// This process's announcement and the task refreshing it.
pub(super) struct Announced {
    db: DatabaseConnection,
    instance: Instance,
    heartbeat: tokio::task::JoinHandle<()>,
}

/// Announces this process, running `command`, and starts its heartbeat.
pub(super) async fn announce(db: &DatabasePools, command: &str) -> anyhow::Result<Announced> {
    let holder = crate::lease::Holder::current();
    let host = crate::lease::hostname();
    let instance = Instance::announce(db.main(), holder.as_str(), &host, command)
        .await
        .context("announcing this instance in the instances table")?;
    let db = db.main().clone();
    let mut beating = instance.clone();
    let connection = db.clone();
    let heartbeat = tokio::spawn(async move {
        let mut ticks = tokio::time::interval(HEARTBEAT_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate: the row was just written.
        ticks.tick().await;
        loop {
            ticks.tick().await;
            if let Err(error) = beating.heartbeat(&connection).await {
                tracing::warn!(%error, "The instance's heartbeat could not be written.");
            }
        }
    });
    Ok(Announced {
        db,
        instance,
        heartbeat,
    })
}

impl Announced {
    /// Stops the heartbeat and removes the row.
    pub(super) async fn withdraw(self) {
        self.heartbeat.abort();
        let Announced {
            db,
            instance,
            heartbeat,
        } = self;
        // A heartbeat cut short mid-write must not write the row again after it is gone.
        let _ = heartbeat.await;
        if let Err(error) = instance.withdraw(&db).await {
            tracing::warn!(
                %error,
                "The instance's row could not be removed; it is swept once its heartbeat is stale."
            );
        }
    }
}
