//! The report's plots, drawn as SVG by `plotters`: latency CDFs of every workload and floor, fleet throughput and p99 against the Cell count, and the capacity curve (achieved rate and p99 against the offered rate).
//!
//! One chart shape serves all three: named series of (x, y) points on
//! logarithmic or linear axes, and a legend to the right of the plot.

use std::path::{Path, PathBuf};

use anyhow::Context;
use hdrhistogram::Histogram;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;

use crate::report::Report;

const WIDTH: u32 = 760;
const HEIGHT: u32 = 440;
/// The font family (sizes are given as `plotters` scales them: 15 draws
/// as about 12 px).
const FONT: &str = "sans-serif";
/// The legend's width, right of the plot.
const LEGEND: u32 = 220;
const COLOURS: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];
/// Quantiles at which a CDF is drawn (denser in the tail).
const CDF_QUANTILES: [f64; 24] = [
    0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.925, 0.95, 0.96, 0.97, 0.98,
    0.99, 0.993, 0.995, 0.997, 0.999, 0.9995, 1.0,
];

/// One line of a chart.
#[derive(Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub dashed: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct Axis<'a> {
    pub label: &'a str,
    pub log: bool,
}

/// The range an axis shows for `values` (positive only on a log axis):
/// whole decades on a log axis, from zero (or below) on a linear one.
fn range(values: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let values: Vec<f64> = values
        .filter(|v| v.is_finite() && (!log || *v > 0.0))
        .collect();
    let (mut low, mut high) = values
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), v| (l.min(*v), h.max(*v)));
    if values.is_empty() {
        return if log { (1.0, 10.0) } else { (0.0, 1.0) };
    }
    if log {
        low = 10f64.powf(low.log10().floor());
        high = 10f64.powf(high.log10().ceil());
        if high <= low {
            high = low * 10.0;
        }
    } else {
        low = low.min(0.0);
        if high <= low {
            high = low + 1.0;
        }
        high *= 1.05;
    }
    (low, high)
}

fn tick_label(value: f64) -> String {
    if value == 0.0 {
        "0".into()
    } else if value.abs() >= 1e6 {
        format!("{}M", value / 1e6)
    } else if value.abs() >= 1e3 {
        format!("{}k", value / 1e3)
    } else if value.abs() >= 1.0 {
        format!("{value}")
    } else {
        format!("{value:.3}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_owned()
    }
}

/// The points of `series` an axis can show (finite; positive on a log axis).
fn drawable(series: &Series, x: Axis, y: Axis) -> Vec<(f64, f64)> {
    series
        .points
        .iter()
        .copied()
        .filter(|(a, b)| {
            a.is_finite() && b.is_finite() && (!x.log || *a > 0.0) && (!y.log || *b > 0.0)
        })
        .collect()
}

/// An SVG line chart of `series`.
pub fn chart(title: &str, x: Axis, y: Axis, series: &[Series]) -> anyhow::Result<String> {
    let (x_low, x_high) = range(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.0)),
        x.log,
    );
    let (y_low, y_high) = range(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
        y.log,
    );
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).context("drawing the chart")?;
        let (plot, legend) = root.split_horizontally(WIDTH - LEGEND);
        let (xs, ys) = (x_low..x_high, y_low..y_high);
        match (x.log, y.log) {
            (true, true) => draw(&plot, title, xs.log_scale(), ys.log_scale(), x, y, series),
            (true, false) => draw(&plot, title, xs.log_scale(), ys, x, y, series),
            (false, true) => draw(&plot, title, xs, ys.log_scale(), x, y, series),
            (false, false) => draw(&plot, title, xs, ys, x, y, series),
        }?;
        draw_legend(&legend, series)?;
        root.present().context("writing the chart")?;
    }
    Ok(svg)
}

