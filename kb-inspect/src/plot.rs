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

/// Chart size in pixels.
pub const WIDTH: u32 = 960;
pub const HEIGHT: u32 = 540;

/// Render `c` as SVG text.
pub fn svg(c: &Chart) -> Result<String> {
    let err = |e: &dyn std::fmt::Display| Error::usage(format!("drawing the chart: {e}"));
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let pts = c.lines.iter().flat_map(|l| l.points.iter());
        let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
        for &(x, y) in pts.filter(|(x, y)| x.is_finite() && y.is_finite()) {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y1 = y1.max(y);
        }
        if !x0.is_finite() {
            (x0, x1) = (0.0, 1.0);
        }
        if !c.categories.is_empty() {
            // Categories sit half a step in from the edges.
            (x0, x1) = (-0.5, c.categories.len() as f64 - 0.5);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        if y1 <= 0.0 {
            y1 = 1.0;
        }
        let mut chart = ChartBuilder::on(&root)
            .caption(&c.title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(72)
            .build_cartesian_2d(x0..x1, 0.0..y1 * 1.05)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(c.x_label.as_str())
            .y_desc(c.y_label.as_str())
            .x_label_formatter(&|v| {
                if c.categories.is_empty() {
                    tick(*v)
                } else if v.fract() == 0.0 && *v >= 0.0 {
                    c.categories.get(*v as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|v| tick(*v))
            .draw()
            .map_err(|e| err(&e))?;
        for (i, l) in c.lines.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()].to_rgba();
            let finite = || {
                l.points
                    .iter()
                    .copied()
                    .filter(|(x, y)| x.is_finite() && y.is_finite())
            };
            chart
                .draw_series(LineSeries::new(finite(), color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(l.name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            // A marker on every point: values are where the data is, the
            // lines only join them.
            chart
                .draw_series(finite().map(|p| Circle::new(p, 3, color.filled())))
                .map_err(|e| err(&e))?;
        }
        if !c.lines.is_empty() {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperRight)
                .draw()
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
    Ok(Chart {
        title: format!("Utilisation per unit kind: {input}"),
        x_label: format!("simulated time (ns; bins of {} ns)", width / 1000.0),
        y_label: "busy units (%)".into(),
        lines,
        skipped: 0,
        categories: Vec::new(),
    })
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
    let x_label = axis_label(&x);
    Ok(Chart {
        title: format!("{y} against {x}: {name}"),
        x_label,
        y_label: axis_label(y),
        lines,
        skipped,
        categories: if xs_numeric { Vec::new() } else { x_names },
    })
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

/// What `plot` drew.
#[derive(Debug, Clone, PartialEq)]
pub struct Info {
    pub lines: usize,
    pub points: usize,
    /// Rows not drawn: x or y not finite ([`Chart::skipped`]).
    pub skipped: usize,
}

/// `plot INPUT -o FILE.svg`: a sweep table's `y` against `x`, or a trace's
/// utilisation over time.
pub fn run(input: &str, x: Option<&str>, y: &str, out: &Path) -> Result<Info> {
    if out.extension().and_then(|e| e.to_str()) != Some("svg") && out != Path::new("-") {
        return Err(Error::usage(format!(
            "plot -o {}: charts are SVG: name a .svg file",
            out.display()
        )));
    }
    let chart = if is_table(input) {
        let t = Table::load(Path::new(input)).map_err(|e| Error::usage(e.to_string()))?;
        sweep_chart(&t, input, x, y)?
    } else {
        utilisation(&Input::parse(input))?
    };
    let text = svg(&chart)?;
    crate::write_output(out, |w| {
        w.write_all(text.as_bytes()).map_err(crate::out_err)
    })?;
    Ok(Info {
        lines: chart.lines.len(),
        points: chart.lines.iter().map(|l| l.points.len()).sum(),
        skipped: chart.skipped,
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
        let info = run(p.to_str().unwrap(), None, "sim_ns", &out).unwrap();
        assert_eq!(
            info,
            Info {
                lines: 5,
                points: 50,
                skipped: 0
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
        let info = run(table.to_str().unwrap(), None, "sim_ns", &out).unwrap();
        assert_eq!(
            info,
            Info {
                lines: 2,
                points: 5,
                skipped: 0
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
        assert_eq!(svg.matches("<circle").count(), 5, "{svg}");
        let lower = svg.to_ascii_lowercase();
        assert!(
            lower.contains("#0072b2") && lower.contains("#e69f00"),
            "{svg}"
        );
        // Not an SVG name: refused before anything is written.
        assert!(
            run(
                table.to_str().unwrap(),
                None,
                "sim_ns",
                &d.path().join("x.png")
            )
            .is_err()
        );
    }
}
