//! Charts of a run, as SVG and PNG, drawn with plotters: no external tool, and no
//! system font (the text is set in a subset of DejaVu Sans that ships in the crate,
//! `assets/`), so a chart looks the same on every machine.
//!
//! One panel per route (at most [`MAX_ROUTES`]), each of two plots over time:
//! - requests: offered, admitted and rejected (and, with a capacity, the route's
//!   overload) as rates in req/s; the current limit and the base limit; the capacity
//!   itself on one-route runs (it is shared by all the routes of a run);
//! - ROC, with the danger and safe thresholds as dashed lines.
//!
//! Cut periods are shaded red, recovering periods amber, in both plots, so the cut
//! and the climb back to the base limit show at a glance.
//!
//! Long runs are drawn with at most [`MAX_POINTS`] points per line: each point
//! stands for a run of consecutive slots and shows their highest rates and ROC and
//! their lowest limit, so that a spike or a cut never disappears in the averaging.
//!
//! ```
//! use rocgate::config::{Config, RouteConfig, RouteMatch};
//! use rocgate::sim::{chart, ArrivalModel, Scenario, Simulator};
//!
//! let config = Config::new(vec![RouteConfig::new("order", RouteMatch::prefix("/"))]);
//! let run = Simulator::new(config, None).unwrap()
//!     .run_profile_all(&Scenario::FlashSale.profile(), ArrivalModel::Uniform)
//!     .unwrap();
//! let svg = chart::svg(&run).unwrap();
//! assert!(svg.starts_with("<svg") && svg.contains("danger_roc 80"));
//! let png = chart::png(&run).unwrap();
//! assert_eq!(&png[1..4], b"PNG");
//! assert_eq!(chart::size(1), (1200, 560));
//! ```

use super::run::{SimResult, SimRun, SlotRow};
use crate::config::Mode;
use crate::controller::ControllerState;
use plotters::backend::{BitMapBackend, DrawingBackend, SVGBackend};
use plotters::chart::{ChartBuilder, SeriesLabelPosition};
use plotters::coord::Shift;
use plotters::drawing::{DrawingArea, DrawingAreaErrorKind, IntoDrawingArea};
use plotters::element::{PathElement, Rectangle};
use plotters::series::{DashedLineSeries, LineSeries};
use plotters::style::{Color, RGBColor, ShapeStyle, BLACK, WHITE};
use text::Typeset;

mod text;

/// Width of a chart, pixels.
pub const WIDTH: u32 = 1200;
/// Height of one route's panel, pixels.
pub const PANEL_HEIGHT: u32 = 560;
/// The most routes charted; later routes are left out (their numbers are still in
/// the summary and the series).
pub const MAX_ROUTES: usize = 12;
/// The most points drawn per line.
pub const MAX_POINTS: usize = 1000;

/// The font family named in the SVG; its metrics are the bundled font's.
const FAMILY: &str = "sans-serif";

/// Colours, one per meaning (Tableau 10).
const OFFERED: RGBColor = RGBColor(127, 127, 127);
const ADMITTED: RGBColor = RGBColor(31, 119, 180);
const REJECTED: RGBColor = RGBColor(255, 127, 14);
const OVERLOAD: RGBColor = RGBColor(148, 103, 189);
const LIMIT: RGBColor = RGBColor(0, 0, 0);
const BASE: RGBColor = RGBColor(90, 90, 90);
const ROC: RGBColor = RGBColor(31, 119, 180);
/// The danger threshold's line colour, `#D62728` in the SVG.
pub const DANGER: RGBColor = RGBColor(214, 39, 40);
/// The safe threshold's line colour, `#2CA02C` in the SVG.
pub const SAFE: RGBColor = RGBColor(44, 160, 44);
const CUT_SHADE: RGBColor = RGBColor(214, 39, 40);
const RECOVERING_SHADE: RGBColor = RGBColor(255, 187, 120);

