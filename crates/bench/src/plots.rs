//! The report's plots, as hand-written SVG (no plotting crate): latency CDFs of every workload and floor, fleet throughput and p99 against the Cell count, and the capacity curve (achieved rate and p99 against the offered rate).
//!
//! One chart shape serves all three: named series of (x, y) points on
//! logarithmic or linear axes, with ticks at powers of ten (log) or at
//! round steps (linear), and a legend.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use hdrhistogram::Histogram;

use crate::report::Report;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 220.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLOURS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
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

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The range an axis shows for `values` (positive only on a log axis).
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

fn ticks(low: f64, high: f64, log: bool) -> Vec<f64> {
    if log {
        let mut ticks = Vec::new();
        let mut tick = low;
        while tick <= high * 1.0001 {
            ticks.push(tick);
            tick *= 10.0;
        }
        return ticks;
    }
    let raw = (high - low) / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(raw);
    let mut ticks = Vec::new();
    let mut tick = (low / step).ceil() * step;
    while tick <= high {
        ticks.push(tick);
        tick += step;
    }
    ticks
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

/// An SVG line chart of `series`.
pub fn chart(title: &str, x: Axis, y: Axis, series: &[Series]) -> String {
    let (x_low, x_high) = range(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.0)),
        x.log,
    );
    let (y_low, y_high) = range(
        series.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
        y.log,
    );
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let scale = |value: f64, low: f64, high: f64, log: bool| {
        if log {
            (value.max(low).log10() - low.log10()) / (high.log10() - low.log10())
        } else {
            (value - low) / (high - low)
        }
    };
    let px = |v: f64| LEFT + scale(v, x_low, x_high, x.log) * plot_w;
    let py = |v: f64| TOP + plot_h - scale(v, y_low, y_high, y.log) * plot_h;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        LEFT + plot_w / 2.0,
        escape(title)
    );
    for tick in ticks(x_low, x_high, x.log) {
        let at = px(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{at:.1}" y1="{TOP}" x2="{at:.1}" y2="{:.1}" stroke="#e0e0e0"/><text x="{at:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 16.0,
            tick_label(tick)
        );
    }
    for tick in ticks(y_low, y_high, y.log) {
        let at = py(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{at:.1}" x2="{:.1}" y2="{at:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            at + 4.0,
            tick_label(tick)
        );
    }
    let _ = writeln!(
        svg,
        r#"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 12.0,
        escape(x.label)
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + plot_h / 2.0,
        escape(y.label)
    );
    for (index, line) in series.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        let points: Vec<String> = line
            .points
            .iter()
            .filter(|(a, b)| {
                a.is_finite() && b.is_finite() && (!x.log || *a > 0.0) && (!y.log || *b > 0.0)
            })
            .map(|(a, b)| format!("{:.1},{:.1}", px(*a), py(*b)))
            .collect();
        let dash = if line.dashed {
            r#" stroke-dasharray="5 4""#
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{}"/>"#,
            points.join(" ")
        );
        if line.points.len() <= 16 {
            for point in &points {
                let (cx, cy) = point.split_once(',').expect("formatted as x,y");
                let _ = writeln!(
                    svg,
                    r#"<circle cx="{cx}" cy="{cy}" r="3" fill="{colour}"/>"#
                );
            }
        }
        let legend_y = TOP + 10.0 + index as f64 * 18.0;
        let legend_x = LEFT + plot_w + 12.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{legend_x}" y1="{legend_y}" x2="{:.1}" y2="{legend_y}" stroke="{colour}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            legend_x + 22.0,
            legend_x + 28.0,
            legend_y + 4.0,
            escape(&line.name)
        );
    }
    svg.push_str("</svg>\n");
    svg
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

