//! `rocgate demo`: a flash sale absorbed in one command, over real HTTP on loopback.
//!
//! Three parts run in one process: a demo [`Shop`] with a modelled capacity (about
//! 300 req/s: latency grows past it, and a full line answers `503`), the reverse proxy
//! of `rocgate serve` in front of it with the built-in demo configuration
//! ([`CONFIG_TOML`]), and an open-loop load generator ([`load`]) that plays the
//! flash-sale scenario: 40 req/s, a step to 600 req/s when the sale opens, a plateau,
//! a decay back to 40. While it runs, [`run`] writes a table once per second: offered,
//! admitted, rejected and failed req/s as the client saw them, the sale route's ROC,
//! controller state and limit, and the shop's p99 latency. The admin API (`/metrics`,
//! `/admin/routes`) listens meanwhile, so Prometheus and Grafana can watch the run.
//! With `compare`, the same traffic then goes straight to a fresh shop, without
//! rocgate, and the report puts both side by side ([`write_report`]). A run that cut
//! also has its own schedule simulated on the virtual clock, so that the report can
//! say what the base limit alone rejects of it and what the cut itself cost
//! ([`Plan::rejected_without_cuts`]).
//!
//! The scenario is written for 60 s. A shorter or longer `duration` compresses or
//! stretches its timeline *and* the controller's durations (window, slot, hold,
//! restore interval, dwell, longest cut, a window counter's window) by the same factor
//! ([`Plan::scale`]); rates and ROC thresholds, in req/s, are unchanged, so the
//! controller sees the same demand curve and acts at the same points of it. A token
//! bucket's `burst` is not scaled: it absorbs the clustering of arrivals at a rate,
//! which a shorter timeline does not compress (scaled, a 5 s run's bucket held under
//! 2 tokens and rejected a sixth of its 40 req/s warm-up).

pub mod load;
mod report;
mod shop;

pub use load::{LoadCounters, LoadSettings, LoadTotals};
pub use report::write_report;
pub use shop::{Shop, ShopSettings, ShopStats};

use crate::config::{Config, ConfigError};
use crate::controller::ControllerState;
use crate::engine::RouteSnapshot;
use crate::hints::Hint;
use crate::limiter::Algorithm;
use crate::proxy::{Proxy, ProxySettings, Reloader};
use crate::sim::{ArrivalModel, Profile, ProfileError, Scenario, SimError, Simulator};
use crate::window::WindowSpec;
use std::future::Future;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The demo's configuration, built in: `config/demo.toml`.
pub const CONFIG_TOML: &str = include_str!("../../config/demo.toml");

/// The route the sale's traffic goes to (`POST /api/order`).
pub const SALE_ROUTE: &str = "order";

/// The path the sale's traffic goes to.
pub const SALE_PATH: &str = "/api/order";

/// How long a stopped demo waits for the answers to requests it had sent.
const SETTLE: Duration = Duration::from_secs(1);

/// The length the scenario and the configuration are written for.
pub const NOMINAL_DURATION: Duration = Duration::from_secs(60);

/// The shortest demo: below it, the compressed window would hold too few requests for
/// a meaningful ROC.
pub const MIN_DURATION: Duration = Duration::from_secs(5);

/// The longest demo.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);

/// The scenario's timeline at nominal length, seconds: the sale opens (40 → 600
/// req/s), the plateau ends, the decay back to 40 req/s ends.
const SALE_OPENS_S: f64 = 20.0;
const PLATEAU_ENDS_S: f64 = 40.0;
const DECAY_ENDS_S: f64 = 50.0;

/// How often the demo looks at the sale route's controller (to time its transitions).
const OBSERVE_EVERY: Duration = Duration::from_millis(25);

/// The flash sale at a given length.
#[derive(Clone, Debug)]
pub struct Plan {
    duration: Duration,
    scale: f64,
    profile: Profile,
}

