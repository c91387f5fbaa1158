//! tributary: a scheduled multi-provider sync daemon.
//!
//! # Layout
//! - [`config`]: `config.toml`, its settings types and validation.
//! - [`credentials`]: what `connections.credentials` holds and how a run resolves it.
//! - [`db`]: connecting, migrating, and loading configured connections into `connections`.
//! - [`entities`]: the SeaORM entities of `connections`, `records`, `sync_runs`, `run_errors`.
//! - [`lease`]: at most one run of a connection at a time, across processes.
//! - [`pipeline`]: the one pipeline that stores records: [`pipeline::sync_connection`] runs
//!   one connection once, page by page, keyed on (user_id, provider, external_id).
//! - [`reconcile`]: removing duplicates from before the unique index, with an audit log.
//! - [`replay`]: re-ingesting a run's failed records from their stored payloads.
//! - [`secrets`]: the keys that encrypt stored credentials, and the sealed form.
//! - [`sync`]: choosing the connections a command or a schedule syncs and running them
//!   with bounded concurrency.
//! - [`telemetry`]: the metrics and where each is recorded.
//! - [`daemon`]: `tributary daemon`: cron schedules, leases, graceful shutdown, systemd
//!   notifications, `/healthz` and `/metrics`.
//! - [`cli`]: the `tributary` commands.
//! - [`demo`]: `tributary demo`, a built-in emulated API and a two-pass sync of it.
//! - [`bench`]: `tributary bench`, throughput and memory at scale against an emulated Stripe.
//!
//! Adapters live in the `tributary-providers` crate and never touch the database; the
//! schema lives in the `tributary-migrations` crate. Only [`pipeline`] writes `records`.

pub mod bench;
pub mod cli;
pub mod config;
pub mod credentials;
pub mod daemon;
pub mod db;
pub mod demo;
pub mod entities;
pub mod lease;
pub mod pipeline;
pub mod reconcile;
pub mod replay;
pub mod secrets;
pub mod sync;
pub mod telemetry;
