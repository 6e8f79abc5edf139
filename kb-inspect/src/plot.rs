//! `plot`: SVG charts (the `plotters` crate, its SVG backend only) of
//! what people would rather look at than read:
//!
//! - **a trace**: utilisation over time per unit kind (`pe_dma`,
//!   `pe_gemm`, `pe_math`, `hbm_ctrl`, ...): in each of up to
//!   [`crate::timeline::BINS`] time bins, the busy fraction of that kind's
//!   units (the union of each unit's active intervals, the time it
//!   computes or transfers as `kb_format::usage` defines busy, over the
//!   units of that kind that have ops x the bin width);
//! - **a sweep table** (`.parquet` or `.csv`, as `kb-sim sweep` writes):
//!   a metric (`--y`, default `sim_ns`) against a swept column (`--x`,
//!   default the first swept one), one line per combination of the other
//!   swept columns' values.
//!
//! The chart is written atomically (a temporary file renamed into place).

use std::collections::BTreeMap;
use std::path::Path;

use kb_format::{Record, Strings};
use kb_table::{Table, Values};
use plotters::element::DashedPathElement;
use plotters::prelude::*;

use crate::columns::Places;
use crate::render::natural_cmp;
use crate::source::{self, End, Flow, Input, Visitor};
use crate::timeline::Bins;
use crate::{Error, Result};

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// How an axis maps values to positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scale {
    /// Logarithmic when the axis' values are at least three distinct
    /// powers of two (16, 32, 64: a doubling sweep), else linear.
    #[default]
    Auto,
    /// Linear.
    Lin,
    /// Logarithmic (base 2): a value that is not positive is left out.
    Log,
}

/// A chart: title, axis labels, lines.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub lines: Vec<Line>,
    /// Rows left out because x or y is not finite (`inf`, `NaN`): an
    /// axis cannot reach them (plotters looped forever on one).
    pub skipped: usize,
    /// A text x column's values: x is their index, ticked by name.
    pub categories: Vec<String>,
    /// Whether each axis is logarithmic ([`Scale`] resolved).
    pub x_log: bool,
    pub y_log: bool,
    /// Points left out because a log axis cannot place them (x or y
    /// zero or negative).
    pub not_positive: usize,
    /// Whether a line joins its points (a roofline shows markers only).
    pub joined: bool,
    /// Reference lines (a roofline's ceilings): dashed, grey, in the
    /// legend after the data lines.
    pub ceilings: Vec<Line>,
}

impl Chart {
    /// A chart of `lines`, linear axes, lines joined, nothing skipped.
    pub fn new(title: String, x_label: String, y_label: String, lines: Vec<Line>) -> Chart {
        Chart {
            title,
            x_label,
            y_label,
            lines,
            skipped: 0,
            categories: Vec::new(),
            x_log: false,
            y_log: false,
            not_positive: 0,
            joined: true,
            ceilings: Vec::new(),
        }
    }

    /// Resolve the axes' scales: `Auto` is log where the values are
    /// [`powers_of_two`] (never on a categorical x); points a log axis
    /// cannot place are left out and counted in `not_positive`.
    pub fn scale(&mut self, x: Scale, y: Scale) -> Result<()> {
        if !self.categories.is_empty() && x == Scale::Log {
            return Err(Error::usage(format!(
                "--x-scale log: x ({}) is a text column, drawn by category",
                self.x_label
            )));
        }
        let pts = || self.lines.iter().flat_map(|l| l.points.iter());
        self.x_log = match x {
            Scale::Auto => self.categories.is_empty() && powers_of_two(pts().map(|p| p.0)),
            Scale::Lin => false,
            Scale::Log => true,
        };
        self.y_log = match y {
            Scale::Auto => powers_of_two(pts().map(|p| p.1)),
            Scale::Lin => false,
            Scale::Log => true,
        };
        let (xl, yl) = (self.x_log, self.y_log);
        for l in &mut self.lines {
            let before = l.points.len();
            l.points
                .retain(|&(x, y)| (!xl || x > 0.0) && (!yl || y > 0.0));
            self.not_positive += before - l.points.len();
        }
        self.lines.retain(|l| !l.points.is_empty());
        for l in &mut self.ceilings {
            l.points
                .retain(|&(x, y)| (!xl || x > 0.0) && (!yl || y > 0.0));
        }
        Ok(())
    }
}

/// Whether `values` are at least three distinct powers of two (1/2, 1,
/// 2, 4, ...): a doubling sweep, evenly spaced on a log axis.
pub fn powers_of_two(values: impl Iterator<Item = f64>) -> bool {
    let mut seen = std::collections::BTreeSet::new();
    for v in values {
        let e = v.log2();
        if !(v > 0.0 && e.is_finite() && e == e.round()) {
            return false;
        }
        seen.insert(e as i64);
    }
    seen.len() >= 3
}

/// A tick label: whole numbers without a point (`100000`, not
/// `100000.0`), others to 4 significant digits, trailing zeros dropped.
pub fn tick(v: f64) -> String {
    if v == v.trunc() && v.abs() < 1e15 {
        return format!("{}", v as i64);
    }
    let digits = (3 - v.abs().log10().floor() as i32).clamp(0, 12) as usize;
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// An axis label for a table column: its name and, from its suffix, its
/// unit (`kernel_ns` -> `kernel_ns (ns)`, `achieved_gbs` -> `(GB/s)`).
pub fn axis_label(column: &str) -> String {
    let unit = [
        ("_ns", "ns"),
        ("_gbs", "GB/s"),
        ("_gflops", "GFLOP/s"),
        ("_util", "fraction of the units' time"),
        ("_s", "s"),
        ("bytes", "bytes"),
        ("flops", "FLOPs"),
        ("intensity", "FLOPs per byte"),
    ]
    .iter()
    .find(|(suffix, _)| column.ends_with(suffix))
    .map(|(_, u)| *u);
    match unit {
        Some(u) => format!("{column} ({u})"),
        None => column.to_string(),
    }
}

/// Line colours: the Okabe-Ito palette (told apart with the common
/// colour-vision deficiencies), its yellow left out (unreadable on white).
pub const PALETTE: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(213, 94, 0),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
];

/// Line `i`'s marker: its palette colour, filled in the palette's first
/// round, hollow (a ring) in the next, and so on: past seven lines a
/// colour repeats, its marker does not.
pub fn marker(i: usize) -> (ShapeStyle, u32) {
    let color = PALETTE[i % PALETTE.len()].to_rgba();
    if (i / PALETTE.len()).is_multiple_of(2) {
        (color.filled(), 3)
    } else {
        (color.stroke_width(2), 4)
    }
}