impl Plan {
    /// The flash-sale scenario over `duration`, between [`MIN_DURATION`] and
    /// [`MAX_DURATION`].
    pub fn new(duration: Duration) -> Result<Plan, PlanError> {
        if !(MIN_DURATION..=MAX_DURATION).contains(&duration) {
            return Err(PlanError::OutOfRange { duration });
        }
        let scale = duration.as_secs_f64() / NOMINAL_DURATION.as_secs_f64();
        let profile = Scenario::FlashSale
            .profile()
            .time_scaled(scale)
            .map_err(PlanError::Scale)?;
        Ok(Plan {
            duration,
            scale,
            profile,
        })
    }

    /// The demo's length.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// `duration` ÷ 60 s: the factor every time of the scenario and the configuration
    /// is multiplied by.
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// The traffic: the flash-sale scenario on the scaled timeline.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// When the sale opens, seconds since the start.
    pub fn sale_opens_s(&self) -> f64 {
        SALE_OPENS_S * self.scale
    }

    /// The scenario's phase at `t_s` seconds since the start.
    pub fn phase(&self, t_s: f64) -> &'static str {
        let nominal = t_s / self.scale;
        if nominal < SALE_OPENS_S {
            "warm-up"
        } else if nominal < PLATEAU_ENDS_S {
            "sale"
        } else if nominal < DECAY_ENDS_S {
            "decay"
        } else {
            "after"
        }
    }

    /// The demo configuration with the controller's durations (and a window
    /// counter's window) multiplied by [`Plan::scale`]; a token bucket's burst as
    /// written.
    pub fn config(&self) -> Result<Config, ConfigError> {
        let mut config = Config::from_toml_str(CONFIG_TOML, "config/demo.toml (built in)")?;
        for route in &mut config.routes {
            route.window = scaled_window(&route.window, self.scale);
            let c = &mut route.controller;
            for d in [
                &mut c.hold,
                &mut c.restore_interval,
                &mut c.min_dwell,
                &mut c.max_cut,
            ] {
                *d = d.mul_f64(self.scale);
            }
            if let Algorithm::FixedWindow { window } | Algorithm::SlidingWindow { window } =
                &mut route.algorithm
            {
                *window = window.mul_f64(self.scale);
            }
        }
        Ok(config)
    }

    /// What the sale route rejects by its base limit alone on this plan's schedule
    /// under `arrivals`, simulated: the first `offered` arrivals of the profile (the
    /// whole run, or as far as a run cut short got: the load generator offers them in
    /// this order), through [`Plan::config`] on the virtual clock, counted by the
    /// simulator's twin engine whose controller never cuts
    /// ([`Summary::rejected_without_cuts`](crate::sim::Summary::rejected_without_cuts)).
    /// `None` when the route is not in `enforce` mode.
    pub fn rejected_without_cuts(
        &self,
        arrivals: ArrivalModel,
        offered: u64,
    ) -> Result<Option<u64>, SimError> {
        let sim = Simulator::new(self.config()?, Some(SALE_ROUTE))?;
        let schedule = self
            .profile
            .arrivals(arrivals)
            .take(usize::try_from(offered).unwrap_or(usize::MAX));
        let run = sim.run(schedule, self.profile.duration())?;
        Ok(run.summary.rejected_without_cuts)
    }
}

/// The same number of slots, each `scale` times as long (whole microseconds, 1 ms at
/// least, so the slot still divides the window exactly).
fn scaled_window(window: &WindowSpec, scale: f64) -> WindowSpec {
    let slot_us = (window.slot().as_secs_f64() * 1e6 * scale)
        .round()
        .max(1000.0);
    let slot = Duration::from_micros(slot_us as u64);
    let slots = u32::try_from(window.slots()).unwrap_or(u32::MAX);
    WindowSpec::new(slot * slots, slot).unwrap_or(*window)
}

