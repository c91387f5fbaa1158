//! Strava's rate limits: per application, a budget per 15-minute window (windows start at
//! :00, :15, :30 and :45 UTC) and per UTC day, reported on every answer as
//! `X-RateLimit-Limit` / `X-RateLimit-Usage` (`"15min,daily"`, e.g. `"600,30000"` and
//! `"598,1200"`), and for reads also as `X-ReadRateLimit-Limit` / `X-ReadRateLimit-Usage`.
//!
//! [`RateLimits`] keeps the latest usage (shared by every connection of the provider,
//! behind a mutex) and decides, before each request, whether to wait for the next window
//! or the next day. It is also the [`ResponsePolicy`] of the API requests: it notes the
//! usage headers of every answer and waits out a 429 until the next window.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::HeaderMap;
use reqwest::StatusCode;

use crate::http::{Answer, ResponsePolicy, Verdict};

/// Seconds in one rate-limit window.
const WINDOW_SECONDS: i64 = 15 * 60;

/// Seconds in one UTC day.
const DAY_SECONDS: i64 = 24 * 60 * 60;

/// The (limit, usage) header pairs Strava sends: the overall budget, then the read budget.
const HEADER_PAIRS: [(&str, &str); 2] = [
    ("x-ratelimit-limit", "x-ratelimit-usage"),
    ("x-readratelimit-limit", "x-readratelimit-usage"),
];

/// Where "now" comes from; tests move it next to a window boundary.
pub(crate) type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// One budget as a pair of headers reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Budget {
    /// Requests allowed per 15-minute window.
    pub window_limit: u64,
    /// Requests made in the current window.
    pub window_usage: u64,
    /// Requests allowed per UTC day.
    pub daily_limit: u64,
    /// Requests made today.
    pub daily_usage: u64,
}

/// The budgets of the latest answer and when it came.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Usage {
    budgets: Vec<Budget>,
    at: DateTime<Utc>,
}

/// Why the next request has to wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// The 15-minute budget (less the reserve) is spent: wait this long, for the next window.
    Window(Duration),
    /// The daily budget is spent: wait this long, until midnight UTC.
    Day(Duration),
}

impl Wait {
    /// How long.
    pub fn duration(self) -> Duration {
        match self {
            Wait::Window(wait) | Wait::Day(wait) => wait,
        }
    }
}

/// The rate-limit state of one provider (one Strava application).
pub(crate) struct RateLimits {
    reserve: u64,
    clock: Clock,
    usage: Mutex<Option<Usage>>,
}

impl std::fmt::Debug for RateLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimits")
            .field("reserve", &self.reserve)
            .field("usage", &*self.lock())
            .finish_non_exhaustive()
    }
}

impl RateLimits {
    /// No usage known yet; `reserve` requests of each window are kept back.
    pub fn new(reserve: u32, clock: Clock) -> RateLimits {
        RateLimits {
            reserve: u64::from(reserve),
            clock,
            usage: Mutex::new(None),
        }
    }

    /// The current time by the provider's clock.
    pub fn now(&self) -> DateTime<Utc> {
        (self.clock)()
    }

    /// The usage is plain numbers, valid whatever a panicking holder left behind.
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Usage>> {
        self.usage.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Before a request: how long to wait, or `None` to send it now. A request that may go
    /// is counted at once, so concurrent connections do not all spend the last requests
    /// of a window; the next answer's headers then replace the estimate.
    pub fn reserve_request(&self) -> Option<Wait> {
        let now = self.now();
        let mut usage = self.lock();
        let current = usage.as_mut()?;
        let wait = wait_before_request(current, self.reserve, now);
        if wait.is_none() && window(current.at) == window(now) {
            for budget in &mut current.budgets {
                budget.window_usage = budget.window_usage.saturating_add(1);
                budget.daily_usage = budget.daily_usage.saturating_add(1);
            }
        }
        wait
    }

    /// Notes the usage headers of an answer, when it has them.
    pub fn record(&self, headers: &HeaderMap) {
        let budgets = budgets(headers);
        if !budgets.is_empty() {
            *self.lock() = Some(Usage {
                budgets,
                at: self.now(),
            });
        }
    }

    /// The wait after a 429: until midnight UTC when a daily budget is spent, else until
    /// the next window.
    fn wait_after_429(&self) -> Wait {
        let now = self.now();
        let daily_spent = self.lock().as_ref().is_some_and(|usage| {
            same_day(usage.at, now) && usage.budgets.iter().any(|b| b.daily_usage >= b.daily_limit)
        });
        if daily_spent {
            Wait::Day(until(next_midnight(now), now))
        } else {
            Wait::Window(until(next_window_start(now), now))
        }
    }
}

impl ResponsePolicy for RateLimits {
    fn observe(&self, _status: StatusCode, headers: &HeaderMap) {
        self.record(headers);
    }

