//! The integration suite: one binary, real SQLite databases, wiremock standing in for the
//! third-party APIs. Logs are silent unless `TEST_LOG` is set.

mod adapters;
mod bench;
mod cli;
mod concurrency;
mod connections;
mod crash;
mod daemon;
mod faults;
mod helpers;
mod keying;
mod leases;
mod pagination;
mod poison;