/// What [`run`] needs. Build it with [`DemoSettings::new`] and set its fields.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DemoSettings {
    /// The traffic and its timeline.
    pub plan: Plan,
    /// Also run the same traffic without rocgate.
    pub compare: bool,
    /// Where the proxy listens.
    pub listen: SocketAddr,
    /// Where the admin API listens.
    pub admin: SocketAddr,
    /// Evenly spaced or Poisson arrivals.
    pub arrivals: ArrivalModel,
    /// The shop's capacity model.
    pub shop: ShopSettings,
}

impl DemoSettings {
    /// The demo of `plan` with the proxy on `listen` and the admin API on `admin`:
    /// gated traffic only, evenly spaced arrivals, the default shop.
    pub fn new(plan: Plan, listen: SocketAddr, admin: SocketAddr) -> Self {
        DemoSettings {
            plan,
            compare: false,
            listen,
            admin,
            arrivals: ArrivalModel::Uniform,
            shop: ShopSettings::default(),
        }
    }
}

/// Why [`Plan::new`] refused a length. `Display` names the flag that gives it,
/// `--duration`. Non-exhaustive: a new rule is not a breaking change.
///
/// ```
/// use rocgate::demo::{Plan, PlanError};
/// use std::time::Duration;
///
/// let e = Plan::new(Duration::from_secs(2)).unwrap_err();
/// assert!(matches!(e, PlanError::OutOfRange { duration } if duration.as_secs() == 2));
/// assert_eq!(e.to_string(), "--duration: must be between 5s and 1h, got 2s");
/// ```
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// The length is not between [`MIN_DURATION`] and [`MAX_DURATION`].
    #[error(
        "--duration: must be between {} and {}, got {}",
        humantime::format_duration(MIN_DURATION),
        humantime::format_duration(MAX_DURATION),
        humantime::format_duration(*duration)
    )]
    OutOfRange {
        /// The length asked for.
        duration: Duration,
    },
    /// The scenario's timeline could not be stretched to the length.
    #[error("--duration: cannot scale the scenario: {0}")]
    Scale(#[source] ProfileError),
}

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// The built-in configuration was refused (a bug: a unit test checks it).
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// A listener could not be opened.
    #[error("cannot listen on {what}: {source}")]
    Listen {
        /// Which listener, with its address.
        what: String,
        /// Why.
        source: io::Error,
    },
    /// The proxy or its admin API could not be opened (the error names which).
    #[error("{0} (--listen and --admin take 127.0.0.1:0: any free port)")]
    Proxy(#[source] crate::proxy::BindError),
    /// Writing the table or the report failed.
    #[error("cannot write the output: {0}")]
    Output(#[from] io::Error),
}

/// A controller transition of the sale route, as the demo saw it.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct SeenTransition {
    /// When the controller entered `to`, seconds since the start of the traffic.
    pub t_s: f64,
    /// The state before.
    pub from: ControllerState,
    /// The state after.
    pub to: ControllerState,
    /// The limit right after, req/s.
    pub limit_rps: f64,
}

/// One run of the traffic, with or without rocgate.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RunReport {
    /// Whether rocgate was in front of the shop.
    pub gated: bool,
    /// Whether `stop` (Ctrl-C, SIGTERM) cut the run short.
    pub interrupted: bool,
    /// How long the traffic ran, its last answers included.
    pub elapsed: Duration,
    /// The client's counts.
    pub load: LoadTotals,
    /// Requests the shop served.
    pub served: u64,
    /// Requests the shop turned away (`503`).
    pub overloaded: u64,
    /// The shop's p99 latency over the run.
    pub shop_p99: Option<Duration>,
    /// The worst of the shop's p99 latencies per second, and the end of that second
    /// (seconds since the start).
    pub worst_p99: Option<(f64, Duration)>,
    /// The sale route's transitions (rocgate only).
    pub transitions: Vec<SeenTransition>,
    /// The highest ROC the sale route showed (rocgate only).
    pub peak_roc: Option<f64>,
    /// Every route's state at the end (rocgate only).
    pub routes: Vec<RouteSnapshot>,
}