/// Why a chart could not be drawn. Each variant keeps its cause as its `source()`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChartError {
    /// The bundled font was refused.
    #[error("the bundled chart font cannot be loaded")]
    Font(#[source] ab_glyph::InvalidFont),
    /// Drawing failed: the drawing backend's error (plotters' `DrawingAreaErrorKind`).
    #[error("cannot draw the chart: {0}")]
    Draw(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// PNG encoding failed.
    #[error("cannot encode the chart as PNG: {0}")]
    Png(#[source] png::EncodingError),
}

/// The size of a chart of `routes` routes, pixels: `(WIDTH, PANEL_HEIGHT × routes)`,
/// with routes counted from 1 to [`MAX_ROUTES`].
pub fn size(routes: usize) -> (u32, u32) {
    (WIDTH, PANEL_HEIGHT * routes.clamp(1, MAX_ROUTES) as u32)
}

/// The chart as an SVG document.
pub fn svg(run: &SimRun) -> Result<String, ChartError> {
    let mut out = String::new();
    {
        let backend = SVGBackend::with_string(&mut out, size(run.routes.len()));
        let root = Typeset::new(backend, false)
            .map_err(ChartError::Font)?
            .into_drawing_area();
        draw(&root, run).map_err(draw_error)?;
        root.present().map_err(draw_error)?;
    }
    Ok(out)
}

/// The chart as a PNG image (8-bit RGB).
pub fn png(run: &SimRun) -> Result<Vec<u8>, ChartError> {
    let (w, h) = size(run.routes.len());
    let mut pixels = vec![0u8; w as usize * h as usize * 3];
    {
        let backend = BitMapBackend::with_buffer(&mut pixels, (w, h));
        let root = Typeset::new(backend, true)
            .map_err(ChartError::Font)?
            .into_drawing_area();
        draw(&root, run).map_err(draw_error)?;
        root.present().map_err(draw_error)?;
    }
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, w, h);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder
        .write_header()
        .and_then(|mut writer| writer.write_image_data(&pixels))
        .map_err(ChartError::Png)?;
    Ok(out)
}

fn draw_error<E: std::error::Error + Send + Sync + 'static>(
    e: DrawingAreaErrorKind<E>,
) -> ChartError {
    ChartError::Draw(Box::new(e))
}

type Drawn<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, run: &SimRun) -> Drawn<DB> {
    root.fill(&WHITE)?;
    let routes = &run.routes[..run.routes.len().min(MAX_ROUTES)];
    let capacity = run.summary.capacity_rps;
    let one_route = run.routes.len() == 1;
    for (area, route) in root
        .split_evenly((routes.len().max(1), 1))
        .iter()
        .zip(routes)
    {
        panel(area, route, capacity, one_route)?;
    }
    Ok(())
}

/// One point of a line: a run of consecutive slots.
#[derive(Clone, Copy, Debug)]
struct Point {
    t_s: f64,
    offered: f64,
    admitted: f64,
    rejected: f64,
    overload: f64,
    roc: f64,
    danger: f64,
    safe: f64,
    limit: f64,
    base: f64,
}

/// At most [`MAX_POINTS`] points: rates and ROC at their highest over each run of
/// slots, limits at their lowest, thresholds as at its start.
fn points(series: &[SlotRow], slot_s: f64) -> Vec<Point> {
    let group = series.len().div_ceil(MAX_POINTS).max(1);
    series
        .chunks(group)
        .map(|rows| {
            let max = |f: fn(&SlotRow) -> f64| rows.iter().map(f).fold(f64::MIN, f64::max);
            let min = |f: fn(&SlotRow) -> f64| rows.iter().map(f).fold(f64::MAX, f64::min);
            Point {
                t_s: rows[0].t_s,
                offered: max(|r| r.offered as f64) / slot_s,
                admitted: max(|r| r.admitted as f64) / slot_s,
                rejected: max(|r| r.rejected.total() as f64) / slot_s,
                overload: max(|r| r.overload as f64) / slot_s,
                roc: max(|r| r.roc),
                danger: rows[0].danger_roc,
                safe: rows[0].safe_roc,
                limit: min(|r| r.limit_rps),
                base: min(|r| r.base_limit_rps),
            }
        })
        .collect()
}

