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

/// How often the start timeout is extended while the daemon is still starting.
const EXTEND_EVERY: Duration = Duration::from_secs(10);
/// How much each extension grants: three periods, so one late tick costs nothing.
const EXTEND_BY_USEC: u32 = 30_000_000;

/// While the returned task runs, asks systemd every few seconds for more time to start
/// (`EXTEND_TIMEOUT_USEC`), so that a long migration or a wait for another instance's
/// migration lock is not taken for a hung start and restarted in a loop. `None` outside
/// systemd.
pub fn spawn_start_extender() -> Option<tokio::task::JoinHandle<()>> {
    std::env::var_os("NOTIFY_SOCKET")?;
    Some(tokio::spawn(async move {
        let mut ticks = tokio::time::interval(EXTEND_EVERY);
        loop {
            ticks.tick().await;
            notify(&[NotifyState::ExtendTimeoutUsec(EXTEND_BY_USEC)]);
        }
    }))
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
