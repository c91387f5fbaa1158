//! Live progress on a terminal: one line per connection with pages, records and records/s.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use crate::entities::connection;
use crate::pipeline::{ProgressSink, RunCounts};

/// Draws a spinner line per connection as its pages commit.
pub struct BarProgress {
    multi: MultiProgress,
    bars: Mutex<HashMap<i64, (ProgressBar, Instant)>>,
}

impl Default for BarProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl BarProgress {
    pub fn new() -> BarProgress {
        BarProgress {
            multi: MultiProgress::new(),
            bars: Mutex::new(HashMap::new()),
        }
    }

    /// Removes the bars so the summary lines print cleanly.
    pub fn clear(&self) {
        if let Ok(mut bars) = self.bars.lock() {
            for (bar, _) in bars.values() {
                bar.finish_and_clear();
            }
            bars.clear();
        }
        let _ = self.multi.clear();
    }
}

impl ProgressSink for BarProgress {
    fn page_committed(&self, connection: &connection::Model, counts: &RunCounts) {
        let Ok(mut bars) = self.bars.lock() else {
            return;
        };
        let (bar, started) = bars.entry(connection.id).or_insert_with(|| {
            let bar = self.multi.add(ProgressBar::new_spinner());
            if let Ok(style) = ProgressStyle::with_template("{spinner} {prefix}: {msg}") {
                bar.set_style(style);
            }
            bar.set_prefix(format!("{}@{}", connection.user_id, connection.provider));
            (bar, Instant::now())
        });
        let seconds = started.elapsed().as_secs_f64().max(0.001);
        bar.set_message(format!(
            "{} pages, {} records ({} new, {} failed), {:.0} records/s",
            counts.pages_fetched,
            counts.fetched,
            counts.inserted,
            counts.failed,
            counts.fetched as f64 / seconds
        ));
        bar.tick();
    }
}
