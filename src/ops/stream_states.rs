//! A connection's streams as lists and statuses show them: the configured ones, then any
//! other that has state.

use chrono::{DateTime, Utc};

use crate::config::Settings;
use crate::entities::{connection, connection_stream};

/// One stream's state as a list shows it.
pub(super) struct StreamState {
    pub name: Option<String>,
    pub cursor: Option<String>,
    pub checkpoint: Option<String>,
    pub last_success_run_id: Option<i64>,
    pub last_success_at: Option<DateTime<Utc>>,
    /// Since when the operator has paused the stream.
    pub paused_at: Option<DateTime<Utc>>,
}

/// The streams of connection `row` to show, given its stream states `own`: the configured
/// ones in their order, then any other stream that has state. A stream that never ran shows
/// nothing, except the primary stream, which shows the state the connection kept from
/// before streams until its first run takes it over.
pub(super) fn stream_states(
    settings: &Settings,
    row: &connection::Model,
    own: Vec<connection_stream::Model>,
) -> Vec<StreamState> {
    let provider = settings.providers.get(&row.provider);
    let primary = provider.map(|provider| provider.primary_stream().name);
    let mut names: Vec<String> = provider
        .map(|provider| provider.streams.iter().map(|s| s.name.clone()).collect())
        .unwrap_or_default();
    for state in &own {
        if !names.contains(&state.stream) {
            names.push(state.stream.clone());
        }
    }
    let legacy = || StreamState {
        name: None,
        cursor: row.cursor.clone(),
        checkpoint: row.checkpoint.clone(),
        last_success_run_id: row.last_success_run_id,
        last_success_at: row.last_success_at,
        paused_at: None,
    };
    if names.is_empty() {
        return vec![legacy()];
    }
    names
        .into_iter()
        .map(|name| match own.iter().find(|state| state.stream == name) {
            Some(state) => StreamState {
                name: Some(name),
                cursor: state.cursor.clone(),
                checkpoint: state.checkpoint.clone(),
                last_success_run_id: state.last_success_run_id,
                last_success_at: state.last_success_at,
                paused_at: state.paused_at,
            },
            None if primary.as_ref() == Some(&name) => StreamState {
                name: Some(name),
                ..legacy()
            },
            None => StreamState {
                name: Some(name),
                cursor: None,
                checkpoint: None,
                last_success_run_id: None,
                last_success_at: None,
                paused_at: None,
            },
        })
        .collect()
}