/// The plot: axes with their labels, a light grid and one line per series
/// (with its points marked when it has few).
fn draw<X, Y>(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    x_range: X,
    y_range: Y,
    x: Axis,
    y: Axis,
    series: &[Series],
) -> anyhow::Result<()>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 19))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x_range, y_range)
        .context("laying out the chart")?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .bold_line_style(RGBColor(0xe0, 0xe0, 0xe0))
        .light_line_style(WHITE)
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 15))
        .x_desc(x.label)
        .y_desc(y.label)
        .x_label_formatter(&|v| tick_label(*v))
        .y_label_formatter(&|v| tick_label(*v))
        .draw()
        .context("drawing the axes")?;
    for (index, line) in series.iter().enumerate() {
        let style = COLOURS[index % COLOURS.len()].stroke_width(2);
        let points = drawable(line, x, y);
        if line.dashed {
            chart.draw_series(DashedLineSeries::new(points.clone(), 5, 4, style))
        } else {
            chart.draw_series(LineSeries::new(points.clone(), style))
        }
        .context("drawing a series")?;
        if line.points.len() <= 16 {
            chart
                .draw_series(points.iter().map(|p| Circle::new(*p, 3, style.filled())))
                .context("drawing a series' points")?;
        }
    }
    Ok(())
}

/// The legend: each series' name next to a sample of its line.
fn draw_legend(area: &DrawingArea<SVGBackend<'_>, Shift>, series: &[Series]) -> anyhow::Result<()> {
    for (index, line) in series.iter().enumerate() {
        let style = COLOURS[index % COLOURS.len()].stroke_width(2);
        let y = 50 + index as i32 * 18;
        let sample = vec![(12, y), (34, y)];
        if line.dashed {
            area.draw(&DashedPathElement::new(sample, 5, 4, style))
        } else {
            area.draw(&PathElement::new(sample, style))
        }
        .context("drawing the legend")?;
        area.draw(&Text::new(
            line.name.clone(),
            (40, y - 6),
            (FONT, 15).into_font(),
        ))
        .context("drawing the legend")?;
    }
    Ok(())
}

/// (latency ms, fraction) points of a histogram's CDF.
fn cdf(histogram: &Histogram<u64>) -> Vec<(f64, f64)> {
    if histogram.is_empty() {
        return Vec::new();
    }
    CDF_QUANTILES
        .iter()
        .map(|q| (histogram.value_at_quantile(*q) as f64 / 1e3, *q))
        .collect()
}

/// A named line of points.
fn line(name: impl Into<String>, points: Vec<(f64, f64)>, dashed: bool) -> Series {
    Series {
        name: name.into(),
        points,
        dashed,
    }
}

/// Every workload's, the floors' (dashed) and every fleet size's latency
/// CDF on one chart; `None` with nothing measured.
fn latency_chart(report: &Report) -> anyhow::Result<Option<String>> {
    let floors = [
        crate::floors::ECHO,
        crate::floors::STORE_PUBLICATION,
        crate::floors::SQLITE,
    ];
    let lines: Vec<Series> = report
        .workloads
        .iter()
        .map(|row| {
            let name = format!("{} c{}", row.name, row.concurrency);
            line(name, cdf(&row.histogram), false)
        })
        .chain(
            report
                .floors
                .iter()
                .filter(|r| r.phase == crate::report::Phase::Before && floors.contains(&r.name))
                .map(|row| {
                    let name = format!("floor {} c{}", row.name, row.concurrency);
                    line(name, cdf(&row.histogram), true)
                }),
        )
        .chain(report.fleet.iter().map(|row| {
            let name = format!("fleet {} cells", row.cells);
            line(name, cdf(&row.histogram), false)
        }))
        .collect();
    if lines.is_empty() {
        return Ok(None);
    }
    let x = Axis {
        label: "latency (ms, log)",
        log: true,
    };
    let y = Axis {
        label: "fraction of requests",
        log: false,
    };
    chart("Latency CDF (client-side; dashed: floors)", x, y, &lines).map(Some)
}