    fn classify(&self, answer: &Answer<'_>, default: Verdict) -> Verdict {
        let verdict = default.with_message(super::error_message(answer));
        if answer.status != StatusCode::TOO_MANY_REQUESTS {
            return verdict;
        }
        let wait = self.wait_after_429();
        let wait = answer
            .retry_after()
            .map_or(wait.duration(), |asked| asked.max(wait.duration()));
        tracing::warn!(
            url = answer.url,
            wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
            "Strava answered 429 Too Many Requests; waiting for its rate limit to reset."
        );
        verdict.retry(Some(wait))
    }
}

/// Whether the next request at `now` has to wait, given the latest `usage`. Usage seen in
/// an earlier window (or day) no longer counts against the current one.
fn wait_before_request(usage: &Usage, reserve: u64, now: DateTime<Utc>) -> Option<Wait> {
    if same_day(usage.at, now) && usage.budgets.iter().any(|b| b.daily_usage >= b.daily_limit) {
        return Some(Wait::Day(until(next_midnight(now), now)));
    }
    if window(usage.at) == window(now)
        && usage
            .budgets
            .iter()
            .any(|b| b.window_usage >= b.window_limit.saturating_sub(reserve))
    {
        return Some(Wait::Window(until(next_window_start(now), now)));
    }
    None
}

/// The budgets the headers report (overall, then read), skipping pairs that are absent or
/// unreadable.
pub(crate) fn budgets(headers: &HeaderMap) -> Vec<Budget> {
    HEADER_PAIRS
        .iter()
        .filter_map(|(limit, usage)| {
            let text = |name: &str| headers.get(name)?.to_str().ok();
            let (window_limit, daily_limit) = pair(text(limit)?)?;
            let (window_usage, daily_usage) = pair(text(usage)?)?;
            Some(Budget {
                window_limit,
                window_usage,
                daily_limit,
                daily_usage,
            })
        })
        .collect()
}

/// `"600,30000"` as (600, 30000).
fn pair(text: &str) -> Option<(u64, u64)> {
    let (window, daily) = text.split_once(',')?;
    Some((window.trim().parse().ok()?, daily.trim().parse().ok()?))
}

/// The index of the 15-minute window `time` falls in (windows are aligned to the epoch,
/// hence to :00, :15, :30 and :45 UTC).
fn window(time: DateTime<Utc>) -> i64 {
    time.timestamp().div_euclid(WINDOW_SECONDS)
}

fn same_day(a: DateTime<Utc>, b: DateTime<Utc>) -> bool {
    a.date_naive() == b.date_naive()
}

/// The start of the window after the one `now` falls in.
pub(crate) fn next_window_start(now: DateTime<Utc>) -> DateTime<Utc> {
    let start = (window(now) + 1) * WINDOW_SECONDS;
    DateTime::from_timestamp(start, 0).unwrap_or(now)
}

/// The next midnight UTC after `now`.
pub(crate) fn next_midnight(now: DateTime<Utc>) -> DateTime<Utc> {
    let start = (now.timestamp().div_euclid(DAY_SECONDS) + 1) * DAY_SECONDS;
    DateTime::from_timestamp(start, 0).unwrap_or(now)
}

/// The time from `now` to `then`, zero when `then` has passed.
fn until(then: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (then - now).to_std().unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().into()
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, HeaderValue::from_static(value));
        }
        headers
    }

    fn usage(budgets: Vec<Budget>, when: &str) -> Usage {
        Usage {
            budgets,
            at: at(when),
        }
    }

    fn budget(window_limit: u64, window_usage: u64, daily_limit: u64, daily_usage: u64) -> Budget {
        Budget {
            window_limit,
            window_usage,
            daily_limit,
            daily_usage,
        }
    }

    #[test]
    fn windows_start_at_the_quarter_hours_and_days_at_midnight_utc() {
        let cases = [
            ("2024-03-01T12:00:00Z", "2024-03-01T12:15:00Z"),
            ("2024-03-01T12:14:59.900Z", "2024-03-01T12:15:00Z"),
            ("2024-03-01T12:15:00Z", "2024-03-01T12:30:00Z"),
            ("2024-03-01T12:44:10Z", "2024-03-01T12:45:00Z"),
            ("2024-03-01T23:50:00Z", "2024-03-02T00:00:00Z"),
        ];
        for (now, next) in cases {
            assert_eq!(next_window_start(at(now)), at(next), "{now}");
        }
        assert_eq!(
            next_midnight(at("2024-03-01T23:59:30Z")),
            at("2024-03-02T00:00:00Z")
        );
        assert_eq!(
            next_midnight(at("2024-03-02T00:00:00Z")),
            at("2024-03-03T00:00:00Z")
        );
    }

    #[test]
    fn usage_headers_are_read_in_pairs() {
        let both = headers(&[
            ("x-ratelimit-limit", "600,30000"),
            ("x-ratelimit-usage", "598,1200"),
            ("x-readratelimit-limit", "300, 15000"),
            ("x-readratelimit-usage", "12,400"),
        ]);
        assert_eq!(
            budgets(&both),
            [budget(600, 598, 30000, 1200), budget(300, 12, 15000, 400)]
        );
        let broken = headers(&[
            ("x-ratelimit-limit", "600"),
            ("x-ratelimit-usage", "1,2"),
            ("x-readratelimit-limit", "300,15000"),
        ]);
        assert!(budgets(&broken).is_empty());
    }

    #[test]
    fn the_reserve_of_the_stricter_budget_decides_the_wait() {
        let now = at("2024-03-01T12:10:00Z");
        let overall = budget(600, 594, 30000, 1200);
        let calm = usage(vec![overall], "2024-03-01T12:09:00Z");
        assert_eq!(wait_before_request(&calm, 5, now), None);
        let busy = usage(vec![budget(600, 595, 30000, 1200)], "2024-03-01T12:09:00Z");
        assert_eq!(
            wait_before_request(&busy, 5, now),
            Some(Wait::Window(Duration::from_secs(5 * 60)))
        );
        // The read budget is nearly spent although the overall one is not.
        let read = usage(
            vec![overall, budget(100, 96, 1000, 500)],
            "2024-03-01T12:09:00Z",
        );
        assert_eq!(
            wait_before_request(&read, 5, now),
            Some(Wait::Window(Duration::from_secs(5 * 60)))
        );
        // Usage from an earlier window no longer counts.
        let earlier = usage(vec![budget(600, 600, 30000, 1200)], "2024-03-01T11:59:00Z");
        assert_eq!(wait_before_request(&earlier, 5, now), None);
    }

    #[test]
    fn a_spent_daily_budget_waits_until_midnight_utc() {
        let now = at("2024-03-01T22:00:00Z");
        let spent = usage(vec![budget(600, 3, 30000, 30000)], "2024-03-01T21:00:00Z");
        assert_eq!(
            wait_before_request(&spent, 5, now),
            Some(Wait::Day(Duration::from_secs(2 * 3600)))
        );
        let yesterday = usage(vec![budget(600, 3, 30000, 30000)], "2024-02-29T23:00:00Z");
        assert_eq!(wait_before_request(&yesterday, 5, now), None);
    }

    #[test]
    fn requests_are_counted_until_the_next_answer_says_otherwise() {
        let now = at("2024-03-01T12:10:00Z");
        let limits = RateLimits::new(5, Arc::new(move || now));
        assert_eq!(limits.reserve_request(), None);
        limits.record(&headers(&[
            ("x-ratelimit-limit", "600,30000"),
            ("x-ratelimit-usage", "593,1200"),
        ]));
        assert_eq!(limits.reserve_request(), None);
        assert_eq!(limits.reserve_request(), None);
        assert_eq!(
            limits.reserve_request(),
            Some(Wait::Window(Duration::from_secs(5 * 60)))
        );
    }
}