impl RunReport {
    /// The sale route's final state (rocgate only).
    pub fn sale_route(&self) -> Option<&RouteSnapshot> {
        self.routes.iter().find(|r| r.name == SALE_ROUTE)
    }

    /// When the first cut came, seconds since the start.
    pub fn first_cut_s(&self) -> Option<f64> {
        self.transitions
            .iter()
            .find(|t| t.to == ControllerState::Cut)
            .map(|t| t.t_s)
    }
}

/// What the demo did.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Outcome {
    /// The traffic.
    pub plan: Plan,
    /// The shop's capacity model.
    pub shop: ShopSettings,
    /// The run through rocgate.
    pub gated: RunReport,
    /// The same traffic straight to the shop, with `compare`.
    pub ungated: Option<RunReport>,
    /// The tuning hints for the run through rocgate, for every route that had
    /// traffic (what `GET /admin/hints` answered at its end).
    pub hints: Vec<Hint>,
    /// What the sale route's base limit alone rejects of the arrivals the run through
    /// rocgate offered, simulated ([`Plan::rejected_without_cuts`]): only when that
    /// run cut and the route is in `enforce` mode.
    pub rejected_without_cuts: Option<u64>,
}

impl Outcome {
    /// Whether `stop` (Ctrl-C, SIGTERM) cut the demo short.
    pub fn interrupted(&self) -> bool {
        self.gated.interrupted || self.ungated.as_ref().is_some_and(|u| u.interrupted)
    }
}

/// Runs the demo: starts the shop and the proxy, plays the traffic while writing the
/// live table to `out`, then (with `compare`) plays it again straight to a new shop.
/// When `stop` completes (Ctrl-C, SIGTERM), the traffic stops, everything shuts down, and the
/// outcome so far is returned. The report is [`write_report`]'s.
pub async fn run(
    settings: &DemoSettings,
    out: &mut (dyn Write + Send),
    stop: impl Future<Output = ()>,
) -> Result<Outcome, DemoError> {
    tokio::pin!(stop);
    let plan = &settings.plan;
    let config = plan.config()?;
    let shop = Shop::start(settings.shop)
        .await
        .map_err(|source| DemoError::Listen {
            what: "127.0.0.1:0 (the demo shop)".into(),
            source,
        })?;
    let upstream: http::Uri =
        format!("http://{}", shop.addr())
            .parse()
            .map_err(|e| DemoError::Listen {
                what: format!("{} (the demo shop)", shop.addr()),
                source: io::Error::new(io::ErrorKind::InvalidInput, e),
            })?;
    let mut proxy_settings = ProxySettings::from_server(&config.server, upstream);
    proxy_settings.listen = settings.listen;
    proxy_settings.admin_listen = settings.admin;
    proxy_settings.admin_token = None;
    let proxy = Proxy::bind(proxy_settings, &config, None)
        .await
        .map_err(DemoError::Proxy)?;
    let proxy_addr = proxy.local_addr()?;
    let admin_addr = proxy.admin_addr()?;
    let reloader = proxy.reloader().clone();
    let advisor = proxy.advisor();
    report::write_header(
        out,
        plan,
        &settings.shop,
        &config,
        shop.addr(),
        proxy_addr,
        admin_addr,
    )?;
    let (proxy_stop, proxy_stopped) = tokio::sync::oneshot::channel::<()>();
    let proxy_task = tokio::spawn(proxy.run(async {
        let _ = proxy_stopped.await;
    }));

    let load = LoadSettings::new(proxy_addr, http::Method::POST, SALE_PATH);
    let gated = drive(
        settings,
        load.clone(),
        Some(&reloader),
        &shop,
        out,
        stop.as_mut(),
    )
    .await?;
    // The hints over the whole run, its last partial interval closed first.
    let now = reloader.clock().now();
    advisor.tick(&reloader.engine(), now);
    let hints = advisor
        .report(
            gated.elapsed + Duration::from_secs(1),
            now,
            &reloader.engine(),
        )
        .routes
        .into_iter()
        .filter(|r| r.offered > 0)
        .flat_map(|r| r.hints)
        .collect();
    // Simulated on a blocking thread (up to about 0.2 s for an hour's run) while the
    // proxy and the shop stop.
    let without_cuts = gated.sale_route().is_some_and(|r| r.cuts > 0).then(|| {
        let (plan, arrivals, offered) = (plan.clone(), settings.arrivals, gated.load.offered);
        tokio::task::spawn_blocking(move || plan.rejected_without_cuts(arrivals, offered))
    });
    let _ = proxy_stop.send(());
    let grace = Duration::from_secs(3);
    if tokio::time::timeout(grace, proxy_task).await.is_err() {
        tracing::warn!("the proxy did not stop within {grace:?}");
    }
    shop.stop(grace).await;
    let rejected_without_cuts = match without_cuts {
        None => None,
        Some(task) => match task.await {
            Ok(Ok(count)) => count,
            Ok(Err(e)) => {
                tracing::warn!("cannot simulate the run without cuts: {e}");
                None
            }
            Err(e) => {
                tracing::warn!("the simulation of the run without cuts failed: {e}");
                None
            }
        },
    };

    let mut ungated = None;
    if settings.compare && !gated.interrupted {
        let shop = Shop::start(settings.shop)
            .await
            .map_err(|source| DemoError::Listen {
                what: "127.0.0.1:0 (the second demo shop)".into(),
                source,
            })?;
        writeln!(
            out,
            "\nthe same traffic straight to a new shop at http://{}, without rocgate:\n",
            shop.addr()
        )?;
        let mut direct = load.clone();
        direct.target = shop.addr();
        ungated = Some(drive(settings, direct, None, &shop, out, stop.as_mut()).await?);
        shop.stop(grace).await;
    }
    Ok(Outcome {
        plan: plan.clone(),
        shop: settings.shop,
        gated,
        ungated,
        hints,
        rejected_without_cuts,
    })
}