/// Chart size in pixels.
pub const WIDTH: u32 = 960;
pub const HEIGHT: u32 = 540;

/// The colour of a chart's ceilings (reference lines).
pub const CEILING: RGBColor = RGBColor(110, 110, 110);

/// Legend rows: their height, and the legend's font size, in pixels.
const LEGEND_ROW: i32 = 20;
const LEGEND_FONT: i32 = 13;

/// The legend's width in pixels: enough for its longest name at about 7
/// pixels a character, within [140, 320] (a longer name is cut).
pub fn legend_width(c: &Chart) -> u32 {
    let longest = c
        .lines
        .iter()
        .chain(&c.ceilings)
        .map(|l| l.name.chars().count())
        .max();
    match longest {
        None => 0,
        Some(n) => (n as u32 * 7 + 52).clamp(140, 320),
    }
}

/// `name` cut to `max` characters (an ellipsis marks the cut).
fn fit(name: &str, max: usize) -> String {
    if name.chars().count() <= max {
        return name.to_string();
    }
    let mut s: String = name.chars().take(max.saturating_sub(1)).collect();
    s.push('\u{2026}');
    s
}

/// A log axis' tick: the value at `v` (a power of two), only at whole
/// exponents unless the axis spans less than two doublings.
fn log_tick(v: f64, span: f64) -> String {
    if v == v.round() || span < 2.0 {
        tick(v.exp2())
    } else {
        String::new()
    }
}

/// Render `c` as SVG text: the plot area on the left, the legend (data
/// lines, then ceilings) beside it on the right, outside the data.
pub fn svg(c: &Chart) -> Result<String> {
    let err = |e: &dyn std::fmt::Display| Error::usage(format!("drawing the chart: {e}"));
    let fx = |x: f64| if c.x_log { x.log2() } else { x };
    let fy = |y: f64| if c.y_log { y.log2() } else { y };
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let area = root
            .titled(&c.title, ("sans-serif", 22))
            .map_err(|e| err(&e))?;
        let legend_w = legend_width(c);
        let (plot, legend) = area.split_horizontally(WIDTH - legend_w);
        let finite = |l: &Line| -> Vec<(f64, f64)> {
            l.points
                .iter()
                .map(|&(x, y)| (fx(x), fy(y)))
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect()
        };
        let (mut x0, mut x1) = (f64::INFINITY, f64::NEG_INFINITY);
        let (mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY);
        for (x, y) in c.lines.iter().chain(&c.ceilings).flat_map(finite) {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if !x0.is_finite() {
            (x0, x1) = (0.0, 1.0);
        }
        if !c.categories.is_empty() {
            // Categories sit half a step in from the edges.
            (x0, x1) = (-0.5, c.categories.len() as f64 - 0.5);
        } else if c.x_log {
            // Markers at the ends stay whole.
            let pad = ((x1 - x0) * 0.04).max(0.1);
            (x0, x1) = (x0 - pad, x1 + pad);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        if !y0.is_finite() {
            (y0, y1) = (0.0, 1.0);
        }
        if c.y_log {
            let pad = ((y1 - y0) * 0.05).max(0.1);
            (y0, y1) = (y0 - pad, y1 + pad);
        } else {
            (y0, y1) = (0.0, y1.max(0.0) * 1.05);
            if y1 <= 0.0 {
                y1 = 1.0;
            }
        }
        let (x_span, y_span) = (x1 - x0, y1 - y0);
        let mut chart = ChartBuilder::on(&plot)
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(72)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(c.x_label.as_str())
            .y_desc(c.y_label.as_str())
            .x_label_formatter(&|v| {
                if !c.categories.is_empty() {
                    if v.fract() == 0.0 && *v >= 0.0 {
                        c.categories.get(*v as usize).cloned().unwrap_or_default()
                    } else {
                        String::new()
                    }
                } else if c.x_log {
                    log_tick(*v, x_span)
                } else {
                    tick(*v)
                }
            })
            .y_label_formatter(&|v| {
                if c.y_log {
                    log_tick(*v, y_span)
                } else {
                    tick(*v)
                }
            })
            .draw()
            .map_err(|e| err(&e))?;
        for l in &c.ceilings {
            chart
                .draw_series(DashedLineSeries::new(
                    finite(l),
                    8,
                    5,
                    CEILING.stroke_width(2),
                ))
                .map_err(|e| err(&e))?;
        }
        for (i, l) in c.lines.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()].to_rgba();
            if c.joined {
                chart
                    .draw_series(LineSeries::new(finite(l), color.stroke_width(2)))
                    .map_err(|e| err(&e))?;
            }
            // A marker on every point: values are where the data is, the
            // lines only join them.
            let (style, r) = marker(i);
            chart
                .draw_series(finite(l).into_iter().map(|p| Circle::new(p, r, style)))
                .map_err(|e| err(&e))?;
        }
        // The legend, beside the plot: a row per line, a sample of its
        // line and marker, then its name; rows that do not fit are counted.
        let rows = ((HEIGHT as i32 - 80) / LEGEND_ROW).max(1) as usize;
        let entries: Vec<(&Line, Option<usize>)> = c
            .lines
            .iter()
            .enumerate()
            .map(|(i, l)| (l, Some(i)))
            .chain(c.ceilings.iter().map(|l| (l, None)))
            .collect();
        let max_chars = (legend_w.saturating_sub(52) / 7) as usize;
        let style = ("sans-serif", LEGEND_FONT).into_font().color(&BLACK);
        for (row, (l, color)) in entries.iter().enumerate() {
            let y = 32 + row as i32 * LEGEND_ROW;
            if row + 1 == rows && entries.len() > rows {
                let more = format!("... {} more", entries.len() - row);
                legend
                    .draw(&Text::new(more, (8, y - LEGEND_FONT / 2), style.clone()))
                    .map_err(|e| err(&e))?;
                break;
            }
            match color {
                Some(i) => {
                    let col = PALETTE[i % PALETTE.len()];
                    if c.joined {
                        legend
                            .draw(&PathElement::new(
                                vec![(8, y), (32, y)],
                                col.stroke_width(2),
                            ))
                            .map_err(|e| err(&e))?;
                    }
                    legend
                        .draw(&{
                            let (style, r) = marker(*i);
                            Circle::new((20, y), r, style)
                        })
                        .map_err(|e| err(&e))?;
                }
                None => legend
                    .draw(&DashedPathElement::new(
                        vec![(8, y), (32, y)],
                        8,
                        5,
                        CEILING.stroke_width(2),
                    ))
                    .map_err(|e| err(&e))?,
            }
            legend
                .draw(&Text::new(
                    fit(&l.name, max_chars),
                    (40, y - LEGEND_FONT / 2),
                    style.clone(),
                ))
                .map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))?;
    }
    Ok(out)
}

