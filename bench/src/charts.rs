//! SVG charts beside report.md (plotters): per-query runtime, fresh vs minimum
//! tokens, and throughput. Queries without a value get no bar.

use std::path::Path;

use plotters::prelude::*;

use crate::error::{BenchError, Result};
use crate::metrics::QueryStatus;
use crate::run_file::RunFile;

/// Bars of one series: name, value per query, colour.
type Series<'a> = (&'a str, Vec<Option<f64>>, RGBColor);

fn bar_chart(
    path: &Path,
    title: &str,
    y_desc: &str,
    labels: &[String],
    series: &[Series<'_>],
) -> Result<()> {
    let n = labels.len().max(1);
    let max = series
        .iter()
        .flat_map(|(_, v, _)| v.iter().flatten())
        .fold(0.0f64, |a, &b| a.max(b));
    let top = if max > 0.0 { max * 1.1 } else { 1.0 };
    let width = (160 + 22 * n as u32).max(480);
    // Drawn under a temporary name and renamed, like every output file.
    let tmp = aisql_engine::data::files::temp_path(path);
    let root = SVGBackend::new(&tmp, (width, 480)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| BenchError::Io {
        path: path.to_path_buf(),
        message: format!("chart: {e}"),
    };
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(80)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..top)
        .map_err(|x| e(&x))?;
    let fmt = |x: &f64| -> String {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            labels.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&fmt)
        .x_label_style(
            ("sans-serif", 11)
                .into_font()
                .transform(FontTransform::Rotate90),
        )
        .y_desc(y_desc)
        .draw()
        .map_err(|x| e(&x))?;
    let k = series.len().max(1) as f64;
    let w = 0.8 / k;
    for (s, (name, values, color)) in series.iter().enumerate() {
        let style = color.filled();
        let bars = values.iter().enumerate().filter_map(|(i, v)| {
            v.map(|v| {
                let x0 = i as f64 - 0.4 + w * s as f64;
                Rectangle::new([(x0, 0.0), (x0 + w, v)], style)
            })
        });
        chart
            .draw_series(bars)
            .map_err(|x| e(&x))?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
    }
    if series.len() > 1 {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    drop(chart);
    drop(root);
    Ok(aisql_engine::data::files::publish(&tmp, path)?)
}

/// Writes the charts of `run` into `dir`; returns (title, file name) per chart.
pub fn write_charts(dir: &Path, run: &RunFile) -> Result<Vec<(String, String)>> {
    let done: Vec<_> = run
        .queries
        .iter()
        .filter(|q| q.status == QueryStatus::Complete && q.metrics.is_some())
        .collect();
    if done.is_empty() {
        return Ok(Vec::new());
    }
    let labels: Vec<String> = done.iter().map(|q| q.id.clone()).collect();
    let m = |f: &dyn Fn(&crate::metrics::QueryMetrics) -> Option<f64>| -> Vec<Option<f64>> {
        done.iter()
            .map(|q| q.metrics.as_ref().and_then(f))
            .collect()
    };
    let mut out = Vec::new();
    let runtime = ("runtime.svg", "Query runtime (seconds)");
    bar_chart(
        &dir.join(runtime.0),
        runtime.1,
        "seconds",
        &labels,
        &[(
            "runtime",
            m(&|x| Some(x.runtime_s)),
            RGBColor(0x1f, 0x77, 0xb4),
        )],
    )?;
    out.push((runtime.1.to_string(), runtime.0.to_string()));
    let tokens = ("tokens.svg", "Fresh vs minimum tokens");
    bar_chart(
        &dir.join(tokens.0),
        tokens.1,
        "tokens",
        &labels,
        &[
            (
                "fresh",
                m(&|x| x.fresh_tokens.map(|v| v as f64)),
                RGBColor(0xd6, 0x27, 0x28),
            ),
            (
                "minimum",
                m(&|x| x.minimum_tokens.map(|v| v as f64)),
                RGBColor(0x2c, 0xa0, 0x2c),
            ),
        ],
    )?;
    out.push((tokens.1.to_string(), tokens.0.to_string()));
    let tput = (
        "throughput.svg",
        "Throughput (documents or pairs per second)",
    );
    bar_chart(
        &dir.join(tput.0),
        tput.1,
        "per second",
        &labels,
        &[
            (
                "documents/second",
                m(&|x| match x.throughput {
                    crate::metrics::Throughput::Documents(v) => v,
                    _ => None,
                }),
                RGBColor(0x94, 0x67, 0xbd),
            ),
            (
                "document pairs/second",
                m(&|x| match x.throughput {
                    crate::metrics::Throughput::Pairs(v) => v,
                    _ => None,
                }),
                RGBColor(0xff, 0x7f, 0x0e),
            ),
        ],
    )?;
    out.push((tput.1.to_string(), tput.0.to_string()));
    Ok(out)
}