/// Plays the traffic to `load.target` and writes a table row per second until the
/// traffic is over or `stop` completes.
async fn drive<S: Future<Output = ()>>(
    settings: &DemoSettings,
    load: LoadSettings,
    gate: Option<&Reloader>,
    shop: &Shop,
    out: &mut (dyn Write + Send),
    mut stop: Pin<&mut S>,
) -> Result<RunReport, DemoError> {
    let plan = &settings.plan;
    let counters = Arc::new(LoadCounters::default());
    let start = Instant::now();
    let mut observer = gate.map(Observer::new);
    let mut generator = tokio::spawn(load::run(
        load,
        plan.profile().clone(),
        settings.arrivals,
        start,
        Arc::clone(&counters),
    ));
    report::write_table_head(out, gate.is_some())?;
    let mut tick = tokio::time::interval_at(start + OBSERVE_EVERY, OBSERVE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut row = Row {
        started: start,
        totals: LoadTotals::default(),
    };
    // Rows end on whole seconds since the start: the sale opens on a row boundary at
    // the default 60 s (20 s in), within a row on a scaled run (3.33 s at 10 s).
    let mut next_row = start + Duration::from_secs(1);
    let mut worst_p99: Option<(f64, Duration)> = None;
    let mut interrupted = false;
    loop {
        tokio::select! {
            _ = &mut generator => break,
            () = &mut stop => {
                interrupted = true;
                generator.abort();
                break;
            }
            _ = tick.tick() => {
                if let Some(o) = &mut observer {
                    o.observe();
                }
                if Instant::now() >= next_row {
                    next_row += Duration::from_secs(1);
                    let p99 = row.write(out, plan, start, &counters, observer.as_ref(), shop)?;
                    keep_worst(&mut worst_p99, p99);
                }
            }
        }
    }
    // Requests sent before a stop run to their end: their answers are counted, up to
    // a second (the shop answers within its line's length, about 210 ms); the report
    // names those still unanswered.
    let settle = Instant::now() + SETTLE;
    while counters.totals().in_flight() > 0 && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if let Some(o) = &mut observer {
        o.observe();
    }
    if row.started.elapsed() >= Duration::from_millis(200) {
        let p99 = row.write(out, plan, start, &counters, observer.as_ref(), shop)?;
        keep_worst(&mut worst_p99, p99);
    }
    let stats = shop.stats();
    let (routes, peak_roc, transitions) = match observer {
        Some(o) => (o.final_routes(), o.peak_roc, o.transitions),
        None => (Vec::new(), None, Vec::new()),
    };
    Ok(RunReport {
        gated: gate.is_some(),
        interrupted,
        elapsed: start.elapsed(),
        load: counters.totals(),
        served: stats.served(),
        overloaded: stats.overloaded(),
        shop_p99: stats.run_p99(),
        worst_p99,
        transitions,
        peak_roc,
        routes,
    })
}

/// Keeps the higher p99 of `worst` and `period` with the time of its period.
fn keep_worst(worst: &mut Option<(f64, Duration)>, period: Option<(f64, Duration)>) {
    if let Some((t_s, p99)) = period {
        if worst.is_none_or(|(_, w)| p99 > w) {
            *worst = Some((t_s, p99));
        }
    }
}

/// The period of the next table row.
struct Row {
    started: Instant,
    totals: LoadTotals,
}

impl Row {
    /// Writes the row for the period that ends now and starts the next one. Returns the
    /// shop's p99 in the period, with the period's end (seconds since `start`).
    fn write(
        &mut self,
        out: &mut (dyn Write + Send),
        plan: &Plan,
        start: Instant,
        counters: &LoadCounters,
        observer: Option<&Observer<'_>>,
        shop: &Shop,
    ) -> Result<Option<(f64, Duration)>, DemoError> {
        let now = Instant::now();
        let period = now.duration_since(self.started).as_secs_f64();
        let totals = counters.totals();
        let delta = totals - self.totals;
        let p99 = shop.stats().take_period_p99();
        let end_s = now.duration_since(start).as_secs_f64();
        let mid_s = (end_s - period / 2.0).max(0.0);
        let controller = observer.and_then(Observer::current);
        report::write_row(
            out,
            end_s,
            plan.phase(mid_s),
            &delta,
            period,
            controller.as_ref(),
            p99,
        )?;
        self.started = now;
        self.totals = totals;
        Ok(p99.map(|p| (end_s, p)))
    }
}

/// Watches the sale route's controller through the engine, in process.
struct Observer<'a> {
    reloader: &'a Reloader,
    /// The engine clock's reading when the traffic started.
    start: crate::clock::Nanos,
    last: Option<RouteSnapshot>,
    transitions: Vec<SeenTransition>,
    peak_roc: Option<f64>,
}

