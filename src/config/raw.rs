//! The file format: raw serde structs that mirror the TOML, and their validation into
//! [`Config`].
//!
//! Deserialization checks only the shape (known fields, numbers where numbers go) and
//! stops at the first shape error. Everything else (durations, names, modes, paths,
//! limits and how they combine) is checked by [`Config::try_from`], which reports every
//! problem, each under the field path as written in the file.
//!
//! A setting comes from the most specific place that gives it: an event, else its
//! route, else `[defaults]`, else the built-in value (the classic ones of
//! [`ControllerParams::default`]). A value that is wrong on its own is reported where it
//! is written, once (`defaults.hold`, not once per route). Two values that do not fit
//! together are reported at the more specific of the two: `[defaults]` `cut_limit = 60`
//! with a route's `base_limit = 50` is `routes[i].base_limit: must be ≥ cut_limit (60)`.

use super::load::Problem;
use super::{quoted, quotes_bounded, Segment, Tier};
use super::{AdminReads, ClientIpHeader, HintsConfig, ProxyProtocol, ServerConfig, UpstreamError};
use super::{Config, Event, KeyLimits, Mode, Partition, PathPattern, RouteConfig, RouteMatch};
use crate::controller::{ControllerParams, ProfileFields};
use crate::hints::Policy;
use crate::limiter::{gcra, words, Algorithm, MAX_PERMITS, MAX_SPACED_RATE, MAX_WINDOW_COUNT};
use crate::route_index::RouteTries;
use crate::store::{masked_url, FailMode, RedisConfig, RedisServers, StoreConfig, SyncMode};
use crate::window::{RocMode, WindowSpec};
use serde::de::{self, Deserializer, Unexpected, Visitor};
use serde::Deserialize;
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The whole file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    #[serde(default)]
    defaults: RawSettings,
    #[serde(default)]
    routes: Vec<RawRoute>,
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    admin: RawAdmin,
    #[serde(default)]
    hints: RawHints,
    #[serde(default)]
    store: RawStore,
}

/// `[store]`: where shared state lives.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    backend: Option<String>,
    url: Option<String>,
    cluster_nodes: Option<TextList<NodeUrls>>,
    timeout: Option<String>,
    key_prefix: Option<String>,
    fail_mode: Option<String>,
    mode: Option<String>,
    heartbeat: Option<String>,
    failures_to_open: Option<Whole>,
    probe_interval: Option<String>,
    key_ttl: Option<String>,
    instance_id: Option<String>,
    expected_instances: Option<Whole>,
}

/// A list field of `[server]`, `[admin]` or `[store]` (`trusted_proxies`,
/// `proxy_protocol_from`, `allowed_hosts`, `cluster_nodes`): an array of strings, or one
/// string of items between commas, as an environment variable gives it
/// (`ROCGATE__SERVER__TRUSTED_PROXIES=10.0.0.0/8, 192.168.0.0/16`) and as the file may
/// write it too. Each item of the string is read without the ASCII whitespace around
/// it; an empty one (`a,,b`, a comma at the end) is refused with its position, and a
/// string of none (`""`, spaces) as listing nothing (an empty list is `[]`). Any
/// other value (`5`, `true`, a table) is refused as neither, naming what the field
/// lists ([`ListItems::ITEMS`]).
#[derive(Debug)]
struct TextList<K> {
    items: Vec<String>,
    kind: PhantomData<K>,
}

/// The fields read as a [`TextList`], by path: the lists of values the environment
/// sets whole.
pub(super) const TEXT_LISTS: [&str; 4] = [
    "server.trusted_proxies",
    "server.proxy_protocol_from",
    "admin.allowed_hosts",
    "store.cluster_nodes",
];

impl<K> TextList<K> {
    fn into_items(self) -> Vec<String> {
        self.items
    }
}

/// What a [`TextList`] holds: the name its refusal gives the items, and where its
/// string is cut.
trait ListItems {
    /// The items, as in "expected a list of networks".
    const ITEMS: &'static str;

    /// The items of the comma-separated `text`, each as written.
    fn cut(text: &str) -> Vec<&str> {
        text.split(',').collect()
    }
}

/// `server.trusted_proxies` and `server.proxy_protocol_from`.
#[derive(Debug)]
struct Networks;

impl ListItems for Networks {
    const ITEMS: &'static str = "networks (such as \"10.0.0.0/8\")";
}

/// `admin.allowed_hosts`.
#[derive(Debug)]
struct HostNames;

impl ListItems for HostNames {
    const ITEMS: &'static str = "host names";
}

/// `store.cluster_nodes`, whose string is cut as [`node_urls`] cuts it.
#[derive(Debug)]
struct NodeUrls;

impl ListItems for NodeUrls {
    const ITEMS: &'static str = "Redis URLs";

    fn cut(text: &str) -> Vec<&str> {
        node_urls(text)
    }
}

impl<'de, K: ListItems> Deserialize<'de> for TextList<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ListVisitor<K>(PhantomData<K>);

        impl<'de, K: ListItems> Visitor<'de> for ListVisitor<K> {
            type Value = Vec<String>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a list of {}, or a comma-separated string", K::ITEMS)
            }

            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<String>()? {
                    items.push(item);
                }
                Ok(items)
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                if text.trim_ascii().is_empty() {
                    return Err(E::custom(
                        "lists nothing (an empty string): write [] in the file for an empty list",
                    ));
                }
                let mut items = Vec::new();
                for (i, item) in K::cut(text).into_iter().enumerate() {
                    let item = item.trim_ascii();
                    if item.is_empty() {
                        return Err(E::custom(format!(
                            "item {i} (counted from 0) of the comma-separated list is empty: \
                             write one item between two commas, and no comma after the last"
                        )));
                    }
                    items.push(item.to_owned());
                }
                Ok(items)
            }
        }

        d.deserialize_any(ListVisitor::<K>(PhantomData))
            .map(|items| TextList {
                items,
                kind: PhantomData,
            })
    }
}

/// The URLs of `cluster_nodes` written as one string, cut at the commas between them.
/// A comma in a node's user info (`redis://fleet:s3c,r3t@a:7000`: a URL's password
/// may hold commas unencoded) is part of that node: the pieces that follow a URL with
/// no `@` and begin no URL themselves (no `://`) are joined to it up to the last of
/// them holding an `@`. Cut there, neither half was read, nor masked where a refusal
/// quoted it ([`masked_url`]): each showed half the password.
pub(super) fn node_urls(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut from = 0;
    for piece in text.split(',') {
        pieces.push((from, piece));
        from += piece.len() + 1;
    }
    let mut out = Vec::with_capacity(pieces.len());
    let mut i = 0;
    while i < pieces.len() {
        // The URL at `i` and the pieces after it that begin no URL.
        let end = (i + 1..pieces.len())
            .find(|&j| pieces[j].1.contains("://"))
            .unwrap_or(pieces.len());
        let (at, first) = pieces[i];
        let user_info_end = (i + 1..end)
            .rev()
            .find(|&j| pieces[j].1.contains('@'))
            .filter(|_| !first.contains('@'));
        let rest = match user_info_end {
            Some(j) => {
                let (last_at, last) = pieces[j];
                out.push(&text[at..last_at + last.len()]);
                j + 1
            }
            None => i,
        };
        out.extend(pieces[rest..end].iter().map(|&(_, piece)| piece));
        i = end;
    }
    out
}

/// `[server]`: the reverse proxy.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<String>,
    upstream: Option<String>,
    connect_timeout: Option<String>,
    response_timeout: Option<String>,
    header_read_timeout: Option<String>,
    max_body_bytes: Option<Whole>,
    max_upstream_lanes: Option<Whole>,
    upstream_idle_timeout: Option<String>,
    normalize_path: Option<Flag>,
    trusted_proxies: Option<TextList<Networks>>,
    trusted_hops: Option<Whole>,
    client_ip_header: Option<String>,
    proxy_protocol: Option<String>,
    proxy_protocol_from: Option<TextList<Networks>>,
    shutdown_grace: Option<String>,
    max_connections: Option<Whole>,
    max_connections_per_client: Option<Whole>,
    max_upstream_requests: Option<Whole>,
    idle_timeout: Option<String>,
    lingering_time: Option<String>,
    lingering_timeout: Option<String>,
}

/// `[admin]`: the admin API.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    listen: Option<String>,
    token: Option<TokenText>,
    allowed_hosts: Option<TextList<HostNames>>,
    reads: Option<String>,
    wrong_tokens_burst: Option<Whole>,
    wrong_tokens_per_second: Option<Num>,
}

/// `[hints]`: what the tuning hints keep and call saturated.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHints {
    interval: Option<String>,
    keep: Option<String>,
    latency_budget: Option<String>,
    error_budget: Option<Num>,
    min_requests: Option<Whole>,
}

/// Declares `[defaults]` and `[[routes]]` from one list of settings, so that a route
/// takes exactly the settings `[defaults]` takes, plus its own fields.
macro_rules! tables {
    (
        settings { $($s:ident: $sty:ty,)* }
        route { $($r:ident: $rty:ty,)* }
    ) => {
        /// `[defaults]`, or the settings part of a route or an event: every field optional.
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct RawSettings {
            $($s: Option<$sty>,)*
        }

        /// One `[[routes]]` table.
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct RawRoute {
            $(#[serde(default)] $r: $rty,)*
            $($s: Option<$sty>,)*
        }

        /// A route's own fields, split from its settings.
        struct RouteFields {
            $($r: $rty,)*
        }

        impl RawRoute {
            fn split(self) -> (RouteFields, RawSettings) {
                (RouteFields { $($r: self.$r,)* }, RawSettings { $($s: self.$s,)* })
            }
        }
    };
}

tables! {
    settings {
        window: String,
        slot: String,
        roc_mode: String,
        base_limit: Num,
        cut_limit: Num,
        danger_roc: Num,
        safe_roc: Num,
        hold: String,
        restore_step: Num,
        restore_interval: String,
        min_rps: Num,
        min_samples: Whole,
        min_dwell: String,
        max_cut: String,
        mode: String,
        reject_status: Whole,
        algorithm: String,
        burst: String,
        limiter_window: String,
        queue: Whole,
        partition: String,
        max_keys: Whole,
        idle_timeout: String,
        ipv6_prefix: Whole,
    }
    route {
        name: Option<String>,
        method: Option<String>,
        path: Option<String>,
        path_prefix: Option<String>,
        route_limit: Option<Num>,
        tiers: Vec<RawTier>,
        events: Vec<RawEvent>,
    }
}

/// One `[[routes.tiers]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTier {
    name: Option<String>,
    values: Option<Vec<String>>,
    base_limit: Option<Num>,
    cut_limit: Option<Num>,
}

/// The settings a `[[routes.events]]` table can change, as written: the controller's
/// and a partitioned route's `route_limit` ([`RawEvent`]'s fields after `name`,
/// `start` and `duration`). Any other setting (`burst`, `mode`) is the route's own, in
/// force during its events too.
pub(crate) const EVENT_SETTINGS: [&str; 13] = [
    "base_limit",
    "cut_limit",
    "danger_roc",
    "safe_roc",
    "hold",
    "restore_step",
    "restore_interval",
    "min_rps",
    "min_samples",
    "min_dwell",
    "max_cut",
    "roc_mode",
    "route_limit",
];

/// One `[[routes.events]]` table: when, and the controller settings it changes.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEvent {
    name: Option<String>,
    start: Option<String>,
    duration: Option<String>,
    base_limit: Option<Num>,
    cut_limit: Option<Num>,
    danger_roc: Option<Num>,
    safe_roc: Option<Num>,
    hold: Option<String>,
    restore_step: Option<Num>,
    restore_interval: Option<String>,
    min_rps: Option<Num>,
    min_samples: Option<Whole>,
    min_dwell: Option<String>,
    max_cut: Option<String>,
    roc_mode: Option<String>,
    route_limit: Option<Num>,
}

impl RawSettings {
    /// Which of the controller's fields these set, as an event's table does.
    fn profile_fields(&self) -> ProfileFields {
        ProfileFields {
            base_limit: self.base_limit.is_some(),
            cut_limit: self.cut_limit.is_some(),
            roc_mode: self.roc_mode.is_some(),
            danger_roc: self.danger_roc.is_some(),
            safe_roc: self.safe_roc.is_some(),
            hold: self.hold.is_some(),
            restore_step: self.restore_step.is_some(),
            restore_interval: self.restore_interval.is_some(),
            min_rps: self.min_rps.is_some(),
            min_samples: self.min_samples.is_some(),
            min_dwell: self.min_dwell.is_some(),
            max_cut: self.max_cut.is_some(),
        }
    }
}

impl RawEvent {
    /// Its name, start and duration, its controller settings, and its `route_limit`.
    fn split(self) -> ([Option<String>; 3], RawSettings, Option<Num>) {
        let settings = RawSettings {
            base_limit: self.base_limit,
            cut_limit: self.cut_limit,
            danger_roc: self.danger_roc,
            safe_roc: self.safe_roc,
            hold: self.hold,
            restore_step: self.restore_step,
            restore_interval: self.restore_interval,
            min_rps: self.min_rps,
            min_samples: self.min_samples,
            min_dwell: self.min_dwell,
            max_cut: self.max_cut,
            roc_mode: self.roc_mode,
            ..RawSettings::default()
        };
        (
            [self.name, self.start, self.duration],
            settings,
            self.route_limit,
        )
    }
}

/// The refusal of text `v` from the environment that is not the `expected` value
/// ([`Num`], [`Whole`], [`Flag`]): it names the text as a string, quoted.
fn not_text_of<E: de::Error>(v: &str, expected: &dyn de::Expected) -> E {
    E::invalid_value(
        Unexpected::Other(&format!("string {:?}", quoted(v))),
        expected,
    )
}

/// Why a number written not 0 but reading as 0 is refused: how the file, the
/// environment's overrides and a runtime change end its refusal, after the number as
/// written.
pub(super) const NEARER_0: &str =
    "nearer 0 than any number held, it would read as 0 (write 0 if 0 is meant)";

/// Whether the number written `text` (TOML's, JSON's or an override's, a float), read as
/// `read`, is written not 0 (a digit before its exponent is not 0) but reads as 0,
/// nearer 0 than any number held (`1e-400`): taken, it was a 0 nobody wrote.
pub(super) fn written_not_0(text: &str, read: f64) -> bool {
    read == 0.0
        && text
            .split(['e', 'E'])
            .next()
            .is_some_and(|mantissa| mantissa.bytes().any(|b| matches!(b, b'1'..=b'9')))
}

/// The text `v` of a number from the environment without TOML's underscores
/// (`1_000` is `1000`), or, where an underscore does not stand between two digits as
/// TOML has it (`1__0`, `_1`, `1_`, `1_.5`), the refusal of `v` as not the `expected`
/// number, saying where one goes.
fn without_underscores<'a, E: de::Error>(
    v: &'a str,
    expected: &dyn de::Expected,
) -> Result<std::borrow::Cow<'a, str>, E> {
    if !v.contains('_') {
        return Ok(std::borrow::Cow::Borrowed(v));
    }
    let bytes = v.as_bytes();
    let between_digits = bytes.iter().enumerate().all(|(i, &b)| {
        b != b'_'
            || (i > 0
                && bytes[i - 1].is_ascii_digit()
                && bytes.get(i + 1).is_some_and(u8::is_ascii_digit))
    });
    if !between_digits {
        return Err(E::custom(format!(
            "invalid value: string {:?}, expected {expected} (an underscore goes between \
             two digits, as in 1_000)",
            quoted(v)
        )));
    }
    Ok(std::borrow::Cow::Owned(v.replace('_', "")))
}

/// A number, as written in the file (integer or float) or as text from the
/// environment. Stricter than the `config` crate's own conversion: `true` is not 1.
#[derive(Clone, Copy, Debug)]
struct Num(f64);

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NumVisitor { takes_text: true })
    }
}

/// Reads a [`Num`]; from text only if `takes_text` (the environment's overrides arrive
/// as text, a JSON body's numbers as numbers: [`JsonNum`]).
struct NumVisitor {
    takes_text: bool,
}