/// The periods the controller spent in `state`, as `(from, to)` seconds.
fn periods(series: &[SlotRow], state: ControllerState, end_s: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let mut since = None;
    for r in series {
        match (r.state == state, since) {
            (true, None) => since = Some(r.t_s),
            (false, Some(from)) => {
                out.push((from, r.t_s));
                since = None;
            }
            _ => {}
        }
    }
    if let Some(from) = since {
        out.push((from, end_s));
    }
    out
}

/// A step line: each value held until the next point, the last until `end_s`.
fn steps(points: &[Point], end_s: f64, value: fn(&Point) -> f64) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() * 2);
    for (i, p) in points.iter().enumerate() {
        let next = points.get(i + 1).map_or(end_s, |q| q.t_s);
        out.push((p.t_s, value(p)));
        out.push((next, value(p)));
    }
    out
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    route: &SimResult,
    capacity: Option<u64>,
    one_route: bool,
) -> Drawn<DB> {
    let s = &route.summary;
    let end_s = s.duration_s.max(s.slot_s).max(1e-3);
    let pts = points(&route.series, s.slot_s.max(1e-9));
    let cut = periods(&route.series, ControllerState::Cut, end_s);
    let recovering = periods(&route.series, ControllerState::Recovering, end_s);

    let mut title = format!(
        "{} ({}): {} offered, {:.1}% rejected",
        s.route,
        s.mode.as_str(),
        s.offered,
        100.0 * s.rejected as f64 / s.offered.max(1) as f64
    );
    if s.shadow_rejected > 0 {
        let share = 100.0 * s.shadow_rejected as f64 / s.offered.max(1) as f64;
        // shadow_adaptive rejects at the base limit and counts the cut's share apart.
        title.push_str(&if s.mode == Mode::ShadowAdaptive {
            format!(" (the cut would have rejected {share:.1}% more)")
        } else {
            format!(" ({share:.1}% would have been)")
        });
    }
    match s.first_cut_s {
        Some(t) => title.push_str(&format!(
            ", {} cut(s), first at {t:.1} s, {:.1} s in cut",
            s.cuts.len(),
            s.time_in_cut_s
        )),
        None => title.push_str(", no cut"),
    }
    if capacity.is_some() || s.overload > 0 {
        title.push_str(&format!(", {} overload", s.overload));
    }
    let area = area.titled(&title, (FAMILY, 17))?;
    let height = area.dim_in_pixel().1;
    let (upper, lower) = area.split_vertically(height * 58 / 100);

    // Requests.
    let top = pts
        .iter()
        .flat_map(|p| [p.offered, p.limit, p.base])
        .chain(capacity.filter(|_| one_route).map(|c| c as f64))
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&upper)
        .margin(6)
        .x_label_area_size(24)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..end_s, 0.0..top)?;
    chart
        .configure_mesh()
        .x_label_formatter(&|v| tick(*v, end_s))
        .y_label_formatter(&|v| tick(*v, top))
        .y_desc("req/s")
        .label_style((FAMILY, 12))
        .axis_desc_style((FAMILY, 13))
        .light_line_style(WHITE)
        .draw()?;
    shade(&mut chart, &cut, &recovering, top)?;
    chart
        .draw_series(DashedLineSeries::new(
            steps(&pts, end_s, |p| p.base),
            6,
            4,
            line(BASE, 1),
        ))?
        .label("base limit")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], line(BASE, 1)));
    chart
        .draw_series(LineSeries::new(
            steps(&pts, end_s, |p| p.limit),
            line(LIMIT, 2),
        ))?
        .label("limit")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], line(LIMIT, 2)));
    for (name, color, width, value) in [
        (
            "offered",
            OFFERED,
            1,
            (|p: &Point| p.offered) as fn(&Point) -> f64,
        ),
        ("admitted", ADMITTED, 2, |p| p.admitted),
        ("rejected", REJECTED, 1, |p| p.rejected),
    ] {
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|p| (p.t_s, value(p))),
                line(color, width),
            ))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], line(color, 2)));
    }
    if capacity.is_some() {
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|p| (p.t_s, p.overload)),
                line(OVERLOAD, 2),
            ))?
            .label("overload")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], line(OVERLOAD, 2)));
    }
    if let Some(c) = capacity.filter(|_| one_route) {
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, c as f64), (end_s, c as f64)],
                6,
                4,
                line(OVERLOAD, 1),
            ))?
            .label(format!("capacity {c}"))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], line(OVERLOAD, 1)));
    }
    legend(&mut chart)?;

    // ROC.
    let (low, high) = pts
        .iter()
        .flat_map(|p| [p.roc, p.danger, p.safe])
        .fold((0.0f64, 1.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let pad = (high - low) * 0.08;
    let (low, high) = (low - pad, high + pad);
    let mut chart = ChartBuilder::on(&lower)
        .margin(6)
        .x_label_area_size(38)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..end_s, low..high)?;
    chart
        .configure_mesh()
        .x_label_formatter(&|v| tick(*v, end_s))
        .y_label_formatter(&|v| tick(*v, high - low))
        .x_desc("t (s)")
        .y_desc("ROC")
        .label_style((FAMILY, 12))
        .axis_desc_style((FAMILY, 13))
        .light_line_style(WHITE)
        .draw()?;
    shade(&mut chart, &cut, &recovering, high)?;
    let first = pts.first();
    for (name, color, value) in [
        (
            "danger_roc",
            DANGER,
            (|p: &Point| p.danger) as fn(&Point) -> f64,
        ),
        ("safe_roc", SAFE, |p| p.safe),
    ] {
        let label = match first {
            Some(p) => format!("{name} {}", value(p)),
            None => name.to_owned(),
        };
        chart
            .draw_series(DashedLineSeries::new(
                steps(&pts, end_s, value),
                8,
                5,
                line(color, 2),
            ))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], line(color, 2)));
    }
    chart
        .draw_series(LineSeries::new(
            pts.iter().map(|p| (p.t_s, p.roc)),
            line(ROC, 1),
        ))?
        .label("roc")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], line(ROC, 2)));
    legend(&mut chart)
}

