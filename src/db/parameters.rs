//! How many values one statement may bind on each backend, and so how many rows a
//! multi-row statement may carry. Every multi-row statement is chunked from these, by
//! the values it binds per row ([`Binds`]), so none exceeds its backend's limit whatever
//! the page size.

use sea_orm::DbBackend;

/// SQLite's `SQLITE_MAX_VARIABLE_NUMBER` as libsqlite3-sys builds it (SQLite's default).
const SQLITE_MAX_PARAMETERS: usize = 32_766;
/// PostgreSQL's protocol counts a statement's parameters in 16 bits.
const POSTGRES_MAX_PARAMETERS: usize = 65_535;
/// MySQL's and MariaDB's protocol counts a prepared statement's parameters in 16 bits.
const MYSQL_MAX_PARAMETERS: usize = 65_535;

/// The most rows one multi-row statement carries even where the limit allows more: a
/// chunk that fails is written again row by row on the careful path, and MySQL's
/// `max_allowed_packet` bounds a statement's bytes, payloads included.
pub const MAX_ROWS_PER_STATEMENT: usize = 500;

/// The most values one statement may bind on `backend`.
pub fn max_parameters(backend: DbBackend) -> usize {
    match backend {
        DbBackend::Sqlite => SQLITE_MAX_PARAMETERS,
        DbBackend::Postgres => POSTGRES_MAX_PARAMETERS,
        // MySQL, MariaDB, and any backend sea-orm adds: the smallest 16-bit count.
        _ => MYSQL_MAX_PARAMETERS,
    }
}

/// What a multi-row statement binds: `per_row` values for each row, and `fixed` values
/// of its own whatever its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binds {
    pub per_row: usize,
    pub fixed: usize,
}

impl Binds {
    pub const fn new(per_row: usize, fixed: usize) -> Binds {
        Binds { per_row, fixed }
    }

    /// The most rows whose values fit `backend`'s limit; at least one, so that chunking
    /// by it always makes progress.
    pub fn rows_within_limit(self, backend: DbBackend) -> usize {
        let room = max_parameters(backend).saturating_sub(self.fixed);
        room.checked_div(self.per_row).unwrap_or(usize::MAX).max(1)
    }

    /// The rows one statement carries on `backend`: within its limit, and at most
    /// [`MAX_ROWS_PER_STATEMENT`].
    pub fn rows(self, backend: DbBackend) -> usize {
        self.rows_within_limit(backend).min(MAX_ROWS_PER_STATEMENT)
    }

    /// How many values a statement of `rows` rows binds.
    pub fn values(self, rows: usize) -> usize {
        self.per_row.saturating_mul(rows).saturating_add(self.fixed)
    }
}

/// The backends a statement must fit, for tests that build each one on all of them.
#[cfg(test)]
pub const BACKENDS: [DbBackend; 3] = [DbBackend::Sqlite, DbBackend::Postgres, DbBackend::MySql];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rows_of_a_statement_fit_the_limit_of_every_backend() {
        for backend in BACKENDS {
            for per_row in 1..=20 {
                for fixed in [0, 1, 4, 12] {
                    let binds = Binds::new(per_row, fixed);
                    let rows = binds.rows_within_limit(backend);
                    assert!(binds.values(rows) <= max_parameters(backend));
                    assert!(binds.values(rows + 1) > max_parameters(backend));
                    assert!(binds.rows(backend) <= rows);
                }
            }
        }
    }

    #[test]
    fn sqlite_takes_fewer_rows_of_a_new_record_than_the_servers() {
        let record = Binds::new(9, 2);
        assert_eq!(record.rows_within_limit(DbBackend::Sqlite), 3_640);
        assert_eq!(record.rows_within_limit(DbBackend::Postgres), 7_281);
        assert_eq!(record.rows_within_limit(DbBackend::MySql), 7_281);
    }

    #[test]
    fn a_statement_without_values_per_row_or_room_still_takes_one_row_at_a_time() {
        assert_eq!(
            Binds::new(0, 3).rows_within_limit(DbBackend::Sqlite),
            usize::MAX
        );
        assert_eq!(
            Binds::new(0, 3).rows(DbBackend::Sqlite),
            MAX_ROWS_PER_STATEMENT
        );
        assert_eq!(
            Binds::new(1, 1_000_000).rows_within_limit(DbBackend::MySql),
            1
        );
    }
}