impl<'a> Observer<'a> {
    fn new(reloader: &'a Reloader) -> Self {
        Observer {
            reloader,
            start: reloader.clock().now(),
            last: None,
            transitions: Vec::new(),
            peak_roc: None,
        }
    }

    fn snapshot(&self) -> Option<RouteSnapshot> {
        let engine = self.reloader.engine();
        let id = engine.route_id(SALE_ROUTE)?;
        engine.route_snapshot(id, self.reloader.clock().now())
    }

    fn observe(&mut self) {
        let Some(now) = self.snapshot() else { return };
        let from = self
            .last
            .as_ref()
            .map_or(ControllerState::Normal, |s| s.state);
        if now.state != from {
            self.transitions.push(SeenTransition {
                t_s: now.state_since.saturating_since(self.start).as_secs_f64(),
                from,
                to: now.state,
                limit_rps: now.limit_rps,
            });
        }
        if self.peak_roc.is_none_or(|p| now.roc > p) {
            self.peak_roc = Some(now.roc);
        }
        self.last = Some(now);
    }

    fn current(&self) -> Option<RouteSnapshot> {
        self.last.clone()
    }

    fn final_routes(&self) -> Vec<RouteSnapshot> {
        self.reloader.engine().snapshot(self.reloader.clock().now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_config_is_valid_and_scales() {
        let plan = Plan::new(Duration::from_secs(10)).unwrap();
        let config = plan.config().unwrap();
        let order = config.routes.iter().find(|r| r.name == SALE_ROUTE).unwrap();
        assert!(order.matcher.matches("POST", SALE_PATH));
        // 60 slots of 100 ms become 60 of 17 ms (16.67 rounded to whole µs).
        assert_eq!(order.window.slots(), 60);
        assert_eq!(order.window.slot(), Duration::from_micros(16_667));
        assert_eq!(
            order.controller.hold,
            Duration::from_secs(2).mul_f64(1.0 / 6.0)
        );
        assert_eq!(order.controller.base_limit_rps, 200.0);
        assert_eq!(order.controller.danger_roc, 80.0);
        let nominal = Plan::new(NOMINAL_DURATION).unwrap().config().unwrap();
        assert_eq!(
            nominal,
            Config::from_toml_str(CONFIG_TOML, "config/demo.toml (built in)").unwrap()
        );
    }

    /// The warm-up's 40 req/s pass a 200 req/s bucket whole at every length: its
    /// burst absorbs Poisson clusters, which a shorter run does not compress.
    #[test]
    fn a_short_run_admits_its_whole_warm_up() {
        for secs in [5, 10, 60] {
            let plan = Plan::new(Duration::from_secs(secs)).unwrap();
            let config = plan.config().unwrap();
            let order = config.routes.iter().find(|r| r.name == SALE_ROUTE).unwrap();
            assert_eq!(
                order.algorithm,
                Algorithm::TokenBucket {
                    burst: Duration::from_millis(100)
                }
            );
            let warm_up =
                Profile::from_points(&[(0.0, 40.0), (plan.sale_opens_s(), 40.0)]).unwrap();
            let sim = crate::sim::Simulator::new(config, Some(SALE_ROUTE)).unwrap();
            for seed in 1..=5 {
                let run = sim
                    .run_profile(&warm_up, ArrivalModel::Poisson { seed })
                    .unwrap();
                let s = &run.summary;
                assert!(s.offered > 0, "{secs} s, seed {seed}");
                assert_eq!(s.rejected, 0, "{secs} s, seed {seed}: {s:?}");
            }
        }
    }

    /// A caller can hold a `PlanError` as any error, and reach the profile's error
    /// through its source.
    #[test]
    fn a_plan_error_is_an_error() {
        fn is_an_error<E: std::error::Error + Send + Sync + 'static>() {}
        is_an_error::<PlanError>();
        let profile = Scenario::FlashSale.profile().time_scaled(-1.0).unwrap_err();
        let e = PlanError::Scale(profile.clone());
        assert_eq!(
            e.to_string(),
            format!("--duration: cannot scale the scenario: {profile}")
        );
        let source = std::error::Error::source(&e).expect("the profile's error");
        assert_eq!(source.downcast_ref::<ProfileError>(), Some(&profile));
    }

    /// The sale route of the demo configuration as written, on `profile`: what
    /// `rocgate simulate --config config/demo.toml` reports.
    fn simulated(config: Config, profile: &Profile, model: ArrivalModel) -> crate::sim::Summary {
        crate::sim::Simulator::new(config, Some(SALE_ROUTE))
            .unwrap()
            .run_profile(profile, model)
            .unwrap()
            .summary
    }

    fn demo_toml() -> Config {
        Config::from_toml_str(CONFIG_TOML, "config/demo.toml").unwrap()
    }

    /// A default run's rejections without cuts are those of `rocgate simulate --config
    /// config/demo.toml --scenario flash-sale`, evenly spaced or from a seed; the cut
    /// cost something beyond them.
    #[test]
    fn a_default_run_without_cuts_is_the_flash_sale_simulated() {
        let plan = Plan::new(NOMINAL_DURATION).unwrap();
        for model in [ArrivalModel::Uniform, ArrivalModel::Poisson { seed: 7 }] {
            let s = simulated(demo_toml(), &Scenario::FlashSale.profile(), model);
            let without = s.rejected_without_cuts.expect("an enforce route");
            assert!(!s.cuts.is_empty() && without < s.rejected, "{model}: {s:?}");
            assert_eq!(
                plan.rejected_without_cuts(model, s.offered).unwrap(),
                Some(without),
                "{model}"
            );
        }
    }

    /// A 10 s run: the scenario compressed six times, the configuration's durations
    /// with it, and the seed the load generator used.
    #[test]
    fn a_scaled_run_without_cuts_is_its_own_schedule_simulated() {
        let plan = Plan::new(Duration::from_secs(10)).unwrap();
        let profile = Scenario::FlashSale
            .profile()
            .time_scaled(1.0 / 6.0)
            .unwrap();
        for model in [ArrivalModel::Uniform, ArrivalModel::Poisson { seed: 3 }] {
            let s = simulated(plan.config().unwrap(), &profile, model);
            let without = s.rejected_without_cuts.unwrap();
            assert!(!s.cuts.is_empty() && without < s.rejected, "{model}: {s:?}");
            assert_eq!(
                plan.rejected_without_cuts(model, s.offered).unwrap(),
                Some(without),
                "{model}"
            );
            // The base limit alone is the token bucket's, whose burst is not scaled:
            // the controller's scaled durations change the cuts, not this count.
            let nominal = simulated(demo_toml(), &profile, model);
            assert_eq!(nominal.rejected_without_cuts, Some(without), "{model}");
            assert_ne!(nominal.rejected, s.rejected, "{model}");
        }
    }

    /// A run cut short 10 s into the sale offered the schedule's first arrivals: the
    /// count is the schedule up to there, simulated.
    #[test]
    fn a_run_cut_short_is_simulated_up_to_its_stop() {
        let plan = Plan::new(NOMINAL_DURATION).unwrap();
        let until_30_s =
            Profile::from_points(&[(0.0, 40.0), (20.0, 40.0), (20.0, 600.0), (30.0, 600.0)])
                .unwrap();
        let s = simulated(demo_toml(), &until_30_s, ArrivalModel::Uniform);
        let without = s.rejected_without_cuts.unwrap();
        assert_eq!(s.offered, 800 + 6000);
        assert!(!s.cuts.is_empty() && without > 0, "{s:?}");
        assert_eq!(
            plan.rejected_without_cuts(ArrivalModel::Uniform, s.offered)
                .unwrap(),
            Some(without)
        );
        let whole = plan
            .rejected_without_cuts(ArrivalModel::Uniform, u64::MAX)
            .unwrap()
            .unwrap();
        assert!(without < whole, "{without} of {whole}");
    }

    #[test]
    fn the_plan_compresses_the_sale() {
        let plan = Plan::new(Duration::from_secs(12)).unwrap();
        assert_eq!(plan.sale_opens_s(), 4.0);
        let p = plan.profile();
        assert_eq!(p.rate_at(3.99), 40.0);
        assert_eq!(p.rate_at(4.0), 600.0);
        assert_eq!(p.rate_at(7.99), 600.0);
        assert_eq!(p.duration(), Duration::from_secs(12));
        assert_eq!(plan.phase(1.0), "warm-up");
        assert_eq!(plan.phase(5.0), "sale");
        assert_eq!(plan.phase(9.0), "decay");
        assert_eq!(plan.phase(11.0), "after");
        for bad in [0, 4, 3601] {
            let err = Plan::new(Duration::from_secs(bad)).unwrap_err();
            assert_eq!(
                err,
                PlanError::OutOfRange {
                    duration: Duration::from_secs(bad)
                }
            );
            let err = err.to_string();
            assert!(
                err.starts_with("--duration: must be between 5s and 1h"),
                "{err}"
            );
        }
    }
}
