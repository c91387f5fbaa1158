//! The integration suite: one binary, real SQLite, PostgreSQL or MariaDB databases
//! (`TRIBUTARY_TEST_DB`), wiremock standing in for the third-party APIs. Logs are silent
//! unless `TEST_LOG` is set.

mod adapters;
mod bad_input;
mod big_pages;
mod bookkeeping;
mod changes;
mod cli;
mod clock;
mod concurrency;
mod connections;
mod crash;
mod daemon;
mod db_proxy;
mod deletions;
mod enum_columns;
mod fault_scenarios;
mod faults;
mod fencing;
mod helpers;
mod keying;
mod leases;
mod lock_order;
mod long_values;
mod mid_run_changes;
mod migration_lock;
mod notifications;
mod oauth_refresh;
mod pagination;
mod panics;
mod poison;
mod pools;
mod presets;
mod queue;
mod queue_faults;
mod race;
mod redaction;
mod rest_incremental;
mod scripted;
mod secrets;
mod shortcuts;
mod streams;
mod stripe_events;
mod tenants;
mod tools;
mod upgrades;
