//! systemd's notify protocol: READY=1 once serving, STOPPING=1 on shutdown, and WATCHDOG=1
//! pings when the unit sets `WatchdogSec`. Outside systemd every call is a no-op.

use std::time::Duration;

use sd_notify::NotifyState;

/// Tells systemd the daemon is up (migrations applied, schedules running).
pub fn ready() {
    notify(&[NotifyState::Ready]);
}

/// Tells systemd the daemon is shutting down.
pub fn stopping() {
    notify(&[NotifyState::Stopping]);
}

/// Pings the watchdog at half its interval for as long as the returned task runs.
pub fn spawn_watchdog() -> Option<tokio::task::JoinHandle<()>> {
    let interval = sd_notify::watchdog_enabled()?;
    let period = (interval / 2).max(Duration::from_millis(500));
    tracing::info!(
        period_ms = period.as_millis() as u64,
        "Pinging the systemd watchdog."
    );
    Some(tokio::spawn(async move {
        let mut ticks = tokio::time::interval(period);
        loop {
            ticks.tick().await;
            notify(&[NotifyState::Watchdog]);
        }
    }))
}

fn notify(state: &[NotifyState]) {
    if let Err(error) = sd_notify::notify(state) {
        tracing::warn!(%error, "Notifying systemd failed.");
    }
}