/// Per unit kind: busy time per bin (a visitor over records).
struct Util {
    bins: Bins,
    places: Places,
    /// Per component: its series and its active intervals not yet final
    /// (busy is their union: `kb_format::usage`).
    comps: Vec<Option<(usize, kb_format::usage::Intervals)>>,
    /// Unit kind -> (series, units with ops).
    kinds: BTreeMap<String, (usize, u64)>,
    end: u64,
}

impl Visitor for Util {
    fn record(&mut self, r: &Record, s: &Strings) -> Result<Flow> {
        let i = r.component as usize;
        if i >= self.comps.len() {
            self.comps.resize(i + 1, None);
        }
        if self.comps[i].is_none() {
            let unit = self.places.get(r.component, s).unit.clone();
            let k = match self.kinds.get_mut(&unit) {
                Some(e) => {
                    e.1 += 1;
                    e.0
                }
                None => {
                    let k = self.bins.push();
                    self.kinds.insert(unit, (k, 1));
                    k
                }
            };
            self.comps[i] = Some((k, Default::default()));
        }
        let (k, busy) = self.comps[i].as_mut().expect("set");
        let (k, bins) = (*k, &mut self.bins);
        busy.settle(r.t_start, |a, b| bins.add(k, a, b, (b - a) as f64));
        let (a0, a1) = kb_format::usage::active(r);
        busy.insert(a0, a1);
        self.end = self.end.max(r.t_end);
        Ok(Flow::Continue)
    }

    fn end(&mut self, _: &End<'_>) -> Result<()> {
        self.bins.fit(self.end);
        let bins = &mut self.bins;
        for (k, busy) in self.comps.iter_mut().flatten() {
            let k = *k;
            busy.settle(u64::MAX, |a, b| bins.add(k, a, b, (b - a) as f64));
        }
        Ok(())
    }
}

/// Utilisation over time per unit kind of a trace.
pub fn utilisation(input: &Input) -> Result<Chart> {
    let mut u = Util {
        bins: Bins::new(),
        places: Places::default(),
        comps: Vec::new(),
        kinds: BTreeMap::new(),
        end: 0,
    };
    source::visit(input, &mut u)?;
    let width = u.bins.width as f64;
    let last = ((u.end as f64 / width).ceil() as usize).clamp(1, crate::timeline::BINS);
    let mut kinds: Vec<(&String, &(usize, u64))> = u.kinds.iter().collect();
    kinds.sort_by(|a, b| natural_cmp(a.0, b.0));
    let lines = kinds
        .into_iter()
        .map(|(name, &(k, n))| Line {
            name: format!("{name} ({n} unit{})", if n == 1 { "" } else { "s" }),
            points: (0..last)
                .map(|i| {
                    let t_ns = (i as f64 + 0.5) * width / 1000.0;
                    (t_ns, u.bins.series[k].bins[i] / (width * n as f64) * 100.0)
                })
                .collect(),
        })
        .collect();
    Ok(Chart::new(
        format!("Utilisation per unit kind: {input}"),
        format!("simulated time (ns; bins of {} ns)", width / 1000.0),
        "busy units (%)".into(),
        lines,
    ))
}

/// Columns a sweep table has beside its swept ones.
const RESULT_COLUMNS: &[&str] = &[
    "status",
    "sim_ns",
    "kernel_start_ns",
    "kernel_ns",
    "records",
    "bytes",
    "kernel_bytes",
    "achieved_gbs",
    "flops",
    "useful_flops",
    "achieved_gflops",
    "executed_gflops",
    "verdict",
    "trace",
    "wall_s",
];

/// The swept columns of a sweep table: between `point` and `status`.
pub fn swept_columns(t: &Table) -> Vec<String> {
    t.columns
        .iter()
        .map(|c| c.name.clone())
        .skip_while(|n| n == "point")
        .take_while(|n| !RESULT_COLUMNS.contains(&n.as_str()))
        .collect()
}

/// `y` against `x` from a sweep table, a line per combination of the
/// other swept columns.
pub fn sweep_chart(t: &Table, name: &str, x: Option<&str>, y: &str) -> Result<Chart> {
    let swept = swept_columns(t);
    let x = match x {
        Some(x) => x.to_string(),
        None => swept.first().cloned().ok_or_else(|| {
            Error::usage(format!(
                "{name}: no swept column (columns: {}); name one with --x",
                t.describe()
            ))
        })?,
    };
    let col = |n: &str| {
        t.column(n).ok_or_else(|| {
            Error::usage(format!(
                "{name}: no column {n:?} (columns: {})",
                t.describe()
            ))
        })
    };
    let xc = col(&x)?;
    let yc = col(y)?;
    if matches!(yc.values, Values::Str(_)) {
        return Err(Error::usage(format!("{name}: column {y} is not numeric")));
    }
    // The legend names only the swept columns that vary: one value for
    // every row says nothing about a line.
    let others: Vec<String> = swept
        .iter()
        .filter(|c| **c != x)
        .filter(|c| {
            let v = &t.column(c).expect("listed").values;
            (1..t.rows()).any(|i| v.text(i) != v.text(0))
        })
        .cloned()
        .collect();
    let mut lines: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let xs_numeric = !matches!(xc.values, Values::Str(_));
    let mut x_names: Vec<String> = Vec::new();
    let mut skipped = 0;
    for i in 0..t.rows() {
        let key = others
            .iter()
            .map(|o| format!("{o}={}", t.column(o).expect("listed").values.text(i)))
            .collect::<Vec<_>>()
            .join(" ");
        let xv = if xs_numeric {
            xc.values.f64(i)
        } else {
            let s = xc.values.text(i);
            let j = x_names.iter().position(|n| *n == s).unwrap_or_else(|| {
                x_names.push(s);
                x_names.len() - 1
            });
            Some(j as f64)
        };
        let (Some(xv), Some(yv)) = (xv, yc.values.f64(i)) else {
            continue; // a failed point has no metrics
        };
        if !xv.is_finite() || !yv.is_finite() {
            skipped += 1;
            continue;
        }
        if !lines.contains_key(&key) {
            order.push(key.clone());
        }
        lines.entry(key).or_default().push((xv, yv));
    }
    let lines = order
        .into_iter()
        .map(|k| {
            let mut points = lines.remove(&k).unwrap_or_default();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Line {
                name: if k.is_empty() { y.to_string() } else { k },
                points,
            }
        })
        .collect();
    let mut c = Chart::new(
        format!("{y} against {x}: {name}"),
        axis_label(&x),
        axis_label(y),
        lines,
    );
    c.skipped = skipped;
    if !xs_numeric {
        c.categories = x_names;
    }
    Ok(c)
}

