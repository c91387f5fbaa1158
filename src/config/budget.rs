//! `[providers.NAME.budget]`: request budgets every instance shares through the database,
//! for the whole application (`app`) and per connection's token (`connection`).

use std::time::Duration;

use serde::Deserialize;
use tributary_providers::bounds::{count_in, duration_in};

/// One window of a budget: at most `requests` per `per`, windows aligned to the Unix epoch
/// (a `15m` window starts on the quarter hour, a `1d` one at midnight UTC).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetWindow {
    /// The most requests sent in one window.
    pub requests: u64,
    /// The window's length (humantime, whole seconds: `"15m"`, `"1h"`, `"1d"`).
    #[serde(with = "humantime_serde")]
    pub per: Duration,
}

impl BudgetWindow {
    /// The window's length in seconds (whole seconds, checked when parsed).
    pub fn period_seconds(&self) -> i64 {
        i64::try_from(self.per.as_secs()).unwrap_or(i64::MAX)
    }

    /// The most requests, as the database counts them.
    pub fn limit(&self) -> i64 {
        i64::try_from(self.requests).unwrap_or(i64::MAX)
    }
}

/// `[providers.NAME.budget]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetSettings {
    /// Windows shared by every connection of the provider (the application's limit),
    /// shortest first once parsed.
    pub app: Vec<BudgetWindow>,
    /// Windows of each connection on its own (a token's limit), shortest first.
    pub connection: Vec<BudgetWindow>,
    /// Count a window as full as the API's `X-RateLimit-Remaining` (or Strava's
    /// `X-RateLimit-Limit` less `X-RateLimit-Usage`) says it is. The headers count against
    /// the connection's windows when it has any, else the application's, matched in order.
    pub learn_from_headers: bool,
}

impl BudgetSettings {
    /// Whether any window is configured (without one, no request touches the table).
    pub fn is_empty(&self) -> bool {
        self.app.is_empty() && self.connection.is_empty()
    }
}

/// `requests` of one window.
pub const REQUESTS: (u64, u64) = (1, 1_000_000_000);
/// `per` of one window: a second to a week.
pub const PERIOD: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(7 * 86_400));
/// Windows per scope.
pub const MAX_WINDOWS: usize = 8;

/// Checks the table and sorts its windows; errors are `(key under budget, message)`.
pub(super) fn checked(mut budget: BudgetSettings) -> Result<BudgetSettings, (String, String)> {
    for (scope, windows) in [
        ("app", &mut budget.app),
        ("connection", &mut budget.connection),
    ] {
        if windows.len() > MAX_WINDOWS {
            return Err((
                format!("budget.{scope}"),
                format!("at most {MAX_WINDOWS} windows, got {}", windows.len()),
            ));
        }
        for (index, window) in windows.iter().enumerate() {
            let key = format!("budget.{scope}[{index}]");
            let (min, max) = REQUESTS;
            count_in(window.requests, min, max)
                .map_err(|message| (format!("{key}.requests"), message))?;
            let (min, max) = PERIOD;
            duration_in(window.per, min, max).map_err(|message| (format!("{key}.per"), message))?;
            if window.per.subsec_nanos() != 0 {
                return Err((
                    format!("{key}.per"),
                    format!("must be whole seconds, got {:?}", window.per),
                ));
            }
        }
        windows.sort_by_key(|window| window.per);
        if let Some(pair) = windows.windows(2).find(|pair| pair[0].per == pair[1].per) {
            return Err((
                format!("budget.{scope}"),
                format!(
                    "two windows per {}s: give each length once",
                    pair[0].per.as_secs()
                ),
            ));
        }
    }
    Ok(budget)
}
