//! SeaORM entities, one per table. The column names are a contract with operators; see
//! the migrations crate for the schema itself.

pub mod connection;
pub mod processed_key;
pub mod record;
pub mod run_error;
pub mod sync_run;