/// The dtypes of a sweep table's peak columns (`peak_gemm_gflops_f16`).
pub const PEAK_DTYPES: [&str; 4] = ["f32", "f16", "bf16", "i8"];

/// The distinct finite, positive values of column `name` (ascending).
fn distinct(t: &Table, name: &str) -> Vec<f64> {
    let Some(c) = t.column(name) else {
        return Vec::new();
    };
    let mut v: Vec<f64> = (0..t.rows())
        .filter_map(|i| c.values.f64(i))
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    v.sort_by(f64::total_cmp);
    v.dedup();
    v
}

/// A roofline of a sweep table: achieved GFLOP/s (`achieved_gflops`:
/// useful FLOPs per kernel ns) against `arithmetic_intensity` (useful
/// FLOPs per kernel byte), a marker per point (grouped as
/// [`sweep_chart`] groups lines), under the machine's ceilings read from
/// the table: a flat line per distinct compute peak
/// (`peak_gemm_gflops_D`, `peak_math_gflops_D` for the dtypes of a
/// `dtype` column, else every dtype; dtypes with one peak share a line)
/// and a slope per distinct `peak_hbm_gbs` (GB/s x FLOPs per byte =
/// GFLOP/s). The axes are left to [`Chart::scale`] (`run` asks log-log).
pub fn roofline(t: &Table, name: &str) -> Result<Chart> {
    let needed = ["arithmetic_intensity", "achieved_gflops", "peak_hbm_gbs"];
    if let Some(m) = needed.iter().find(|n| t.column(n).is_none()) {
        return Err(Error::usage(format!(
            "{name}: --roofline needs column {m} (kb-sim sweep writes it; columns: {})",
            t.describe()
        )));
    }
    let mut c = sweep_chart(t, name, Some("arithmetic_intensity"), "achieved_gflops")?;
    c.title = format!("Roofline: {name}");
    c.joined = false;
    let dtypes: Vec<&str> = match t.column("dtype") {
        Some(col) => PEAK_DTYPES
            .into_iter()
            .filter(|d| (0..t.rows()).any(|i| col.values.text(i) == *d))
            .collect(),
        None => PEAK_DTYPES.to_vec(),
    };
    // (unit, peak) -> the dtypes that have it, highest peak first.
    let mut peaks: Vec<(&str, f64, Vec<&str>)> = Vec::new();
    for unit in ["GEMM", "math"] {
        let mut of_unit: Vec<(f64, Vec<&str>)> = Vec::new();
        for d in &dtypes {
            let col = format!("peak_{}_gflops_{d}", unit.to_ascii_lowercase());
            for p in distinct(t, &col) {
                match of_unit.iter_mut().find(|(v, _)| *v == p) {
                    Some((_, ds)) => ds.push(d),
                    None => of_unit.push((p, vec![d])),
                }
            }
        }
        of_unit.sort_by(|a, b| b.0.total_cmp(&a.0));
        peaks.extend(of_unit.into_iter().map(|(p, ds)| (unit, p, ds)));
    }
    let mut bws = distinct(t, "peak_hbm_gbs");
    bws.reverse();
    if peaks.is_empty() || bws.is_empty() {
        return Err(Error::usage(format!(
            "{name}: --roofline needs peak_gemm_gflops_D or peak_math_gflops_D (D in {}) and \
             peak_hbm_gbs values (kb-sim sweep writes them)",
            dtypes.join(", ")
        )));
    }
    // The x extent: the points and every ridge (where a slope meets a
    // peak), a doubling beyond each end.
    let ridges = peaks
        .iter()
        .flat_map(|(_, p, _)| bws.iter().map(move |b| p / b));
    let xs = c.lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let (mut xa, mut xb) = (f64::INFINITY, f64::NEG_INFINITY);
    for x in ridges.chain(xs).filter(|x| x.is_finite() && *x > 0.0) {
        xa = xa.min(x);
        xb = xb.max(x);
    }
    let (xa, xb) = (xa / 2.0, xb * 2.0);
    let top = peaks.iter().map(|p| p.1).fold(0.0, f64::max);
    for (unit, p, ds) in &peaks {
        c.ceilings.push(Line {
            name: format!("{unit} peak {}: {} GFLOP/s", ds.join(", "), tick(*p)),
            points: vec![(xa, *p), (xb, *p)],
        });
    }
    for b in bws {
        let end = (top / b).min(xb);
        c.ceilings.push(Line {
            name: format!("HBM peak: {} GB/s", tick(b)),
            points: vec![(xa, b * xa), (end, b * end)],
        });
    }
    Ok(c)
}

/// Whether `path` names a results table rather than a trace.
pub fn is_table(path: &str) -> bool {
    let p = Path::new(path);
    matches!(
        p.extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref(),
        Some("parquet" | "csv")
    )
}

/// What `plot` draws: the columns, the axes' scales, a roofline or not.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Options {
    /// Sweep tables: the x column (default: the first swept one).
    pub x: Option<String>,
    /// Sweep tables: the y column (default `sim_ns`).
    pub y: Option<String>,
    pub x_scale: Scale,
    pub y_scale: Scale,
    /// Sweep tables: a roofline ([`roofline`]), log-log unless a scale
    /// is given.
    pub roofline: bool,
}

/// What `plot` drew.
#[derive(Debug, Clone, PartialEq)]
pub struct Info {
    pub lines: usize,
    pub points: usize,
    /// Rows not drawn: x or y not finite ([`Chart::skipped`]).
    pub skipped: usize,
    /// Points not drawn: not positive on a log axis
    /// ([`Chart::not_positive`]).
    pub not_positive: usize,
    /// Whether each axis is logarithmic.
    pub x_log: bool,
    pub y_log: bool,
}

