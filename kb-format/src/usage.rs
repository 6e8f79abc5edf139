//! Utilisation: the one definition every tool uses (`kb-sim sweep`,
//! `kb-inspect stats`, `timeline`, `summary`).
//!
//! - A unit's **busy** time is the time it computes or transfers: the
//!   length of the union of its records' active intervals
//!   ([`Record::active`], or the whole span `[t_start, t_end)` where a
//!   record has none).
//! - Sync records ([`OpKind::Sync`]: kernels, waits, signals, launches,
//!   map messages) are never busy: they say when something waited or
//!   was in flight, not that a unit worked.
//! - Its **held** time is the time it holds work: the length of the union
//!   of its records' spans `[t_start, t_end)` (operand streaming, setup
//!   and waiting for a producer included). Busy <= held.
//! - Both are clipped to a **window**, the kernel window: from the first
//!   launch's start to the last launch's end among the launches asked
//!   about ([`kernel_window`]), never the whole run (host upload and
//!   download are not kernel time).
//! - **Utilisation** = busy / (units x window length); **held
//!   utilisation** = held / (units x window length).
//!
//! [`UnitTime`] accumulates one unit's (one component's) records, given
//! in t_start order as traces hold them. Their active intervals are not
//! in start order (a DMA engine with several transfers in flight starts
//! them in order but moves their bytes later), so it keeps the union as a
//! small sorted set of merged intervals and finalises every interval that
//! ends at or before the current record's t_start: nothing later can
//! touch it, since every active interval starts at or after its record's
//! t_start. Memory is bounded by the intervals still open (the unit's
//! work in flight), except when the window is only known at the end (a
//! stream whose launches come after its records, [`UnitTime::deferred`]):
//! then the finalised intervals are kept, merged, until the window is
//! known, and memory grows with the number of disjoint intervals.

use crate::launch::Launch;
use crate::types::{OpKind, Ps, Record};

/// The part of `r`'s span during which its unit computes or transfers:
/// its active interval, or the whole span `[t_start, t_end)` where it has
/// none; empty for a sync record. Clamped to the span (readers refuse
/// anything else; this keeps a hand-built record from counting time
/// outside its span).
pub fn active(r: &Record) -> (Ps, Ps) {
    if r.kind == OpKind::Sync {
        return (r.t_start, r.t_start);
    }
    let t1 = r.t_end.max(r.t_start);
    match r.active {
        Some((a0, a1)) => {
            let a0 = a0.clamp(r.t_start, t1);
            (a0, a1.clamp(a0, t1))
        }
        None => (r.t_start, t1),
    }
}

/// The kernel window of `launches`: the first one's start to the last
/// one's end; `None` without launches.
pub fn kernel_window<'a>(launches: impl IntoIterator<Item = &'a Launch>) -> Option<(Ps, Ps)> {
    launches.into_iter().fold(None, |w, l| {
        Some(match w {
            None => (l.t_start, l.t_end.max(l.t_start)),
            Some((a, b)) => (a.min(l.t_start), b.max(l.t_end)),
        })
    })
}

/// `time / (units x (w1 - w0))`; `None` for an empty window or no units.
pub fn utilisation(time: Ps, units: u64, (w0, w1): (Ps, Ps)) -> Option<f64> {
    let len = w1.saturating_sub(w0);
    (units > 0 && len > 0).then(|| time as f64 / (units as f64 * len as f64))
}

/// The unit kind of a component or node name: the name less its leading
/// `sipN.`, `cubeN.`, `peN.` coordinates (`sip0.cube1.pe3.pe_dma` ->
/// `pe_dma`, `sip0.cube1.hbm_ctrl` -> `hbm_ctrl`, `host` -> `host`).
pub fn unit_kind(name: &str) -> &str {
    let mut rest = name;
    for prefix in ["sip", "cube", "pe"] {
        if let Some((seg, tail)) = rest.split_once('.')
            && seg
                .strip_prefix(prefix)
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        {
            rest = tail;
        }
    }
    rest
}

