//! The progress bar of `timeline` and `export` on stderr (indicatif):
//! shown only when asked for, which the binary does when stderr is a
//! terminal; in a pipe or a file nothing is drawn. A bar over records
//! when the total is known (a file: its footer's record count), a spinner
//! otherwise (standard input). The binary clears it before its summary
//! line or an error ([`Progress::clear`]; dropping it clears it too).

use std::cell::Cell;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::Input;

/// Records between two updates of the bar (an update takes a lock).
const EVERY: u64 = 1 << 12;

/// A progress bar over records read, or nothing. A clone (what a pass
/// holds) draws on the same bar; dropping the original clears it.
#[derive(Debug)]
pub struct Progress {
    bar: Option<ProgressBar>,
    /// Records seen by this handle.
    records: Cell<u64>,
    /// The original, not a clone: clears the bar when dropped.
    owner: bool,
}

impl Clone for Progress {
    fn clone(&self) -> Progress {
        Progress {
            bar: self.bar.clone(),
            records: Cell::new(0),
            owner: false,
        }
    }
}

impl Progress {
    /// Nothing drawn.
    pub fn hidden() -> Progress {
        Progress {
            bar: None,
            records: Cell::new(0),
            owner: true,
        }
    }

    /// When `show`: a bar on stderr, `WHAT [bar] N/TOTAL records (rate,
    /// eta ETA)`, over `input`'s records when its footer gives their count
    /// (a file), else a spinner, `WHAT: N records (rate) ELAPSED`.
    pub fn new(show: bool, what: &str, input: &Input) -> Progress {
        if !show {
            return Progress::hidden();
        }
        let total = total_records(input);
        let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr_with_hz(10));
        bar.set_style(style(total.is_some()));
        bar.set_prefix(what.to_string());
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress {
            bar: Some(bar),
            records: Cell::new(0),
            owner: true,
        }
    }

    /// Whether anything is drawn.
    pub fn is_shown(&self) -> bool {
        self.bar.is_some()
    }

    /// One more record read.
    #[inline]
    pub fn record(&self) {
        let n = self.records.get() + 1;
        self.records.set(n);
        if n.is_multiple_of(EVERY)
            && let Some(b) = &self.bar
        {
            b.set_position(n);
        }
    }

    /// Records read so far (through this handle).
    pub fn records(&self) -> u64 {
        self.records.get()
    }

    /// The records are read: say what is being done now (`writing
    /// channels and counters`).
    pub fn message(&self, msg: &str) {
        if let Some(b) = &self.bar {
            b.set_position(self.records.get());
            b.set_message(msg.to_string());
        }
    }

    /// Remove the bar (before the summary or an error is printed).
    pub fn clear(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // A dropped bar would stay drawn: the original clears it (an
        // error returned past the binary's own `clear`).
        if self.owner {
            self.clear();
        }
    }
}

/// The bar's template: with a total, or a spinner.
fn style(total: bool) -> ProgressStyle {
    let t = if total {
        "{prefix} {bar:30} {human_pos}/{human_len} records ({per_sec}, eta {eta}) {msg}"
    } else {
        "{spinner} {prefix}: {human_pos} records ({per_sec}) {elapsed} {msg}"
    };
    ProgressStyle::with_template(t).expect("valid template")
}

/// A file's record count from its footer (none for standard input, a
/// pipe, or a file that does not open: the pass itself reports that).
pub fn total_records(input: &Input) -> Option<u64> {
    match input {
        Input::Path(p) if std::fs::metadata(p).is_ok_and(|m| m.is_file()) => {
            let m = kb_format::MmapTrace::open(p).ok()?;
            Some(m.footer().counts.records)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;

    #[test]
    fn a_bar_not_asked_for_is_hidden_and_still_counts() {
        let (_d, p) = testutil::write_temp(&testutil::sample_trace());
        let p = Progress::new(false, "timeline", &Input::Path(p));
        assert!(!p.is_shown());
        for _ in 0..5 {
            p.record();
        }
        assert_eq!(p.records(), 5);
        p.message("writing");
        p.clear();
        assert!(!Progress::hidden().is_shown());
    }

    #[test]
    fn the_total_is_the_footers_record_count() {
        let (_d, p) = testutil::write_temp(&testutil::sample_trace());
        assert_eq!(total_records(&Input::Path(p.clone())), Some(7));
        assert_eq!(total_records(&Input::Stdin), None);
        let missing = p.with_file_name("missing.kbt");
        assert_eq!(total_records(&Input::Path(missing)), None);
        // A shown bar (drawn to a hidden target here: stderr is not a
        // terminal under test, so indicatif draws nothing) has the total.
        let bar = Progress::new(true, "timeline", &Input::Path(p));
        assert!(bar.is_shown());
        assert_eq!(bar.bar.as_ref().unwrap().length(), Some(7));
        bar.clear();
    }
}