/// Writes `latency_cdf.svg`, `fleet.svg` and `capacity.svg` (those with
/// data) into `dir`; returns the paths written.
pub fn write(report: &Report, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut charts = Vec::new();
    let mut lines: Vec<Series> = report
        .workloads
        .iter()
        .map(|row| Series {
            name: format!("{} c{}", row.name, row.concurrency),
            points: cdf(&row.histogram),
            dashed: false,
        })
        .collect();
    for row in report.floors.iter().filter(|r| {
        r.phase == crate::report::Phase::Before
            && [
                crate::floors::ECHO,
                crate::floors::STORE_PUBLICATION,
                crate::floors::SQLITE,
            ]
            .contains(&r.name)
    }) {
        lines.push(Series {
            name: format!("floor {} c{}", row.name, row.concurrency),
            points: cdf(&row.histogram),
            dashed: true,
        });
    }
    for row in &report.fleet {
        lines.push(Series {
            name: format!("fleet {} cells", row.cells),
            points: cdf(&row.histogram),
            dashed: false,
        });
    }
    if !lines.is_empty() {
        charts.push((
            "latency_cdf.svg",
            chart(
                "Latency CDF (client-side; dashed: floors)",
                Axis {
                    label: "latency (ms, log)",
                    log: true,
                },
                Axis {
                    label: "fraction of requests",
                    log: false,
                },
                &lines,
            ),
        ));
    }
    if !report.fleet.is_empty() {
        let series = vec![
            Series {
                name: "per node /s".into(),
                points: report
                    .fleet
                    .iter()
                    .map(|r| (r.cells as f64, r.per_node_per_s))
                    .collect(),
                dashed: false,
            },
            Series {
                name: "cluster /s".into(),
                points: report
                    .fleet
                    .iter()
                    .map(|r| (r.cells as f64, r.summary.throughput_per_s))
                    .collect(),
                dashed: false,
            },
            Series {
                name: "p99 ms".into(),
                points: report
                    .fleet
                    .iter()
                    .map(|r| (r.cells as f64, r.summary.p99_ms))
                    .collect(),
                dashed: true,
            },
        ];
        charts.push((
            "fleet.svg",
            chart(
                "fleet: durable commands/s and p99 vs Cell count",
                Axis {
                    label: "Cells (log)",
                    log: true,
                },
                Axis {
                    label: "commands/s, or p99 ms (log)",
                    log: true,
                },
                &series,
            ),
        ));
    }
    if let Some(capacity) = &report.capacity {
        let steps = &capacity.steps;
        let series = vec![
            Series {
                name: "achieved /s".into(),
                points: steps
                    .iter()
                    .map(|s| (s.offered_per_s, s.achieved_per_s))
                    .collect(),
                dashed: false,
            },
            Series {
                name: "offered = achieved".into(),
                points: steps
                    .iter()
                    .map(|s| (s.offered_per_s, s.offered_per_s))
                    .collect(),
                dashed: true,
            },
            Series {
                name: "p99 ms".into(),
                points: steps
                    .iter()
                    .map(|s| (s.offered_per_s, s.summary.p99_ms))
                    .collect(),
                dashed: false,
            },
            Series {
                name: format!("p99 bound {} ms", capacity.p99_bound_ms),
                points: steps
                    .iter()
                    .map(|s| (s.offered_per_s, capacity.p99_bound_ms))
                    .collect(),
                dashed: true,
            },
        ];
        charts.push((
            "capacity.svg",
            chart(
                "capacity: achieved rate and p99 vs offered rate (open loop)",
                Axis {
                    label: "offered commands/s (log)",
                    log: true,
                },
                Axis {
                    label: "commands/s, or p99 ms (log)",
                    log: true,
                },
                &series,
            ),
        ));
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

    #[test]
    fn a_chart_has_a_line_per_series_and_escapes_names() {
        let svg = chart(
            "t <1>",
            Axis {
                label: "x",
                log: true,
            },
            Axis {
                label: "y",
                log: false,
            },
            &[
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
            ],
        );
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("a&amp;b"));
        assert!(svg.contains("t &lt;1&gt;"));
        // The x = 0 point cannot sit on a log axis and is left out.
        let second = svg
            .lines()
            .filter(|l| l.starts_with("<polyline"))
            .nth(1)
            .unwrap();
        assert_eq!(second.matches(',').count(), 1, "{second}");
        assert_eq!(ticks(0.1, 100.0, true), vec![0.1, 1.0, 10.0, 100.0]);
    }
}
