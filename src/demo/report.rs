//! What the demo writes: the header, the live table, and the final report.

use super::{Outcome, Plan, RunReport, ShopSettings, SALE_PATH, SALE_ROUTE};
use crate::config::Config;
use crate::controller::ControllerState;
use crate::engine::RouteSnapshot;
use crate::limiter::Algorithm;
use crate::sim::CutsOwn;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::time::Duration;

/// Milliseconds with one decimal.
fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "–".into()
    } else {
        format!("{:.1}%", 100.0 * part as f64 / whole as f64)
    }
}

/// What runs where, and the traffic to come.
pub(super) fn write_header(
    out: &mut (dyn Write + Send),
    plan: &Plan,
    shop: &ShopSettings,
    config: &Config,
    shop_addr: SocketAddr,
    proxy_addr: SocketAddr,
    admin_addr: SocketAddr,
) -> io::Result<()> {
    let capacity = shop.capacity_rps();
    writeln!(
        out,
        "rocgate demo: a flash sale on a shop that serves about {capacity:.0} req/s\n"
    )?;
    writeln!(
        out,
        "  shop      http://{shop_addr:<21}  {} workers × {} (≈{capacity:.0} req/s); {} more may wait, then 503",
        shop.workers,
        humantime::format_duration(shop.service_time),
        shop.queue
    )?;
    if let Some(route) = config.routes.iter().find(|r| r.name == SALE_ROUTE) {
        let c = &route.controller;
        writeln!(
            out,
            "  rocgate   http://{proxy_addr:<21}  route {SALE_ROUTE} (POST {SALE_PATH}): limit {} req/s, cut to {} when ROC > {}",
            c.base_limit_rps, c.cut_limit_rps, c.danger_roc
        )?;
    }
    writeln!(
        out,
        "  admin     http://{admin_addr:<21}  /admin/routes, /metrics (Prometheus, Grafana: dashboards/)"
    )?;
    let s = plan.scale();
    writeln!(
        out,
        "  traffic   flash-sale over {}: 40 req/s; at {:.1} s the sale opens, 600 req/s for {:.1} s, back to 40 req/s by {:.1} s",
        humantime::format_duration(plan.duration()),
        plan.sale_opens_s(),
        20.0 * s,
        50.0 * s,
    )?;
    if (s - 1.0).abs() > 1e-9 {
        if let Some(route) = config.routes.iter().find(|r| r.name == SALE_ROUTE) {
            let c = &route.controller;
            let burst = match route.algorithm {
                Algorithm::TokenBucket { burst } => format!("; burst {} (not scaled)", secs(burst)),
                _ => String::new(),
            };
            writeln!(
                out,
                "  time      ×{s:.3} (scenario and config written for 60 s): window {}, slot {}, hold {}, a restore step every {}{burst}",
                secs(route.window.window()),
                secs(route.window.slot()),
                secs(c.hold),
                secs(c.restore_interval),
            )?;
        }
    }
    writeln!(out)
}

fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.1} ms", s * 1e3)
    }
}

/// The cells of a line of the table, each at its column's width: the client's six
/// (time, phase, and the offered, admitted, rejected and failed rates), then the
/// controller's three (ROC, state, limit) behind rocgate. The head and every row are
/// written by it, so that the rows line up under the names.
fn write_cells(
    out: &mut (dyn Write + Send),
    client: [&str; 6],
    controller: Option<[&str; 3]>,
) -> io::Result<()> {
    let [t, phase, offered, admitted, rejected, failed] = client;
    write!(
        out,
        "{t:>6}  {phase:<8} {offered:>8} {admitted:>9} {rejected:>9} {failed:>7}"
    )?;
    if let Some([roc, state, limit]) = controller {
        write!(out, " {roc:>7}  {state:<10} {limit:>6}")?;
    }
    Ok(())
}

/// The column names; the controller's columns only behind rocgate.
pub(super) fn write_table_head(out: &mut (dyn Write + Send), gated: bool) -> io::Result<()> {
    write_cells(
        out,
        ["t", "phase", "offered", "admitted", "rejected", "failed"],
        gated.then_some(["roc", "state", "limit"]),
    )?;
    writeln!(out, " {:>11}", "shop p99")?;
    write_cells(
        out,
        ["s", "", "req/s", "req/s", "req/s", "req/s"],
        gated.then_some(["", "", "req/s"]),
    )?;
    writeln!(out)?;
    out.flush()
}

