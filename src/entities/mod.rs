//! SeaORM entities, one per table. The column names are a contract with operators; see
//! the migrations crate for the schema itself.

pub(crate) mod api_audit;
pub(crate) mod api_key;
pub mod change;
pub mod change_batch;
pub mod change_clock;
pub(crate) mod connect_session;
pub mod connection;
pub mod connection_stream;
pub(crate) mod feed_reader;
pub mod instance;
pub mod notification_delivery;
pub(crate) mod operator_session;
pub mod processed_key;
pub(crate) mod rate_budget;
pub mod record;
pub mod run_error;
pub mod run_sighting;
pub(crate) mod stream_schedule;
pub mod sync_job;
pub mod sync_run;
pub(crate) mod webhook_delivery;

/// Displays enum columns as the strings they are stored as (the CLI prints those).
macro_rules! display_as_stored {
    ($($enum:ty),+) => {
        $(impl std::fmt::Display for $enum {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&sea_orm::ActiveEnum::to_value(self))
            }
        })+
    };
}
use display_as_stored;
