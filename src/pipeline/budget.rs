//! [`TableBudget`]: the request budgets of `[providers.NAME.budget]`, counted in
//! `rate_budgets` so that every instance on the database takes from the same windows.
//!
//! Taking a request is one conditional `UPDATE ... SET used = used + 1 WHERE ... AND used <
//! limit` per window, whose rows affected say whether it was taken; only the first request
//! of a window also inserts its row (if absent) and sweeps ended windows. A request that a
//! later window refuses gives back what the earlier windows gave, so no window ever counts
//! more than was sent and the sum across instances never passes the limit.
//!
//! A request taken at a window's edge counts in the window beside it too: the API counts
//! it when it arrives, by its own clock, which may put it across the edge from where we
//! took it (see [`EDGE_MAX`]).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sea_orm::sea_query::{Expr, ExprTrait, OnConflict};
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, Set};
use tributary_providers::http::{BudgetRefusal, ReportedWindow, RequestBudget};

use crate::config::{BudgetSettings, BudgetWindow, ProviderSettings};
use crate::entities::{connection, rate_budget};

/// The windows of one scope: a provider's application, or one connection.
struct Scope {
    /// The `rate_budgets.scope` key: `provider:NAME` or `connection:ID`.
    key: String,
    /// How errors and logs name it: `provider "strava"`, `connection 7`.
    label: String,
    windows: Vec<BudgetWindow>,
}

/// The budgets one connection's run takes from: its provider's application windows, then
/// its own.
pub(crate) struct TableBudget {
    db: DatabaseConnection,
    scopes: Vec<Scope>,
    /// Which scope an answer's rate-limit headers count against (`learn_from_headers`).
    learns_into: Option<usize>,
}

/// How close to a window's edge a request also counts in the window across it, at most:
/// what lies between our count and the API's (the request's way there, the two clocks'
/// disagreement, a busy machine's scheduling). A twentieth of shorter windows, so that
/// the edges of a 10 s window spend at most a tenth of it twice.
const EDGE_MAX: chrono::TimeDelta = chrono::TimeDelta::seconds(1);

/// One window of one scope as it stands now.
struct WindowAt<'a> {
    scope: &'a Scope,
    window: BudgetWindow,
    start: i64,
    end: i64,
}

impl TableBudget {
    /// The budget of `connection`'s runs, or `None` when its provider configures none.
    pub(crate) fn for_connection(
        db: &DatabaseConnection,
        settings: &ProviderSettings,
        connection: &connection::Model,
    ) -> Option<Arc<dyn RequestBudget>> {
        let budget: &BudgetSettings = settings.budget.as_ref()?;
        let mut scopes = Vec::new();
        if !budget.app.is_empty() {
            scopes.push(Scope {
                key: format!("provider:{}", settings.name),
                label: format!("provider {:?}", settings.name),
                windows: budget.app.clone(),
            });
        }
        if !budget.connection.is_empty() {
            scopes.push(Scope {
                key: format!("connection:{}", connection.id),
                label: format!("connection {} ({:?})", connection.id, connection.user_id),
                windows: budget.connection.clone(),
            });
        }
        // Headers such as GitHub's speak for the token, Strava's for the application:
        // the connection's windows when it has any, else the application's.
        let learns_into = budget
            .learn_from_headers
            .then(|| scopes.len().checked_sub(1))
            .flatten();
        Some(Arc::new(TableBudget {
            db: db.clone(),
            scopes,
            learns_into,
        }))
    }

    /// The windows a request taken at `now` counts in: each scope's window holding `now`,
    /// and beside it the next one within the edge before its end, or the previous one
    /// within the edge after its start. Each comes with when a refusal by it ends.
    fn windows_at(&self, now: DateTime<Utc>) -> Vec<(WindowAt<'_>, DateTime<Utc>)> {
        let seconds = now.timestamp();
        let mut windows = Vec::new();
        for scope in &self.scopes {
            for window in &scope.windows {
                let period = window.period_seconds();
                let (start, end) = window_around(seconds, period);
                let edge = edge_of(period);
                let at = |start: i64, end: i64| WindowAt {
                    scope,
                    window: *window,
                    start,
                    end,
                };
                windows.push((at(start, end), instant(end)));
                let end_edge = instant(end).checked_sub_signed(edge);
                let start_edge = instant(start).checked_add_signed(edge);
                if end_edge.is_some_and(|edge_starts| now >= edge_starts) {
                    let next_end = end.saturating_add(period);
                    windows.push((at(end, next_end), instant(next_end)));
                } else if let Some(edge_ends) = start_edge.filter(|edge_ends| now < *edge_ends) {
                    // A spent previous window holds the request back only until the edge.
                    windows.push((at(start.saturating_sub(period), start), edge_ends));
                }
            }
        }
        windows
    }

