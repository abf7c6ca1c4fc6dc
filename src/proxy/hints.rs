//! The proxy's side of the tuning hints: the bounded [`History`] it keeps of every
//! route, fed by the engine's sample hook, a timer and the forwarder's
//! [`UpstreamMeter`], and the report behind `GET /admin/hints`.

use crate::clock::Nanos;
use crate::config::HintsConfig;
use crate::engine::{Engine, SlotReport};
use crate::hints::{HintsReport, History, Policy, RouteHints, UpstreamMeter};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Keeps the history the tuning hints are computed from, and gives the hints.
#[derive(Debug)]
pub struct Advisor {
    history: Mutex<History>,
    /// `[hints] keep`: the longest period a report looks at.
    keep: Duration,
    meter: Arc<UpstreamMeter>,
    policy: Policy,
}

impl Advisor {
    /// An advisor with an empty history shaped by `config`.
    pub(crate) fn new(config: &HintsConfig) -> Self {
        Advisor {
            history: Mutex::new(History::new(config.interval, config.keep)),
            keep: config.keep,
            meter: Arc::new(UpstreamMeter::new()),
            policy: config.policy.clone(),
        }
    }

    fn history(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The interval at which [`Advisor::tick`] must be called.
    pub(crate) fn interval(&self) -> Duration {
        self.history().interval()
    }

    /// Where the forwarder records upstream outcomes.
    pub(crate) fn meter(&self) -> Arc<UpstreamMeter> {
        Arc::clone(&self.meter)
    }

    /// One completed slot (from the engine's sample hook).
    pub(crate) fn on_slot(&self, route: &str, report: &SlotReport) {
        self.history().on_slot(route, report);
    }

    /// Closes the current interval of every route of `engine` at `now` (the proxy
    /// calls it every `[hints] interval`).
    pub fn tick(&self, engine: &Engine, now: Nanos) {
        // Route locks are taken before, never under, the history's lock: the sample
        // hook takes them in the other order.
        let snapshots = engine.snapshot(now);
        let settings: Vec<_> = engine
            .route_ids()
            .filter_map(|id| engine.route_settings(id))
            .collect();
        self.history()
            .tick(now, &snapshots, settings, Some(&self.meter));
    }

    /// The hints over the last `period` before `now` (at most `[hints] keep`, which the
    /// report's `period_s` then says), as `GET /admin/hints` returns them. The interval
    /// still open is not included: call [`Advisor::tick`] first to close it.
    pub fn report(&self, period: Duration, now: Nanos) -> HintsReport {
        // No longer is kept: the report says the period it looked at.
        let period = period.min(self.keep);
        let since = Nanos::new(
            now.as_u64()
                .saturating_sub(u64::try_from(period.as_nanos()).unwrap_or(u64::MAX)),
        );
        let (interval, routes) = {
            let h = self.history();
            (h.interval(), h.since(since))
        };
        HintsReport {
            period_s: period.as_secs_f64(),
            interval_s: interval.as_secs_f64(),
            routes: routes
                .iter()
                .map(|(settings, intervals)| {
                    RouteHints::new(settings, intervals, None, &self.policy)
                })
                .collect(),
        }
    }
}
