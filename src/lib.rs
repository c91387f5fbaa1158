//! tributary: a scheduled multi-provider sync daemon.
//!
//! # Layout
//! Bottom to top; each module uses only those above it in this list (ARCHITECTURE.md,
//! "Layers", checked by `tests/tidy/`).
//! - [`config`]: `config.toml`, its settings types and validation.
//! - `telemetry`: the metrics, their events and where each is recorded.
//! - [`entities`]: the SeaORM entities of `connections`, `records`, `sync_runs`, `run_errors`.
//! - [`secrets`]: the keys that encrypt stored credentials, and the sealed form.
//! - [`credentials`]: what `connections.credentials` holds and how a run resolves it.
//! - [`db`]: connecting and migrating.
//! - [`connections`]: loading configured connections into `connections`, retiring removed
//!   ones, and keeping their credentials sealed.
//! - `lease`: at most one run of a connection at a time, across processes.
//! - `jobs`: what should run; a schedule slot of a connection is one job across instances.
//! - [`retention`]: deleting the history `[retention]` no longer keeps, in small batches.
//! - [`pipeline`]: the one pipeline that stores records: [`pipeline::sync_connection`] runs
//!   one connection once, page by page, keyed on (user_id, provider, external_id), through
//!   a [`pipeline::Run`]; replaying a run's failed records from their stored payloads.
//! - `reconcile`: removing duplicates from before the unique index, with an audit log.
//! - [`sync`]: choosing the connections a command or a schedule syncs and running them
//!   with bounded concurrency.
//! - [`app`]: start-up, [`app::App::open`], for every face and the daemon alike.
//! - `api`: the HTTP API the daemon serves on `[api] listen`, over the operations.
//! - [`daemon`]: `tributary daemon`: cron schedules, leases, graceful shutdown, systemd
//!   notifications, `/healthz` and `/metrics`.
//! - [`cli`]: the `tributary` commands, and `tributary demo` with its emulated API.
//!
//! Adapters live in the `tributary-providers` crate and never touch the database; the
//! schema lives in the `tributary-migrations` crate, the benchmark in `tributary-bench`. Only [`pipeline`] writes `records`.

pub(crate) mod api;
pub mod app;
pub mod cli;
pub mod config;
pub mod connections;
pub mod credentials;
pub mod daemon;
pub mod db;
pub mod entities;
pub(crate) mod jobs;
pub(crate) mod lease;
pub(crate) mod ops;
pub mod pipeline;
pub(crate) mod reconcile;
pub mod retention;
pub mod secrets;
pub mod sync;
pub(crate) mod telemetry;
#[cfg(test)]
mod testing;
