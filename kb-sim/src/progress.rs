//! The run's progress on stderr (indicatif): simulated time and records
//! so far, shown only on a terminal and without `-q`; in a pipe, a file
//! or a sweep's child nothing is drawn. Display only: the engine tells it
//! where the run is and never waits for it.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kb_format::Ps;

/// A spinner with the run's simulated time and records, or nothing.
#[derive(Debug)]
pub struct Progress(Option<ProgressBar>);

impl Progress {
    /// A spinner on stderr if it is a terminal and `quiet` is off.
    pub fn on_stderr(quiet: bool) -> Progress {
        if quiet || !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(10));
        bar.set_style(
            ProgressStyle::with_template("{spinner} kb-sim: simulating, {msg} ({elapsed})")
                .expect("valid template"),
        );
        bar.set_message("building the workload");
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress(Some(bar))
    }

    /// The run is at simulated time `now` with `records` made.
    pub fn update(&self, now: Ps, records: u64) {
        if let Some(b) = &self.0 {
            b.set_message(progress_text(now, records));
        }
    }

    /// Remove the spinner (before the summary or an error is printed).
    pub fn clear(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}

/// What the spinner says: times in ns, as every human-readable output.
fn progress_text(now: Ps, records: u64) -> String {
    format!("{:.3} ns simulated, {records} records", now as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_gives_ns_and_records() {
        assert_eq!(
            progress_text(12_345_678, 1_000_000),
            "12345.678 ns simulated, 1000000 records"
        );
    }

    #[test]
    fn quiet_draws_nothing() {
        let p = Progress::on_stderr(true);
        assert!(p.0.is_none());
        p.update(1, 2);
    }
}