/// Busy and held time of one unit (or one group of records) in a window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Length of the union of the active intervals, within the window.
    pub busy: Ps,
    /// Length of the union of the spans, within the window.
    pub held: Ps,
}

/// Where finalised intervals go.
#[derive(Debug, Clone)]
enum Sink {
    /// The window is known: add each interval's part in it.
    Fold { window: (Ps, Ps), total: Ps },
    /// The window comes at the end: keep the intervals (disjoint, in
    /// order, touching ones merged).
    Keep(Vec<(Ps, Ps)>),
}

impl Sink {
    fn push(&mut self, (s, e): (Ps, Ps)) {
        match self {
            Sink::Fold {
                window: (w0, w1),
                total,
            } => *total += e.min(*w1).saturating_sub(s.max(*w0)),
            Sink::Keep(v) => match v.last_mut() {
                Some(last) if last.1 >= s => last.1 = last.1.max(e),
                _ => v.push((s, e)),
            },
        }
    }

    fn total(&self, (w0, w1): (Ps, Ps)) -> Ps {
        match self {
            Sink::Fold { total, .. } => *total,
            Sink::Keep(v) => v
                .iter()
                .map(|&(s, e)| e.min(w1).saturating_sub(s.max(w0)))
                .sum(),
        }
    }
}

/// The union of intervals that may arrive out of start order, as long as
/// none starts before the last [`Intervals::settle`] frontier: merged
/// intervals are handed out, final, once they end at or before it (what
/// [`UnitTime`] and the timeline's utilisation counters build on).
#[derive(Debug, Clone, Default)]
pub struct Intervals {
    /// Merged, disjoint, non-empty intervals not yet final, sorted by
    /// start (so by end too).
    open: Vec<(Ps, Ps)>,
}

impl Intervals {
    /// Add `[a, b)` (nothing if empty); `a` must not be before the last
    /// settle frontier.
    pub fn insert(&mut self, a: Ps, b: Ps) {
        if b <= a {
            return;
        }
        // The first open interval that reaches `a`, and every one after it
        // that starts by `b`, merge with [a, b).
        let i = self.open.partition_point(|&(_, e)| e < a);
        let (mut s, mut e) = (a, b);
        let mut j = i;
        while let Some(&(s2, e2)) = self.open.get(j)
            && s2 <= b
        {
            s = s.min(s2);
            e = e.max(e2);
            j += 1;
        }
        self.open.splice(i..j, [(s, e)]);
    }

    /// Hand `f` the merged intervals that end at or before `frontier`, in
    /// order: no later insert can touch them.
    pub fn settle(&mut self, frontier: Ps, mut f: impl FnMut(Ps, Ps)) {
        let n = self.open.partition_point(|&(_, e)| e <= frontier);
        for (s, e) in self.open.drain(..n) {
            f(s, e);
        }
    }
}

/// [`Intervals`] whose final intervals go to a [`Sink`].
#[derive(Debug, Clone)]
struct Union {
    open: Intervals,
    sink: Sink,
}

impl Union {
    fn new(sink: Sink) -> Union {
        Union {
            open: Intervals::default(),
            sink,
        }
    }

    fn insert(&mut self, a: Ps, b: Ps) {
        self.open.insert(a, b);
    }

    fn settle(&mut self, frontier: Ps) {
        let sink = &mut self.sink;
        self.open.settle(frontier, |s, e| sink.push((s, e)));
    }

    fn total(&mut self, window: (Ps, Ps)) -> Ps {
        self.settle(Ps::MAX);
        self.sink.total(window)
    }
}

/// Busy and held time of one unit's records, in t_start order, clipped to
/// a window (module doc). Records of several units may be added too (a
/// group of ops): the unions are then over the group.
#[derive(Debug, Clone)]
pub struct UnitTime {
    busy: Union,
    held: Union,
    /// Records added.
    pub count: u64,
}