    /// Takes one request from `at` at `now`: true when it had one left.
    async fn take_one(&self, at: &WindowAt<'_>, now: DateTime<Utc>) -> Result<bool, DbErr> {
        take_in(&self.db, &at.scope.key, &at.window, (at.start, at.end), now).await
    }

    /// Gives back a request taken from `at` that was never sent.
    async fn give_back(&self, at: &WindowAt<'_>) -> Result<(), DbErr> {
        rate_budget::Entity::update_many()
            .col_expr(
                rate_budget::Column::Used,
                Expr::col(rate_budget::Column::Used).sub(1),
            )
            .filter(window_of(at))
            .filter(rate_budget::Column::Used.gt(0))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    async fn take_all(&self) -> Result<Result<(), BudgetRefusal>, DbErr> {
        // The database's clock, so that every instance counts in the same window.
        self.take_all_at(crate::db::now()).await
    }

    async fn take_all_at(&self, now: DateTime<Utc>) -> Result<Result<(), BudgetRefusal>, DbErr> {
        let windows = self.windows_at(now);
        for (index, (at, reopens_at)) in windows.iter().enumerate() {
            if self.take_one(at, now).await? {
                continue;
            }
            for (taken, _) in &windows[..index] {
                self.give_back(taken).await?;
            }
            return Ok(Err(BudgetRefusal::Spent {
                scope: at.scope.label.clone(),
                reopens_at: *reopens_at,
            }));
        }
        Ok(Ok(()))
    }
}

/// The edge of a window of `period` seconds (see [`EDGE_MAX`]).
fn edge_of(period: i64) -> chrono::TimeDelta {
    let twentieth = chrono::TimeDelta::milliseconds(period.saturating_mul(50));
    Ord::min(twentieth, EDGE_MAX)
}

/// The instant `seconds` after the epoch.
fn instant(seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(seconds, 0).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// The row of the window `at`.
fn window_of(at: &WindowAt<'_>) -> sea_orm::Condition {
    row_of(&at.scope.key, &at.window, at.start)
}

/// The row of scope `key`'s window of `window`'s length that starts at `start`.
fn row_of(key: &str, window: &BudgetWindow, start: i64) -> sea_orm::Condition {
    sea_orm::Condition::all()
        .add(rate_budget::Column::Scope.eq(key))
        .add(rate_budget::Column::PeriodSeconds.eq(window.period_seconds()))
        .add(rate_budget::Column::WindowStart.eq(start))
}

/// Takes one request from scope `key`'s window of `window` that holds `now`: `None`
/// when it had one left, else when the window ends. The API's per-key rate limit counts
/// in the same table, so every instance shares one count per key.
pub(crate) async fn take_one_from(
    db: &DatabaseConnection,
    key: &str,
    window: &BudgetWindow,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, DbErr> {
    let (start, end) = window_around(now.timestamp(), window.period_seconds());
    if take_in(db, key, window, (start, end), now).await? {
        return Ok(None);
    }
    Ok(Some(
        DateTime::from_timestamp(end, 0).unwrap_or(DateTime::<Utc>::MAX_UTC),
    ))
}

/// Takes one request at `now` from the window `[start, end)` of scope `key`: true when
/// it had one left.
async fn take_in(
    db: &DatabaseConnection,
    key: &str,
    window: &BudgetWindow,
    (start, end): (i64, i64),
    now: DateTime<Utc>,
) -> Result<bool, DbErr> {
    if increment(db, key, window, start).await? {
        return Ok(true);
    }
    // The window's first request (or a spent window): make sure its row exists.
    let inserted = rate_budget::Entity::insert(rate_budget::ActiveModel {
        scope: Set(key.to_string()),
        period_seconds: Set(window.period_seconds()),
        window_start: Set(start),
        window_end: Set(end),
        used: Set(0),
    })
    .on_conflict(
        OnConflict::columns([
            rate_budget::Column::Scope,
            rate_budget::Column::PeriodSeconds,
            rate_budget::Column::WindowStart,
        ])
        .do_nothing_on([rate_budget::Column::Used])
        .to_owned(),
    )
    .exec_without_returning(db)
    .await?;
    if inserted > 0 {
        sweep(db, now).await?;
    }
    // Another instance may have inserted the row since our first try.
    increment(db, key, window, start).await
}

/// `used = used + 1` while it stays within the limit.
async fn increment(
    db: &DatabaseConnection,
    key: &str,
    window: &BudgetWindow,
    start: i64,
) -> Result<bool, DbErr> {
    let updated = rate_budget::Entity::update_many()
        .col_expr(
            rate_budget::Column::Used,
            Expr::col(rate_budget::Column::Used).add(1),
        )
        .filter(row_of(key, window, start))
        .filter(rate_budget::Column::Used.lt(window.limit()))
        .exec(db)
        .await?;
    Ok(updated.rows_affected == 1)
}

/// Removes the windows that ended before `now` (any scope's), but for those whose edge
/// is not yet past: a window's row is useless once its edge is over, and this runs only
/// when a new window opens.
async fn sweep(db: &DatabaseConnection, now: DateTime<Utc>) -> Result<(), DbErr> {
    let edge_past = now.checked_sub_signed(EDGE_MAX).unwrap_or(now).timestamp();
    let swept = rate_budget::Entity::delete_many()
        .filter(rate_budget::Column::WindowEnd.lte(edge_past))
        .exec(db)
        .await?
        .rows_affected;
    if swept > 0 {
        tracing::debug!(swept, "Swept ended request budget windows.");
    }
    Ok(())
}

/// The window of length `period` (seconds) that holds `now` (seconds since the epoch),
/// aligned to the epoch: `[start, end)`.
fn window_around(now: i64, period: i64) -> (i64, i64) {
    let period = Ord::max(period, 1);
    let start = now.div_euclid(period).saturating_mul(period);
    (start, start.saturating_add(period))
}

#[async_trait::async_trait]
impl RequestBudget for TableBudget {
    async fn take(&self) -> Result<(), BudgetRefusal> {
        self.take_all().await.unwrap_or_else(|error| {
            Err(BudgetRefusal::Unavailable {
                message: error.to_string(),
            })
        })
    }

    async fn learn(&self, reported: &[ReportedWindow]) {
        let Some(scope) = self.learns_into.and_then(|index| self.scopes.get(index)) else {
            return;
        };
        let now = crate::db::now().timestamp();
        for (window, reported) in scope.windows.iter().zip(reported) {
            let (start, end) = window_around(now, window.period_seconds());
            let at = WindowAt {
                scope,
                window: *window,
                start,
                end,
            };
            // Counted as full as the API says it is, never less full than we count it.
            let remaining = i64::try_from(reported.remaining).unwrap_or(i64::MAX);
            let used = Ord::max(window.limit().saturating_sub(remaining), 0);
            let raised = rate_budget::Entity::update_many()
                .col_expr(rate_budget::Column::Used, Expr::value(used))
                .filter(window_of(&at))
                .filter(rate_budget::Column::Used.lt(used))
                .exec(&self.db)
                .await;
            match raised {
                Ok(result) if result.rows_affected > 0 => tracing::debug!(
                    scope = %scope.label,
                    period_seconds = window.period_seconds(),
                    used,
                    "Request budget raised to what the API reports."
                ),
                Ok(_) => {}
                Err(error) => tracing::warn!(
                    scope = %scope.label,
                    %error,
                    "Learning a request budget from the API's headers failed; the count stays."
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::{DateTime, TimeDelta, Utc};
    use sea_orm::{EntityTrait, QueryOrder};
    use tributary_providers::http::BudgetRefusal;

    use super::{window_around, Scope, TableBudget};
    use crate::config::BudgetWindow;
    use crate::entities::rate_budget;
    use crate::testing::TestDb;

    /// An application budget of `requests` per 10 s.
    fn ten_seconds(test: &TestDb, requests: u64) -> TableBudget {
        TableBudget {
            db: test.main().clone(),
            scopes: vec![Scope {
                key: "provider:p".to_string(),
                label: "provider \"p\"".to_string(),
                windows: vec![BudgetWindow {
                    requests,
                    per: Duration::from_secs(10),
                }],
            }],
            learns_into: None,
        }
    }

    /// `seconds` and `millis` after the start of a window (2026-12-06T00:00:00Z).
    fn at(seconds: i64, millis: i64) -> DateTime<Utc> {
        let start = DateTime::from_timestamp(1_796_515_200, 0).unwrap_or_default();
        start + TimeDelta::seconds(seconds) + TimeDelta::milliseconds(millis)
    }

    /// Each window's start (seconds after the first's) and how many it counts.
    async fn counted(test: &TestDb) -> Vec<(i64, i64)> {
        rate_budget::Entity::find()
            .order_by_asc(rate_budget::Column::WindowStart)
            .all(test.main())
            .await
            .expect("rate budgets")
            .into_iter()
            .map(|row| (row.window_start - 1_796_515_200, row.used))
            .collect()
    }

    #[tokio::test]
    async fn a_request_at_a_windows_end_counts_in_the_next_window_too() {
        let test = TestDb::new().await;
        let budget = ten_seconds(&test, 5);
        assert!(budget.take_all_at(at(4, 0)).await.expect("taken").is_ok());
        // Within the last half second (a twentieth of 10 s): the API may count it after.
        assert!(budget.take_all_at(at(9, 600)).await.expect("taken").is_ok());
        assert_eq!(counted(&test).await, [(0, 2), (10, 1)]);
        // The next window then has room for four, not five.
        for millis in [0, 100, 200, 300] {
            let taken = budget.take_all_at(at(15, millis)).await.expect("taken");
            assert!(taken.is_ok(), "{taken:?}");
        }
        let refused = budget.take_all_at(at(15, 400)).await.expect("answered");
        let Err(BudgetRefusal::Spent { reopens_at, .. }) = refused else {
            panic!("the fifth request of the window was taken: {refused:?}");
        };
        assert_eq!(reopens_at, at(20, 0));
        // (The first window, over, may have been swept.)
        assert_eq!(counted(&test).await.last(), Some(&(10, 5)));
    }

    #[tokio::test]
    async fn a_request_at_a_windows_start_waits_while_the_spent_window_before_may_count_it() {
        let test = TestDb::new().await;
        let budget = ten_seconds(&test, 2);
        for seconds in [3, 5] {
            assert!(budget
                .take_all_at(at(seconds, 0))
                .await
                .expect("taken")
                .is_ok());
        }
        // A clock a little behind the API's: just after the edge, the API may still be
        // counting in the spent window.
        let early = budget.take_all_at(at(10, 100)).await.expect("answered");
        let Err(BudgetRefusal::Spent { reopens_at, .. }) = early else {
            panic!("taken in the edge after a spent window: {early:?}");
        };
        assert_eq!(reopens_at, at(10, 500));
        assert_eq!(
            counted(&test).await,
            [(0, 2), (10, 0)],
            "the refusal gave back"
        );
        let after = budget.take_all_at(at(10, 500)).await.expect("taken");
        assert!(after.is_ok(), "{after:?}");
        assert_eq!(counted(&test).await, [(0, 2), (10, 1)]);
    }

    #[test]
    fn windows_are_aligned_to_the_quarter_hour_and_to_midnight() {
        // 2026-12-04T15:37:12Z
        let now = 1_796_398_632;
        let (start, end) = window_around(now, 15 * 60);
        assert_eq!((start % 900, end - start), (0, 900));
        assert!(start <= now && now < end);
        let (start, end) = window_around(now, 86_400);
        assert_eq!(start % 86_400, 0);
        assert_eq!(end - start, 86_400);
        assert_eq!(window_around(-1, 10), (-10, 0));
    }
}