/// A tick label for `v` on an axis spanning `span`: whole numbers, or as many
/// decimals as a small span needs.
fn tick(v: f64, span: f64) -> String {
    let decimals = if span >= 20.0 {
        0
    } else if span >= 2.0 {
        1
    } else {
        2
    };
    format!("{v:.decimals$}")
}

/// A line of colour `c`, `w` pixels wide.
fn line(c: RGBColor, w: u32) -> ShapeStyle {
    ShapeStyle::from(c).stroke_width(w)
}

type Chart<'a, DB> = plotters::chart::ChartContext<
    'a,
    DB,
    plotters::coord::cartesian::Cartesian2d<
        plotters::coord::types::RangedCoordf64,
        plotters::coord::types::RangedCoordf64,
    >,
>;

/// Shades cut and recovering periods from the bottom of the plot to `top`.
fn shade<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    cut: &[(f64, f64)],
    recovering: &[(f64, f64)],
    top: f64,
) -> Drawn<DB> {
    let bottom = chart.y_range().start;
    for (name, periods, color, alpha) in [
        ("cut", cut, CUT_SHADE, 0.18),
        ("recovering", recovering, RECOVERING_SHADE, 0.30),
    ] {
        if periods.is_empty() {
            continue;
        }
        let style = color.mix(alpha).filled();
        chart
            .draw_series(
                periods
                    .iter()
                    .map(|&(from, to)| Rectangle::new([(from, bottom), (to, top)], style)),
            )?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], style));
    }
    Ok(())
}

fn legend<'a, DB: DrawingBackend + 'a>(chart: &mut Chart<'a, DB>) -> Drawn<DB> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FAMILY, 12))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
}