/// `plot INPUT -o FILE.svg`: a sweep table's `y` against `x` (or its
/// roofline), or a trace's utilisation over time.
pub fn run(input: &str, o: &Options, out: &Path) -> Result<Info> {
    if out.extension().and_then(|e| e.to_str()) != Some("svg") && out != Path::new("-") {
        return Err(Error::usage(format!(
            "plot -o {}: charts are SVG: name a .svg file",
            out.display()
        )));
    }
    let table = is_table(input);
    if !table && (o.roofline || o.x.is_some() || o.y.is_some()) {
        let flag = if o.roofline { "--roofline" } else { "--x/--y" };
        return Err(Error::usage(format!(
            "plot {input}: {flag} needs a sweep table (.parquet or .csv); a trace plots utilisation"
        )));
    }
    if o.roofline && (o.x.is_some() || o.y.is_some()) {
        return Err(Error::usage(
            "plot --roofline draws achieved_gflops against arithmetic_intensity: leave out --x and --y"
                .to_string(),
        ));
    }
    let (mut xs, mut ys) = (o.x_scale, o.y_scale);
    let mut chart = if table {
        let t = Table::load(Path::new(input)).map_err(|e| Error::usage(e.to_string()))?;
        if o.roofline {
            if xs == Scale::Auto {
                xs = Scale::Log;
            }
            if ys == Scale::Auto {
                ys = Scale::Log;
            }
            roofline(&t, input)?
        } else {
            let y = o.y.as_deref().unwrap_or("sim_ns");
            sweep_chart(&t, input, o.x.as_deref(), y)?
        }
    } else {
        utilisation(&Input::parse(input))?
    };
    chart.scale(xs, ys)?;
    let text = svg(&chart)?;
    crate::write_output(out, |w| {
        w.write_all(text.as_bytes()).map_err(crate::out_err)
    })?;
    Ok(Info {
        lines: chart.lines.len(),
        points: chart.lines.iter().map(|l| l.points.len()).sum(),
        skipped: chart.skipped,
        not_positive: chart.not_positive,
        x_log: chart.x_log,
        y_log: chart.y_log,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil;

    /// (width, height) of an SVG and its polylines' point counts.
    fn shape(svg: &str) -> ((u32, u32), Vec<usize>) {
        let attr = |name: &str| -> u32 {
            let at = svg.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
            svg[at..].split('"').next().unwrap().parse().unwrap()
        };
        let lines = svg
            .match_indices("<polyline")
            .map(|(i, _)| {
                let p = svg[i..].find("points=\"").unwrap() + i + 8;
                svg[p..]
                    .split('"')
                    .next()
                    .unwrap()
                    .split_whitespace()
                    .count()
            })
            .collect();
        ((attr("width"), attr("height")), lines)
    }

    #[test]
    fn a_trace_plots_utilisation_per_unit_kind() {
        let (_d, p) = testutil::write_temp(&testutil::sample_trace());
        let c = utilisation(&Input::Path(p.clone())).unwrap();
        let names: Vec<&str> = c.lines.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "gemm (1 unit)",
                "host (1 unit)",
                "pcie_ep (1 unit)",
                "pe_dma (1 unit)",
                "vec (1 unit)"
            ]
        );
        // 10 ns of run in 1 ns bins; pe_dma active [2, 2.4), [2.5, 3) and
        // [5, 6) ns (testutil::sample_ops): 90 % of bin 2, all of bin 5.
        let dma = &c.lines[3].points;
        assert_eq!(dma.len(), 10);
        let busy: Vec<f64> = dma.iter().map(|p| p.1).collect();
        assert_eq!(busy, [0.0, 0.0, 90.0, 0.0, 0.0, 100.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(dma[1].0, 1.5);
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("util.svg");
        let info = run(p.to_str().unwrap(), &Options::default(), &out).unwrap();
        assert_eq!(
            info,
            Info {
                lines: 5,
                points: 50,
                skipped: 0,
                not_positive: 0,
                x_log: false,
                y_log: false
            }
        );
        let svg = std::fs::read_to_string(&out).unwrap();
        let (size, polylines) = shape(&svg);
        assert_eq!(size, (WIDTH, HEIGHT));
        // One polyline of 10 points per unit kind (legend marks are 2-point lines).
        assert_eq!(
            polylines.iter().filter(|&&n| n == 10).count(),
            5,
            "{polylines:?}"
        );
        for n in names {
            assert!(svg.contains(n), "legend {n}");
        }
    }

    /// A text column on x is categorical: one tick per value, named.
    #[test]
    fn a_text_x_column_is_ticked_by_name() {
        let mut t = Table::default();
        t.push("point", Values::U64((0..3).map(Some).collect()));
        t.push(
            "algorithm",
            Values::Str(
                ["ring", "tree", "direct"]
                    .map(|s| Some(s.to_string()))
                    .to_vec(),
            ),
        );
        t.push("status", Values::Str(vec![Some("ok".into()); 3]));
        t.push("sim_ns", Values::F64(vec![Some(5.0), Some(7.0), Some(6.0)]));
        let c = sweep_chart(&t, "t.csv", None, "sim_ns").unwrap();
        assert_eq!(c.categories, ["ring", "tree", "direct"]);
        assert_eq!(c.lines[0].points, [(0.0, 5.0), (1.0, 7.0), (2.0, 6.0)]);
        let text = svg(&c).unwrap();
        // The text of every <text> element.
        let labels: Vec<&str> = text
            .split("</text>")
            .filter_map(|part| part.rsplit_once('>').map(|(_, t)| t.trim()))
            .collect();
        for name in ["ring", "tree", "direct"] {
            assert!(labels.contains(&name), "{name} not a tick: {labels:?}");
        }
        // No numeric ticks on a categorical axis.
        assert!(
            !labels.contains(&"0.5") && !labels.contains(&"-0.5"),
            "{labels:?}"
        );
    }

    #[test]
    fn ticks_and_labels_read_as_numbers_with_units() {
        assert_eq!(tick(100000.0), "100000");
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(2.5), "2.5");
        assert_eq!(tick(0.125), "0.125");
        assert_eq!(tick(1234.5678), "1235");
        assert_eq!(tick(0.000123456), "0.0001235");
        assert_eq!(axis_label("kernel_ns"), "kernel_ns (ns)");
        assert_eq!(axis_label("achieved_gflops"), "achieved_gflops (GFLOP/s)");
        assert_eq!(axis_label("m"), "m");
    }

    /// `inf` or `NaN` in a column: those rows are left out (counted), the
    /// rest drawn; plotters looped forever on an infinite axis.
    #[test]
    fn non_finite_values_are_skipped_not_drawn() {
        let mut t = Table::default();
        t.push("point", Values::U64((0..4).map(Some).collect()));
        t.push(
            "bw",
            Values::F64(vec![Some(8.0), Some(16.0), Some(f64::INFINITY), Some(64.0)]),
        );
        t.push("status", Values::Str(vec![Some("ok".into()); 4]));
        t.push(
            "sim_ns",
            Values::F64(vec![Some(3.0), Some(f64::NAN), Some(2.0), Some(1.0)]),
        );
        let c = sweep_chart(&t, "t.csv", None, "sim_ns").unwrap();
        assert_eq!(c.skipped, 2);
        assert_eq!(c.lines.len(), 1);
        assert_eq!(c.lines[0].points, [(8.0, 3.0), (64.0, 1.0)]);
        // Drawn, at its size (an infinite point hung here before).
        let text = svg(&c).unwrap();
        assert_eq!(shape(&text).0, (WIDTH, HEIGHT));
    }

    #[test]
    fn a_sweep_plots_its_metric_against_a_swept_value() {
        let mut t = Table::default();
        t.push("point", Values::U64((0..6).map(Some).collect()));
        t.push(
            "hbm.channel_bw_gbs",
            Values::F64([16.0, 32.0, 64.0, 16.0, 32.0, 64.0].map(Some).to_vec()),
        );
        t.push(
            "m",
            Values::U64([64, 64, 64, 128, 128, 128].map(Some).to_vec()),
        );
        t.push("status", Values::Str(vec![Some("ok".into()); 6]));
        t.push(
            "sim_ns",
            Values::F64(vec![
                Some(300.0),
                Some(200.0),
                Some(150.0),
                Some(600.0),
                None,
                Some(290.0),
            ]),
        );
        assert_eq!(swept_columns(&t), ["hbm.channel_bw_gbs", "m"]);
        let c = sweep_chart(&t, "t", None, "sim_ns").unwrap();
        assert_eq!(c.x_label, "hbm.channel_bw_gbs (GB/s)");
        assert_eq!(c.y_label, "sim_ns (ns)");
        assert_eq!(c.lines.len(), 2);
        assert_eq!(c.lines[0].name, "m=64");
        assert_eq!(
            c.lines[0].points,
            [(16.0, 300.0), (32.0, 200.0), (64.0, 150.0)]
        );
        // The failed point (no sim_ns) is left out.
        assert_eq!(c.lines[1].points, [(16.0, 600.0), (64.0, 290.0)]);
        let c = sweep_chart(&t, "t", Some("m"), "sim_ns").unwrap();
        assert_eq!(c.lines.len(), 3);
        // A swept column with one value is not in the legend.
        let mut one = t.clone();
        one.columns.insert(
            2,
            kb_table::Column {
                name: "dtype".into(),
                values: Values::Str(vec![Some("f16".into()); 6]),
            },
        );
        assert_eq!(swept_columns(&one), ["hbm.channel_bw_gbs", "dtype", "m"]);
        let c = sweep_chart(&one, "t", None, "sim_ns").unwrap();
        let names: Vec<&str> = c.lines.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["m=64", "m=128"]);
        assert!(sweep_chart(&t, "t", Some("nope"), "sim_ns").is_err());
        assert!(sweep_chart(&t, "t", None, "status").is_err());
        let d = tempfile::tempdir().unwrap();
        let table = d.path().join("sweep.parquet");
        t.save(&table).unwrap();
        let out = d.path().join("sweep.svg");
        let info = run(table.to_str().unwrap(), &Options::default(), &out).unwrap();
        // 16, 32, 64: powers of two, a log x; sim_ns is not.
        assert_eq!(
            info,
            Info {
                lines: 2,
                points: 5,
                skipped: 0,
                not_positive: 0,
                x_log: true,
                y_log: false
            }
        );
        let svg = std::fs::read_to_string(&out).unwrap();
        let (size, polylines) = shape(&svg);
        assert_eq!(size, (WIDTH, HEIGHT));
        // The m=64 line is the one 3-point polyline (the m=128 line, the
        // legend marks and the mesh are 2-point ones).
        assert_eq!(
            polylines.iter().filter(|&&n| n == 3).count(),
            1,
            "{polylines:?}"
        );
        assert!(svg.contains("m=64") && svg.contains("m=128") && svg.contains("sim_ns"));
        // A marker per point, in the colour-blind-safe palette's first
        // two colours.
        // (and one per legend row, beside the plot).
        assert_eq!(svg.matches("<circle").count(), 5 + 2, "{svg}");
        let lower = svg.to_ascii_lowercase();
        assert!(
            lower.contains("#0072b2") && lower.contains("#e69f00"),
            "{svg}"
        );
        // Not an SVG name: refused before anything is written.
        assert!(
            run(
                table.to_str().unwrap(),
                &Options::default(),
                &d.path().join("x.png")
            )
            .is_err()
        );
    }

    /// The x positions of `<text>` elements reading `label`.
    fn text_x(svg: &str, label: &str) -> Vec<f64> {
        svg.split("<text")
            .skip(1)
            .filter(|t| {
                t.split_once('>')
                    .and_then(|(_, rest)| rest.split_once("</text>"))
                    .is_some_and(|(text, _)| text.trim() == label)
            })
            .map(|t| {
                let at = t.find(" x=\"").unwrap() + 4;
                t[at..].split('"').next().unwrap().parse().unwrap()
            })
            .collect()
    }

    /// `<circle>` centres (cx, cy).
    fn circles(svg: &str) -> Vec<(f64, f64)> {
        let attr = |t: &str, name: &str| -> f64 {
            let at = t.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
            t[at..].split('"').next().unwrap().parse().unwrap()
        };
        svg.split("<circle")
            .skip(1)
            .map(|t| (attr(t, "cx"), attr(t, "cy")))
            .collect()
    }

    fn doubling_table() -> Table {
        let mut t = Table::default();
        t.push("point", Values::U64((0..4).map(Some).collect()));
        t.push(
            "hbm.channel_bw_gbs",
            Values::F64([8.0, 16.0, 32.0, 64.0].map(Some).to_vec()),
        );
        t.push("status", Values::Str(vec![Some("ok".into()); 4]));
        t.push(
            "sim_ns",
            Values::F64([900.0, 500.0, 300.0, 0.0].map(Some).to_vec()),
        );
        t
    }

    /// Powers of two on x give a log axis (8, 16, 32, 64 evenly spaced);
    /// --x-scale lin forces linear (equal steps of value evenly spaced);
    /// a log axis leaves out what it cannot place, counted.
    #[test]
    fn powers_of_two_get_a_log_axis_unless_told() {
        assert!(powers_of_two([16.0, 32.0, 64.0].into_iter()));
        assert!(powers_of_two([0.5, 1.0, 2.0, 2.0].into_iter()));
        assert!(!powers_of_two([16.0, 32.0].into_iter()), "two values");
        assert!(!powers_of_two([16.0, 24.0, 32.0].into_iter()));
        assert!(!powers_of_two([0.0, 1.0, 2.0, 4.0].into_iter()));
        let t = doubling_table();
        let mut c = sweep_chart(&t, "t", None, "sim_ns").unwrap();
        c.scale(Scale::Auto, Scale::Auto).unwrap();
        assert!(c.x_log && !c.y_log);
        let text = svg(&c).unwrap();
        let xs: Vec<f64> = ["8", "16", "32", "64"]
            .iter()
            .map(|l| {
                let x = text_x(&text, l);
                assert_eq!(x.len(), 1, "tick {l}: {x:?}");
                x[0]
            })
            .collect();
        let steps: Vec<f64> = xs.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(steps[0] > 50.0, "{xs:?}");
        for s in &steps {
            assert!(
                (s - steps[0]).abs() <= 1.0,
                "log ticks evenly spaced: {xs:?}"
            );
        }
        // Forced linear.
        let mut c = sweep_chart(&t, "t", None, "sim_ns").unwrap();
        c.scale(Scale::Lin, Scale::Auto).unwrap();
        assert!(!c.x_log);
        // Markers: linear x puts 8, 16, 32 at steps 1:2.
        let m = circles(&svg(&c).unwrap());
        let (d1, d2) = (m[1].0 - m[0].0, m[2].0 - m[1].0);
        assert!((d2 / d1 - 2.0).abs() < 0.05, "{m:?}");
        // Forced log y: the 0 ns point cannot be placed: left out, counted.
        let mut c = sweep_chart(&t, "t", None, "sim_ns").unwrap();
        c.scale(Scale::Auto, Scale::Log).unwrap();
        assert!(c.x_log && c.y_log);
        assert_eq!(c.not_positive, 1);
        assert_eq!(c.lines[0].points.len(), 3);
        // A text x cannot be log.
        let mut cat = t.clone();
        cat.columns[1].values = Values::Str(["a", "b", "c", "d"].map(|s| Some(s.into())).to_vec());
        let mut c = sweep_chart(&cat, "t", None, "sim_ns").unwrap();
        assert!(c.scale(Scale::Log, Scale::Auto).is_err());
        c.scale(Scale::Auto, Scale::Auto).unwrap();
        assert!(!c.x_log);
    }

    /// The legend sits beside the plot: every data marker is left of it,
    /// its names right of every marker.
    #[test]
    fn the_legend_is_outside_the_data() {
        let mut t = doubling_table();
        t.columns.insert(
            2,
            kb_table::Column {
                name: "m".into(),
                values: Values::U64([64, 64, 128, 128].map(Some).to_vec()),
            },
        );
        let mut c = sweep_chart(&t, "t", None, "sim_ns").unwrap();
        c.scale(Scale::Auto, Scale::Auto).unwrap();
        let text = svg(&c).unwrap();
        let edge = f64::from(WIDTH - legend_width(&c));
        let marks = circles(&text);
        // 4 data markers, 2 legend samples.
        assert_eq!(marks.len(), 6, "{marks:?}");
        let (data, legend): (Vec<&(f64, f64)>, Vec<_>) = marks.iter().partition(|m| m.0 < edge);
        assert_eq!((data.len(), legend.len()), (4, 2), "{marks:?} edge {edge}");
        for name in ["m=64", "m=128"] {
            let x = text_x(&text, name);
            assert_eq!(x.len(), 1, "{name}");
            assert!(x[0] > edge, "{name} at {x:?}, plot ends at {edge}");
        }
        // A name longer than the legend is cut, not drawn over the plot.
        let long = Chart::new(
            "t".into(),
            "x".into(),
            "y".into(),
            vec![Line {
                name: "x".repeat(200),
                points: vec![(1.0, 1.0)],
            }],
        );
        assert_eq!(legend_width(&long), 320);
        // Past the palette, the colour repeats but the marker is a ring.
        assert_eq!(marker(0).0.color, marker(7).0.color);
        assert!(marker(0).0.filled && !marker(7).0.filled);
        assert!(
            svg(&long)
                .unwrap()
                .contains(&format!("{}\u{2026}", "x".repeat(37)))
        );
    }

    fn roofline_table() -> Table {
        let mut t = Table::default();
        t.push("point", Values::U64((0..4).map(Some).collect()));
        t.push(
            "hbm.channel_bw_gbs",
            Values::F64([8.0, 16.0, 8.0, 16.0].map(Some).to_vec()),
        );
        t.push(
            "dtype",
            Values::Str(
                ["f16", "f16", "f16", "f16"]
                    .map(|s| Some(s.into()))
                    .to_vec(),
            ),
        );
        t.push("m", Values::U64([128, 128, 512, 512].map(Some).to_vec()));
        t.push("status", Values::Str(vec![Some("ok".into()); 4]));
        t.push(
            "achieved_gflops",
            Values::F64([100.0, 180.0, 300.0, 500.0].map(Some).to_vec()),
        );
        t.push(
            "arithmetic_intensity",
            Values::F64([12.0, 12.0, 40.0, 40.0].map(Some).to_vec()),
        );
        for (d, g, m) in [
            ("f32", 16000.0, 500.0),
            ("f16", 64000.0, 1000.0),
            ("bf16", 64000.0, 1000.0),
            ("i8", 128000.0, 2000.0),
        ] {
            t.push(
                format!("peak_gemm_gflops_{d}"),
                Values::F64(vec![Some(g); 4]),
            );
            t.push(
                format!("peak_math_gflops_{d}"),
                Values::F64(vec![Some(m); 4]),
            );
        }
        t.push(
            "peak_hbm_gbs",
            Values::F64([256.0, 512.0, 256.0, 512.0].map(Some).to_vec()),
        );
        t
    }

    /// A roofline: achieved GFLOP/s against intensity, markers only,
    /// log-log, under the table's ceilings (the dtype column's peaks, a
    /// slope per HBM bandwidth); the same table gives the same bytes.
    #[test]
    fn a_roofline_draws_the_points_under_the_tables_ceilings() {
        let t = roofline_table();
        let c = roofline(&t, "r").unwrap();
        assert!(!c.joined);
        let names: Vec<&str> = c.lines.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "hbm.channel_bw_gbs=8 m=128",
                "hbm.channel_bw_gbs=16 m=128",
                "hbm.channel_bw_gbs=8 m=512",
                "hbm.channel_bw_gbs=16 m=512"
            ]
        );
        assert_eq!(c.lines[3].points, [(40.0, 500.0)]);
        let ceilings: Vec<&str> = c.ceilings.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            ceilings,
            [
                "GEMM peak f16: 64000 GFLOP/s",
                "math peak f16: 1000 GFLOP/s",
                "HBM peak: 512 GB/s",
                "HBM peak: 256 GB/s"
            ]
        );
        // x from half the least intensity to twice the most, points and
        // ridges (where a slope meets a peak) both: 1000 / 512 and
        // 64000 / 256.
        let xa = 1000.0 / 512.0 / 2.0;
        assert_eq!(c.ceilings[0].points, [(xa, 64000.0), (500.0, 64000.0)]);
        // A slope: GB/s x FLOPs per byte, up to the highest peak.
        assert_eq!(c.ceilings[2].points, [(xa, 512.0 * xa), (125.0, 64000.0)]);
        assert_eq!(c.ceilings[3].points, [(xa, 256.0 * xa), (250.0, 64000.0)]);
        // Without a dtype column, every dtype: equal peaks share a line.
        let mut all = t.clone();
        all.columns.retain(|c| c.name != "dtype");
        let c = roofline(&all, "r").unwrap();
        assert_eq!(c.ceilings[1].name, "GEMM peak f16, bf16: 64000 GFLOP/s");
        assert_eq!(c.ceilings.len(), 3 + 3 + 2);
        // Through run: log-log, the same bytes twice.
        let d = tempfile::tempdir().unwrap();
        let table = d.path().join("r.csv");
        t.save(&table).unwrap();
        let roof = Options {
            roofline: true,
            ..Options::default()
        };
        let (a, b) = (d.path().join("a.svg"), d.path().join("b.svg"));
        let info = run(table.to_str().unwrap(), &roof, &a).unwrap();
        assert!(info.x_log && info.y_log && info.points == 4, "{info:?}");
        run(table.to_str().unwrap(), &roof, &b).unwrap();
        let text = std::fs::read_to_string(&a).unwrap();
        assert_eq!(text, std::fs::read_to_string(&b).unwrap());
        assert!(text.contains("GEMM peak f16: 64000 GFLOP/s"));
        // Markers only: one per point and per legend row of data.
        assert_eq!(circles(&text).len(), 4 + 4);
        // Asked for linear, it is linear.
        let lin = Options {
            x_scale: Scale::Lin,
            ..roof.clone()
        };
        assert!(!run(table.to_str().unwrap(), &lin, &a).unwrap().x_log);
        // A table without the columns, or --x with it: usage errors.
        let mut bare = doubling_table();
        let e = roofline(&bare, "bare").unwrap_err().to_string();
        assert!(e.contains("arithmetic_intensity"), "{e}");
        bare.push("arithmetic_intensity", Values::F64(vec![Some(1.0); 4]));
        bare.push("achieved_gflops", Values::F64(vec![Some(1.0); 4]));
        bare.push("peak_hbm_gbs", Values::F64(vec![Some(1.0); 4]));
        let e = roofline(&bare, "bare").unwrap_err().to_string();
        assert!(e.contains("peak_gemm_gflops_D"), "{e}");
        let with_x = Options {
            x: Some("m".into()),
            ..roof.clone()
        };
        assert!(run(table.to_str().unwrap(), &with_x, &a).is_err());
        let (_d, trace) = testutil::write_temp(&testutil::sample_trace());
        assert!(run(trace.to_str().unwrap(), &roof, &a).is_err());
    }

    /// Looked at as pixels: resvg renders the SVG to a PNG of the size
    /// the SVG gives, and the plot area holds the data's colour.
    #[test]
    fn the_chart_renders_to_a_png_with_its_points() {
        use resvg::{tiny_skia, usvg};
        let t = roofline_table();
        let mut c = roofline(&t, "r").unwrap();
        c.scale(Scale::Log, Scale::Log).unwrap();
        let text = svg(&c).unwrap();
        let tree = usvg::Tree::from_str(&text, &usvg::Options::default()).unwrap();
        let size = tree.size().to_int_size();
        assert_eq!((size.width(), size.height()), (WIDTH, HEIGHT));
        let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
        resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
        let png = pixmap.encode_png().unwrap();
        // A PNG, its header (IHDR) sized as the SVG says.
        assert_eq!(&png[1..4], b"PNG");
        let be = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
        assert_eq!((be(16), be(20)), (WIDTH, HEIGHT));
        let back = tiny_skia::Pixmap::decode_png(&png).unwrap();
        let edge = WIDTH - legend_width(&c);
        // Pixels of a line's colour (markers are the only such ones in
        // the plot area), around each data marker and nowhere else far
        // from one.
        let near = |px: (u32, u32), rgb: (u8, u8, u8)| {
            let p = back.pixel(px.0, px.1).unwrap().demultiply();
            (p.red(), p.green(), p.blue()) == rgb
        };
        let first = (0, 114, 178);
        let marks = circles(&text);
        let (mx, my) = (marks[0].0 as u32, marks[0].1 as u32);
        assert!(mx < edge, "the first circle is a data marker");
        assert!(near((mx, my), first), "no marker drawn at ({mx}, {my})");
        let coloured = (0..edge)
            .flat_map(|x| (0..HEIGHT).map(move |y| (x, y)))
            .filter(|&p| near(p, first))
            .count();
        // One marker of radius 3: a few dozen pixels.
        assert!((10..200).contains(&coloured), "{coloured} pixels");
        // Ceilings and axes: dark pixels in the plot area, not only white.
        let dark = (0..edge)
            .flat_map(|x| (0..HEIGHT).map(move |y| (x, y)))
            .filter(|&(x, y)| {
                let p = back.pixel(x, y).unwrap().demultiply();
                p.red() < 160 && p.red() == p.green() && p.green() == p.blue()
            })
            .count();
        assert!(dark > 1000, "{dark} grey or black pixels");
    }
}