impl Visitor<'_> for NumVisitor {
    type Value = Num;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number")
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Num, E> {
        Ok(Num(v as f64))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Num, E> {
        Ok(Num(v as f64))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Num, E> {
        Ok(Num(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Num, E> {
        if !self.takes_text {
            return Err(text_for_a_number(v, false, &self));
        }
        let read = without_underscores(v.trim_ascii(), &self)?.parse().map(Num);
        match read {
            // Past what a number holds (`1e400`), which Rust reads as infinity: refused as
            // the file's is, not as an infinity nobody wrote (`inf` is one, refused by
            // the field's rules).
            Ok(Num(n)) if n.is_infinite() && v.bytes().any(|b| b.is_ascii_digit()) => Err(
                E::custom(format!("number out of range, got {:?}", quoted(v))),
            ),
            // Nearer 0 than any number held (`1e-400`), which Rust reads as 0.
            Ok(Num(n)) if written_not_0(v, n) => Err(E::custom(format!(
                "number out of range, got {:?}: {NEARER_0}",
                quoted(v)
            ))),
            Ok(n) => Ok(n),
            Err(_) => Err(not_text_of(v, &self)),
        }
    }
}

/// A whole number ≥ 0, as written in the file or as text from the environment.
#[derive(Clone, Copy, Debug)]
struct Whole(u64);

impl<'de> Deserialize<'de> for Whole {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(WholeVisitor { takes_text: true })
    }
}

/// Reads a [`Whole`]; from text only if `takes_text`, as [`NumVisitor`].
struct WholeVisitor {
    takes_text: bool,
}

impl Visitor<'_> for WholeVisitor {
    type Value = Whole;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a whole number ≥ 0")
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Whole, E> {
        u64::try_from(v)
            .map(Whole)
            .map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Whole, E> {
        Ok(Whole(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Whole, E> {
        Err(E::invalid_value(Unexpected::Float(v), &self))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Whole, E> {
        if !self.takes_text {
            return Err(text_for_a_number(v, true, &self));
        }
        without_underscores(v.trim_ascii(), &self)?
            .parse()
            .map(Whole)
            .map_err(|_| not_text_of(v, &self))
    }
}

/// A number of a runtime change: a JSON number, never text. JSON has numbers, so
/// `"300"` there is a client's mistake (a script that quoted what it should not), refused
/// naming the field; the file's [`Num`] takes text for the environment's overrides.
#[derive(Clone, Copy, Debug)]
struct JsonNum(Num);

impl<'de> Deserialize<'de> for JsonNum {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NumVisitor { takes_text: false })
            .map(JsonNum)
    }
}

/// A whole number of a runtime change: a JSON number, never text, as [`JsonNum`]. A
/// number that is no whole number ≥ 0 (`-1`, `2.5`) reads, as the refusal of the rules
/// (`Err`): JSON has one type of number, and one out of the field's bounds is refused
/// with the change's other problems (422), as `"base_limit": -1` is, not as a body that
/// is no change (400).
#[derive(Clone, Debug)]
struct JsonWhole(Result<Whole, String>);

impl<'de> Deserialize<'de> for JsonWhole {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct JsonWholeVisitor;
        impl JsonWholeVisitor {
            /// A number, read as [`WholeVisitor`] reads it, its refusal kept.
            fn number(read: Result<Whole, de::value::Error>) -> JsonWhole {
                JsonWhole(read.map_err(|e| e.to_string()))
            }
        }
        impl Visitor<'_> for JsonWholeVisitor {
            type Value = JsonWhole;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                WholeVisitor { takes_text: false }.expecting(f)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<JsonWhole, E> {
                Ok(Self::number(
                    WholeVisitor { takes_text: false }.visit_i64(v),
                ))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<JsonWhole, E> {
                Ok(Self::number(
                    WholeVisitor { takes_text: false }.visit_u64(v),
                ))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<JsonWhole, E> {
                Ok(Self::number(
                    WholeVisitor { takes_text: false }.visit_f64(v),
                ))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<JsonWhole, E> {
                WholeVisitor { takes_text: false }
                    .visit_str(v)
                    .map(|w| JsonWhole(Ok(w)))
            }
        }
        d.deserialize_any(JsonWholeVisitor)
    }
}

/// The refusal of the JSON string `v` where a number goes: what the field takes, and
/// where the text is such a number (`"300"`), how to write it.
fn text_for_a_number<E: de::Error>(v: &str, whole: bool, expected: &dyn de::Expected) -> E {
    E::custom(text_refusal(
        v,
        bare_number(v, whole),
        &format_args!("{expected}"),
    ))
}

/// The refusal of the string `v` (as the file or a change wrote it) where a field takes
/// `expected`, a number or a boolean: with how to write it, `bare`, where it has one.
pub(super) fn text_refusal(v: &str, bare: Option<&str>, expected: &dyn fmt::Display) -> String {
    let how = bare
        .map(|bare| format!(" (write it without quotes: {})", quoted(bare)))
        .unwrap_or_default();
    format!("must be {expected}, got the string {:?}{how}", quoted(v))
}

/// `text` without the whitespace around it, where it is a number as JSON and TOML both
/// write one (`-2.5e1`: not `.5`, `+5`, `007`, `Infinity`, `NaN`, nor `1e400`, past what
/// a number holds, nor `1e-400`, nearer 0 than any, [`written_not_0`]) and, if `whole`,
/// a whole number ≥ 0: how a number written as a string is written without its quotes.
/// Only such text is advised, so that the advice is never text that does not read, or
/// that the field refuses as no whole number.
pub(super) fn bare_number(text: &str, whole: bool) -> Option<&str> {
    let bare = text.trim_ascii();
    let read = serde_json::from_str::<serde_json::Number>(bare).ok()?;
    if read.as_f64().is_some_and(|x| written_not_0(bare, x)) {
        return None;
    }
    (!whole || bare.parse::<u64>().is_ok()).then_some(bare)
}

/// `true` or `false`, as written in the file or as text from the environment (where
/// `config` would also take `1`, `on` or `yes`: a file says `true`).
#[derive(Clone, Copy, Debug)]
struct Flag(bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct FlagVisitor;
        impl Visitor<'_> for FlagVisitor {
            type Value = Flag;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true or false")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Flag, E> {
                Ok(Flag(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Flag, E> {
                match v.trim_ascii() {
                    "true" => Ok(Flag(true)),
                    "false" => Ok(Flag(false)),
                    _ => Err(not_text_of(v, &self)),
                }
            }
        }
        d.deserialize_any(FlagVisitor)
    }
}

/// A duration of a runtime change: a JSON string, read by the file's rules. Any other
/// JSON value (`5`, `2.5`, `true`, an array, an object) is refused naming what it is,
/// as a change that does not read (400): a bare number was taken as its text and
/// refused by the rules (422) as `invalid duration "5": time unit needed`, where every
/// other field of the wrong JSON type is a change that does not read. (`null` is
/// refused before, by [`not_null`].)
#[derive(Debug)]
struct DurationText(String);

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct DurationVisitor;
        impl DurationVisitor {
            fn refuse<E: de::Error>(got: fmt::Arguments<'_>) -> Result<DurationText, E> {
                Err(E::custom(format!(
                    "must be a duration string such as \"5s\" or \"100ms\", got {got}"
                )))
            }
        }
        impl<'de> Visitor<'de> for DurationVisitor {
            type Value = DurationText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"5s\" or \"100ms\"")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<DurationText, E> {
                Self::refuse(format_args!("{v}"))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<DurationText, E> {
                Self::refuse(format_args!("the number {v}"))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<DurationText, E> {
                Self::refuse(format_args!("the number {v}"))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<DurationText, E> {
                Self::refuse(format_args!("the number {}", figure(v)))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<DurationText, A::Error> {
                Self::refuse(format_args!("an array"))
            }
            fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<DurationText, A::Error> {
                Self::refuse(format_args!("an object"))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<DurationText, E> {
                Ok(DurationText(v.to_owned()))
            }
        }
        d.deserialize_any(DurationVisitor)
    }
}

/// `[admin] token`: a TOML string, or a variable's text. A number or a boolean is
/// refused, naming its kind and never its value (the token is a secret, and a
/// refusal goes to logs): the `config` crate would take it as the text it writes for
/// it, not as the file has it (`0x1F` as `31`, `1e3` as `1000`), and serde's own
/// refusal quotes the value (``invalid type: integer `123456` ``). A date-time
/// reaches it as the crate's text for it, and is refused where the file is read
/// (`token_is_datetime` in `load.rs`). Held as a [`Secret`](super::Secret), `***` in
/// the `Debug` of [`RawAdmin`] too.
#[derive(Debug)]
struct TokenText(super::Secret);

impl<'de> Deserialize<'de> for TokenText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TokenVisitor;
        impl TokenVisitor {
            fn refuse<E: de::Error>(kind: &str) -> Result<TokenText, E> {
                Err(E::custom(format!(
                    "must be a string, got {kind}: write it in quotes (token = \"…\"), \
                     the text a client sends"
                )))
            }
        }
        impl Visitor<'_> for TokenVisitor {
            type Value = TokenText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<TokenText, E> {
                Self::refuse("a boolean")
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<TokenText, E> {
                Self::refuse("an integer")
            }
            fn visit_i128<E: de::Error>(self, _: i128) -> Result<TokenText, E> {
                Self::refuse("an integer")
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<TokenText, E> {
                Self::refuse("an integer")
            }
            fn visit_u128<E: de::Error>(self, _: u128) -> Result<TokenText, E> {
                Self::refuse("an integer")
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<TokenText, E> {
                Self::refuse("a float")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<TokenText, E> {
                Ok(TokenText(super::Secret::new(v)))
            }
        }
        d.deserialize_any(TokenVisitor)
    }
}

/// Where a value was written. Later variants are more specific; only scopes of one
/// route are ever compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    /// Not written anywhere: the built-in value.
    Builtin,
    /// The value in force before a runtime change.
    Current,
    /// `[defaults]`.
    Defaults,
    /// `routes[i]`.
    Route(usize),
    /// `routes[i].events[j]`.
    Event(usize, usize),
    /// `routes[i].tiers[j]`.
    Tier(usize, usize),
    /// A field of a runtime change.
    Patch,
}

impl Scope {
    /// The path of `field` at this scope, as written in the file.
    fn path(self, field: &str) -> String {
        match self {
            Scope::Builtin | Scope::Defaults => format!("defaults.{field}"),
            Scope::Current | Scope::Patch => field.to_owned(),
            Scope::Route(i) => format!("routes[{i}].{field}"),
            Scope::Event(i, j) => format!("routes[{i}].events[{j}].{field}"),
            Scope::Tier(i, j) => format!("routes[{i}].tiers[{j}].{field}"),
        }
    }
}

/// A value and where it was written.
#[derive(Clone, Debug)]
struct Set<T> {
    value: T,
    scope: Scope,
}

/// A setting in force somewhere, or `None` where what was written is invalid (and
/// already reported).
type Res<T> = Option<Set<T>>;

/// The problems found so far, without repeats (a `[defaults]` value that does not fit
/// is found once per route).
#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn at(&mut self, location: String, message: impl Into<String>) {
        self.add(Problem::new(location, message));
    }

    fn add(&mut self, problem: Problem) {
        if !self.0.contains(&problem) {
            self.0.push(problem);
        }
    }
}

/// The enforcing algorithm, as named in the file; its settings are separate fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    TokenBucket,
    FixedWindow,
    SlidingWindow,
    LeakyBucket,
    Concurrency,
}

const ALGORITHMS: [(&str, Kind); 5] = [
    ("token_bucket", Kind::TokenBucket),
    ("fixed_window", Kind::FixedWindow),
    ("sliding_window", Kind::SlidingWindow),
    ("leaky_bucket", Kind::LeakyBucket),
    ("concurrency", Kind::Concurrency),
];

/// The algorithm's name as written in the file.
fn kind_name(kind: Kind) -> &'static str {
    ALGORITHMS
        .iter()
        .find(|(_, k)| *k == kind)
        .map_or("", |(n, _)| n)
}

/// The partition, as named in the file; its key limits are separate fields.
#[derive(Clone, Debug, PartialEq, Eq)]
enum PartitionKind {
    Route,
    Ip,
    /// Lower-case header name.
    Header(String),
}

/// Every setting as in force at one place: `[defaults]`, a route, or an event.
#[derive(Clone, Debug)]
struct Settings {
    window: Res<Duration>,
    slot: Res<Duration>,
    roc_mode: Res<RocMode>,
    base_limit: Res<f64>,
    cut_limit: Res<f64>,
    danger_roc: Res<f64>,
    safe_roc: Res<f64>,
    hold: Res<Duration>,
    restore_step: Res<f64>,
    restore_interval: Res<Duration>,
    min_rps: Res<f64>,
    min_samples: Res<u64>,
    min_dwell: Res<Duration>,
    max_cut: Res<Duration>,
    mode: Res<Mode>,
    reject_status: Res<u16>,
    algorithm: Res<Kind>,
    burst: Res<Duration>,
    limiter_window: Res<Duration>,
    queue: Res<u32>,
    partition: Res<PartitionKind>,
    max_keys: Res<usize>,
    idle_timeout: Res<Duration>,
    ipv6_prefix: Res<u8>,
}

impl Settings {
    /// The built-in values: the classic ones, a token bucket of one second, no partition.
    fn builtin() -> Settings {
        fn b<T>(value: T) -> Res<T> {
            Some(Set {
                value,
                scope: Scope::Builtin,
            })
        }
        let c = ControllerParams::default();
        let w = WindowSpec::default();
        let k = KeyLimits::default();
        Settings {
            window: b(w.window()),
            slot: b(w.slot()),
            roc_mode: b(c.roc_mode),
            base_limit: b(c.base_limit_rps),
            cut_limit: b(c.cut_limit_rps),
            danger_roc: b(c.danger_roc),
            safe_roc: b(c.safe_roc),
            hold: b(c.hold),
            restore_step: b(c.restore_step_rps),
            restore_interval: b(c.restore_interval),
            min_rps: b(c.min_rps),
            min_samples: b(c.min_samples),
            min_dwell: b(c.min_dwell),
            max_cut: b(c.max_cut),
            mode: b(Mode::default()),
            reject_status: b(429),
            algorithm: b(Kind::TokenBucket),
            burst: b(Duration::from_secs(1)),
            limiter_window: b(Duration::from_secs(1)),
            queue: b(0),
            partition: b(PartitionKind::Route),
            max_keys: b(k.max_keys),
            idle_timeout: b(k.idle_timeout),
            ipv6_prefix: b(k.ipv6_prefix),
        }
    }

    /// These settings, overridden by those written at `at`; each value written there
    /// is checked on its own.
    fn over(&self, raw: RawSettings, at: Scope, p: &mut Problems) -> Settings {
        let mut r = Reader { p: &mut *p, at };
        let s = Settings {
            window: r.read("window", raw.window, &self.window, window_duration),
            slot: r.read("slot", raw.slot, &self.slot, window_duration),
            roc_mode: r.read("roc_mode", raw.roc_mode, &self.roc_mode, roc_mode),
            base_limit: r.read("base_limit", raw.base_limit, &self.base_limit, limit),
            cut_limit: r.read("cut_limit", raw.cut_limit, &self.cut_limit, limit),
            danger_roc: r.read("danger_roc", raw.danger_roc, &self.danger_roc, finite),
            safe_roc: r.read("safe_roc", raw.safe_roc, &self.safe_roc, finite),
            hold: r.read("hold", raw.hold, &self.hold, controller_duration),
            restore_step: r.read(
                "restore_step",
                raw.restore_step,
                &self.restore_step,
                positive,
            ),
            restore_interval: r.read(
                "restore_interval",
                raw.restore_interval,
                &self.restore_interval,
                nonzero_controller_duration,
            ),
            min_rps: r.read("min_rps", raw.min_rps, &self.min_rps, non_negative),
            min_samples: r.read("min_samples", raw.min_samples, &self.min_samples, |w| {
                Ok(w.0)
            }),
            min_dwell: r.read(
                "min_dwell",
                raw.min_dwell,
                &self.min_dwell,
                controller_duration,
            ),
            max_cut: r.read(
                "max_cut",
                raw.max_cut,
                &self.max_cut,
                nonzero_controller_duration,
            ),
            mode: r.read("mode", raw.mode, &self.mode, mode),
            reject_status: r.read(
                "reject_status",
                raw.reject_status,
                &self.reject_status,
                reject_status,
            ),
            algorithm: r.read("algorithm", raw.algorithm, &self.algorithm, algorithm),
            burst: r.read("burst", raw.burst, &self.burst, burst_duration),
            limiter_window: r.read(
                "limiter_window",
                raw.limiter_window,
                &self.limiter_window,
                millis_duration,
            ),
            queue: r.read("queue", raw.queue, &self.queue, queue_length),
            partition: r.read("partition", raw.partition, &self.partition, partition),
            max_keys: r.read("max_keys", raw.max_keys, &self.max_keys, key_count),
            idle_timeout: r.read(
                "idle_timeout",
                raw.idle_timeout,
                &self.idle_timeout,
                idle_duration,
            ),
            ipv6_prefix: r.read(
                "ipv6_prefix",
                raw.ipv6_prefix,
                &self.ipv6_prefix,
                prefix_bits,
            ),
        };
        s.check_mode_change(self, at, p);
        s
    }

    /// The ROC thresholds are in req/s per half-window (absolute) or a ratio (relative): where
    /// `roc_mode` changes the mode in force below, thresholds written below (not the
    /// built-in ones, which `controller_params` reports) would be read in the other
    /// unit, so they must be written here.
    fn check_mode_change(&self, below: &Settings, at: Scope, p: &mut Problems) {
        let (Some(mode), Some(under)) = (&self.roc_mode, &below.roc_mode) else {
            return;
        };
        if mode.scope != at || mode.value == under.value {
            return;
        }
        let unit = match mode.value {
            RocMode::Absolute => "req/s per half-window",
            RocMode::Relative => "a ratio",
        };
        for (field, threshold) in [
            ("danger_roc", &self.danger_roc),
            ("safe_roc", &self.safe_roc),
        ] {
            let inherited = threshold
                .as_ref()
                .filter(|t| t.scope != at && t.scope != Scope::Builtin);
            if let Some(t) = inherited {
                p.at(
                    at.path(field),
                    format!(
                        "must be set with roc_mode where it changes the mode: the {field} in force ({}) is in the other mode's unit, and this mode reads it as {unit}",
                        t.value
                    ),
                );
            }
        }
    }
}

/// Reads the values written at one scope.
struct Reader<'a> {
    p: &'a mut Problems,
    at: Scope,
}

impl Reader<'_> {
    /// `raw` parsed and checked, if it was written; else the setting in force below.
    fn read<R, T: Clone>(
        &mut self,
        field: &str,
        raw: Option<R>,
        under: &Res<T>,
        parse: impl FnOnce(R) -> Result<T, String>,
    ) -> Res<T> {
        let Some(raw) = raw else {
            return under.clone();
        };
        match parse(raw) {
            Ok(value) => Some(Set {
                value,
                scope: self.at,
            }),
            Err(message) => {
                self.p.at(self.at.path(field), message);
                None
            }
        }
    }

    /// `raw` parsed and checked; reported as required when absent.
    fn require<R, T: Clone>(
        &mut self,
        field: &str,
        raw: Option<R>,
        parse: impl FnOnce(R) -> Result<T, String>,
    ) -> Res<T> {
        if raw.is_none() {
            self.p.at(self.at.path(field), "required");
        }
        self.read(field, raw, &None, parse)
    }
}

fn any_duration(text: String) -> Result<Duration, String> {
    if text.trim_ascii_start().starts_with('-') {
        return Err(format!("must not be negative, got {:?}", quoted(&text)));
    }
    // humantime reads any whitespace as a space: "5s\u{a0}" (or a vertical tab) was 5s,
    // read without the character nobody sees, where every other value refuses it.
    if let Some(c) = text
        .chars()
        .find(|c| c.is_whitespace() && !c.is_ascii_whitespace())
    {
        return Err(format!(
            "invalid duration {:?}: holds U+{:04X}, {}",
            quoted(&text),
            u32::from(c),
            "whitespace other than a space, tab, line break or form feed"
        ));
    }
    humantime::parse_duration(text.trim_ascii()).map_err(|e| {
        let why = match e {
            // The unit as written, the whole value at worst: quoted as the value is.
            humantime::DurationError::UnknownUnit { unit, .. } if !unit.is_empty() => format!(
                "unknown time unit {:?}, supported units: ns, us/µs, ms, sec, min, hours, \
                 days, weeks, months, years (and few variations)",
                quoted(&unit)
            ),
            e => e.to_string(),
        };
        format!("invalid duration {:?}: {why}", quoted(&text))
    })
}

fn nonzero_duration(text: String) -> Result<Duration, String> {
    match any_duration(text)? {
        d if d.is_zero() => Err("must be longer than zero".to_owned()),
        d => Ok(d),
    }
}

/// The longest ROC `window` (and `slot`): the controller acts on what a window shows,
/// and a longer one would be an hour before it first acts.
const LONGEST_WINDOW: Duration = Duration::from_secs(3600);

/// The longest `hold`, `restore_interval`, `min_dwell` and `max_cut`: a cut held, or a
/// restore step waited for, longer than a day is no adaptive limit but a fixed one.
const LONGEST_CONTROLLER_DURATION: Duration = Duration::from_secs(24 * 3600);

/// The longest restore from `cut_limit` to `base_limit`, all its steps together (7
/// steps of the longest `restore_interval`): a cut route back at its base limit only
/// later than that is cut for good.
pub(crate) const LONGEST_RESTORE: Duration = Duration::from_secs(7 * 24 * 3600);

/// The longest `idle_timeout` of a partition's keys.
const LONGEST_IDLE_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// `d`, unless longer than `most` (written `most_text` in the error).
fn at_most(d: Duration, most: Duration, most_text: &str) -> Result<Duration, String> {
    if d > most {
        return Err(format!(
            "must be at most {most_text}, got {}",
            humantime::format_duration(d)
        ));
    }
    Ok(d)
}

/// A ROC `window` or `slot`: at most [`LONGEST_WINDOW`].
fn window_duration(text: String) -> Result<Duration, String> {
    at_most(any_duration(text)?, LONGEST_WINDOW, "1h")
}

/// `hold` or `min_dwell`: zero or more, at most [`LONGEST_CONTROLLER_DURATION`].
fn controller_duration(text: String) -> Result<Duration, String> {
    at_most(any_duration(text)?, LONGEST_CONTROLLER_DURATION, "1day")
}

/// `restore_interval` or `max_cut`: longer than zero, at most
/// [`LONGEST_CONTROLLER_DURATION`].
fn nonzero_controller_duration(text: String) -> Result<Duration, String> {
    at_most(nonzero_duration(text)?, LONGEST_CONTROLLER_DURATION, "1day")
}

/// A partition's `idle_timeout`: longer than zero, at most [`LONGEST_IDLE_TIMEOUT`].
fn idle_duration(text: String) -> Result<Duration, String> {
    at_most(nonzero_duration(text)?, LONGEST_IDLE_TIMEOUT, "7days")
}

/// A window the window counters keep exactly: a whole number of milliseconds, in 32
/// bits (up to 49 days).
fn millis_duration(text: String) -> Result<Duration, String> {
    let most = Duration::from_millis(u32::MAX.into());
    match nonzero_duration(text)? {
        d if d.subsec_nanos() % 1_000_000 != 0 => Err(format!(
            "must be a whole number of milliseconds, got {}",
            humantime::format_duration(d)
        )),
        d if d > most => Err(format!(
            "must be at most 4294967295ms (49.7 days, what a window counter holds), got {}ms",
            d.as_millis()
        )),
        d => Ok(d),
    }
}

/// A token bucket's burst, which it keeps to the millisecond in 32 bits (up to 49.7
/// days): longer than zero, and no longer than that rather than cut short unsaid.
fn burst_duration(text: String) -> Result<Duration, String> {
    check_burst(nonzero_duration(text)?)
}

/// A burst no longer than a token bucket keeps (see [`burst_duration`]).
pub(crate) fn check_burst(burst: Duration) -> Result<Duration, String> {
    let most = Duration::from_millis(u32::MAX.into());
    if burst > most {
        return Err(format!(
            "must be at most 4294967295ms (49.7 days, what a token bucket keeps), got {}ms",
            burst.as_millis()
        ));
    }
    Ok(burst)
}

/// A timeout or period a timer waits for: longer than zero, at most a year. Longer
/// ones (written to mean "never") overflow the clock where a timer adds them to now.
fn timer_duration(text: String) -> Result<Duration, String> {
    const LONGEST: Duration = Duration::from_secs(365 * 24 * 3600);
    match nonzero_duration(text.clone())? {
        d if d > LONGEST => Err(format!("must be at most 365 days, got {:?}", quoted(&text))),
        d => Ok(d),
    }
}

/// The last second RFC 3339 can write (9999-12-31T23:59:59Z), past which humantime's
/// formatting panics, as it does before 1970.
const LAST_RFC3339_SECOND: u64 = 253_402_300_799;

/// `t` written in RFC 3339 by `format`, or, out of the range that can be written (an
/// event built in code, an event's end past the year 9999), a phrase saying where it is.
fn utc_text<D: fmt::Display>(t: SystemTime, format: fn(SystemTime) -> D) -> String {
    match t.duration_since(UNIX_EPOCH) {
        Err(_) => "a time before 1970-01-01T00:00:00Z".to_owned(),
        Ok(d) if d.as_secs() > LAST_RFC3339_SECOND => {
            "a time after 9999-12-31T23:59:59Z".to_owned()
        }
        Ok(_) => format(t).to_string(),
    }
}

/// An RFC 3339 time in UTC; its `T` and `Z` may be lower case (RFC 3339 §5.6), and a
/// space may stand for the `T`.
fn utc_time(text: String) -> Result<SystemTime, String> {
    let mut written = text.trim_ascii().to_ascii_uppercase();
    if written.get(10..11) == Some(" ") {
        written.replace_range(10..11, "T");
    }
    humantime::parse_rfc3339(&written).map_err(|e| {
        format!(
            "must be an RFC 3339 UTC time such as \"2026-11-27T20:00:00Z\" (in UTC: Z, or an offset of +00:00), got {:?}: {e}",
            quoted(&text)
        )
    })
}

fn queue_length(w: Whole) -> Result<u32, String> {
    u32::try_from(w.0).map_err(|_| format!("must be at most {}, got {}", u32::MAX, w.0))
}

/// The leading bits of an IPv6 address that make a key.
fn prefix_bits(w: Whole) -> Result<u8, String> {
    match u8::try_from(w.0) {
        Ok(bits @ 1..=128) => Ok(bits),
        _ => Err(format!(
            "must be a prefix length from 1 to 128, got {}",
            w.0
        )),
    }
}

fn key_count(w: Whole) -> Result<usize, String> {
    match usize::try_from(w.0) {
        Ok(0) => Err("must be at least 1, got 0".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("must be at most {}, got {}", usize::MAX, w.0)),
    }
}

fn positive(n: Num) -> Result<f64, String> {
    if n.0.is_finite() && n.0 > 0.0 {
        Ok(n.0)
    } else if n.0.is_finite() {
        Err(format!("must be a number > 0, got {}", figure(n.0)))
    } else {
        Err(format!("must be a finite number > 0, got {}", figure(n.0)))
    }
}

/// A limit: at least one request in 11.6 days, so that the interval between two
/// requests stays within the limiters' nanosecond arithmetic.
fn limit(n: Num) -> Result<f64, String> {
    match positive(n)? {
        rate if rate < super::MIN_LIMIT => Err(format!(
            "must be at least {:.6} (one request in 11.6 days), got {}",
            super::MIN_LIMIT,
            figure(n.0)
        )),
        rate => Ok(rate),
    }
}

fn non_negative(n: Num) -> Result<f64, String> {
    if n.0.is_finite() && n.0 >= 0.0 {
        Ok(n.0)
    } else if n.0.is_finite() {
        Err(format!("must be a number ≥ 0, got {}", figure(n.0)))
    } else {
        Err(format!("must be a finite number ≥ 0, got {}", figure(n.0)))
    }
}

fn finite(n: Num) -> Result<f64, String> {
    if n.0.is_finite() {
        Ok(n.0)
    } else {
        Err(format!("must be a finite number, got {}", figure(n.0)))
    }
}

fn choice<T: Clone>(text: &str, options: &[(&str, T)]) -> Result<T, String> {
    options
        .iter()
        .find(|(name, _)| *name == text)
        .map(|(_, value)| value.clone())
        .ok_or_else(|| {
            let names: Vec<String> = options
                .iter()
                .map(|(name, _)| format!("{name:?}"))
                .collect();
            format!(
                "must be one of {}, got {:?}",
                names.join(", "),
                quoted(text)
            )
        })
}

fn roc_mode(text: String) -> Result<RocMode, String> {
    choice(
        &text,
        &[
            ("absolute", RocMode::Absolute),
            ("relative", RocMode::Relative),
        ],
    )
}

/// The status of a rejection: 429, or another 4xx or 5xx such as 503 for capacity
/// shedding.
fn reject_status(w: Whole) -> Result<u16, String> {
    match u16::try_from(w.0) {
        Ok(code @ 400..=599) => Ok(code),
        _ => Err(format!(
            "must be an HTTP status from 400 to 599, got {}",
            w.0
        )),
    }
}

fn mode(text: String) -> Result<Mode, String> {
    choice(
        &text,
        &[Mode::Enforce, Mode::Shadow, Mode::ShadowAdaptive].map(|m| (m.as_str(), m)),
    )
}

fn algorithm(text: String) -> Result<Kind, String> {
    choice(&text, &ALGORITHMS)
}

fn partition(text: String) -> Result<PartitionKind, String> {
    match text.as_str() {
        "route" => Ok(PartitionKind::Route),
        "ip" => Ok(PartitionKind::Ip),
        _ => match text.strip_prefix("header:") {
            Some(name) if is_token(name) => Ok(PartitionKind::Header(name.to_ascii_lowercase())),
            Some(name) => Err(format!(
                "{:?} is not a valid HTTP header name",
                quoted(name)
            )),
            None => Err(format!(
                r#"must be "route", "ip" or "header:<name>", got {:?}"#,
                quoted(&text)
            )),
        },
    }
}

/// Whether `s` is an HTTP token (RFC 9110 §5.6.2), as header names and methods are.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Whether `s` can arrive as a header's value: no control characters but tabs (RFC
/// 9110 §5.5), and no leading or trailing whitespace (a parser strips it).
pub(super) fn is_header_value(s: &str) -> bool {
    !s.starts_with([' ', '\t'])
        && !s.ends_with([' ', '\t'])
        && s.bytes().all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// What keeps `token`, which [`is_header_value`] refuses, out of a header, said
/// without the token: it is a secret, and the error goes to logs.
pub(super) fn unsendable(token: &str) -> String {
    let len = token.chars().count();
    if token.starts_with([' ', '\t']) {
        return format!("whitespace before a token of {len} characters");
    }
    if token.ends_with([' ', '\t']) {
        return format!("whitespace after a token of {len} characters");
    }
    token
        .chars()
        .enumerate()
        .find(|(_, c)| c.is_ascii_control() && *c != '\t')
        .map_or_else(
            || format!("a token of {len} characters it cannot carry"),
            |(i, c)| {
                format!(
                    "the control character U+{:04X} as character {} of {len}",
                    u32::from(c),
                    i + 1
                )
            },
        )
}

/// Checks a name that may become a metric label value: `A-Z a-z 0-9 _ . : -`.
fn check_name(p: &mut Problems, at: Scope, raw: Option<String>) -> Option<String> {
    let is_label = |n: &str| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.:-".contains(c))
    };
    match raw {
        Some(n) if is_label(&n) => return Some(n),
        Some(n) => p.at(
            at.path("name"),
            format!("must be non-empty and use only A-Z a-z 0-9 _ . : - (it is a metric label value), got {:?}", quoted(&n)),
        ),
        None => p.at(at.path("name"), "required"),
    }
    None
}

/// Reports `low` above `high` (or equal to it, when `strict`) at the more specific of
/// the two.
fn ordered(p: &mut Problems, low: (&str, &Set<f64>), high: (&str, &Set<f64>), strict: bool) {
    let ((low_name, low), (high_name, high)) = (low, high);
    let fits = if strict {
        low.value < high.value
    } else {
        low.value <= high.value
    };
    if fits {
        return;
    }
    let (below, above) = if strict { ("<", ">") } else { ("≤", "≥") };
    if low.scope >= high.scope {
        let message = format!(
            "must be {below} {high_name} ({}), got {}",
            figure(high.value),
            figure(low.value)
        );
        p.at(low.scope.path(low_name), message);
    } else {
        let message = format!(
            "must be {above} {low_name} ({}), got {}",
            figure(low.value),
            figure(high.value)
        );
        p.at(high.scope.path(high_name), message);
    }
}

/// The controller parameters, with the checks of how they combine.
fn controller_params(p: &mut Problems, s: &Settings) -> Option<ControllerParams> {
    if let (Some(cut), Some(base)) = (&s.cut_limit, &s.base_limit) {
        ordered(p, ("cut_limit", cut), ("base_limit", base), false);
        if let (Some(step), Some(interval)) = (&s.restore_step, &s.restore_interval) {
            restores_within_a_week(p, (cut, base), step, interval);
        }
    }
    if let (Some(safe), Some(danger)) = (&s.safe_roc, &s.danger_roc) {
        ordered(p, ("safe_roc", safe), ("danger_roc", danger), true);
    }
    if let Some(mode) = s.roc_mode.as_ref().filter(|m| m.value == RocMode::Relative) {
        for (field, threshold) in [("danger_roc", &s.danger_roc), ("safe_roc", &s.safe_roc)] {
            if threshold
                .as_ref()
                .is_some_and(|t| t.scope == Scope::Builtin)
            {
                p.at(
                    mode.scope.path(field),
                    "must be set when roc_mode is relative: it is then a ratio (1.0 means demand doubled)",
                );
            }
        }
        if let Some(safe) = s.safe_roc.as_ref().filter(|t| t.value <= -1.0) {
            p.at(
                safe.scope.max(mode.scope).path("safe_roc"),
                format!(
                    "must be > -1 when roc_mode is relative (demand cannot fall by more than all of it), got {}",
                    figure(safe.value)
                ),
            );
        }
        if let Some(min) = s.min_rps.as_ref().filter(|m| m.value == 0.0) {
            p.at(
                min.scope.max(mode.scope).path("min_rps"),
                "must be > 0 when roc_mode is relative (it is the least denominator of the ratio)",
            );
        }
    }
    Some(ControllerParams {
        base_limit_rps: s.base_limit.as_ref()?.value,
        cut_limit_rps: s.cut_limit.as_ref()?.value,
        danger_roc: s.danger_roc.as_ref()?.value,
        safe_roc: s.safe_roc.as_ref()?.value,
        hold: s.hold.as_ref()?.value,
        restore_step_rps: s.restore_step.as_ref()?.value,
        restore_interval: s.restore_interval.as_ref()?.value,
        min_rps: s.min_rps.as_ref()?.value,
        min_samples: s.min_samples.as_ref()?.value,
        min_dwell: s.min_dwell.as_ref()?.value,
        max_cut: s.max_cut.as_ref()?.value,
        roc_mode: s.roc_mode.as_ref()?.value,
    })
}

/// Refuses a restore from `cut_limit` to `base_limit` that takes longer than
/// [`LONGEST_RESTORE`]: a `restore_step` too small for the gap (`1e-300`) left a cut
/// route at its cut limit for good. Named at the more specific of `restore_step` and
/// `restore_interval`.
fn restores_within_a_week(
    p: &mut Problems,
    (cut, base): (&Set<f64>, &Set<f64>),
    step: &Set<f64>,
    interval: &Set<Duration>,
) {
    if cut.value >= base.value || step.value <= 0.0 {
        return;
    }
    let steps = ((base.value - cut.value) / step.value).ceil();
    let longest = LONGEST_RESTORE.as_secs_f64();
    if steps * interval.value.as_secs_f64() <= longest {
        return;
    }
    // Named at the most specific of the four (the step, else the interval, else the
    // limits, where equally specific).
    let at = [
        ("restore_step", step.scope),
        ("restore_interval", interval.scope),
        ("base_limit", base.scope),
        ("cut_limit", cut.scope),
    ]
    .into_iter()
    .rev()
    .max_by_key(|&(_, scope)| scope)
    .map(|(field, scope)| scope.path(field))
    .unwrap_or_default();
    // The least step that restores in time, rounded up to 4 figures: one more in the
    // fourth while the check above would refuse it (the rounded step can land on the
    // least exactly, and the gap divided by it just over the steps that fit).
    let gap = base.value - cut.value;
    let fewest = (longest / interval.value.as_secs_f64()).floor().max(1.0);
    let least = gap / fewest;
    let scale = 10f64.powi(3 - least.log10().floor() as i32);
    let mut suggested = (least * scale).ceil();
    while (gap / (suggested / scale)).ceil() * interval.value.as_secs_f64() > longest {
        suggested += 1.0;
    }
    p.at(
        at,
        format!(
            "restoring from cut_limit ({}) to base_limit ({}) in steps of {} every {} takes \
             {} steps, longer than 7days: take a restore_step of at least {} or a shorter \
             restore_interval",
            figure(cut.value),
            figure(base.value),
            figure(step.value),
            humantime::format_duration(interval.value),
            figure(steps),
            figure(suggested / scale),
        ),
    );
}

/// `x` as written in a file: in full, or with an exponent where that would run long
/// (`1e-300`, not 300 zeros and a 1). For every number an error quotes, and the
/// swept values of `rocgate simulate --sweep`'s table.
///
/// ```
/// use rocgate::config::figure;
///
/// assert_eq!(figure(2000001.0), "2000001");
/// assert_eq!(figure(0.5), "0.5");
/// assert_eq!(figure(1e308), "1e308");
/// assert_eq!(figure(-1e-300), "-1e-300");
/// ```
pub fn figure(x: f64) -> String {
    if x != 0.0 && !(1e-4..1e15).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        x.to_string()
    }
}

/// Checks limits against the algorithm that enforces them, so that each is enforced
/// as written or refused: whole numbers, and at most [`MAX_PERMITS`], for
/// `concurrency`; at most [`MAX_SPACED_RATE`] for `token_bucket` and `leaky_bucket`,
/// and a capacity (`limit × burst`) that a token bucket can hold for `token_bucket`;
/// window quotas that a window counter can hold and that admit at least one request
/// for `fixed_window` and `sliding_window`. Each limit is `(field, value, whether it
/// is a limit rather than a step)`.
fn check_limits(p: &mut Problems, s: &Settings, limits: &[(&str, &Set<f64>, bool)]) {
    let Some(kind) = &s.algorithm else { return };
    for &(field, v, is_limit) in limits {
        match kind.value {
            Kind::Concurrency if v.value < 1.0 || v.value.fract() != 0.0 => p.at(
                v.scope.max(kind.scope).path(field),
                format!(
                    "must be a whole number ≥ 1 with algorithm concurrency (it counts requests in flight), got {}",
                    figure(v.value)
                ),
            ),
            Kind::Concurrency if is_limit && v.value > f64::from(MAX_PERMITS) => p.at(
                v.scope.max(kind.scope).path(field),
                format!(
                    "must be at most {MAX_PERMITS} with algorithm concurrency (what its count of requests in flight holds), got {}",
                    figure(v.value)
                ),
            ),
            Kind::TokenBucket | Kind::LeakyBucket if is_limit && v.value > MAX_SPACED_RATE => p.at(
                v.scope.max(kind.scope).path(field),
                format!(
                    "must be at most {MAX_SPACED_RATE} req/s with algorithm {} (it spaces requests a whole number of nanoseconds apart, which above {MAX_SPACED_RATE} req/s, 500 ns apart, moves the rate by more than 0.1%), got {}",
                    kind_name(kind.value),
                    figure(v.value)
                ),
            ),
            Kind::TokenBucket if is_limit => {
                let Some(burst) = &s.burst else { continue };
                // As the bucket computes it (the burst is kept to the millisecond).
                let tokens = gcra::tokens(v.value, gcra::burst_ms(burst.value));
                if tokens > f64::from(gcra::MAX_TOKENS) {
                    p.at(
                        v.scope.max(kind.scope).max(burst.scope).path(field),
                        format!(
                            "{field} × burst must be at most {} tokens (what a token bucket holds), got {}",
                            gcra::MAX_TOKENS,
                            figure(tokens)
                        ),
                    );
                }
            }
            Kind::FixedWindow | Kind::SlidingWindow if is_limit => {
                let Some(window) = &s.limiter_window else { continue };
                // As the counters compute it (the window is a whole number of ms).
                let window_ns = words::window_ns(words::window_ms(window.value));
                let quota = words::per_window(v.value, window_ns);
                let at = v.scope.max(kind.scope).max(window.scope).path(field);
                if quota > MAX_WINDOW_COUNT as f64 {
                    p.at(
                        at,
                        format!(
                            "{field} × limiter_window must be at most {MAX_WINDOW_COUNT} requests (what a window counter holds), got {}",
                            figure(quota)
                        ),
                    );
                } else if words::quota(v.value, window_ns) < 1.0 {
                    p.at(
                        at,
                        format!(
                            "{field} × limiter_window must admit at least 1 request, got {}",
                            figure(quota)
                        ),
                    );
                }
            }
            _ => {}
        }
    }
}

/// The route-level limits of `s`, for [`check_limits`].
fn check_route_limits(p: &mut Problems, s: &Settings) {
    let mut limits = Vec::new();
    for (field, v, is_limit) in [
        ("base_limit", &s.base_limit, true),
        ("cut_limit", &s.cut_limit, true),
        ("restore_step", &s.restore_step, false),
    ] {
        if let Some(v) = v {
            limits.push((field, v, is_limit));
        }
    }
    check_limits(p, s, &limits);
}

/// The enforcing algorithm with its settings; a setting of another algorithm written
/// on the route itself is reported, since it would do nothing.
fn algorithm_of(p: &mut Problems, s: &Settings, at: Scope) -> Option<Algorithm> {
    let kind = s.algorithm.as_ref()?.value;
    let name = kind_name(kind);
    let written_here = |scope: Option<Scope>| scope == Some(at);
    for (field, scope, applies, algorithms) in [
        (
            "burst",
            s.burst.as_ref().map(|v| v.scope),
            kind == Kind::TokenBucket,
            "token_bucket",
        ),
        (
            "limiter_window",
            s.limiter_window.as_ref().map(|v| v.scope),
            matches!(kind, Kind::FixedWindow | Kind::SlidingWindow),
            "fixed_window and sliding_window",
        ),
        (
            "queue",
            s.queue.as_ref().map(|v| v.scope),
            matches!(kind, Kind::LeakyBucket | Kind::Concurrency),
            "leaky_bucket and concurrency",
        ),
    ] {
        if written_here(scope) && !applies {
            p.at(
                at.path(field),
                format!("applies only to {algorithms}, and this route uses {name}"),
            );
        }
    }
    let algorithm_scope = s.algorithm.as_ref()?.scope;
    if let Some(mode) = s.mode.as_ref().filter(|m| m.value == Mode::ShadowAdaptive) {
        if kind == Kind::Concurrency {
            p.at(
                mode.scope.max(algorithm_scope).path("mode"),
                "shadow_adaptive cannot count what a cut would reject with the concurrency \
                 algorithm (its shadow permits would be released at once): use enforce or \
                 shadow, or another algorithm",
            );
        }
    }
    let queued = s.queue.as_ref().filter(|q| q.value > 0);
    if let (Some(mode), Some(queue)) = (s.mode.as_ref().filter(|m| m.value == Mode::Shadow), queued)
    {
        if kind == Kind::Concurrency {
            p.at(
                mode.scope
                    .max(queue.scope)
                    .max(algorithm_scope)
                    .path("mode"),
                "shadow admits every request at once, so a concurrency queue would hold \
                 requests it should not: set queue = 0 (over-limit requests are then \
                 counted as concurrency), or use enforce",
            );
        }
    }
    Some(match kind {
        Kind::TokenBucket => Algorithm::TokenBucket {
            burst: s.burst.as_ref()?.value,
        },
        Kind::FixedWindow => Algorithm::FixedWindow {
            window: s.limiter_window.as_ref()?.value,
        },
        Kind::SlidingWindow => Algorithm::SlidingWindow {
            window: s.limiter_window.as_ref()?.value,
        },
        Kind::LeakyBucket => Algorithm::LeakyBucket {
            queue: s.queue.as_ref()?.value,
        },
        Kind::Concurrency => Algorithm::Concurrency {
            queue: s.queue.as_ref()?.value,
        },
    })
}

/// The ROC window; a shape [`WindowSpec`] refuses is reported under the more specific
/// of `window` and `slot` (`slot` where both are given in one place).
fn window_spec(p: &mut Problems, s: &Settings) -> Option<WindowSpec> {
    let (window, slot) = (s.window.as_ref()?, s.slot.as_ref()?);
    let at = if window.scope > slot.scope {
        window.scope.path("window")
    } else {
        slot.scope.path("slot")
    };
    WindowSpec::new(window.value, slot.value)
        .map_err(|e| p.at(at, e.to_string()))
        .ok()
}

/// The partition with its key limits; a key limit written on an unpartitioned route
/// itself is reported, since it would do nothing.
fn partition_of(p: &mut Problems, s: &Settings, at: Scope) -> Option<Partition> {
    let kind = &s.partition.as_ref()?.value;
    if *kind == PartitionKind::Route {
        for (field, scope) in [
            ("max_keys", s.max_keys.as_ref().map(|v| v.scope)),
            ("idle_timeout", s.idle_timeout.as_ref().map(|v| v.scope)),
        ] {
            if scope == Some(at) {
                p.at(
                    at.path(field),
                    r#"applies only to partitioned routes (partition = "ip" or "header:<name>")"#,
                );
            }
        }
    }
    if *kind != PartitionKind::Ip && s.ipv6_prefix.as_ref().map(|v| v.scope) == Some(at) {
        p.at(
            at.path("ipv6_prefix"),
            r#"applies only to routes partitioned by client IP (partition = "ip")"#,
        );
    }
    let limits = || {
        Some(KeyLimits {
            max_keys: s.max_keys.as_ref()?.value,
            idle_timeout: s.idle_timeout.as_ref()?.value,
            ipv6_prefix: s.ipv6_prefix.as_ref()?.value,
        })
    };
    Some(match kind {
        PartitionKind::Route => Partition::Route,
        PartitionKind::Ip => Partition::ClientIp(limits()?),
        PartitionKind::Header(header) => Partition::Header(header.clone(), limits()?),
    })
}

/// A partitioned route's `route_limit`, its keys' requests together, req/s: a limit
/// ([`limit`]) held by a token bucket whose burst is the route's (`burst`, or
/// `limiter_window` for the window counters), within what such a bucket holds and
/// spaces. Refused on a route limited as a whole (its `base_limit` is its total
/// already) and with `leaky_bucket` or `concurrency`, whose admissions (paced, or
/// holding a permit) the total could not take back once it refused. `Some(None)` when
/// not written; `None` when refused.
fn route_limit_of(
    p: &mut Problems,
    at: Scope,
    raw: Option<Num>,
    s: &Settings,
) -> Option<Option<f64>> {
    let Some(raw) = raw else {
        return Some(None);
    };
    let field = at.path("route_limit");
    let value = match limit(raw) {
        Ok(value) => value,
        Err(message) => {
            p.at(field, message);
            return None;
        }
    };
    if s.partition.as_ref()?.value == PartitionKind::Route {
        p.at(
            field,
            r#"applies only to partitioned routes (partition = "ip" or "header:<name>"): a route limited as a whole holds its total with base_limit"#,
        );
        return None;
    }
    let kind = s.algorithm.as_ref()?.value;
    let burst = match kind {
        Kind::TokenBucket => s.burst.as_ref()?.value,
        Kind::FixedWindow | Kind::SlidingWindow => s.limiter_window.as_ref()?.value,
        Kind::LeakyBucket | Kind::Concurrency => {
            p.at(
                field,
                format!(
                    "applies only with token_bucket, fixed_window or sliding_window, and this route uses {} (a request it admits paced or holding a permit could not be taken back when the total refuses it)",
                    kind_name(kind)
                ),
            );
            return None;
        }
    };
    if value > MAX_SPACED_RATE {
        p.at(
            field,
            format!(
                "must be at most {MAX_SPACED_RATE} req/s (a token bucket holds it, spacing requests a whole number of nanoseconds apart), got {}",
                figure(value)
            ),
        );
        return None;
    }
    let tokens = gcra::tokens(value, gcra::burst_ms(burst));
    if tokens > f64::from(gcra::MAX_TOKENS) {
        p.at(
            field,
            format!(
                "route_limit × burst must be at most {} tokens (what a token bucket holds), got {}",
                gcra::MAX_TOKENS,
                figure(tokens)
            ),
        );
        return None;
    }
    Some(Some(value))
}

/// The first parameter name a template gives twice (`id` of `/a/{id}/{id}`): one name
/// for two segments, a slip in the template (the engine's matching ignores names, but
/// whoever reads the template, or a handler reading its parameters by name, cannot
/// tell the two apart).
fn repeated_param(segments: &[Segment]) -> Option<&str> {
    let mut seen = std::collections::HashSet::new();
    segments.iter().find_map(|segment| match segment {
        Segment::Param(name) | Segment::CatchAll(name) if !seen.insert(name.as_str()) => {
            Some(name.as_str())
        }
        _ => None,
    })
}

/// The first parameter name of a template that holds a `:`, a pattern in another
/// router's syntax (`{id:[0-9]+}` of actix and gorilla/mux, `{:id}`): this one would
/// take it as a name and match any one segment with it, `/items/abc` taken by
/// `/items/{id:[0-9]+}`.
fn patterned_param(segments: &[Segment]) -> Option<&str> {
    segments.iter().find_map(|segment| match segment {
        Segment::Param(name) | Segment::CatchAll(name) if name.contains(':') => Some(name.as_str()),
        _ => None,
    })
}

/// The first catch-all (`{*rest}`) of a template written `path` that is not its last
/// segment (a trailing slash is one), with its name.
fn misplaced_catch_all(path: &str) -> Option<&str> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (_, before) = segments.split_last()?;
    before.iter().find_map(|segment| {
        segment
            .strip_prefix("{*")
            .and_then(|s| s.strip_suffix('}'))
            .filter(|name| !name.is_empty() && !name.contains(['{', '}']))
    })
}

