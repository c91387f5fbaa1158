//! [`TableBudget`]: the request budgets of `[providers.NAME.budget]`, counted in
//! `rate_budgets` so that every instance on the database takes from the same windows.
//!
//! Taking a request is one conditional `UPDATE ... SET used = used + 1 WHERE ... AND used <
//! limit` per window, whose rows affected say whether it was taken; only the first request
//! of a window also inserts its row (if absent) and sweeps ended windows. A request that a
//! later window refuses gives back what the earlier windows gave, so no window ever counts
//! more than was sent and the sum across instances never passes the limit.

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

    fn windows_at(&self, now: DateTime<Utc>) -> Vec<WindowAt<'_>> {
        let now = now.timestamp();
        self.scopes
            .iter()
            .flat_map(|scope| {
                scope.windows.iter().map(move |window| {
                    let (start, end) = window_around(now, window.period_seconds());
                    WindowAt {
                        scope,
                        window: *window,
                        start,
                        end,
                    }
                })
            })
            .collect()
    }

    /// Takes one request from `at`: true when it had one left.
    async fn take_one(&self, at: &WindowAt<'_>) -> Result<bool, DbErr> {
        take_in(&self.db, &at.scope.key, &at.window, at.start, at.end).await
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
        let windows = self.windows_at(crate::db::now());
        for (index, at) in windows.iter().enumerate() {
            if self.take_one(at).await? {
                continue;
            }
            for taken in &windows[..index] {
                self.give_back(taken).await?;
            }
            let reopens_at =
                DateTime::from_timestamp(at.end, 0).unwrap_or(DateTime::<Utc>::MAX_UTC);
            return Ok(Err(BudgetRefusal::Spent {
                scope: at.scope.label.clone(),
                reopens_at,
            }));
        }
        Ok(Ok(()))
    }
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
    if take_in(db, key, window, start, end).await? {
        return Ok(None);
    }
    Ok(Some(
        DateTime::from_timestamp(end, 0).unwrap_or(DateTime::<Utc>::MAX_UTC),
    ))
}

/// Takes one request from the window `[start, end)` of scope `key`: true when it had one
/// left.
async fn take_in(
    db: &DatabaseConnection,
    key: &str,
    window: &BudgetWindow,
    start: i64,
    end: i64,
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
        sweep(db, start).await?;
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

/// Removes the windows that ended before `now` (any scope's): a window's row is useless
/// once it ends, and this runs only when a new window opens.
async fn sweep(db: &DatabaseConnection, now: i64) -> Result<(), DbErr> {
    let swept = rate_budget::Entity::delete_many()
        .filter(rate_budget::Column::WindowEnd.lte(now))
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
    use super::window_around;

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
