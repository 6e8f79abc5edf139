//! The progress bar on stderr (indicatif): shown only when asked for,
//! which the binary does when stderr is a terminal and `--quiet` is off;
//! in a pipe or a file nothing is drawn.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A progress bar over records read, or nothing.
#[derive(Debug)]
pub struct Progress(Option<ProgressBar>);

impl Progress {
    /// Nothing drawn.
    pub fn hidden() -> Progress {
        Progress(None)
    }

    /// A bar on stderr when `show` (a spinner until [`Progress::set_total`]).
    pub fn new(show: bool) -> Progress {
        if !show {
            return Progress::hidden();
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(10));
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} replaying {human_pos} records ({per_sec}) {elapsed} {msg}",
            )
            .expect("valid template"),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress(Some(bar))
    }

    /// A spinner on stderr when `show`, for the verification that follows
    /// the replay (its f64 references can take longer than the replay).
    pub fn verifying(show: bool) -> Progress {
        if !show {
            return Progress::hidden();
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(10));
        bar.set_style(
            ProgressStyle::with_template("{spinner} verifying: {msg} ({elapsed})")
                .expect("valid template"),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress(Some(bar))
    }

    /// Say what is being done now.
    pub fn message(&self, msg: String) {
        if let Some(b) = &self.0 {
            b.set_message(msg);
        }
    }

    /// Whether anything is drawn.
    pub fn is_shown(&self) -> bool {
        self.0.is_some()
    }

    /// The trace's record count, when known (a file's footer).
    pub fn set_total(&self, records: u64) {
        if let Some(b) = &self.0 {
            b.set_length(records);
            b.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {human_pos}/{human_len} records ({per_sec}, eta {eta}) {msg}",
                )
                .expect("valid template"),
            );
        }
    }

    /// Records read so far, and how many are held waiting.
    pub fn update(&self, records: u64, pending: u64) {
        if let Some(b) = &self.0 {
            b.set_position(records);
            b.set_message(format!("{pending} held"));
        }
    }

    /// Remove the bar (before the summary or an error is printed).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hidden_bar_does_nothing() {
        let p = Progress::new(false);
        assert!(!p.is_shown());
        p.set_total(10);
        p.update(5, 1);
        p.clear();
    }
}