/// `path` with each character that is not printable ASCII percent-encoded (its UTF-8
/// bytes, upper-case hex), as clients send it, or `None` if it has none. A template's
/// `{param}` segment is a name, never sent, and is kept as written.
fn percent_encoded(path: &str) -> Option<String> {
    if path.chars().all(|c| c.is_ascii_graphic()) {
        return None;
    }
    let segments: Vec<String> = path
        .split('/')
        .map(|segment| {
            if segment.starts_with('{') && segment.ends_with('}') {
                return segment.to_owned();
            }
            let mut out = Vec::with_capacity(segment.len());
            for &b in segment.as_bytes() {
                if b.is_ascii_graphic() {
                    out.push(b);
                } else {
                    super::push_escape(&mut out, b);
                }
            }
            // Every byte beyond ASCII was encoded: the text is ASCII.
            String::from_utf8_lossy(&out).into_owned()
        })
        .collect();
    let encoded = segments.join("/");
    (encoded != path).then_some(encoded)
}

/// A route path's normalized spelling, if it is written otherwise. A template's
/// parameters are names, not text a request holds: normalized as a placeholder each
/// (`{thé}` is no `{th%C3%A9}`), and given back in the spelling asked for.
fn normalized_otherwise(path: &str) -> Option<String> {
    const PARAM: &str = "{_}";
    let is_param = |segment: &&str| segment.starts_with('{') && segment.ends_with('}');
    let neutral: Vec<&str> = path
        .split('/')
        .map(|segment| if is_param(&segment) { PARAM } else { segment })
        .collect();
    let neutral = neutral.join("/");
    let normalized = super::normalize_path(&neutral);
    if normalized == neutral {
        return None;
    }
    let mut named = normalized.into_owned();
    for param in path.split('/').filter(is_param) {
        named = named.replacen(PARAM, param, 1);
    }
    Some(named)
}