/// Per-node and cluster rates and p99 against the fleet's Cell counts.
fn fleet_chart(report: &Report) -> anyhow::Result<String> {
    let fleet = &report.fleet;
    let by_cells = |value: fn(&crate::fleet::FleetRow) -> f64| -> Vec<(f64, f64)> {
        fleet.iter().map(|r| (r.cells as f64, value(r))).collect()
    };
    let series = [
        line("per node /s", by_cells(|r| r.per_node_per_s), false),
        line(
            "cluster /s",
            by_cells(|r| r.summary.throughput_per_s),
            false,
        ),
        line("p99 ms", by_cells(|r| r.summary.p99_ms), true),
    ];
    let x = Axis {
        label: "Cells (log)",
        log: true,
    };
    let y = Axis {
        label: "commands/s, or p99 ms (log)",
        log: true,
    };
    chart(
        "fleet: durable commands/s and p99 vs Cell count",
        x,
        y,
        &series,
    )
}

/// The open-loop sweep: achieved rate and p99 against the offered rate.
fn capacity_chart(capacity: &crate::capacity::CapacityResult) -> anyhow::Result<String> {
    let by_offered = |value: &dyn Fn(&crate::capacity::CapacityStep) -> f64| -> Vec<(f64, f64)> {
        capacity
            .steps
            .iter()
            .map(|s| (s.offered_per_s, value(s)))
            .collect()
    };
    let bound = capacity.p99_bound_ms;
    let series = [
        line("achieved /s", by_offered(&|s| s.achieved_per_s), false),
        line("offered = achieved", by_offered(&|s| s.offered_per_s), true),
        line("p99 ms", by_offered(&|s| s.summary.p99_ms), false),
        line(
            format!("p99 bound {bound} ms"),
            by_offered(&|_| bound),
            true,
        ),
    ];
    let x = Axis {
        label: "offered commands/s (log)",
        log: true,
    };
    let y = Axis {
        label: "commands/s, or p99 ms (log)",
        log: true,
    };
    chart(
        "capacity: achieved rate and p99 vs offered rate (open loop)",
        x,
        y,
        &series,
    )
}

/// Writes `latency_cdf.svg`, `fleet.svg` and `capacity.svg` (those with
/// data) into `dir`; returns the paths written.
pub fn write(report: &Report, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut charts = Vec::new();
    if let Some(svg) = latency_chart(report)? {
        charts.push(("latency_cdf.svg", svg));
    }
    if !report.fleet.is_empty() {
        charts.push(("fleet.svg", fleet_chart(report)?));
    }
    if let Some(capacity) = &report.capacity {
        charts.push(("capacity.svg", capacity_chart(capacity)?));
    }
    let mut written = Vec::new();
    for (name, svg) in charts {
        let path = dir.join(name);
        std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_series() -> Vec<Series> {
        vec![
            Series {
                name: "a&b".into(),
                points: vec![(0.5, 0.0), (5.0, 1.0)],
                dashed: false,
            },
            Series {
                name: "c".into(),
                points: vec![(1.0, 0.5), (0.0, 0.7)],
                dashed: true,
            },
        ]
    }

    #[test]
    fn a_chart_draws_each_series_and_escapes_names() {
        let (x, y) = (
            Axis {
                label: "x",
                log: true,
            },
            Axis {
                label: "y",
                log: false,
            },
        );
        let svg = chart("t <1>", x, y, &two_series()).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
        assert!(svg.contains("a&amp;b"), "{svg}");
        assert!(svg.contains("t &lt;1&gt;"), "{svg}");
        // Each series' colour draws its line (solid or dashed).
        for colour in ["#1F77B4", "#D62728"] {
            assert!(
                svg.contains(&format!("stroke=\"{colour}\"")),
                "{colour}: {svg}"
            );
        }
        // The x = 0 point cannot sit on a log axis and is left out.
        assert_eq!(drawable(&two_series()[1], x, y), vec![(1.0, 0.5)]);
        assert_eq!(range([0.5, 5.0, 0.0].into_iter(), true), (0.1, 10.0));
        assert_eq!(range([0.5, 5.0].into_iter(), false), (0.0, 5.25));
    }
}