/// One row: the client's counts over the last `period_s` as rates, the controller's
/// state now, the shop's p99 over the period.
pub(super) fn write_row(
    out: &mut (dyn Write + Send),
    end_s: f64,
    phase: &str,
    counts: &super::LoadTotals,
    period_s: f64,
    controller: Option<&RouteSnapshot>,
    p99: Option<Duration>,
) -> io::Result<()> {
    let rate = |n: u64| format!("{:.0}", n as f64 / period_s.max(1e-3));
    let client = [
        format!("{end_s:.1}"),
        phase.to_owned(),
        rate(counts.offered),
        rate(counts.admitted()),
        rate(counts.rejected),
        rate(counts.failures()),
    ];
    let controller = controller.map(|c| {
        [
            format!("{:.1}", c.roc),
            c.state.as_str().to_owned(),
            format!("{:.0}", c.limit_rps),
        ]
    });
    write_cells(
        out,
        client.each_ref().map(String::as_str),
        controller
            .as_ref()
            .map(|c| c.each_ref().map(String::as_str)),
    )?;
    writeln!(out, " {:>11}", p99.map_or_else(|| "–".into(), ms))?;
    out.flush()
}

/// The report after the run: what happened behind rocgate (when the cut came, how much
/// was rejected, the shop's worst p99) and, after a `compare` run, both runs side by
/// side, and the tuning hints for the run.
pub fn write_report(out: &mut (dyn Write + Send), outcome: &Outcome) -> io::Result<()> {
    let plan = &outcome.plan;
    let gated = &outcome.gated;
    writeln!(out, "\nsummary (with rocgate)")?;
    if gated.interrupted {
        writeln!(
            out,
            "  interrupted   after {:.1} s",
            gated.elapsed.as_secs_f64()
        )?;
    }
    if gated.elapsed.as_secs_f64() < plan.sale_opens_s() {
        writeln!(
            out,
            "  sale opened   never: it was due at {:.2} s (40 → 600 req/s)",
            plan.sale_opens_s()
        )?;
    } else {
        writeln!(
            out,
            "  sale opened   at {:.2} s: 40 → 600 req/s",
            plan.sale_opens_s()
        )?;
    }
    write_cut(out, plan, gated)?;
    let load = &gated.load;
    writeln!(
        out,
        "  offered       {} requests in {:.1} s",
        load.offered,
        gated.elapsed.as_secs_f64()
    )?;
    writeln!(
        out,
        "  admitted      {:<7} {:>6}   the shop served {}, turned {} away (503)",
        load.admitted(),
        percent(load.admitted(), load.offered),
        gated.served,
        gated.overloaded
    )?;
    let reasons = gated
        .sale_route()
        .map(|r| {
            r.rejected
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(reason, n)| format!("{} {n}", reason.as_str()))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .filter(|s| !s.is_empty())
        .map_or_else(String::new, |s| format!(" ({s})"));
    writeln!(
        out,
        "  rejected      {:<7} {:>6}   429 from rocgate{reasons}",
        load.rejected,
        percent(load.rejected, load.offered)
    )?;
    if let Some(without) = outcome.rejected_without_cuts {
        write_without_cuts(out, load.rejected, without, load.offered)?;
    }
    let live = gated.sale_route().filter(|r| r.cuts > 0);
    if let Some(net) = live.and_then(RouteSnapshot::cut_own_net) {
        write_cut_own_live(out, net, load.offered)?;
    }
    writeln!(
        out,
        "  failed        {:<7} {:>6}   5xx or no answer",
        load.failures(),
        percent(load.failures(), load.offered)
    )?;
    if load.in_flight() > 0 {
        writeln!(
            out,
            "  unanswered    {:<7} {:>6}   still in flight a second after the stop",
            load.in_flight(),
            percent(load.in_flight(), load.offered)
        )?;
    }
    if load.skipped > 0 {
        writeln!(
            out,
            "  not sent      {:<7} {:>6}   the generator had 1000 requests outstanding",
            load.skipped,
            percent(load.skipped, load.offered)
        )?;
    }
    writeln!(out, "  shop p99      {}", p99_line(gated))?;
    if let Some(ungated) = &outcome.ungated {
        write_comparison(out, gated, ungated)?;
    }
    if !outcome.hints.is_empty() {
        writeln!(
            out,
            "\nhints (what this run suggests; GET /admin/hints on a live instance)"
        )?;
        write!(out, "{}", crate::hints::table(&outcome.hints))?;
    }
    out.flush()
}

/// What the base limit alone rejects of the run's `offered` arrivals (`without`,
/// simulated), and the difference from what the run rejected (`rejected`, measured):
/// the cuts' own, or said as a difference when below zero.
fn write_without_cuts(
    out: &mut (dyn Write + Send),
    rejected: u64,
    without: u64,
    offered: u64,
) -> io::Result<()> {
    let own = CutsOwn::new(rejected, without, offered);
    writeln!(
        out,
        "  without cuts  {without:<7} {:>6}   the base limit alone, simulated on this schedule; {} ≈ {}, {:.1}%",
        percent(without, offered),
        own.label(),
        own.count,
        own.percent
    )
}

/// The cuts' own refusals as the sale route's engine counted them during the run, net
/// ([`RouteSnapshot::cut_own_net`], `GET /admin/routes`' `cut_own_net`), and their
/// share of the `offered`.
fn write_cut_own_live(out: &mut (dyn Write + Send), net: i64, offered: u64) -> io::Result<()> {
    let share = if offered == 0 {
        "–".to_owned()
    } else {
        format!("{:.1}%", 100.0 * net as f64 / offered as f64)
    };
    writeln!(
        out,
        "  cut's own net {net:<7} {share:>6}   live, counted by rocgate during the cuts (/admin/routes' cut_own_net)"
    )
}

/// The first cut, and the way back from it.
fn write_cut(out: &mut (dyn Write + Send), plan: &Plan, run: &RunReport) -> io::Result<()> {
    let route = run.sale_route();
    let danger = route.map_or(0.0, |r| r.danger_roc);
    let peak = run.peak_roc.unwrap_or(0.0);
    let Some(first) = run
        .transitions
        .iter()
        .position(|t| t.to == ControllerState::Cut)
    else {
        return writeln!(
            out,
            "  cut           none: ROC peaked at {peak:.1} (danger {danger})"
        );
    };
    let cut = &run.transitions[first];
    let base = route.map_or(0.0, |r| r.base_limit_rps);
    writeln!(
        out,
        "  cut           at {:.2} s, {:.2} s after the sale opened: limit {base} → {} req/s (ROC peaked at {peak:.1}, danger {danger})",
        cut.t_s,
        cut.t_s - plan.sale_opens_s(),
        cut.limit_rps
    )?;
    let later = &run.transitions[first + 1..];
    let recovering = later.iter().find(|t| t.to == ControllerState::Recovering);
    let normal = later.iter().find(|t| t.to == ControllerState::Normal);
    let mut restore = match (recovering, normal) {
        (Some(r), Some(n)) => format!(
            "recovering at {:.2} s, back to normal at {:.2} s",
            r.t_s, n.t_s
        ),
        (Some(r), None) => format!("recovering at {:.2} s, not back to normal yet", r.t_s),
        _ => "still cut at the end".into(),
    };
    if let Some(r) = route {
        restore.push_str(&format!(
            "; {} cut(s), {:.2} s in cut",
            r.cuts,
            r.time_in_cut.as_secs_f64()
        ));
    }
    writeln!(out, "  restore       {restore}")
}

fn p99_line(run: &RunReport) -> String {
    let whole = run.shop_p99.map_or_else(
        || "– (nothing served)".into(),
        |p| format!("{} over the run", ms(p)),
    );
    match run.worst_p99 {
        Some((t_s, p)) => format!("{whole}; worst second {} (ending at {t_s:.1} s)", ms(p)),
        None => whole,
    }
}

/// Both runs side by side.
fn write_comparison(
    out: &mut (dyn Write + Send),
    gated: &RunReport,
    ungated: &RunReport,
) -> io::Result<()> {
    if ungated.interrupted {
        writeln!(
            out,
            "\nwith and without rocgate (without: interrupted after {:.1} s)",
            ungated.elapsed.as_secs_f64()
        )?;
    } else {
        writeln!(out, "\nwith and without rocgate (the same traffic)")?;
    }
    writeln!(out, "  {:<28} {:>14} {:>14}", "", "with rocgate", "without")?;
    let row = |out: &mut (dyn Write + Send), name: &str, f: &dyn Fn(&RunReport) -> String| {
        writeln!(out, "  {name:<28} {:>14} {:>14}", f(gated), f(ungated))
    };
    row(out, "offered", &|r| r.load.offered.to_string())?;
    row(out, "served by the shop (2xx)", &|r| r.load.ok.to_string())?;
    row(out, "rejected by rocgate (429)", &|r| {
        r.load.rejected.to_string()
    })?;
    row(out, "failed (5xx or no answer)", &|r| {
        r.load.failures().to_string()
    })?;
    row(out, "error rate (client)", &|r| {
        percent(r.load.failures(), r.load.offered)
    })?;
    row(out, "shop error rate (503)", &|r| {
        percent(r.overloaded, r.served + r.overloaded)
    })?;
    row(out, "shop p99", &|r| {
        r.shop_p99.map_or_else(|| "–".into(), ms)
    })?;
    row(out, "shop worst 1-s p99", &|r| {
        r.worst_p99.map_or_else(|| "–".into(), |(_, p)| ms(p))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Nanos;
    use crate::config::{RouteConfig, RouteMatch};
    use crate::engine::Engine;
    use std::time::UNIX_EPOCH;

    /// What `write` writes.
    fn written(write: impl FnOnce(&mut (dyn Write + Send)) -> io::Result<()>) -> String {
        let mut out = Vec::new();
        write(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// The line after `rejected`: the simulated count and its share of the offered,
    /// then the measured rejections less it, below zero said as a difference.
    #[test]
    fn the_line_without_cuts_says_the_cuts_own() {
        assert_eq!(
            written(|out| write_without_cuts(out, 11006, 9410, 16400)),
            "  without cuts  9410     57.4%   the base limit alone, simulated on this schedule; \
             the cuts' own ≈ 1596, 9.7%\n"
        );
        assert_eq!(
            written(|out| write_without_cuts(out, 480, 492, 1000)),
            "  without cuts  492      49.2%   the base limit alone, simulated on this schedule; \
             difference ≈ -12, -1.2%\n"
        );
        // Lined up with the line above it.
        let rejected = "  rejected      11006    67.1%   429 from rocgate";
        let line = written(|out| write_without_cuts(out, 11006, 9410, 16400));
        assert_eq!(line.find('%'), rejected.find('%'));
    }

    /// The cuts' own as rocgate counted it live: the net and its share of the offered,
    /// lined up with the line above it.
    #[test]
    fn the_live_line_says_the_cuts_own_net() {
        let line = written(|out| write_cut_own_live(out, 1596, 16400));
        assert_eq!(
            line,
            "  cut's own net 1596      9.7%   live, counted by rocgate during the cuts \
             (/admin/routes' cut_own_net)\n"
        );
        let rejected = "  rejected      11006    67.1%   429 from rocgate";
        assert_eq!(line.find('%'), rejected.find('%'));
        assert!(written(|out| write_cut_own_live(out, -12, 1000))
            .starts_with("  cut's own net -12      -1.2%   "));
    }

    /// The live table, with the controller's columns (behind rocgate) and without: the
    /// head's names and units, and a row's rates, state and p99, each at its column's
    /// width under its name.
    #[test]
    fn the_rows_of_the_table_line_up_under_its_head() {
        let engine = Engine::new(
            &Config::new(vec![RouteConfig::new("r", RouteMatch::any())]),
            Nanos::ZERO,
            UNIX_EPOCH,
        )
        .unwrap();
        let mut snap = engine
            .route_snapshot(engine.route_at(0).unwrap(), Nanos::ZERO)
            .unwrap();
        (snap.roc, snap.state, snap.limit_rps) = (12.34, ControllerState::Cut, 60.0);
        let counts = super::super::LoadTotals {
            offered: 600,
            ok: 100,
            rejected: 480,
            failed: 20,
            errors: 5,
            skipped: 0,
        };
        let p99 = Some(Duration::from_micros(4_321));
        assert_eq!(
            written(|out| write_table_head(out, true)),
            "     t  phase     offered  admitted  rejected  failed     roc  state       limit    shop p99\n\
             \x20    s              req/s     req/s     req/s   req/s                      req/s\n"
        );
        assert_eq!(
            written(|out| write_row(out, 12.34, "sale", &counts, 1.0, Some(&snap), p99)),
            "  12.3  sale          600       120       480      25    12.3  cut            60      4.3 ms\n"
        );
        assert_eq!(
            written(|out| write_table_head(out, false)),
            "     t  phase     offered  admitted  rejected  failed    shop p99\n\
             \x20    s              req/s     req/s     req/s   req/s\n"
        );
        assert_eq!(
            written(|out| write_row(out, 12.34, "sale", &counts, 1.0, None, None)),
            "  12.3  sale          600       120       480      25           –\n"
        );
    }
}