/// Which requests the route takes.
fn matcher(p: &mut Problems, at: Scope, own: &RouteFields) -> Option<RouteMatch> {
    let method = match &own.method {
        None => Some(None),
        // A token, "*" too; but no client sends "*", and written it means "any".
        Some(m) if m == "*" => {
            p.at(
                at.path("method"),
                r#"leave method out to take every method: "*" is no wildcard, and no request has it"#,
            );
            None
        }
        Some(m) if is_token(m) => Some(Some(m.to_ascii_uppercase())),
        Some(m) => {
            p.at(
                at.path("method"),
                format!(
                    r#"must be an HTTP method such as "GET" or "POST", got {:?}"#,
                    quoted(m)
                ),
            );
            None
        }
    };
    let mut check = |field: &str, path: &str| {
        let shown = quoted(path);
        let problem = if !path.starts_with('/') {
            format!("must start with '/', got {shown:?}")
        } else if path.contains(['?', '#']) || path.contains(char::is_whitespace) {
            format!(
                "must not contain '?', '#' or whitespace (only the path is matched), got {shown:?}"
            )
        } else if path.contains(';') {
            format!(
                "must not contain ';': `serve` matches a request's path without its segments' \
                 parameters (`/order;x=1` as `/order`, as Tomcat and Spring route it), got {shown:?}"
            )
        } else if field == "path_prefix" && path.contains(['{', '}']) {
            format!("must not contain '{{' or '}}' (templates go in path), got {shown:?}")
        } else if let Some(encoded) = percent_encoded(path) {
            // A client sends such a character percent-encoded, and normalization keeps
            // the escape (`%C3%A9` is no unreserved character): the route never
            // matched.
            format!(
                "must be printable ASCII, as clients send it (other characters \
                 percent-encoded in UTF-8): write {:?}, got {shown:?}",
                quoted(&encoded)
            )
        } else if let Some(normalized) = normalized_otherwise(path) {
            // Such a route would never match behind `serve`, which matches requests
            // once normalized; the layer matches as written, where a client seldom
            // spells a path so. One spelling, the normalized, is asked for.
            format!(
                "a route's path is written normalized (`serve` matches requests so): write {:?} (no \"//\", \
                 no \".\" or \"..\" segment, letters, digits and -._~ not percent-encoded), \
                 got {shown:?}",
                quoted(&normalized)
            )
        } else {
            return true;
        };
        p.at(at.path(field), problem);
        false
    };
    let pattern = match (&own.path, &own.path_prefix) {
        (Some(_), Some(_)) => {
            p.at(
                at.path("path_prefix"),
                "cannot be set together with path: set one of the two",
            );
            None
        }
        (None, None) => {
            p.at(
                at.path("path"),
                "required: set path (exact or a template) or path_prefix",
            );
            None
        }
        (None, Some(prefix)) => {
            check("path_prefix", prefix).then(|| PathPattern::Prefix(prefix.clone()))
        }
        (Some(path), None) if check("path", path) => match PathPattern::parse_path(path) {
            None => {
                let message = match misplaced_catch_all(path) {
                    Some(name) => format!(
                        "invalid template {:?}: the catch-all {{*{}}} takes the rest of the path, \
                         and must be the last segment (with no trailing slash), as in \
                         \"/files/{{*rest}}\"",
                        quoted(path),
                        quoted(name)
                    ),
                    None => format!(
                        r#"invalid template {:?}: each {{param}} must be a whole segment with a name, as in "/api/items/{{id}}" (or, last, a catch-all: "/files/{{*rest}}")"#,
                        quoted(path)
                    ),
                };
                p.at(at.path("path"), message);
                None
            }
            Some(PathPattern::Template(segments)) => {
                match (patterned_param(&segments), repeated_param(&segments)) {
                    (Some(name), _) => {
                        let message = format!(
                            "invalid template {:?}: the parameter name {:?} holds ':', a pattern \
                             in another router's syntax ({{id:[0-9]+}}), which is no part of \
                             this one's: a parameter takes any one segment (a catch-all, the \
                             rest of the path), whatever its name",
                            quoted(path),
                            quoted(name)
                        );
                        p.at(at.path("path"), message);
                        None
                    }
                    (None, Some(name)) => {
                        let message = format!(
                            "invalid template {:?}: the parameter {{{}}} is named twice; give each its own name",
                            quoted(path),
                            quoted(name)
                        );
                        p.at(at.path("path"), message);
                        None
                    }
                    (None, None) => Some(PathPattern::Template(segments)),
                }
            }
            pattern => pattern,
        },
        (Some(_), None) => None,
    };
    Some(RouteMatch {
        method: method?,
        path: pattern?,
    })
}

/// The client an address is keyed as: IPv4 (an IPv4-mapped IPv6 address too) whole,
/// IPv6 by its first `v6_prefix` bits, as the engine keys a request.
fn client_key(ip: IpAddr, v6_prefix: u8) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let kept = u128::MAX << (128 - u32::from(v6_prefix.clamp(1, 128)));
            format!(
                "{}/{v6_prefix}",
                std::net::Ipv6Addr::from_bits(v6.to_bits() & kept)
            )
        }
    }
}