impl UnitTime {
    /// An accumulator for the window `[w0, w1)`, known now: memory bounded
    /// by the intervals still open.
    pub fn new((w0, w1): (Ps, Ps)) -> UnitTime {
        let sink = Sink::Fold {
            window: (w0, w1.max(w0)),
            total: 0,
        };
        UnitTime {
            busy: Union::new(sink.clone()),
            held: Union::new(sink),
            count: 0,
        }
    }

    /// An accumulator whose window is given to [`Self::finish`]: it keeps
    /// the merged intervals until then, so its memory grows with the
    /// number of disjoint intervals.
    pub fn deferred() -> UnitTime {
        UnitTime {
            busy: Union::new(Sink::Keep(Vec::new())),
            held: Union::new(Sink::Keep(Vec::new())),
            count: 0,
        }
    }

    /// Add a record; records must come in t_start order.
    pub fn add(&mut self, r: &Record) {
        let (a0, a1) = active(r);
        self.add_span(r.t_start, r.t_end, (a0, a1));
    }

    /// Add a span `[t_start, t_end)` whose unit was active during
    /// `active` (within the span); spans must come in t_start order.
    pub fn add_span(&mut self, t_start: Ps, t_end: Ps, active: (Ps, Ps)) {
        self.count += 1;
        // Every later span and active interval starts at or after t_start.
        self.busy.settle(t_start);
        self.held.settle(t_start);
        self.held.insert(t_start, t_end);
        self.busy.insert(active.0, active.1);
    }

