//! [`RequestBudget`]: request budgets kept outside the process (the root crate keeps them
//! in the database, shared by every instance), which the client takes from before each
//! request and teaches what an answer's rate-limit headers report.
//!
//! The budget of a connection's run is scoped to its fetches with [`with_budget`] rather
//! than passed through every adapter: every request an adapter makes while fetching a page
//! counts, including ones a new adapter adds, without the adapter knowing.

use std::future::Future;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use reqwest::header::HeaderMap;

/// Why a request could not be taken from a budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BudgetRefusal {
    /// The window of `scope` is spent; it reopens at `reopens_at`.
    Spent {
        /// What the budget belongs to, e.g. `provider strava` or `connection 7`.
        scope: String,
        /// When the spent window ends.
        reopens_at: DateTime<Utc>,
    },
    /// The budget could not be read (the database is unreachable): no request is sent.
    Unavailable { message: String },
}

/// One window an answer's headers report, in the order the headers list them (Strava's
/// `X-RateLimit-Limit: 100,1000` is the 15-minute window, then the daily one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportedWindow {
    /// The requests the API says remain in the window.
    pub remaining: u64,
}

/// Request budgets shared beyond this process. Implemented by the root crate over its
/// database; the providers crate only asks.
#[async_trait::async_trait]
pub trait RequestBudget: Send + Sync {
    /// Takes one request from every window that applies, or none when one is spent.
    async fn take(&self) -> Result<(), BudgetRefusal>;

    /// Learns from an answer's headers: a window the API says has fewer requests left
    /// than the budget counts is counted as that full. Never counts a window down.
    async fn learn(&self, reported: &[ReportedWindow]);
}

tokio::task_local! {
    static BUDGET: Arc<dyn RequestBudget>;
}

/// Runs `fetch` with `budget` consulted by every [`super::HttpClient`] request it makes
/// (on this task).
pub async fn with_budget<F: Future>(budget: Arc<dyn RequestBudget>, fetch: F) -> F::Output {
    BUDGET.scope(budget, fetch).await
}

/// The budget of the fetch this task is running, if any.
pub(super) fn current() -> Option<Arc<dyn RequestBudget>> {
    BUDGET.try_with(Arc::clone).ok()
}

/// The windows an answer's rate-limit headers report: `X-RateLimit-Remaining` (GitHub and
/// most APIs), or `X-RateLimit-Limit` less `X-RateLimit-Usage` (Strava), each a
/// comma-separated list of one value per window. Values that are not numbers end the
/// list there.
pub fn reported_windows(headers: &HeaderMap) -> Vec<ReportedWindow> {
    let numbers = |name: &str| -> Option<Vec<u64>> {
        let text = headers.get(name)?.to_str().ok()?;
        text.split(',')
            .map(|part| part.trim().parse::<u64>().ok())
            .collect()
    };
    if let Some(remaining) = numbers("x-ratelimit-remaining") {
        return remaining
            .into_iter()
            .map(|remaining| ReportedWindow { remaining })
            .collect();
    }
    match (numbers("x-ratelimit-limit"), numbers("x-ratelimit-usage")) {
        (Some(limits), Some(usage)) => limits
            .into_iter()
            .zip(usage)
            .map(|(limit, used)| ReportedWindow {
                remaining: limit.saturating_sub(used),
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().expect("header value"));
        }
        map
    }

    fn remaining(values: &[u64]) -> Vec<ReportedWindow> {
        values
            .iter()
            .map(|&remaining| ReportedWindow { remaining })
            .collect()
    }

    #[test]
    fn github_and_strava_headers_give_what_remains_per_window() {
        let github = headers(&[
            ("x-ratelimit-limit", "5000"),
            ("x-ratelimit-remaining", "4990"),
            ("x-ratelimit-reset", "1767225600"),
        ]);
        assert_eq!(reported_windows(&github), remaining(&[4990]));
        let strava = headers(&[
            ("x-ratelimit-limit", "100,1000"),
            ("x-ratelimit-usage", "12,300"),
        ]);
        assert_eq!(reported_windows(&strava), remaining(&[88, 700]));
        let over = headers(&[("x-ratelimit-limit", "100"), ("x-ratelimit-usage", "250")]);
        assert_eq!(reported_windows(&over), remaining(&[0]));
    }

    #[test]
    fn headers_that_are_absent_or_not_numbers_report_nothing() {
        assert!(reported_windows(&HeaderMap::new()).is_empty());
        let garbled = headers(&[("x-ratelimit-remaining", "lots")]);
        assert!(reported_windows(&garbled).is_empty());
        let limit_only = headers(&[("x-ratelimit-limit", "100")]);
        assert!(reported_windows(&limit_only).is_empty());
        let huge = headers(&[("x-ratelimit-remaining", "99999999999999999999999")]);
        assert!(reported_windows(&huge).is_empty());
    }
}