/// The route's tiers: named key values with limits of their own.
fn route_tiers(p: &mut Problems, i: usize, raw: Vec<RawTier>, s: &Settings) -> Option<Vec<Tier>> {
    let partition = s.partition.as_ref().map(|k| &k.value);
    if !raw.is_empty() && partition == Some(&PartitionKind::Route) {
        p.at(
            format!("routes[{i}].tiers"),
            r#"only partitioned routes have tiers: set partition = "ip" or "header:<name>""#,
        );
    }
    let mut names = HashMap::new();
    // By the client key each value maps to: two addresses of one IPv6 prefix, or an
    // address and its IPv4-mapped form, are one client.
    let mut owners: HashMap<String, String> = HashMap::new();
    let v6_prefix = s.ipv6_prefix.as_ref().map_or(128, |v| v.value);
    let mut tiers = Vec::new();
    let mut complete = true;
    for (j, t) in raw.into_iter().enumerate() {
        let at = Scope::Tier(i, j);
        let name = check_name(p, at, t.name);
        if let Some(n) = &name {
            if let Some(first) = names.insert(n.clone(), j) {
                p.at(
                    at.path("name"),
                    format!(
                        "duplicate of routes[{i}].tiers[{first}].name ({:?})",
                        quoted(n)
                    ),
                );
            }
        }
        let mut values = Vec::new();
        match t.values {
            None => p.at(
                at.path("values"),
                "required: the key values that belong to the tier",
            ),
            Some(v) if v.is_empty() => p.at(at.path("values"), "must hold at least one key value"),
            Some(v) => {
                for (k, value) in v.into_iter().enumerate() {
                    let location = format!("{}[{k}]", at.path("values"));
                    let mut key = None;
                    let value = match partition {
                        Some(PartitionKind::Ip) => match value.trim_ascii().parse::<IpAddr>() {
                            Ok(ip) => {
                                key = Some(client_key(ip, v6_prefix));
                                ip.to_string()
                            }
                            Err(_) => {
                                p.at(
                                    location,
                                    format!("must be an IP address, got {:?}", quoted(&value)),
                                );
                                continue;
                            }
                        },
                        _ if value.is_empty() => {
                            p.at(location, "must not be empty");
                            continue;
                        }
                        Some(PartitionKind::Header(_)) if !is_header_value(&value) => {
                            p.at(
                                location,
                                format!("can never match: a header value has no control characters and no leading or trailing whitespace, got {:?}", quoted(&value)),
                            );
                            continue;
                        }
                        Some(PartitionKind::Header(h))
                            if h == "host" && super::host_key(&value) != value.as_str() =>
                        {
                            p.at(
                                location,
                                format!(
                                    "can never match: a host is keyed by its name in lower case, without a port or a trailing dot ({:?}), got {:?}",
                                    quoted(&super::host_key(&value)),
                                    quoted(&value)
                                ),
                            );
                            continue;
                        }
                        Some(PartitionKind::Header(h))
                            if super::is_credentials_header(h)
                                && super::credentials_key(&value) != value.as_str() =>
                        {
                            p.at(
                                location,
                                format!(
                                    "can never match: credentials are keyed by their scheme in lower case, one space, then the credentials as sent ({:?}), got {:?}",
                                    quoted(&super::credentials_key(&value)),
                                    quoted(&value)
                                ),
                            );
                            continue;
                        }
                        _ => value,
                    };
                    let key = key.unwrap_or_else(|| value.clone());
                    match owners.get(&key) {
                        Some(first) if key == value => p.at(
                            location,
                            format!("duplicate of {first} ({:?}): a key belongs to one tier", quoted(&value)),
                        ),
                        Some(first) => p.at(
                            location,
                            format!("the same client as {first} ({:?} is keyed as {key}, by ipv6_prefix): a key belongs to one tier", quoted(&value)),
                        ),
                        None => {
                            owners.insert(key, location);
                        }
                    }
                    values.push(value);
                }
            }
        }
        let mut r = Reader { p: &mut *p, at };
        let base = r.require("base_limit", t.base_limit, limit);
        let cut = r.require("cut_limit", t.cut_limit, limit);
        if let (Some(base), Some(cut)) = (&base, &cut) {
            ordered(p, ("cut_limit", cut), ("base_limit", base), false);
            check_limits(
                p,
                s,
                &[("base_limit", base, true), ("cut_limit", cut, true)],
            );
        }
        match (name, base, cut) {
            (Some(name), Some(base), Some(cut)) if !values.is_empty() => tiers.push(Tier {
                name,
                values,
                base_limit_rps: base.value,
                cut_limit_rps: cut.value,
            }),
            _ => complete = false,
        }
    }
    complete.then_some(tiers)
}

/// The route's scheduled events, each a profile over the route's own settings. An
/// event's `route_limit` is checked as the route's ([`route_limit_of`]), and only on a
/// route with one of its own (`own_total`, as [`route_limit_of`] gave it): an event
/// changes the route's total, it does not add one.
fn route_events(
    p: &mut Problems,
    i: usize,
    raw: Vec<RawEvent>,
    s: &Settings,
    own_total: Option<Option<f64>>,
) -> Option<Vec<Event>> {
    let mut names = HashMap::new();
    let mut events = Vec::new();
    let mut spans = Vec::new();
    let mut complete = true;
    for (j, e) in raw.into_iter().enumerate() {
        let at = Scope::Event(i, j);
        let ([name_raw, start_raw, duration_raw], settings, total_raw) = e.split();
        let sets = settings.profile_fields();
        let es = s.over(settings, at, p);
        let name = check_name(p, at, name_raw);
        if let Some(n) = &name {
            if let Some(first) = names.insert(n.clone(), j) {
                p.at(
                    at.path("name"),
                    format!(
                        "duplicate of routes[{i}].events[{first}].name ({:?})",
                        quoted(n)
                    ),
                );
            }
        }
        let mut r = Reader { p: &mut *p, at };
        let start = r.require("start", start_raw, utc_time);
        let duration = r.require("duration", duration_raw, timer_duration);
        if let (Some(d), Some(slot)) = (&duration, &s.slot) {
            // The profile due is taken at each slot's end: a shorter event between two
            // ends would never be in force.
            if d.value < slot.value {
                p.at(
                    at.path("duration"),
                    format!(
                        "must be at least the route's slot ({}), got {}: the profile in force is taken at each slot's end",
                        humantime::format_duration(slot.value),
                        humantime::format_duration(d.value)
                    ),
                );
            }
        }
        if let (Some(start), Some(d)) = (&start, &duration) {
            match start.value.checked_add(d.value) {
                Some(end) => spans.push((start.value, end, j)),
                None => p.at(
                    at.path("duration"),
                    "too long: the end of the event cannot be represented",
                ),
            }
        }
        let controller = controller_params(p, &es);
        check_route_limits(p, &es);
        let total = match (total_raw, own_total) {
            (Some(_), Some(None)) => {
                p.at(
                    at.path("route_limit"),
                    "applies only on a route with a route_limit of its own: an event changes the route's total, it does not add one",
                );
                None
            }
            (raw, _) => route_limit_of(p, at, raw, &es),
        };
        match (name, start, duration, controller, total) {
            (Some(name), Some(start), Some(duration), Some(controller), Some(total)) => {
                events.push(Event {
                    name,
                    start: start.value,
                    duration: duration.value,
                    controller,
                    sets: Some(sets),
                    route_limit_rps: total,
                });
            }
            _ => complete = false,
        }
    }
    spans.sort();
    // In order of start: each event must start after every earlier one has ended.
    let mut latest: Option<(SystemTime, usize)> = None;
    for (start, end, j) in spans {
        match latest {
            Some((until, first)) if start < until => {
                let other = Scope::Event(i, first);
                let problem = Problem::new(
                    Scope::Event(i, j).path("start"),
                    format!(
                        "overlaps routes[{i}].events[{first}], which runs until {}: events of one route must not overlap",
                        utc_text(until, humantime::format_rfc3339)
                    ),
                );
                p.add(problem.caused_by(vec![other.path("start"), other.path("duration")]));
            }
            _ => {}
        }
        if latest.is_none_or(|(until, _)| end > until) {
            latest = Some((end, j));
        }
    }
    complete.then_some(events)
}

/// One route, checked on its own: its name where that is valid (the check of
/// duplicate names takes it whatever else is wrong with the route), and the route where
/// all of it is.
fn route(
    p: &mut Problems,
    i: usize,
    raw: RawRoute,
    defaults: &Settings,
) -> (Option<String>, Option<RouteConfig>) {
    let at = Scope::Route(i);
    let (mut own, settings) = raw.split();
    let s = defaults.over(settings, at, p);
    let name = check_name(p, at, own.name.take()).filter(|n| {
        let reserved = n == super::UNMATCHED_ROUTE;
        if reserved {
            p.at(
                at.path("name"),
                format!(
                    "{:?} is reserved: it labels the requests that no route takes",
                    quoted(n)
                ),
            );
        }
        // The admin API names a route in its path, where `.` and `..` are steps of the
        // path to every client, percent-encoded or not (WHATWG URLs decode `%2e`).
        let dots = n == "." || n == "..";
        if dots {
            p.at(
                at.path("name"),
                format!("{n:?} cannot name a route: the admin API names a route in its path (/admin/routes/{{name}}), where clients read . and .. as steps of the path"),
            );
        }
        !reserved && !dots
    });
    let matcher = matcher(p, at, &own);
    let window = window_spec(p, &s);
    let controller = controller_params(p, &s);
    check_route_limits(p, &s);
    let algorithm = algorithm_of(p, &s, at);
    let partition = partition_of(p, &s, at);
    let route_limit = route_limit_of(p, at, own.route_limit, &s);
    let tiers = route_tiers(p, i, own.tiers, &s);
    let events = route_events(p, i, own.events, &s, route_limit);
    // The route where every part of it is valid; its name is given back either way.
    let built = || {
        Some(RouteConfig {
            name: name.clone()?,
            matcher: matcher?,
            mode: s.mode.as_ref()?.value,
            reject_status: s.reject_status.as_ref()?.value,
            window: window?,
            controller: controller?,
            algorithm: algorithm?,
            partition: partition?,
            route_limit_rps: route_limit?,
            tiers: tiers?,
            events: events?,
        })
    };
    let built = built();
    (name, built)
}

/// For each route (`None` where it is invalid), the first valid route before it that
/// [`shadows`] it. Each route is compared only with the earlier routes whose path
/// could take every path of its own ([`RouteTries::first_covering`]), not with every
/// one before it: about linear in the routes where paths differ by their literals,
/// and quadratic only where many routes share a path or a template's shape and differ
/// by method alone.
fn first_shadowing(matchers: &[Option<&RouteMatch>]) -> Vec<Option<usize>> {
    let mut earlier = RouteTries::default();
    matchers
        .iter()
        .enumerate()
        .map(|(j, later)| {
            let later = (*later)?;
            let first = earlier.first_covering(&later.path, |i| {
                matchers[i].is_some_and(|first| shadows(first, later))
            });
            earlier.insert(j, &later.path);
            first
        })
        .collect()
}

/// Whether `first` takes every request that `later` would match, so `later` never
/// sees one.
fn shadows(first: &RouteMatch, later: &RouteMatch) -> bool {
    let methods = match (&first.method, &later.method) {
        (None, _) => true,
        (Some(a), Some(b)) => a == b || (a == "GET" && b == "HEAD"),
        (Some(_), None) => false,
    };
    methods
        && match (&first.path, &later.path) {
            // An exact path is taken with or without its trailing slash: shadowed
            // only if both spellings are the first route's.
            (_, PathPattern::Exact(path)) => {
                let bare = super::without_trailing_slash(path);
                first.path.matches(bare) && (bare == "/" || first.path.matches(&format!("{bare}/")))
            }
            (PathPattern::Prefix(p), PathPattern::Prefix(q)) => q.starts_with(p.as_str()),
            // Every path the template matches starts with its literal lead.
            (PathPattern::Prefix(p), PathPattern::Template(segments)) => {
                super::literal_lead(segments).starts_with(p.as_str())
            }
            (PathPattern::Template(a), PathPattern::Template(b)) => template_covers(a, b),
            (PathPattern::Template(a), PathPattern::Prefix(q)) => catch_all_covers(a, q),
            (a, b) => a == b,
        }
}

/// Whether the template `first`, ending in a catch-all, matches every path that starts
/// with `prefix`: the prefix holds each segment before the catch-all whole (a literal
/// the same, a parameter's not empty), each followed by its slash, and then some text
/// of the rest (`/files/{*rest}` takes every path under `/files/a`, not every path
/// under `/files/`, which takes `/files/` itself).
fn catch_all_covers(first: &[Segment], prefix: &str) -> bool {
    let first = super::without_trailing_empty(first);
    let Some((Segment::CatchAll(_), before)) = first.split_last() else {
        return false;
    };
    let Some(mut rest) = prefix.strip_prefix('/') else {
        return false;
    };
    for segment in before {
        let Some((part, next)) = rest.split_once('/') else {
            return false;
        };
        let takes = match segment {
            Segment::Literal(l) => l == part,
            _ => !part.is_empty(),
        };
        if !takes {
            return false;
        }
        rest = next;
    }
    !rest.is_empty()
}

/// Whether the template `first` matches every path the template `later` matches: as
/// many segments (a trailing slash aside), each a parameter or the same literal; or,
/// if `first` ends in a catch-all, the segments before it so and `later` longer (its
/// rest, past them, is never empty: `/files/{*rest}` covers `/files/{id}`,
/// `/files/a/{*rest}` and `/files/a/b`). The names of parameters do not matter.
fn template_covers(first: &[Segment], later: &[Segment]) -> bool {
    let (first, later) = (
        super::without_trailing_empty(first),
        super::without_trailing_empty(later),
    );
    let (before, lengths) = match first.split_last() {
        Some((Segment::CatchAll(_), before)) => (before, later.len() > before.len()),
        _ => (first, first.len() == later.len()),
    };
    lengths
        && before.iter().zip(later).all(|pair| match pair {
            (Segment::Literal(a), Segment::Literal(b)) => a == b,
            (Segment::Param(_), Segment::Param(_)) => true,
            (Segment::Param(_), Segment::Literal(l)) => !l.is_empty(),
            _ => false,
        })
}

impl TryFrom<RawConfig> for Config {
    type Error = Vec<Problem>;

    /// Validates a file's content, reporting every problem found.
    fn try_from(raw: RawConfig) -> Result<Config, Vec<Problem>> {
        let mut p = Problems::default();
        let defaults = Settings::builtin().over(raw.defaults, Scope::Defaults, &mut p);
        if raw.routes.is_empty() {
            p.at(
                "routes".to_owned(),
                "at least one [[routes]] table is required",
            );
        }
        let (names, routes): (Vec<Option<String>>, Vec<Option<RouteConfig>>) = raw
            .routes
            .into_iter()
            .enumerate()
            .map(|(i, r)| route(&mut p, i, r, &defaults))
            .unzip();
        let matchers: Vec<Option<&RouteMatch>> = routes
            .iter()
            .map(|r| r.as_ref().map(|r| &r.matcher))
            .collect();
        let shadowed_by = first_shadowing(&matchers);
        // Each name's first route: every later one is named a duplicate of it.
        let mut named = HashMap::new();
        for (j, r) in routes.iter().enumerate() {
            if let Some(name) = names[j].as_deref() {
                let first = *named.entry(name).or_insert(j);
                if first != j {
                    p.at(
                        Scope::Route(j).path("name"),
                        format!("duplicate of routes[{first}].name ({:?})", quoted(name)),
                    );
                }
            }
            let Some(r) = r else { continue };
            let earlier = shadowed_by[j].and_then(|i| Some((i, routes[i].as_ref()?)));
            if let Some((i, e)) = earlier {
                let field = match r.matcher.path {
                    PathPattern::Prefix(_) => "path_prefix",
                    _ => "path",
                };
                // The fields of the earlier route that take the request are named, so
                // that a variable that set one of them is named too.
                let takes = match (&e.matcher.method, &e.matcher.path) {
                    (None, PathPattern::Prefix(_)) => "its path_prefix takes",
                    (None, _) => "its path takes",
                    (Some(_), PathPattern::Prefix(_)) => "its method and path_prefix take",
                    (Some(_), _) => "its method and path take",
                };
                p.at(
                    Scope::Route(j).path(field),
                    format!(
                        "never matches: routes[{i}] ({:?}) comes first and {takes} every request it would",
                        quoted(&e.name)
                    ),
                );
            }
        }
        let server = server_config(&mut p, raw.server, raw.admin);
        let hints = hints_config(&mut p, raw.hints);
        let store = store_config(&mut p, raw.store);
        if p.0.is_empty() {
            Ok(Config {
                routes: routes.into_iter().flatten().collect(),
                server,
                hints,
                store,
            })
        } else {
            Err(p.0)
        }
    }
}

/// Checks routes built in code by the rules of the file: each route is written back
/// as the table that would give it and validated as one, so that a value or a
/// combination the file refuses is refused here too, under the same field path
/// (`routes[0].cut_limit: must be ≤ base_limit (2), got 60`).
pub(crate) fn check_routes(routes: &[RouteConfig]) -> Result<(), Vec<Problem>> {
    reread(routes).map(|_| ())
}

/// Checks one route built in code as [`check_routes`] does, with each problem's path
/// inside the route (`cut_limit`, `events[0].hold`).
pub(crate) fn check_route(route: &RouteConfig) -> Result<(), Vec<Problem>> {
    check_routes(std::slice::from_ref(route)).map_err(|problems| {
        problems
            .into_iter()
            .map(|p| {
                let location = p
                    .location()
                    .strip_prefix("routes[0].")
                    .unwrap_or(p.location());
                Problem::new(location, p.message())
            })
            .collect()
    })
}

/// `routes` written back as tables and read as a file's ([`check_routes`]).
fn reread(routes: &[RouteConfig]) -> Result<Config, Vec<Problem>> {
    let raw = RawConfig {
        defaults: RawSettings::default(),
        routes: routes.iter().map(RawRoute::of).collect(),
        server: RawServer::default(),
        admin: RawAdmin::default(),
        hints: RawHints::default(),
        store: RawStore::default(),
    };
    Config::try_from(raw)
}

/// A duration as the file writes it (`"1s 500ms"`), which reads back exactly.
fn written(d: Duration) -> Option<String> {
    Some(humantime::format_duration(d).to_string())
}

fn roc_mode_name(mode: RocMode) -> Option<String> {
    Some(match mode {
        RocMode::Absolute => "absolute".to_owned(),
        RocMode::Relative => "relative".to_owned(),
    })
}