    /// Busy and held time within `window`: for [`Self::new`] the window
    /// given there (intervals already finalised were clipped to it), for
    /// [`Self::deferred`] this one.
    pub fn finish(&mut self, window: (Ps, Ps)) -> Totals {
        let window = (window.0, window.1.max(window.0));
        Totals {
            busy: self.busy.total(window),
            held: self.held.total(window),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(t_start: Ps, t_end: Ps, active: Option<(Ps, Ps)>) -> Record {
        Record {
            t_start,
            t_end,
            active,
            ..Record::default()
        }
    }

    /// Both modes over the same records and window.
    fn both(recs: &[Record], window: (Ps, Ps)) -> Totals {
        let mut a = UnitTime::new(window);
        let mut b = UnitTime::deferred();
        for r in recs {
            a.add(r);
            b.add(r);
        }
        let (ta, tb) = (a.finish(window), b.finish(window));
        assert_eq!(ta, tb, "fold and keep modes agree");
        assert_eq!(a.count, recs.len() as u64);
        ta
    }

    const ALL: (Ps, Ps) = (0, Ps::MAX);

    #[test]
    fn records_without_an_active_interval_are_busy_all_their_span() {
        // Spans [0,10) [5,20) [20,25) [30,31) [30,30): union 0..25 and
        // 30..31 = 26, busy the same.
        let recs = [
            rec(0, 10, None),
            rec(5, 20, None),
            rec(20, 25, None),
            rec(30, 31, None),
            rec(30, 30, None),
        ];
        assert_eq!(both(&recs, ALL), Totals { busy: 26, held: 26 });
    }

    #[test]
    fn overlapping_active_intervals_count_once() {
        // Spans [0,100) and [10,60): held 100. Active [20,50) and
        // [40,60): union [20,60) = 40.
        let recs = [rec(0, 100, Some((20, 50))), rec(10, 60, Some((40, 60)))];
        assert_eq!(
            both(&recs, ALL),
            Totals {
                busy: 40,
                held: 100
            }
        );
    }

    #[test]
    fn active_intervals_out_of_start_order() {
        // A DMA engine: transfers issued at 0, 10, 20, 30, each moving its
        // bytes later and out of order:
        //   op0 [0,100)  active [70,90)
        //   op1 [10,60)  active [30,40)
        //   op2 [20,50)  active [45,50)
        //   op3 [30,200) active [95,120)
        //   op4 [150,160) active [150,155)  (after op1 and op2 ended)
        //   op5 [165,170) active [165,170)
        // Active union: [30,40) 10 + [45,50) 5 + [70,90) 20 + [95,120) 25
        // + [150,155) 5 + [165,170) 5 = 70. Held: [0,200) = 200.
        let recs = [
            rec(0, 100, Some((70, 90))),
            rec(10, 60, Some((30, 40))),
            rec(20, 50, Some((45, 50))),
            rec(30, 200, Some((95, 120))),
            rec(150, 160, Some((150, 155))),
            rec(165, 170, Some((165, 170))),
        ];
        assert_eq!(
            both(&recs, ALL),
            Totals {
                busy: 70,
                held: 200
            }
        );
        // An interval bridging two open ones merges them: [30,40) and
        // [45,50) joined by [35,47) -> [30,50) = 20.
        let recs = [
            rec(0, 100, Some((30, 40))),
            rec(10, 100, Some((45, 50))),
            rec(20, 100, Some((35, 47))),
        ];
        assert_eq!(
            both(&recs, ALL),
            Totals {
                busy: 20,
                held: 100
            }
        );
    }

    #[test]
    fn the_window_clips_both() {
        // Spans [0,100) active [20,50), [80,150) active [90,140),
        // [200,300) active [250,260). Window [30,120):
        // busy [30,50) 20 + [90,120) 30 = 50; held [30,120) = 90.
        let recs = [
            rec(0, 100, Some((20, 50))),
            rec(80, 150, Some((90, 140))),
            rec(200, 300, Some((250, 260))),
        ];
        assert_eq!(both(&recs, (30, 120)), Totals { busy: 50, held: 90 });
        // A window past everything, and an empty one.
        assert_eq!(both(&recs, (400, 500)), Totals::default());
        assert_eq!(both(&recs, (60, 60)), Totals::default());
        // Whole: busy 30 + 50 + 10, held 150 + 100.
        assert_eq!(
            both(&recs, ALL),
            Totals {
                busy: 90,
                held: 250
            }
        );
    }

    #[test]
    fn mixed_records_with_and_without_intervals() {
        // [0,40) all active; [10,100) active [60,70); [50,55) all active.
        // Busy [0,40) 40 + [50,55) 5 + [60,70) 10 = 55; held [0,100).
        let recs = [
            rec(0, 40, None),
            rec(10, 100, Some((60, 70))),
            rec(50, 55, None),
        ];
        assert_eq!(
            both(&recs, ALL),
            Totals {
                busy: 55,
                held: 100
            }
        );
    }

    #[test]
    fn active_is_the_interval_or_the_span_clamped() {
        assert_eq!(active(&rec(10, 20, None)), (10, 20));
        assert_eq!(active(&rec(10, 20, Some((12, 15)))), (12, 15));
        // Hand-built records outside the rules stay within their span.
        assert_eq!(active(&rec(10, 20, Some((5, 25)))), (10, 20));
        assert_eq!(active(&rec(10, 20, Some((15, 12)))), (15, 15));
        assert_eq!(active(&rec(10, 5, None)), (10, 10));
    }

    #[test]
    fn windows_units_and_kinds() {
        let l = |t_start, t_end| Launch {
            kernel: "k".into(),
            grid: [1, 1, 1],
            pes: vec![[0, 0, 0]],
            t_start,
            t_end,
            flops: 0,
            useful_flops: 0,
        };
        assert_eq!(kernel_window(&[]), None);
        assert_eq!(
            kernel_window(&[l(500, 900), l(100, 300), l(950, 1200)]),
            Some((100, 1200))
        );
        assert_eq!(utilisation(50, 2, (100, 200)), Some(0.25));
        assert_eq!(utilisation(50, 0, (100, 200)), None);
        assert_eq!(utilisation(50, 2, (100, 100)), None);
        assert_eq!(unit_kind("sip0.cube1.pe3.pe_dma"), "pe_dma");
        assert_eq!(unit_kind("sip0.cube1.hbm_ctrl"), "hbm_ctrl");
        assert_eq!(unit_kind("sip1.io_cpu"), "io_cpu");
        assert_eq!(unit_kind("host"), "host");
    }
}
