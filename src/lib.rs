//! rocgate: an adaptive admission controller for HTTP services.
//!
//! Per route, a slotted sliding [`window`] measures the rate of change (ROC) of
//! demand between its two half-windows; the [`controller`] cuts the route's limit
//! when ROC passes a danger threshold and restores it step by step once ROC stays
//! safe; a [`limiter`] enforces the current limit. The [`engine`] ties them together
//! behind one call, `check(route, key, now)`, where `route` is a
//! [`engine::RouteId`] that only the engine hands out and that names a route's state:
//! on an engine that does not hold that state (a reload rebuilt or removed the route,
//! or another engine's) no method panics, `check` admits uncounted and the accessors
//! return `None`.
//!
//! The core (`clock`, `window`, `controller`, `limiter`, `engine`, `config`, `sim`,
//! `hints`)
//! is pure: it takes the time as an argument, does no network I/O and needs no
//! async runtime, so it is deterministic under a [`clock::ManualClock`]. So is
//! [`beside`], the proxy's two futures in one task, kept in the core so that loom
//! checks its wakes (`tests/loom.rs`).
//!
//! Growing the API: enums that a later version may extend (rejection reasons, kinds
//! of admission, controller states, algorithms, partitions, errors) are
//! `#[non_exhaustive]` (not [`limiter::Decision`] itself: admit or reject), as are
//! the configuration structs and the reports and snapshots the crate hands out. Build
//! a configuration from its constructor or `Default` ([`config::RouteConfig::new`],
//! [`config::Tier::new`], [`controller::ControllerParams::default`], the proxy's
//! `ProxySettings::from_server`) and set its public fields; a struct expression,
//! `..Default::default()` included, does not compile outside the crate. Exhaustive on
//! purpose are the plain records a caller fills in to drive a part by hand, for which a
//! new field would be a new thing every caller must supply: a controller's samples
//! ([`window::RocSample`], [`window::SampleAt`]) and memory
//! ([`controller::ControllerMemory`]), a shared store's state for the metrics
//! (`metrics::SharedControl`), the hints' inputs ([`engine::SlotReport`],
//! [`hints::RouteSettings`], [`hints::UpstreamCounts`],
//! [`controller::TransitionCounts`]) and a simulated request ([`sim::Request`]).

pub mod beside;
pub mod clock;
pub mod config;
pub mod controller;
#[cfg(feature = "demo")]
pub mod demo;
pub mod distinct;
pub mod engine;
pub mod hints;
#[cfg(feature = "http")]
pub mod http;
pub mod lanes;
pub mod limiter;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(feature = "proxy")]
pub mod proxy;
mod route_index;
pub mod sim;
pub mod store;
mod sync;
pub mod window;