impl RawRoute {
    /// The table that gives `r`.
    fn of(r: &RouteConfig) -> RawRoute {
        let c = &r.controller;
        let (path, path_prefix) = match &r.matcher.path {
            PathPattern::Exact(p) => (Some(p.clone()), None),
            PathPattern::Prefix(p) => (None, Some(p.clone())),
            PathPattern::Template(segments) => {
                let mut t = String::new();
                for segment in segments {
                    t.push('/');
                    match segment {
                        Segment::Literal(l) => t.push_str(l),
                        Segment::Param(name) => {
                            t.push('{');
                            t.push_str(name);
                            t.push('}');
                        }
                        Segment::CatchAll(name) => {
                            t.push_str("{*");
                            t.push_str(name);
                            t.push('}');
                        }
                    }
                }
                (Some(t), None)
            }
        };
        let (algorithm, burst, limiter_window, queue) = match r.algorithm {
            Algorithm::TokenBucket { burst } => ("token_bucket", written(burst), None, None),
            Algorithm::FixedWindow { window } => ("fixed_window", None, written(window), None),
            Algorithm::SlidingWindow { window } => ("sliding_window", None, written(window), None),
            Algorithm::LeakyBucket { queue } => ("leaky_bucket", None, None, Some(queue)),
            Algorithm::Concurrency { queue } => ("concurrency", None, None, Some(queue)),
        };
        let (partition, keys) = match &r.partition {
            Partition::Route => ("route".to_owned(), None),
            Partition::ClientIp(k) => ("ip".to_owned(), Some(k)),
            Partition::Header(name, k) => (format!("header:{name}"), Some(k)),
        };
        RawRoute {
            name: Some(r.name.clone()),
            method: r.matcher.method.clone(),
            path,
            path_prefix,
            route_limit: r.route_limit_rps.map(Num),
            tiers: r
                .tiers
                .iter()
                .map(|t| RawTier {
                    name: Some(t.name.clone()),
                    values: Some(t.values.clone()),
                    base_limit: Some(Num(t.base_limit_rps)),
                    cut_limit: Some(Num(t.cut_limit_rps)),
                })
                .collect(),
            events: r
                .events
                .iter()
                .map(|e| {
                    let (c, own) = (&e.controller, &r.controller);
                    // The fields it sets; all of them for an event built in code,
                    // whose profile is whole. It keeps the three of ROC together: one
                    // of them it does not set is written too where its value is not
                    // the route's (all three where its mode is not), so that the
                    // table gives the thresholds it runs.
                    let sets = e.sets.unwrap_or(ProfileFields::ALL);
                    let other_mode = sets.roc() && c.roc_mode != own.roc_mode;
                    let roc =
                        |set: bool, differs: bool| set || other_mode || (sets.roc() && differs);
                    RawEvent {
                        name: Some(e.name.clone()),
                        start: Some(utc_text(e.start, humantime::format_rfc3339_nanos)),
                        duration: written(e.duration),
                        base_limit: sets.base_limit.then_some(Num(c.base_limit_rps)),
                        cut_limit: sets.cut_limit.then_some(Num(c.cut_limit_rps)),
                        danger_roc: roc(sets.danger_roc, c.danger_roc != own.danger_roc)
                            .then_some(Num(c.danger_roc)),
                        safe_roc: roc(sets.safe_roc, c.safe_roc != own.safe_roc)
                            .then_some(Num(c.safe_roc)),
                        hold: written(c.hold).filter(|_| sets.hold),
                        restore_step: sets.restore_step.then_some(Num(c.restore_step_rps)),
                        restore_interval: written(c.restore_interval)
                            .filter(|_| sets.restore_interval),
                        min_rps: sets.min_rps.then_some(Num(c.min_rps)),
                        min_samples: sets.min_samples.then_some(Whole(c.min_samples)),
                        min_dwell: written(c.min_dwell).filter(|_| sets.min_dwell),
                        max_cut: written(c.max_cut).filter(|_| sets.max_cut),
                        roc_mode: roc_mode_name(c.roc_mode)
                            .filter(|_| roc(sets.roc_mode, other_mode)),
                        route_limit: e.route_limit_rps.map(Num),
                    }
                })
                .collect(),
            window: written(r.window.window()),
            slot: written(r.window.slot()),
            roc_mode: roc_mode_name(c.roc_mode),
            base_limit: Some(Num(c.base_limit_rps)),
            cut_limit: Some(Num(c.cut_limit_rps)),
            danger_roc: Some(Num(c.danger_roc)),
            safe_roc: Some(Num(c.safe_roc)),
            hold: written(c.hold),
            restore_step: Some(Num(c.restore_step_rps)),
            restore_interval: written(c.restore_interval),
            min_rps: Some(Num(c.min_rps)),
            min_samples: Some(Whole(c.min_samples)),
            min_dwell: written(c.min_dwell),
            max_cut: written(c.max_cut),
            mode: Some(r.mode.as_str().to_owned()),
            reject_status: Some(Whole(r.reject_status.into())),
            algorithm: Some(algorithm.to_owned()),
            burst,
            limiter_window,
            queue: queue.map(|q| Whole(q.into())),
            partition: Some(partition),
            max_keys: keys.map(|k| Whole(u64::try_from(k.max_keys).unwrap_or(u64::MAX))),
            idle_timeout: keys.and_then(|k| written(k.idle_timeout)),
            ipv6_prefix: keys
                .filter(|_| matches!(r.partition, Partition::ClientIp(_)))
                .map(|k| Whole(k.ipv6_prefix.into())),
        }
    }
}

/// A socket address such as `127.0.0.1:8080` or `[::1]:8080`.
fn socket_addr(text: String) -> Result<SocketAddr, String> {
    text.trim_ascii().parse().map_err(|_| {
        format!(
            "must be an IP address and port such as \"127.0.0.1:8080\", got {:?}",
            quoted(&text)
        )
    })
}

/// An upstream URL: `http://host[:port]`, nothing after the authority but `/`, a port
/// from 1 to 65535.
pub(super) fn upstream_url(text: String) -> Result<String, UpstreamError> {
    let t = text.trim_ascii();
    // A scheme is case-insensitive (RFC 3986 §3.1): `HTTP://` is `http://`.
    let after = |scheme: &str| {
        t.get(..scheme.len())
            .filter(|s| s.eq_ignore_ascii_case(scheme))
            .map(|_| &t[scheme.len()..])
    };
    if after("https://").is_some() {
        return Err(UpstreamError::Tls { url: text });
    }
    let rest = after("http://");
    let user_info = rest
        .and_then(|rest| rest.split(['/', '?', '#']).next())
        .is_some_and(|authority| authority.contains('@'));
    if user_info {
        return Err(UpstreamError::UserInfo { url: text });
    }
    let Some(authority) = rest
        .map(|rest| rest.strip_suffix('/').unwrap_or(rest))
        .filter(|a| !a.is_empty() && !a.contains(['/', '?', '#', '@', ' ']))
    else {
        return Err(UpstreamError::NotAnAuthority { url: text });
    };
    let (host, port) = host_and_port(authority);
    let named = match host.strip_prefix('[') {
        Some(v6) => v6
            .strip_suffix(']')
            .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok()),
        None => !host.is_empty() && !host.contains([':', '[', ']']),
    };
    if !named {
        return Err(UpstreamError::NoHost { url: text });
    }
    // A registered name's characters (RFC 3986 §3.2.2), percent-encoding aside: what
    // a URI holds and a resolver is asked.
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=".contains(c);
    let odd = if host.starts_with('[') {
        None
    } else {
        host.chars().find(|&c| !allowed(c))
    };
    if let Some(character) = odd {
        return Err(UpstreamError::HostCharacter {
            url: text,
            character,
        });
    }
    if let Some(port) = port {
        // Port 0 is no port a connection can reach.
        if !port.parse::<u16>().is_ok_and(|p| p != 0) {
            return Err(UpstreamError::Port {
                port: port.to_owned(),
            });
        }
    }
    Ok(format!("http://{authority}"))
}

/// An authority's host (an IPv6 address in brackets) and its port, if it gives one.
pub(super) fn host_and_port(authority: &str) -> (&str, Option<&str>) {
    match authority.rsplit_once(':') {
        Some((host, port))
            if !host.contains(':') || (host.starts_with('[') && host.ends_with(']')) =>
        {
            (host, Some(port))
        }
        _ => (authority, None),
    }
}

/// A trusted proxy network: a CIDR (`10.0.0.0/8`) or one address. A CIDR with bits
/// set past its prefix (`10.0.0.5/24`, as `ip addr` prints an interface's address) is
/// refused: it was taken as its whole network, every peer of the proxy's subnet
/// believed, where one address may have been meant.
fn network(text: &str) -> Result<ipnet::IpNet, String> {
    let t = text.trim_ascii();
    let net = t
        .parse::<ipnet::IpNet>()
        .or_else(|_| t.parse::<IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| {
            format!(
                "must be a network such as \"10.0.0.0/8\" or an IP address, got {:?}",
                quoted(text)
            )
        })?;
    if net.addr() != net.network() {
        return Err(format!(
            "{:?} has bits set past its prefix: write {:?} for the network, or {:?} for the one address",
            quoted(t),
            net.trunc().to_string(),
            net.addr().to_string()
        ));
    }
    Ok(net)
}

/// The largest `server.max_connections` (and per client) and
/// `server.max_upstream_requests`: far above
/// what one process's file descriptors allow (`ulimit -n`), and well within what a
/// semaphore counts.
const MAX_CONNECTIONS_LIMIT: usize = 10_000_000;

/// The most `server.trusted_hops`: more proxies than a request passes through in any
/// deployment seen (a CDN, a cloud balancer and an ingress are 3).
const MAX_TRUSTED_HOPS: usize = 10;

/// The largest `server.max_upstream_lanes`.
const MAX_UPSTREAM_LANES: usize = 1_000_000;

/// A count from `least` to `most`, both included; the error names the bound it misses.
fn count_within(w: Whole, least: usize, most: usize) -> Result<usize, String> {
    match usize::try_from(w.0) {
        Ok(n) if n < least => Err(format!("must be at least {least}, got {n}")),
        Ok(n) if n <= most => Ok(n),
        _ => Err(format!("must be at most {most}, got {}", w.0)),
    }
}

/// `[server]` and `[admin]`, each field checked on its own, defaults where absent.
fn server_config(p: &mut Problems, server: RawServer, admin: RawAdmin) -> ServerConfig {
    let mut out = ServerConfig::default();
    let field = |p: &mut Problems, path: &str, result: Result<(), String>| {
        if let Err(message) = result {
            p.at(path.to_owned(), message);
        }
    };
    // Whether both listening addresses are known, to hold one against the other.
    let mut listeners_read = true;
    if let Some(v) = server.listen {
        let read = socket_addr(v);
        listeners_read &= read.is_ok();
        field(p, "server.listen", read.map(|a| out.listen = a));
    }
    let mut upstream_read = true;
    if let Some(v) = server.upstream {
        let read = upstream_url(v);
        upstream_read &= read.is_ok();
        field(
            p,
            "server.upstream",
            read.map(|u| out.upstream = u).map_err(|e| e.to_string()),
        );
    }
    for (name, raw, slot) in [
        (
            "connect_timeout",
            server.connect_timeout,
            &mut out.connect_timeout,
        ),
        (
            "response_timeout",
            server.response_timeout,
            &mut out.response_timeout,
        ),
        (
            "header_read_timeout",
            server.header_read_timeout,
            &mut out.header_read_timeout,
        ),
        (
            "upstream_idle_timeout",
            server.upstream_idle_timeout,
            &mut out.upstream_idle_timeout,
        ),
        (
            "shutdown_grace",
            server.shutdown_grace,
            &mut out.shutdown_grace,
        ),
        ("idle_timeout", server.idle_timeout, &mut out.idle_timeout),
        (
            "lingering_time",
            server.lingering_time,
            &mut out.lingering_time,
        ),
        (
            "lingering_timeout",
            server.lingering_timeout,
            &mut out.lingering_timeout,
        ),
    ] {
        if let Some(v) = raw {
            field(
                p,
                &format!("server.{name}"),
                timer_duration(v).map(|d| *slot = d),
            );
        }
    }
    if let Some(w) = server.max_body_bytes {
        let checked = match w.0 {
            0 => Err("must be at least 1, got 0".to_owned()),
            n => {
                out.max_body_bytes = n;
                Ok(())
            }
        };
        field(p, "server.max_body_bytes", checked);
    }
    if let Some(w) = server.max_upstream_lanes {
        field(
            p,
            "server.max_upstream_lanes",
            count_within(w, 0, MAX_UPSTREAM_LANES).map(|n| out.max_upstream_lanes = n),
        );
    }
    if let Some(w) = server.max_connections {
        field(
            p,
            "server.max_connections",
            count_within(w, 1, MAX_CONNECTIONS_LIMIT).map(|n| out.max_connections = n),
        );
    }
    if let Some(w) = server.max_connections_per_client {
        field(
            p,
            "server.max_connections_per_client",
            count_within(w, 1, MAX_CONNECTIONS_LIMIT)
                .map(|n| out.max_connections_per_client = Some(n)),
        );
    }
    if let Some(w) = server.max_upstream_requests {
        field(
            p,
            "server.max_upstream_requests",
            count_within(w, 1, MAX_CONNECTIONS_LIMIT).map(|n| out.max_upstream_requests = n),
        );
    }
    if let Some(Flag(normalize)) = server.normalize_path {
        out.normalize_path = normalize;
    }
    let trusted = server
        .trusted_proxies
        .map_or_else(Vec::new, TextList::into_items);
    // Whether the file turns the PROXY protocol off (leaves it out, or says "off"), not
    // whether it was read: a misspelt version is an error of its own.
    let mut protocol_off = true;
    if let Some(version) = server.proxy_protocol {
        let read = match version.trim_ascii().to_ascii_lowercase().as_str() {
            "off" => Ok(ProxyProtocol::Off),
            "v1" => Ok(ProxyProtocol::V1),
            "v2" => Ok(ProxyProtocol::V2),
            "any" => Ok(ProxyProtocol::Any),
            _ => Err(format!(
                "must be \"off\", \"v1\", \"v2\" or \"any\", got {:?}",
                quoted(&version)
            )),
        };
        protocol_off = read == Ok(ProxyProtocol::Off);
        let checked = read.and_then(|v| match v {
            ProxyProtocol::Off => Ok(v),
            _ if server.proxy_protocol_from.is_none() && trusted.is_empty() => Err(format!(
                "{:?} needs server.proxy_protocol_from (or, left out, \
                 server.trusted_proxies): the load balancers' networks, whose \
                 connections must begin with the header (no other peer's is read)",
                v.as_str()
            )),
            _ => Ok(v),
        });
        field(
            p,
            "server.proxy_protocol",
            checked.map(|v| out.proxy_protocol = v),
        );
    }
    for (i, text) in trusted.iter().enumerate() {
        let path = format!("server.trusted_proxies[{i}]");
        field(p, &path, network(text).map(|n| out.trusted_proxies.push(n)));
    }
    if let Some(from) = server.proxy_protocol_from.map(TextList::into_items) {
        let checked = if protocol_off {
            Err(
                "has no effect unless server.proxy_protocol is \"v1\", \"v2\" or \"any\""
                    .to_owned(),
            )
        } else if from.is_empty() {
            Err(
                "must name at least one network: the load balancers whose connections \
                 begin with the PROXY protocol header (left out, server.trusted_proxies)"
                    .to_owned(),
            )
        } else {
            Ok(())
        };
        let networks = checked.map(|()| {
            let mut networks = Vec::with_capacity(from.len());
            for (i, text) in from.iter().enumerate() {
                let path = format!("server.proxy_protocol_from[{i}]");
                field(p, &path, network(text).map(|n| networks.push(n)));
            }
            networks
        });
        field(
            p,
            "server.proxy_protocol_from",
            networks.map(|n| out.proxy_protocol_from = Some(n)),
        );
    }
    if let Some(w) = server.trusted_hops {
        let checked = count_within(w, 0, MAX_TRUSTED_HOPS).and_then(|n| {
            if n > 0 && !trusted.is_empty() {
                Err(
                    "cannot be combined with server.trusted_proxies: trust is by the \
                     proxies' networks or by a count of hops, not both"
                        .to_owned(),
                )
            } else {
                Ok(n)
            }
        });
        field(
            p,
            "server.trusted_hops",
            checked.map(|n| out.trusted_hops = n),
        );
    }
    if let Some(header) = server.client_ip_header {
        let checked = match header.trim_ascii().to_ascii_lowercase().as_str() {
            "x-forwarded-for" => Ok(ClientIpHeader::XForwardedFor),
            "forwarded" => Ok(ClientIpHeader::Forwarded),
            _ => Err(format!(
                "must be \"x-forwarded-for\" or \"forwarded\", got {:?}",
                quoted(&header)
            )),
        };
        field(
            p,
            "server.client_ip_header",
            checked.map(|h| out.client_ip_header = h),
        );
    }
    if let Some(v) = admin.listen {
        let read = socket_addr(v);
        listeners_read &= read.is_ok();
        field(p, "admin.listen", read.map(|a| out.admin_listen = a));
    }
    // The file's upstream is its listeners' own: read where both are the file's or the
    // defaults (flags are held to the same rule by `serve`).
    for (name, addr) in [
        ("server.listen", out.listen),
        ("admin.listen", out.admin_listen),
    ] {
        if listeners_read && upstream_read && super::upstream_is_listener(&out.upstream, addr) {
            p.at(
                "server.upstream".to_owned(),
                format!(
                    "{} is rocgate's own {name} ({addr}): requests would come back to it",
                    out.upstream
                ),
            );
        }
    }
    if listeners_read && super::listeners_clash(out.listen, out.admin_listen) {
        p.at(
            "admin.listen".to_owned(),
            format!(
                "{} takes the port of server.listen ({}): the proxy and the admin API \
                 need an address each",
                out.admin_listen, out.listen
            ),
        );
    }
    // A token given but refused is reported as such, not again as missing.
    let token_given = admin.token.is_some();
    if let Some(TokenText(token)) = admin.token {
        let text = token.expose();
        let checked = if text.trim().is_empty() {
            Err("must not be empty; leave it out to run without a token".to_owned())
        } else if !is_header_value(text) {
            Err(format!(
                "must be sendable in an Authorization header: no control characters and no leading or trailing whitespace, got {}",
                unsendable(text)
            ))
        } else {
            out.admin_token = Some(token);
            Ok(())
        };
        field(p, "admin.token", checked);
    }
    for (i, text) in admin
        .allowed_hosts
        .map_or_else(Vec::new, TextList::into_items)
        .iter()
        .enumerate()
    {
        let path = format!("admin.allowed_hosts[{i}]");
        field(
            p,
            &path,
            allowed_host(text).map(|h| out.admin_allowed_hosts.push(h)),
        );
    }
    if let Some(reads) = admin.reads {
        let checked = match reads.trim_ascii() {
            "open" => Ok(AdminReads::Open),
            "token" => Ok(AdminReads::Token),
            _ => Err(format!(
                "must be \"open\" or \"token\", got {:?}",
                quoted(&reads)
            )),
        };
        let checked = checked.and_then(|r| match (r, &out.admin_token, token_given) {
            (AdminReads::Token, None, false) => Err(
                "\"token\" needs admin.token set: reads from beyond loopback would need a \
                 token there is none of (set admin.token, or reads = \"open\")"
                    .to_owned(),
            ),
            _ => Ok(r),
        });
        field(p, "admin.reads", checked.map(|r| out.admin_reads = r));
    }
    if let Some(w) = admin.wrong_tokens_burst {
        field(
            p,
            "admin.wrong_tokens_burst",
            count_within(w, 1, MAX_WRONG_TOKENS_BURST).map(|n| {
                out.admin_wrong_tokens_burst = u32::try_from(n).unwrap_or(u32::MAX);
            }),
        );
    }
    if let Some(Num(v)) = admin.wrong_tokens_per_second {
        let checked = if (MIN_WRONG_TOKENS_PER_SECOND..=MAX_WRONG_TOKENS_PER_SECOND).contains(&v) {
            out.admin_wrong_tokens_per_second = v;
            Ok(())
        } else {
            Err(format!(
                "must be from {} to {}, got {}",
                figure(MIN_WRONG_TOKENS_PER_SECOND),
                figure(MAX_WRONG_TOKENS_PER_SECOND),
                figure(v)
            ))
        };
        field(p, "admin.wrong_tokens_per_second", checked);
    }
    out
}

/// The most `[admin] wrong_tokens_burst` may be.
pub(crate) const MAX_WRONG_TOKENS_BURST: usize = 10_000;
/// The least `[admin] wrong_tokens_per_second` may be: one a 100 s, so that the
/// longest burst refills within the 49 days a bucket's burst is kept to.
pub(crate) const MIN_WRONG_TOKENS_PER_SECOND: f64 = 0.01;
/// The most `[admin] wrong_tokens_per_second` may be.
pub(crate) const MAX_WRONG_TOKENS_PER_SECOND: f64 = 1_000.0;

/// An `[admin] allowed_hosts` entry: a host name alone, as a request's `Host` names it
/// without its port, lower-cased and without a trailing dot (the admin API compares it
/// so). A scheme, a path or a port is refused, naming what to leave out; so is a name
/// beyond ASCII, which a browser sends in its `xn--` form, and an IP address, which
/// the admin API takes without being listed (the list names this host as a `Host`
/// header does, not the clients allowed). The ASCII whitespace around it is left out,
/// as around a network of `trusted_proxies`.
fn allowed_host(text: &str) -> Result<String, String> {
    let text = text.trim_ascii();
    let alone = |what: &str| {
        Err(format!(
            "must be a host name alone, got {:?}: leave out the {what}",
            quoted(text)
        ))
    };
    if text.is_empty() {
        return Err(
            "must not be empty: a name of this host that a request's Host may \
                    carry, such as \"rocgate.internal\""
                .to_owned(),
        );
    }
    if let Some((scheme, _)) = text.split_once("://") {
        return alone(&format!("scheme ({}://)", quoted(scheme)));
    }
    if let Some(at) = text.find('/') {
        return alone(&format!("path ({})", quoted(&text[at..])));
    }
    let name = text.strip_suffix('.').unwrap_or(text);
    let bracketed = name.starts_with('[') && name.ends_with(']');
    if bracketed || name.parse::<IpAddr>().is_ok() {
        return Err(format!(
            "{:?} is an IP address, which the admin API answers without being listed: \
             leave it out (the list names this host as a Host header does, not the \
             clients allowed)",
            quoted(text)
        ));
    }
    if let Some((_, port)) = text.rsplit_once(':') {
        if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) {
            return alone(&format!(
                "port (:{port}): a name listed is taken on any port"
            ));
        }
    }
    if !name.is_ascii() {
        return Err(format!(
            "must be a host name in ASCII, got {:?}: write an internationalized name in its \
             xn-- form (xn--bcher-kva.example for bücher.example), as a browser sends it in Host",
            quoted(text)
        ));
    }
    let label = |label: &str| {
        (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.len() > 253 || !name.split('.').all(label) {
        return Err(format!(
            "must be a host name (labels of letters, digits, - and _ between dots, each \
             of 1 to 63 characters), got {:?}",
            quoted(text)
        ));
    }
    Ok(name.to_ascii_lowercase())
}

/// `[hints]`, each field checked on its own, defaults where absent.
fn hints_config(p: &mut Problems, raw: RawHints) -> HintsConfig {
    let mut out = HintsConfig::default();
    let mut field = |path: &str, result: Result<(), String>| {
        if let Err(message) = result {
            p.at(format!("hints.{path}"), message);
        }
    };
    // A value refused is not checked against the other: the other would be held
    // against a default the file did not write (a second, wrong error).
    let mut both_read = true;
    if let Some(v) = raw.interval {
        let checked = timer_duration(v).and_then(|d| {
            if d < Duration::from_millis(1) {
                return Err(format!(
                    "must be at least 1ms, got {}",
                    humantime::format_duration(d)
                ));
            }
            out.interval = d;
            Ok(())
        });
        both_read &= checked.is_ok();
        field("interval", checked);
    }
    // A clash of the two is the one the file wrote's (`keep` if both).
    let keep_written = raw.keep.is_some();
    if let Some(v) = raw.keep {
        let checked = timer_duration(v).map(|d| out.keep = d);
        both_read &= checked.is_ok();
        field("keep", checked);
    }
    if let Some(v) = raw.latency_budget {
        field(
            "latency_budget",
            timer_duration(v).and_then(|d| {
                if d > Policy::LONGEST_LATENCY_BUDGET {
                    return Err(format!(
                        "must be at most {} (upstream latencies are told apart up to that), got {}",
                        humantime::format_duration(Policy::LONGEST_LATENCY_BUDGET),
                        humantime::format_duration(d)
                    ));
                }
                out.policy.latency_budget = d;
                Ok(())
            }),
        );
    }
    if let Some(v) = raw.error_budget {
        let checked = if (0.0..1.0).contains(&v.0) {
            out.policy.error_budget = v.0;
            Ok(())
        } else {
            Err(format!(
                "must be a fraction of at least 0 and below 1, such as 0.01, got {}",
                figure(v.0)
            ))
        };
        field("error_budget", checked);
    }
    if let Some(v) = raw.min_requests {
        out.policy.min_requests = v.0;
    }
    if !both_read {
        return out;
    }
    // Every route keeps a record an interval, for `keep`.
    const MOST_INTERVALS: u128 = 100_000;
    let kept = out.keep.as_nanos() / out.interval.as_nanos().max(1);
    let keep = humantime::format_duration(out.keep);
    let interval = humantime::format_duration(out.interval);
    // Twice: the interval that closed last began more than one interval before the
    // tick that closed it (the timer is never early), and a report looks back at least
    // two intervals; with `keep` of one interval, it was dropped at once, and no hint
    // was ever given.
    if out.keep < out.interval.saturating_mul(2) {
        if keep_written {
            field(
                "keep",
                Err(format!(
                    "must be at least twice hints.interval ({interval}), got {keep}: the interval that closed last began more than one interval ago"
                )),
            );
        } else {
            field(
                "interval",
                Err(format!(
                    "must be at most half of hints.keep ({keep}, its default), got {interval}: the interval that closed last began more than one interval ago"
                )),
            );
        }
    } else if kept > MOST_INTERVALS {
        if keep_written {
            field(
                "keep",
                Err(format!(
                    "must be at most {MOST_INTERVALS} intervals of hints.interval ({interval}), got {kept}: every route keeps a record an interval"
                )),
            );
        } else {
            field(
                "interval",
                Err(format!(
                    "must be at least hints.keep ÷ {MOST_INTERVALS} ({}, hints.keep being {keep}, its default), got {interval}: every route keeps a record an interval",
                    humantime::format_duration(out.keep.div_f64(MOST_INTERVALS as f64))
                )),
            );
        }
    }
    out
}

/// A Redis URL with one of `schemes` (in any case, as the Redis client reads them),
/// trimmed, and, in a build with the Redis client, what it reads there
/// ([`read_redis_url`]). `rediss://` (TLS) is refused by name: rocgate is built
/// without TLS for Redis, and would otherwise pass a config check and fail only when
/// `rocgate serve` starts.
fn redis_url<'a>(url: &'a str, schemes: &[&str]) -> Result<(&'a str, RedisUrl), String> {
    let t = url.trim_ascii();
    let scheme = t
        .split_once("://")
        .map(|(scheme, _)| scheme.to_ascii_lowercase());
    if scheme.as_deref() == Some("rediss") {
        return Err(format!(
            "rediss:// (TLS) is not supported: rocgate is built without TLS for Redis; use redis://, through a TLS tunnel (such as stunnel) if Redis requires TLS, got {:?}",
            quoted(&masked_url(url))
        ));
    }
    let known = scheme.is_some_and(|scheme| {
        schemes
            .iter()
            .any(|s| s.strip_suffix("://") == Some(scheme.as_str()))
    });
    if !known || t.split_once("://").is_some_and(|(_, rest)| rest.is_empty()) {
        return Err(format!(
            "must be a URL such as \"redis://127.0.0.1:6379\" ({}), got {:?}",
            schemes.join(", "),
            quoted(&masked_url(url))
        ));
    }
    read_redis_url(t)
        .map(|read| (t, read))
        .map_err(|e| format!("{e}, got {:?}", quoted(&masked_url(url))))
}

/// What a Redis URL gives besides its address, which every node of a Redis Cluster
/// must give alike (the client refuses nodes that differ).
#[derive(Default, PartialEq)]
struct RedisUrl {
    /// Percent-decoded, as the client reads it.
    username: String,
    /// Percent-decoded, as the client reads it.
    password: Option<String>,
    /// The RESP version: 2 unless the URL's `protocol` says 3.
    resp: u8,
    database: i64,
}

/// `url` read as the Redis client (redis-rs) reads it when `serve` starts, with
/// the `url` crate as it does: a URL it cannot read there was a config that
/// `check-config` passed and a process that would not start; a port of 0 or a
/// negative database, which it reads, one that started and could never reach Redis.
#[cfg(feature = "redis")]
fn read_redis_url(t: &str) -> Result<RedisUrl, String> {
    use url::{Host, ParseError};
    let u = url::Url::parse(t).map_err(|e| match e {
        ParseError::EmptyHost => {
            "names no host (redis://host[:port]; an IPv6 host in brackets: redis://[::1]:6379)"
                .to_owned()
        }
        ParseError::InvalidPort => "port must be a number from 1 to 65535".to_owned(),
        ParseError::InvalidIpv6Address => {
            "the host in brackets must be an IPv6 address (redis://[::1]:6379)".to_owned()
        }
        ParseError::InvalidDomainCharacter => {
            "the host holds a character no host name has (a space, ^, |, [, ] …)".to_owned()
        }
        e => format!("is not a URL the Redis client reads ({e})"),
    })?;
    let query: std::collections::HashMap<_, _> = u.query_pairs().collect();
    // The client ignores any other field: `?db=5` on a redis:// URL ran on database 0.
    let (read, reads, place) = if u.scheme() == "redis" {
        (
            &["protocol"][..],
            "protocol alone there, the database from the path (redis://host:port/5)",
            "a redis:// URL",
        )
    } else {
        (
            &["db", "user", "pass", "protocol"][..],
            "db, user, pass and protocol",
            "a unix socket's URL",
        )
    };
    if let Some((field, _)) = u.query_pairs().find(|(k, _)| !read.contains(&k.as_ref())) {
        return Err(format!(
            "the query field {:?} is not read by the Redis client on {place}: it reads {reads}",
            quoted(&field)
        ));
    }
    let resp = match query.get("protocol").map(|p| p.as_ref()) {
        None | Some("2" | "resp2") => 2,
        Some("3" | "resp3") => 3,
        Some(p) => {
            return Err(format!(
                "protocol={:?} is no protocol the Redis client knows (resp2 or resp3)",
                quoted(p)
            ))
        }
    };
    let decoded = |part: &str, what: &str| {
        percent_encoding::percent_decode_str(part)
            .decode_utf8()
            .map(|d| d.into_owned())
            .map_err(|_| format!("the {what}, percent-decoded, must be UTF-8"))
    };
    let whole = |db: &str, written: String, example: &str| match db.parse::<i64>() {
        Ok(n) if n >= 0 => Ok(n),
        _ => Err(format!(
            "the database {written} must be a whole number ≥ 0 ({example})"
        )),
    };
    let database = if u.scheme() == "redis" {
        let host = match u.host() {
            Some(Host::Domain(name)) => name.to_owned(),
            Some(Host::Ipv4(ip)) => ip.to_string(),
            Some(Host::Ipv6(ip)) => ip.to_string(),
            None => return Err("names no host (redis://host[:port])".into()),
        };
        if host == "0.0.0.0" || host == "::" {
            return Err(format!(
                "{host} is a wildcard address, which no connection reaches: name the Redis host"
            ));
        }
        if u.port() == Some(0) {
            return Err("port must be a number from 1 to 65535".into());
        }
        match u.path().trim_matches('/') {
            "" => 0,
            db => whole(db, format!("/{db}"), "redis://host:port/0")?,
        }
    } else {
        if u.to_file_path().is_err() {
            return Err("must give the socket's absolute path (unix:///run/redis.sock)".into());
        }
        match query.get("db") {
            None => 0,
            Some(db) => whole(db, format!("?db={db}"), "unix:///run/redis.sock?db=0")?,
        }
    };
    let username = decoded(u.username(), "user")?;
    let password = u.password().map(|p| decoded(p, "password")).transpose()?;
    // The client authenticates only with a password: a user alone is never sent, and
    // is most often a password written without its colon.
    if !u.username().is_empty() && u.password().is_none() {
        return Err(
            "names a user but no password, and the Redis client sends a user only with a password \
             (redis://user:password@host; a password alone: redis://:password@host)"
                .into(),
        );
    }
    if query.contains_key("user") && !query.contains_key("pass") {
        return Err(
            "names a user but no password, and the Redis client sends a user only with a password \
             (unix:///run/redis.sock?user=u&pass=p)"
                .into(),
        );
    }
    Ok(RedisUrl {
        username,
        password,
        resp,
        database,
    })
}

/// Without the Redis client in the build, no Redis is reached: the scheme alone is
/// checked ([`redis_url`]).
#[cfg(not(feature = "redis"))]
fn read_redis_url(_: &str) -> Result<RedisUrl, String> {
    Ok(RedisUrl::default())
}

/// A cluster node's URL: a Redis Cluster has database 0 only.
fn cluster_node((url, read): (&str, RedisUrl)) -> Result<(&str, RedisUrl), String> {
    if read.database != 0 {
        return Err(format!(
            "a Redis Cluster has database 0 only, got {} in {:?}",
            read.database,
            quoted(&masked_url(url))
        ));
    }
    Ok((url, read))
}

/// `[store]`, each field checked on its own. Redis settings given with the local
/// backend are refused rather than silently ignored.
fn store_config(p: &mut Problems, raw: RawStore) -> StoreConfig {
    let backend = raw.backend.as_deref().map(str::trim_ascii);
    let redis_fields = [
        ("url", raw.url.is_some()),
        ("cluster_nodes", raw.cluster_nodes.is_some()),
        ("timeout", raw.timeout.is_some()),
        ("key_prefix", raw.key_prefix.is_some()),
        ("fail_mode", raw.fail_mode.is_some()),
        ("mode", raw.mode.is_some()),
        ("heartbeat", raw.heartbeat.is_some()),
        ("failures_to_open", raw.failures_to_open.is_some()),
        ("probe_interval", raw.probe_interval.is_some()),
        ("key_ttl", raw.key_ttl.is_some()),
        ("instance_id", raw.instance_id.is_some()),
        ("expected_instances", raw.expected_instances.is_some()),
    ];
    match backend {
        None | Some("local") => {
            for (name, given) in redis_fields {
                if given {
                    p.at(
                        format!("store.{name}"),
                        "only applies with backend = \"redis\"",
                    );
                }
            }
            return StoreConfig::Local;
        }
        Some("redis") => {}
        Some(other) => {
            p.at(
                "store.backend".to_owned(),
                format!("must be \"local\" or \"redis\", got {:?}", quoted(other)),
            );
            return StoreConfig::Local;
        }
    }
    let mut out = RedisConfig::default();
    let field = |p: &mut Problems, name: &str, result: Result<(), String>| {
        if let Err(message) = result {
            p.at(format!("store.{name}"), message);
        }
    };
    match (raw.url, raw.cluster_nodes) {
        (Some(_), Some(_)) => field(
            p,
            "cluster_nodes",
            Err("give either url (one Redis) or cluster_nodes (a Redis Cluster), not both".into()),
        ),
        (Some(url), None) => {
            let checked = redis_url(&url, &["redis://", "unix://", "redis+unix://"])
                .map(|(t, _)| out.servers = RedisServers::Single(t.to_owned()));
            field(p, "url", checked);
        }
        (None, Some(nodes)) => {
            let nodes = nodes.into_items();
            let mut urls = Vec::new();
            let mut first: Option<RedisUrl> = None;
            for (i, url) in nodes.iter().enumerate() {
                match redis_url(url, &["redis://"]).and_then(cluster_node) {
                    Ok((_, read)) if first.as_ref().is_some_and(|f| *f != read) => p.at(
                        format!("store.cluster_nodes[{i}]"),
                        format!(
                            "every node must give the user, password and protocol of cluster_nodes[0] (the Redis client refuses nodes that differ), got {:?}",
                            quoted(&masked_url(url))
                        ),
                    ),
                    Ok((t, read)) => {
                        urls.push(t.to_owned());
                        first.get_or_insert(read);
                    }
                    Err(message) => p.at(format!("store.cluster_nodes[{i}]"), message),
                }
            }
            if urls.is_empty() && nodes.is_empty() {
                field(
                    p,
                    "cluster_nodes",
                    Err("must name at least one node".into()),
                );
            }
            out.servers = RedisServers::Cluster(urls);
        }
        (None, None) => {}
    }
    for (name, raw, slot) in [
        ("timeout", raw.timeout, &mut out.timeout),
        ("heartbeat", raw.heartbeat, &mut out.heartbeat),
        (
            "probe_interval",
            raw.probe_interval,
            &mut out.probe_interval,
        ),
        ("key_ttl", raw.key_ttl, &mut out.key_ttl),
    ] {
        if let Some(v) = raw {
            field(p, name, timer_duration(v).map(|d| *slot = d));
        }
    }
    if out.key_ttl < Duration::from_secs(1) {
        field(
            p,
            "key_ttl",
            Err(format!("must be at least 1s, got {:?}", out.key_ttl)),
        );
    }
    // A beat Redis answers after three of them is no beat: the other instances count
    // this one gone meanwhile, now and then, and their shares jump.
    if out.timeout >= out.heartbeat {
        field(
            p,
            "timeout",
            Err(format!(
                "must be shorter than heartbeat ({:?}), got {:?}: an instance whose beats Redis answers later than 3 beats counts as gone",
                out.heartbeat, out.timeout
            )),
        );
    }
    if let Some(prefix) = raw.key_prefix {
        let checked = if prefix.is_empty()
            || !prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.:-".contains(c))
        {
            Err(format!(
                "must be one or more of A-Z a-z 0-9 _ . : - (no braces: rocgate adds the hash tag), got {:?}",
                quoted(&prefix)
            ))
        } else {
            out.key_prefix = prefix;
            Ok(())
        };
        field(p, "key_prefix", checked);
    }
    if let Some(mode) = raw.fail_mode {
        let checked = match mode.trim_ascii() {
            "local" => Ok(FailMode::Local),
            "open" => Ok(FailMode::Open),
            "closed" => Ok(FailMode::Closed),
            _ => Err(format!(
                "must be \"local\", \"open\" or \"closed\", got {:?}",
                quoted(&mode)
            )),
        };
        field(p, "fail_mode", checked.map(|m| out.fail_mode = m));
    }
    if let Some(mode) = raw.mode {
        let checked = match mode.trim_ascii() {
            "exact" => Ok(SyncMode::Exact),
            "batched" => Ok(SyncMode::Batched),
            _ => Err(format!(
                "must be \"exact\" or \"batched\", got {:?}",
                quoted(&mode)
            )),
        };
        field(p, "mode", checked.map(|m| out.mode = m));
    }
    if let Some(n) = raw.failures_to_open {
        let checked = match u32::try_from(n.0) {
            Ok(n) if n >= 1 => {
                out.failures_to_open = n;
                Ok(())
            }
            _ => Err(format!("must be from 1 to {}, got {}", u32::MAX, n.0)),
        };
        field(p, "failures_to_open", checked);
    }
    if let Some(n) = raw.expected_instances {
        let checked = match u16::try_from(n.0) {
            Ok(n) if n >= 1 => {
                out.expected_instances = n;
                Ok(())
            }
            _ => Err(format!("must be from 1 to {}, got {}", u16::MAX, n.0)),
        };
        field(p, "expected_instances", checked);
    }
    if let Some(id) = raw.instance_id {
        let checked = if id.trim().is_empty() || id.chars().count() > 128 {
            Err(format!(
                "must be 1 to 128 characters; leave it out for a random one, got {:?}",
                quoted(&id)
            ))
        } else {
            out.instance_id = Some(id);
            Ok(())
        };
        field(p, "instance_id", checked);
    }
    StoreConfig::Redis(out)
}

/// The controller fields a runtime change may set: those of `[defaults]` that do not
/// change the shape of a route's state. A field left out keeps its value; `null` is
/// refused ([`not_null`]), and so is a number written as text ([`JsonNum`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPatch {
    #[serde(default, deserialize_with = "not_null")]
    base_limit: Option<JsonNum>,
    #[serde(default, deserialize_with = "not_null")]
    cut_limit: Option<JsonNum>,
    #[serde(default, deserialize_with = "not_null")]
    danger_roc: Option<JsonNum>,
    #[serde(default, deserialize_with = "not_null")]
    safe_roc: Option<JsonNum>,
    #[serde(default, deserialize_with = "not_null")]
    hold: Option<DurationText>,
    #[serde(default, deserialize_with = "not_null")]
    restore_step: Option<JsonNum>,
    #[serde(default, deserialize_with = "not_null")]
    restore_interval: Option<DurationText>,
    #[serde(default, deserialize_with = "not_null")]
    min_rps: Option<JsonNum>,
    #[serde(default, deserialize_with = "not_null")]
    min_samples: Option<JsonWhole>,
    #[serde(default, deserialize_with = "not_null")]
    min_dwell: Option<DurationText>,
    #[serde(default, deserialize_with = "not_null")]
    max_cut: Option<DurationText>,
    #[serde(default, deserialize_with = "not_null")]
    roc_mode: Option<String>,
}

/// What [`not_null`] refuses with; [`patch_controller`] words it in full, with how to
/// withdraw the change ([`null_refusal`]).
const NULL_IS_NO_VALUE: &str = "null is no value";

/// A field of a runtime change that must have a value if written: `null` would read as
/// left out, and an operator who meant "back to the file's value" would get a success
/// and an unchanged route.
fn not_null<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    match Option::<T>::deserialize(d)? {
        Some(v) => Ok(Some(v)),
        None => Err(serde::de::Error::custom(NULL_IS_NO_VALUE)),
    }
}

/// The refusal of a field set to `null`, naming how to withdraw the change
/// (`withdraw`, such as `DELETE /admin/routes/order/change`) where there is one.
fn null_refusal(withdraw: Option<&str>) -> String {
    let how = withdraw.map_or_else(String::new, |w| format!(" ({w})"));
    format!(
        "{NULL_IS_NO_VALUE}: leave the field out to keep it, or withdraw the change{how} to go back to the file's parameters"
    )
}

/// What is wrong in a change's JSON text. A problem with a named field's value is
/// placed by that field, as a file's problem is, without the position serde_json
/// appends (it ended the `null` refusal's "to go back to the file's parameters at line
/// 1 column 20", which read as a place in the config file); one of the text's syntax
/// keeps it, having no field to name.
fn json_problem(e: &serde_json::Error, location: &str) -> String {
    let text = e.to_string();
    if location.is_empty() || e.classify() != serde_json::error::Category::Data {
        return text;
    }
    let position = format!(" at line {} column {}", e.line(), e.column());
    match text.strip_suffix(&position) {
        Some(message) => message.to_owned(),
        None => text,
    }
}

/// Where a deserialization error is, as a field path (`routes[0].hold`): the fields
/// and indices the deserializer had entered, up to the first it had not named yet
/// (serde_path_to_error writes that one `?`: a JSON object cut short after a value
/// was waiting for its next key). Empty at the root: the error's own message says
/// where in the text it is (`EOF while parsing an object at line 1 column 18`).
pub(super) fn error_location(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key: name } | Segment::Enum { variant: name } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&key_text(name));
            }
            Segment::Unknown => break,
        }
    }
    out
}

/// A key as a field path names it: as it is if TOML takes it bare (letters, digits,
/// `_`, `-`), else quoted and escaped (`"x\ny"`, `"a.b"`), so that a problem stays on
/// one line and a dot in a key is not read as a table's. Whole, however long (unlike
/// a value a message quotes, [`quoted`]): the path locates the problem, and names
/// the environment variable that set it.
pub(super) fn key_text(key: &str) -> std::borrow::Cow<'_, str> {
    let bare = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if !key.is_empty() && key.chars().all(bare) {
        std::borrow::Cow::Borrowed(key)
    } else {
        std::borrow::Cow::Owned(format!("{key:?}"))
    }
}

/// `message` with each control character escaped (`\n`, `\u{1}`): a deserializer's
/// message quotes an unknown key or variant as written, and a line break there split
/// one problem over two lines.
pub(super) fn one_line(message: String) -> String {
    match super::escaped(&message, char::is_control) {
        std::borrow::Cow::Borrowed(_) => message,
        std::borrow::Cow::Owned(escaped) => escaped,
    }
}

/// Why a runtime change was refused: its body is no change, or the rules refuse it.
#[derive(Debug)]
pub(crate) enum PatchError {
    /// The text is not a JSON object of the change's fields each of its JSON type
    /// (malformed JSON, an unknown field or one given twice, a number as a string,
    /// `null`): every such problem, and none of the rules', which wait for a change to
    /// read.
    Malformed(Vec<Problem>),
    /// A change that reads, refused by the file's rules: every problem.
    Refused(Vec<Problem>),
}

impl PatchError {
    /// Its problems, whichever it is.
    pub(crate) fn problems(self) -> Vec<Problem> {
        match self {
            PatchError::Malformed(p) | PatchError::Refused(p) => p,
        }
    }
}

/// `current` (enforced by `algorithm`) changed by the JSON object `json`, checked by
/// the rules of the file. Problems are named by field (`cut_limit: must be ≤ base_limit
/// (200), got 300`); the caller names the origin. `withdraw`: how the change is
/// withdrawn, named where a field set to `null` is refused.
pub(crate) fn patch_controller(
    current: &ControllerParams,
    algorithm: &Algorithm,
    json: &str,
    withdraw: Option<&str>,
) -> Result<ControllerParams, PatchError> {
    let raw = read_patch(json, withdraw).map_err(PatchError::Malformed)?;
    let mut p = Problems::default();
    let now = Settings::current(current, algorithm);
    let (min_samples, min_samples_refused) = match raw.min_samples.map(|n| n.0) {
        Some(Err(refused)) => (None, Some(refused)),
        read => (read.and_then(Result::ok), None),
    };
    let settings = RawSettings {
        base_limit: raw.base_limit.map(|n| n.0),
        cut_limit: raw.cut_limit.map(|n| n.0),
        danger_roc: raw.danger_roc.map(|n| n.0),
        safe_roc: raw.safe_roc.map(|n| n.0),
        hold: raw.hold.map(|t| t.0),
        restore_step: raw.restore_step.map(|n| n.0),
        restore_interval: raw.restore_interval.map(|t| t.0),
        min_rps: raw.min_rps.map(|n| n.0),
        min_samples,
        min_dwell: raw.min_dwell.map(|t| t.0),
        max_cut: raw.max_cut.map(|t| t.0),
        roc_mode: raw.roc_mode,
        ..RawSettings::default()
    };
    let s = now.over(settings, Scope::Patch, &mut p);
    if let Some(refused) = min_samples_refused {
        p.at(Scope::Patch.path("min_samples"), refused);
    }
    let params = controller_params(&mut p, &s);
    check_route_limits(&mut p, &s);
    match params {
        Some(params) if p.0.is_empty() => Ok(params),
        _ => Err(PatchError::Refused(p.0)),
    }
}

/// The fields of the change `json`, or every problem of its shape: the text's syntax
/// (which ends the reading), then, field by field in the order written, one given more
/// than once (JSON leaves to the reader which it keeps), one unknown, or a value not of
/// the field's type.
fn read_patch(json: &str, withdraw: Option<&str>) -> Result<RawPatch, Vec<Problem>> {
    // A byte order mark, which some Windows tools write, is no part of the JSON text
    // (RFC 8259 §8.1 lets a parser ignore it).
    let json = json.strip_prefix('\u{feff}').unwrap_or(json);
    // serde reads a struct from a JSON array too, field by field in order.
    if !json.trim_start().starts_with('{') {
        return Err(vec![Problem::new(
            "",
            format!(
                "the change must be a JSON object of fields such as {{\"base_limit\": 300}}, got {:?}",
                json.chars().take(40).collect::<String>()
            ),
        )]);
    }
    let problem = |location: String, message: String| {
        let message = one_line(quotes_bounded(&message));
        let message = if message == NULL_IS_NO_VALUE {
            null_refusal(withdraw)
        } else {
            message
        };
        Problem::new(location, message)
    };
    let mut de = serde_json::Deserializer::from_str(json);
    let (fields, past_largest) = match serde_path_to_error::deserialize(&mut de) {
        Ok(Fields::<serde_json::Value>(fields)) => {
            // Whatever follows the object (a second one) would be dropped silently.
            de.end()
                .map_err(|e| vec![Problem::new("", e.to_string())])?;
            (fields, Vec::new())
        }
        Err(e) => numbers_past_largest(json).ok_or_else(|| {
            let location = error_location(e.path());
            vec![problem(
                location.clone(),
                json_problem(e.inner(), &location),
            )]
        })?,
    };
    let mut given: HashMap<&str, usize> = HashMap::new();
    for (key, _) in &fields {
        *given.entry(key).or_default() += 1;
    }
    let read_as_0 = numbers_read_as_0(json, &fields);
    let mut problems = Vec::new();
    let mut object = serde_json::Map::new();
    for (i, (key, value)) in fields.iter().enumerate() {
        if object.contains_key(key) {
            continue;
        }
        let given = given.get(key.as_str()).copied().unwrap_or(1);
        if given > 1 {
            problems.push(Problem::new(
                key_text(key),
                format!("given {given} times: a change gives each field once"),
            ));
        }
        let alone = serde_json::Value::Object([(key.clone(), value.clone())].into_iter().collect());
        if let Some(text) = read_as_0.get(i).copied().flatten() {
            problems.push(problem(
                key_text(key).into_owned(),
                format!("number out of range, got {:?}: {NEARER_0}", quoted(text)),
            ));
        } else if let Some(text) = past_largest.get(i).copied().flatten() {
            problems.push(problem(
                key_text(key).into_owned(),
                format!(
                    "number out of range, got {:?}: {PAST_LARGEST}",
                    quoted(text)
                ),
            ));
        } else if let Err(e) = serde_path_to_error::deserialize::<_, RawPatch>(alone) {
            let location = error_location(e.path());
            problems.push(problem(location, e.inner().to_string()));
        }
        object.insert(key.clone(), value.clone());
    }
    if problems.len() > MAX_PATCH_PROBLEMS {
        problems.truncate(MAX_PATCH_PROBLEMS);
        problems.push(Problem::new(
            "",
            format!("more problems follow: the first {MAX_PATCH_PROBLEMS} are reported"),
        ));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    serde_path_to_error::deserialize(serde_json::Value::Object(object)).map_err(|e| {
        let location = error_location(e.path());
        vec![problem(location, e.inner().to_string())]
    })
}

/// The most problems of a change's shape reported at once: a 64 KiB body of unknown
/// fields would otherwise be answered with megabytes of them.
const MAX_PATCH_PROBLEMS: usize = 50;

/// A JSON object's fields as written: in order, a field given twice kept twice (a map
/// would keep one, and the change's reader would not see it was given twice). Each
/// value a [`serde_json::Value`], or its text (`&RawValue`), where a number's is
/// needed.
struct Fields<V>(Vec<(String, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Fields<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct FieldsVisitor<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for FieldsVisitor<V> {
            type Value = Fields<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Fields<V>, A::Error> {
                let mut fields = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    fields.push((key, map.next_value()?));
                }
                Ok(Fields(fields))
            }
        }
        d.deserialize_map(FieldsVisitor(std::marker::PhantomData))
    }
}

/// For each field of the change `json` (a JSON object that reads as `fields`), in
/// order, the number it writes not 0 but that reads as 0 (`1e-400`,
/// [`written_not_0`]), as written: serde_json reads it as 0, and keeps no text of it.
/// Empty where no field's number is 0: only then is the text read again.
fn numbers_read_as_0<'a>(
    json: &'a str,
    fields: &[(String, serde_json::Value)],
) -> Vec<Option<&'a str>> {
    let zero = |v: &serde_json::Value| v.as_f64() == Some(0.0);
    if !fields.iter().any(|(_, v)| zero(v)) {
        return Vec::new();
    }
    let Ok(Fields(texts)) = serde_json::from_str::<Fields<&serde_json::value::RawValue>>(json)
    else {
        return Vec::new();
    };
    texts
        .into_iter()
        .zip(fields)
        .map(|((_, text), (_, v))| {
            (zero(v) && written_not_0(text.get(), 0.0)).then_some(text.get())
        })
        .collect()
}

/// Why a change's number past the largest held (`1e400`) is refused, after the number
/// as written.
const PAST_LARGEST: &str = "past the largest number held";

/// The fields of the change `json`, which serde_json refused, where that was for a
/// field's number past the largest held (`1e400`, `-1E+999`): each field's value, a
/// `null` for such a number, and for each field, in order, its number past the largest
/// as written. serde_json stops at the first, naming it by position only. `None` where
/// the change does not read for another reason too (its syntax, a number past the
/// largest inside a field's array or object).
fn numbers_past_largest(json: &str) -> Option<PastLargest<'_>> {
    let Fields(texts) = serde_json::from_str::<Fields<&serde_json::value::RawValue>>(json).ok()?;
    let mut fields = Vec::with_capacity(texts.len());
    let mut past = Vec::with_capacity(texts.len());
    for (key, text) in texts {
        let text = text.get();
        let number = text.starts_with(|c: char| c == '-' || c.is_ascii_digit());
        if number && text.parse::<f64>().is_ok_and(f64::is_infinite) {
            fields.push((key, serde_json::Value::Null));
            past.push(Some(text));
        } else {
            fields.push((key, serde_json::from_str(text).ok()?));
            past.push(None);
        }
    }
    past.iter().any(Option::is_some).then_some((fields, past))
}

/// A change's fields, each number past the largest held as `null`, and for each field,
/// its number past the largest as written: [`numbers_past_largest`].
type PastLargest<'a> = (Vec<(String, serde_json::Value)>, Vec<Option<&'a str>>);

impl Settings {
    /// The settings of a running route: its controller parameters and algorithm.
    fn current(c: &ControllerParams, algorithm: &Algorithm) -> Settings {
        fn cur<T>(value: T) -> Res<T> {
            Some(Set {
                value,
                scope: Scope::Current,
            })
        }
        let (kind, burst, window, queue) = match *algorithm {
            Algorithm::TokenBucket { burst } => (Kind::TokenBucket, Some(burst), None, None),
            Algorithm::FixedWindow { window } => (Kind::FixedWindow, None, Some(window), None),
            Algorithm::SlidingWindow { window } => (Kind::SlidingWindow, None, Some(window), None),
            Algorithm::LeakyBucket { queue } => (Kind::LeakyBucket, None, None, Some(queue)),
            Algorithm::Concurrency { queue } => (Kind::Concurrency, None, None, Some(queue)),
        };
        let builtin = Settings::builtin();
        Settings {
            roc_mode: cur(c.roc_mode),
            base_limit: cur(c.base_limit_rps),
            cut_limit: cur(c.cut_limit_rps),
            danger_roc: cur(c.danger_roc),
            safe_roc: cur(c.safe_roc),
            hold: cur(c.hold),
            restore_step: cur(c.restore_step_rps),
            restore_interval: cur(c.restore_interval),
            min_rps: cur(c.min_rps),
            min_samples: cur(c.min_samples),
            min_dwell: cur(c.min_dwell),
            max_cut: cur(c.max_cut),
            algorithm: cur(kind),
            burst: burst.map_or(builtin.burst.clone(), cur),
            limiter_window: window.map_or(builtin.limiter_window.clone(), cur),
            queue: queue.map_or(builtin.queue.clone(), cur),
            ..builtin
        }
    }
}

#[cfg(test)]
mod tests;
