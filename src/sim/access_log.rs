//! Access-log replay: reads nginx and Apache access logs (the common and combined
//! formats) into an [`AccessLog`], each request matched to a route exactly as
//! `rocgate serve` matches it ([`Engine::route_for`] on the method and the path
//! without its query), and placed on the run's virtual clock.
//!
//! ```
//! use rocgate::config::{Config, RouteConfig, RouteMatch};
//! use rocgate::sim::{LogOptions, LogReader, Simulator};
//!
//! let config = Config::new(vec![RouteConfig::new("order", RouteMatch::exact("POST", "/api/order"))]);
//! let log = "\
//! 203.0.113.7 - - [27/Nov/2026:20:00:00 +0000] \"POST /api/order?id=1 HTTP/1.1\" 200 12 \"-\" \"curl/8\"
//! 2001:db8::1 - - [27/Nov/2026:20:00:00 +0000] \"POST /api/order HTTP/1.1\" 200 12
//! 203.0.113.7 - - [27/Nov/2026:20:00:01 +0000] \"GET /api/order HTTP/1.1\" 200 12
//! 203.0.113.7 - - [27/Nov/2026:20:00:02 +0000] \"POST /api/order HTTP/1.1\" 200 12
//! ";
//! let mut reader = LogReader::new(&config, LogOptions::default()).unwrap();
//! reader.read("access.log", log.as_bytes()).unwrap();
//! let log = reader.finish().unwrap();
//! assert_eq!(log.stats().replayed, 3);
//! assert_eq!(log.stats().unmatched, 1); // GET: the route takes POST only
//! assert_eq!(log.duration().as_secs(), 3);
//! // The two requests of the first second are spread evenly inside it.
//! let times: Vec<f64> = log.requests().map(|r| r.at.as_secs_f64()).collect();
//! assert_eq!(times, [0.25, 0.75, 2.5]);
//! let run = Simulator::for_routes(config, &["order"]).unwrap().replay(&log).unwrap();
//! assert_eq!(run.summary.offered, 3);
//! ```
//!
//! # What is read
//!
//! A line is `client ident user [time] "request" status bytes`, optionally followed by
//! `"referer" "user-agent"` (combined) and further fields (nginx formats often append
//! `$request_time` or `$http_x_forwarded_for`), which are skipped. Quoted fields may
//! hold escapes (`\"`, `\\`, `\xHH`), as both servers write them. The time is
//! `dd/Mon/yyyy:hh:mm:ss ±hhmm`; the client may be IPv4, IPv6 or a host name. Blank
//! lines are skipped; any other line that does not have this shape is *unparsable*: it
//! is counted and the first few are reported with their line numbers, and more than
//! [`MAX_UNPARSABLE_FRACTION`] of them is an error unless [`LogOptions::lenient`]. A
//! line longer than [`MAX_LINE_BYTES`] (1 MiB) ends the read at once, lenient or not
//! ([`LogError::LineTooLong`]): no server writes one, and a line that never ends
//! (`/dev/zero`) would be read forever.
//!
//! A line whose request field is not `METHOD target [protocol]` (nginx logs `"-"` for
//! a connection closed before a request, and the bytes of a TLS handshake sent to a
//! plain port) is a valid line but no request: it counts as *unmatched*, as does a
//! request no route takes.
//!
//! # Time
//!
//! Logged times have one-second resolution: each route's requests of one second are
//! spread evenly inside it (request k of n at `k + ½` n-ths of the second, as a
//! profile's uniform arrivals are) or, with [`Spread::Random`], at independent uniform
//! random times drawn from the seed; the routes' requests are then interleaved by
//! time. Lines need not be in time order (servers write a line when a request ends);
//! evenly spread, a route's requests of a second keep the log's order; randomly
//! spread, each takes its own time, so their order is the draws'. `from` and `to` are
//! compared with the logged seconds exactly (a request logged at 19:00:00 is before a
//! `from` of 19:00:00.999, and before a `to` of 19:00:00.001). Time zero of the run is
//! the first whole second at or after `from`, or the first logged second, and the run
//! ends at the last whole second before `to` (its end), or after the last logged
//! second. The client
//! address is the key of routes partitioned by client IP; routes partitioned by a
//! header are replayed as one keyless client, since logs do not carry headers.

use super::run::Request;
use super::MAX_SLOTS;
use crate::clock::Nanos;
use crate::config::{Config, Partition};
use crate::engine::Engine;
use rand::{RngCore, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;
use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufRead};
use std::iter::FusedIterator;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The largest share of unparsable lines (of the non-blank ones) accepted without
/// [`LogOptions::lenient`]: 1%.
pub const MAX_UNPARSABLE_FRACTION: f64 = 0.01;

/// How many unparsable lines, and unmatched requests, are kept as examples.
pub const EXAMPLES: usize = 5;

/// No client address is kept for the request.
const NO_CLIENT: u32 = u32::MAX;

/// One line of an access log, as written: the fields hold their text as logged
/// (escapes included), borrowed from the line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogLine<'a> {
    /// The client: an address or a host name.
    pub client: &'a [u8],
    /// The logged time, Unix seconds.
    pub time_unix_s: i64,
    /// The request field, between its quotes, escapes not yet undone.
    pub request: &'a [u8],
    /// The response status.
    pub status: u16,
    /// The response size, or `None` for `-`.
    pub bytes: Option<u64>,
    /// The referer field (combined format), between its quotes.
    pub referer: Option<&'a [u8]>,
    /// The user-agent field (combined format), between its quotes.
    pub user_agent: Option<&'a [u8]>,
}

impl LogLine<'_> {
    /// The client's IP address, if the client field is one.
    pub fn client_ip(&self) -> Option<IpAddr> {
        std::str::from_utf8(self.client).ok()?.parse().ok()
    }

    /// The request field with its escapes undone, as text (invalid UTF-8 replaced).
    pub fn request_text(&self) -> Cow<'_, str> {
        unescape(self.request)
    }

    /// The method and the path (query and any `scheme://host` removed), as
    /// `rocgate serve` sees them; `None` when the request field is not
    /// `METHOD target [protocol]`.
    pub fn method_and_path(&self) -> Option<(Cow<'_, str>, Cow<'_, str>)> {
        let (method, target) = split_request(self.request)?;
        let path = path_of(target);
        Some((unescape(method), unescape(path)))
    }
}

/// `METHOD target [protocol]` split into method and target.
fn split_request(request: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut parts = request.split(|&b| b == b' ').filter(|p| !p.is_empty());
    let method = parts.next()?;
    let target = parts.next()?;
    let protocol_ok = match parts.next() {
        None => true,
        Some(p) => p.starts_with(b"HTTP/") && parts.next().is_none(),
    };
    let is_token = method
        .iter()
        .all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    (protocol_ok && is_token).then_some((method, target))
}

/// The path of a request target as `serve` reads it (the `http` crate's URI parser):
/// no query, no fragment, and no `scheme://authority` in front, the authority ending
/// at the first `/`, `?` or `#` (`http://shop.example?next=/api` has the path `/`).
fn path_of(target: &[u8]) -> &[u8] {
    let ends_path = |b: &u8| matches!(b, b'?' | b'#');
    let target = match find(target, b"://") {
        Some(i) if target[..i].iter().all(u8::is_ascii_alphabetic) => {
            let rest = &target[i + 3..];
            match rest.iter().position(|b| *b == b'/' || ends_path(b)) {
                Some(j) if rest[j] == b'/' => &rest[j..],
                _ => b"/",
            }
        }
        _ => target,
    };
    let end = target.iter().position(ends_path).unwrap_or(target.len());
    &target[..end]
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A quoted field's text with `\"`, `\\`, `\xHH`, `\n`, `\r`, `\t` undone.
fn unescape(field: &[u8]) -> Cow<'_, str> {
    if !field.contains(&b'\\') {
        return String::from_utf8_lossy(field);
    }
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        match (field[i], field.get(i + 1)) {
            (b'\\', Some(b'x')) => match field.get(i + 2..i + 4).and_then(hex_byte) {
                Some(byte) => {
                    out.push(byte);
                    i += 4;
                }
                None => {
                    out.push(b'x');
                    i += 2;
                }
            },
            (b'\\', Some(&c)) => {
                out.push(match c {
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    other => other,
                });
                i += 2;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    let digit = |b: u8| (b as char).to_digit(16);
    Some((digit(two[0])? * 16 + digit(two[1])?) as u8)
}

/// Why a line is not an access-log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LineError {
    /// The line does not start with a client field.
    #[error("no client field")]
    Client,
    /// The ident and user fields are missing.
    #[error("no ident and user fields after the client")]
    Identity,
    /// No `[time]` where it belongs.
    #[error("no [time] after the user field")]
    NoTime,
    /// The time is not `dd/Mon/yyyy:hh:mm:ss ±hhmm`.
    #[error("the time is not dd/Mon/yyyy:hh:mm:ss ±hhmm")]
    BadTime,
    /// No quoted request after the time.
    #[error("no quoted request after the time")]
    NoRequest,
    /// A quoted field has no closing quote.
    #[error("a quoted field has no closing quote")]
    Unterminated,
    /// No status code after the request: no field, or one that is not three digits.
    #[error("no status code (three digits) after the request")]
    Status,
    /// No response size after the status.
    #[error("no response size after the status")]
    Bytes,
}

/// The longest line read, without its line break: a request line, referrer and user
/// agent fit in far less (with their default limits, nginx and Apache log each within
/// 8 KiB, or 32 KiB where every byte is past ASCII and logged as `\xHH`: 96 KiB for
/// the three, which a scanner's request reaches; a server whose limits were raised,
/// or a format with more headers, writes longer ones). A longer line is an error,
/// [`LogError::LineTooLong`], found once this much of it is read, so a file with no
/// line breaks neither fills memory nor is read forever.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Parses one line (without its line break) of the common or combined format.
///
/// ```
/// use rocgate::sim::access_log::{parse_line, LineError};
///
/// let line = br#"::1 - alice [10/Oct/2000:13:55:36 -0700] "GET /a?b=\"c\" HTTP/1.0" 200 2326 "http://example.com/" "Mozilla/4.08 [en]""#;
/// let l = parse_line(line).unwrap();
/// assert_eq!(l.client_ip(), Some("::1".parse().unwrap()));
/// assert_eq!(l.time_unix_s, 971_211_336);
/// assert_eq!(l.request_text(), r#"GET /a?b="c" HTTP/1.0"#);
/// assert_eq!(l.method_and_path().unwrap(), ("GET".into(), "/a".into()));
/// assert_eq!((l.status, l.bytes), (200, Some(2326)));
/// assert_eq!(l.user_agent, Some(&b"Mozilla/4.08 [en]"[..]));
/// assert_eq!(parse_line(b"::1 - - [10/Oct/2000:13:55:36] \"GET / HTTP/1.0\" 200 1"), Err(LineError::BadTime));
/// ```
pub fn parse_line(line: &[u8]) -> Result<LogLine<'_>, LineError> {
    parse_line_with(line, parse_time)
}

/// [`parse_line`], with `time` reading the time field.
fn parse_line_with(
    line: &[u8],
    time: impl FnOnce(&[u8]) -> Option<i64>,
) -> Result<LogLine<'_>, LineError> {
    let mut cursor = Cursor { rest: line };
    let client = cursor.token().ok_or(LineError::Client)?;
    cursor.token().ok_or(LineError::Identity)?;
    cursor.token().ok_or(LineError::Identity)?;
    let time_field = cursor.bracketed().ok_or(LineError::NoTime)?;
    let time_unix_s = time(time_field).ok_or(LineError::BadTime)?;
    let request = cursor.quoted()?.ok_or(LineError::NoRequest)?;
    let status = cursor
        .token()
        .filter(|t| t.len() == 3)
        .and_then(number)
        .ok_or(LineError::Status)? as u16;
    let bytes = match cursor.token().ok_or(LineError::Bytes)? {
        b"-" => None,
        t => Some(number(t).ok_or(LineError::Bytes)?),
    };
    let referer = cursor.quoted()?;
    let user_agent = match referer {
        Some(_) => cursor.quoted()?,
        None => None,
    };
    // Further fields: quoted or bare, skipped; a quote must still be closed.
    while !cursor.rest.is_empty() {
        if cursor.quoted()?.is_none() && cursor.token().is_none() {
            break;
        }
    }
    Ok(LogLine {
        client,
        time_unix_s,
        request,
        status,
        bytes,
        referer,
        user_agent,
    })
}

/// Reads fields off the front of a line.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn skip_spaces(&mut self) {
        let n = self.rest.iter().take_while(|&&b| b == b' ').count();
        self.rest = &self.rest[n..];
    }

    /// The next space-separated field, if there is one.
    fn token(&mut self) -> Option<&'a [u8]> {
        self.skip_spaces();
        let n = self.rest.iter().take_while(|&&b| b != b' ').count();
        let (token, rest) = self.rest.split_at(n);
        self.rest = rest;
        (!token.is_empty()).then_some(token)
    }

    /// The next field if it is `[...]`, without the brackets.
    fn bracketed(&mut self) -> Option<&'a [u8]> {
        self.skip_spaces();
        let inner = self.rest.strip_prefix(b"[")?;
        let end = inner.iter().position(|&b| b == b']')?;
        self.rest = &inner[end + 1..];
        Some(&inner[..end])
    }

    /// The next field if it is quoted, without the quotes; an error if its closing
    /// quote is missing. A backslash escapes the byte after it.
    fn quoted(&mut self) -> Result<Option<&'a [u8]>, LineError> {
        self.skip_spaces();
        let Some(inner) = self.rest.strip_prefix(b"\"") else {
            return Ok(None);
        };
        let mut i = 0;
        while i < inner.len() {
            match inner[i] {
                b'\\' => i += 2,
                b'"' => {
                    self.rest = &inner[i + 1..];
                    return Ok(Some(&inner[..i]));
                }
                _ => i += 1,
            }
        }
        Err(LineError::Unterminated)
    }
}

/// A whole number of ASCII digits that fits 18 digits.
fn number(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0, |n, &d| n * 10 + u64::from(d - b'0')))
}

/// A logged time, `dd/Mon/yyyy:hh:mm:ss ±hhmm` (`27/Nov/2026:20:00:00 +0100`), as Unix
/// seconds.
pub fn parse_time(text: &[u8]) -> Option<i64> {
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    if text.len() != 26 || text[2] != b'/' || text[6] != b'/' || text[20] != b' ' {
        return None;
    }
    if [11, 14, 17].iter().any(|&i| text[i] != b':') {
        return None;
    }
    let num = |range: std::ops::Range<usize>| number(&text[range]).map(|n| n as i64);
    let day = num(0..2)?;
    let month = MONTHS.iter().position(|m| m[..] == text[3..6])? as i64 + 1;
    let year = num(7..11)?;
    let (hour, minute, second) = (num(12..14)?, num(15..17)?, num(18..20)?);
    let sign = match text[21] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let (off_h, off_m) = (num(22..24)?, num(24..26)?);
    if !(1..=days_in_month(year, month)).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
        || off_h > 23
        || off_m > 59
    {
        return None;
    }
    let local = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    Some(local - sign * (off_h * 3600 + off_m * 60))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the given date (proleptic Gregorian; H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// How a second's requests are placed inside it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Spread {
    /// Request k of n at `k + ½` n-ths of the second.
    #[default]
    Even,
    /// At independent uniform random times in their second, drawn from the seed
    /// (PCG-64 MCG), and replayed in time order: a second's requests are in the
    /// order of their draws, not of the log.
    Random {
        /// The generator's seed.
        seed: u64,
    },
}

impl Spread {
    /// Random with this seed, or even without one.
    pub fn from_seed(seed: Option<u64>) -> Self {
        seed.map_or(Spread::Even, |seed| Spread::Random { seed })
    }
}

impl fmt::Display for Spread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Spread::Even => f.write_str("evenly spread"),
            Spread::Random { seed } => write!(f, "randomly spread (seed {seed})"),
        }
    }
}

/// What to read from a log, and how to place it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogOptions {
    /// Routes to replay, by name (empty: every route). Requests other routes take
    /// are counted, not replayed.
    pub routes: Vec<String>,
    /// Skip requests logged before this time, compared with the logged second exactly
    /// (19:00:00.999 skips those logged at 19:00:00).
    pub from: Option<SystemTime>,
    /// Skip requests logged at or after this time, compared with the logged second
    /// exactly (19:00:00.001 keeps those logged at 19:00:00).
    pub to: Option<SystemTime>,
    /// How a second's requests are placed inside it.
    pub spread: Spread,
    /// Accept more than [`MAX_UNPARSABLE_FRACTION`] of unparsable lines.
    pub lenient: bool,
}

/// An unparsable line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct BadLine {
    /// The source it was read from.
    pub source: String,
    /// Its 1-based line number.
    pub line: u64,
    /// What is wrong with it.
    #[serde(serialize_with = "display")]
    pub error: LineError,
}

impl fmt::Display for BadLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.source, self.line, self.error)
    }
}

fn display<T: fmt::Display, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// What reading the log found, line by line (see the module doc of [`crate::sim`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LogStats {
    /// Lines read, blank ones included.
    pub lines: u64,
    /// Blank lines, skipped.
    pub blank: u64,
    /// Lines that are not access-log lines.
    pub unparsable: u64,
    /// The first [`EXAMPLES`] of them.
    pub first_unparsable: Vec<BadLine>,
    /// Requests logged outside `from`..`to`.
    pub outside: u64,
    /// Requests no route takes, and lines whose request field is not a request.
    pub unmatched: u64,
    /// The first [`EXAMPLES`] distinct unmatched `METHOD path`s.
    pub unmatched_examples: Vec<String>,
    /// Requests taken by routes that are not replayed.
    pub other_routes: u64,
    /// The first [`EXAMPLES`] of those routes, by name, in the order first met.
    pub other_route_names: Vec<String>,
    /// Requests replayed on routes partitioned by client IP whose logged client is no
    /// IP address (a host name, `-`): one keyless client for all of them.
    pub no_address: u64,
    /// The first [`EXAMPLES`] distinct such clients, as logged.
    pub no_address_examples: Vec<String>,
    /// Requests replayed.
    pub replayed: u64,
}

impl LogStats {
    /// Unparsable lines as a fraction of the non-blank ones.
    pub fn unparsable_fraction(&self) -> f64 {
        let lines = self.lines - self.blank;
        if lines == 0 {
            0.0
        } else {
            self.unparsable as f64 / lines as f64
        }
    }
}

/// Why a log cannot be replayed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// The configuration's routes break the file's rules
    /// ([`Config::validate`](crate::config::Config::validate)).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A route asked for is not in the configuration.
    #[error("unknown route `{}`; routes in the configuration: {}", crate::config::escaped(.name, char::is_control), known.join(", "))]
    UnknownRoute {
        /// The name asked for (shown with its control characters escaped).
        name: String,
        /// The routes there are.
        known: Vec<String>,
    },
    /// `from` is not before `to`.
    #[error("the time bounds are empty: `from` must be before `to`")]
    EmptyBounds,
    /// Reading failed (a gzip file cut short: "incomplete deflate stream").
    #[error("{name}: cannot read {}: {error}", past_line(*.line))]
    Io {
        /// The source being read.
        name: String,
        /// The last line read whole before the failure (0: none).
        line: u64,
        /// What failed.
        error: io::Error,
    },
    /// A line is longer than [`MAX_LINE_BYTES`]: the read ended there, lenient or not.
    #[error(
        "{name}: line {line} is longer than {MAX_LINE_BYTES} bytes ({} MiB), more than an \
         access-log line holds: not an access log?",
        MAX_LINE_BYTES >> 20
    )]
    LineTooLong {
        /// The source being read.
        name: String,
        /// The line.
        line: u64,
    },
    /// Too many lines are not access-log lines.
    #[error(
        "{unparsable} of {lines} lines ({}%) are not access-log lines (common or combined format), more than {:.0}%; first: {}",
        past_the_bound(100.0 * *unparsable as f64 / (*lines).max(1) as f64),
        100.0 * MAX_UNPARSABLE_FRACTION,
        first.iter().map(BadLine::to_string).collect::<Vec<_>>().join("; ")
    )]
    TooManyUnparsable {
        /// Unparsable lines.
        unparsable: u64,
        /// Non-blank lines.
        lines: u64,
        /// The first few.
        first: Vec<BadLine>,
    },
    /// Nothing to replay.
    #[error("no request to replay: {}", describe(stats))]
    NoRequests {
        /// What was read.
        stats: Box<LogStats>,
    },
    /// The logged requests span more time than a run may.
    #[error("the replay would span {span_s} s, more than {MAX_SLOTS} s: from {start} to {end}")]
    TooLong {
        /// The span, seconds.
        span_s: i64,
        /// Where it starts: the `from` bound, or the earliest request and where it
        /// was read.
        start: String,
        /// Where it ends: the `to` bound, or the latest request and where it was
        /// read.
        end: String,
    },
}

/// A share of lines past [`MAX_UNPARSABLE_FRACTION`], in percent: two decimals, or as
/// many more as it takes not to read as the bound itself (1.001% is not "1.00%").
fn past_the_bound(percent: f64) -> String {
    let bound = 100.0 * MAX_UNPARSABLE_FRACTION;
    (2..=9)
        .map(|decimals| format!("{percent:.decimals$}"))
        .find(|text| text.parse::<f64>().is_ok_and(|shown| shown > bound))
        .unwrap_or_else(|| format!("{percent}"))
}

/// Unix seconds as an RFC 3339 time when between 1970 and 9999, else as a number.
fn unix_text(unix_s: i64) -> String {
    match u64::try_from(unix_s) {
        Ok(s) if s < 253_402_300_800 => {
            humantime::format_rfc3339_seconds(UNIX_EPOCH + std::time::Duration::from_secs(s))
                .to_string()
        }
        _ => format!("unix {unix_s} s"),
    }
}

/// Where a read failed: `past line 12`, or `from the start` before the first line.
fn past_line(line: u64) -> String {
    if line == 0 {
        "from the start".to_owned()
    } else {
        format!("past line {line}")
    }
}

fn describe(s: &LogStats) -> String {
    let mut parts = vec![format!("{} lines read", s.lines)];
    for (n, what) in [
        (s.unparsable, "unparsable"),
        (s.outside, "outside the time bounds"),
        (s.unmatched, "matching no route"),
        (s.other_routes, "on routes not replayed"),
    ] {
        if n > 0 {
            parts.push(format!("{n} {what}"));
        }
    }
    if !s.other_route_names.is_empty() {
        if let Some(counted) = parts
            .iter_mut()
            .find(|p| p.ends_with("on routes not replayed"))
        {
            counted.push_str(&format!(" ({})", s.other_route_names.join(", ")));
        }
    }
    if !s.unmatched_examples.is_empty() {
        parts.push(format!("unmatched: {}", s.unmatched_examples.join(", ")));
    }
    parts.join(", ")
}

/// One request read on a route partitioned by client IP, before it is placed inside
/// its second.
#[derive(Clone, Copy, Debug)]
struct Entry {
    second: i64,
    route: u32,
    client: u32,
}

/// The requests read on routes not partitioned by client IP: only how many each route
/// had in each second, since such requests differ in nothing else.
#[derive(Debug, Default)]
struct Counts {
    /// The second being read (lines mostly come in time order), its counts per route,
    /// and the routes it counted.
    current: Option<i64>,
    in_current: Vec<u32>,
    touched: Vec<u32>,
    /// The other seconds read: requests by (second, route).
    done: HashMap<(i64, u32), u32>,
}

impl Counts {
    fn new(routes: usize) -> Self {
        Counts {
            in_current: vec![0; routes],
            ..Counts::default()
        }
    }

    fn add(&mut self, second: i64, route: u32) {
        if self.current != Some(second) {
            self.flush();
            self.current = Some(second);
        }
        let n = &mut self.in_current[route as usize];
        if *n == 0 {
            self.touched.push(route);
        }
        *n += 1;
    }

    /// Moves the current second's counts into `done`.
    fn flush(&mut self) {
        if let Some(second) = self.current.take() {
            for route in self.touched.drain(..) {
                let n = std::mem::take(&mut self.in_current[route as usize]);
                *self.done.entry((second, route)).or_default() += n;
            }
        }
    }
}

/// Reads access logs into an [`AccessLog`], one source after another.
#[derive(Debug)]
pub struct LogReader {
    /// The route table `serve` would build, for matching.
    engine: Engine,
    /// Per config route: replayed or not.
    replayed: Vec<bool>,
    /// Per config route: partitioned by client IP (the client is its key).
    by_ip: Vec<bool>,
    from_s: Option<i64>,
    to_s: Option<i64>,
    options: LogOptions,
    counts: Counts,
    keyed: Vec<Entry>,
    client_index: HashMap<IpAddr, u32>,
    clients: Vec<IpAddr>,
    stats: LogStats,
    /// The last time field parsed and its value: consecutive lines mostly share it.
    last_time: (Vec<u8>, i64),
    /// The inputs read, by name, in order.
    sources: Vec<String>,
    /// The earliest and the latest request replayed: its second, and where it was
    /// read (input, line), for an error that names them.
    earliest: Option<(i64, (usize, u64))>,
    latest: Option<(i64, (usize, u64))>,
}

impl LogReader {
    /// A reader matching requests against `config`'s routes, which are checked by the
    /// rules of the file ([`Config::validate`](crate::config::Config::validate)).
    pub fn new(config: &Config, options: LogOptions) -> Result<Self, LogError> {
        let engine = Engine::new(config, Nanos::ZERO, UNIX_EPOCH)?;
        let mut replayed = vec![options.routes.is_empty(); config.routes.len()];
        for name in &options.routes {
            let i = config
                .routes
                .iter()
                .position(|r| &r.name == name)
                .ok_or_else(|| LogError::UnknownRoute {
                    name: name.clone(),
                    known: config.routes.iter().map(|r| r.name.clone()).collect(),
                })?;
            replayed[i] = true;
        }
        if let (Some(from), Some(to)) = (options.from, options.to) {
            if from >= to {
                return Err(LogError::EmptyBounds);
            }
        }
        // A logged second `s` is in the bounds if `from <= s < to`: if the whole
        // seconds at or after them bound it so.
        let from_s = options.from.map(whole_seconds_up);
        let to_s = options.to.map(whole_seconds_up);
        Ok(LogReader {
            engine,
            replayed,
            by_ip: config
                .routes
                .iter()
                .map(|r| matches!(r.partition, Partition::ClientIp(_)))
                .collect(),
            from_s,
            to_s,
            options,
            counts: Counts::new(config.routes.len()),
            keyed: Vec::new(),
            client_index: HashMap::new(),
            clients: Vec::new(),
            stats: LogStats::default(),
            last_time: (Vec::new(), 0),
            sources: Vec::new(),
            earliest: None,
            latest: None,
        })
    }

    /// Reads every line of `input`; `source` names it in reports (a file name). A line
    /// longer than [`MAX_LINE_BYTES`] ends the read with [`LogError::LineTooLong`] once
    /// that much of it is read.
    pub fn read(&mut self, source: &str, mut input: impl BufRead) -> Result<(), LogError> {
        let mut buf = Vec::with_capacity(512);
        let mut line_no = 0u64;
        self.sources.push(source.to_owned());
        let io = |line, error| LogError::Io {
            name: source.to_owned(),
            line,
            error,
        };
        // Room for a line at the cap and its line break, `\r\n` included.
        let cap = MAX_LINE_BYTES + 2;
        loop {
            buf.clear();
            let n = io::Read::take(&mut input, cap as u64)
                .read_until(b'\n', &mut buf)
                .map_err(|e| io(line_no, e))?;
            if n == 0 {
                return Ok(());
            }
            line_no += 1;
            // The whole line was read: up to its line break, or to the end of the input.
            let whole = buf.last() == Some(&b'\n') || n < cap;
            let before_break = buf.strip_suffix(b"\n").unwrap_or(&buf);
            let before_break = before_break.strip_suffix(b"\r").unwrap_or(before_break);
            if !whole || before_break.len() > MAX_LINE_BYTES {
                return Err(LogError::LineTooLong {
                    name: source.to_owned(),
                    line: line_no,
                });
            }
            let mut line = &buf[..];
            while let [rest @ .., b'\n' | b'\r'] = line {
                line = rest;
            }
            self.line(source, line_no, line);
        }
    }

    fn line(&mut self, source: &str, line_no: u64, line: &[u8]) {
        self.stats.lines += 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            self.stats.blank += 1;
            return;
        }
        let parsed = self.parse_cached(line);
        let l = match parsed {
            Ok(l) => l,
            Err(error) => {
                self.unparsable(source, line_no, error);
                return;
            }
        };
        if self.from_s.is_some_and(|from| l.time_unix_s < from)
            || self.to_s.is_some_and(|to| l.time_unix_s >= to)
        {
            self.stats.outside += 1;
            return;
        }
        let route = match l.method_and_path() {
            Some((method, path)) => {
                let route = self.engine.route_for(&method, &path);
                if route.is_none() {
                    self.note_unmatched(&method, &path);
                }
                route
            }
            None => None,
        };
        let Some(id) = route else {
            self.stats.unmatched += 1;
            return;
        };
        let route = id.index();
        if !self.replayed[route] {
            self.stats.other_routes += 1;
            let names = &mut self.stats.other_route_names;
            let name = self.engine.route_name(id).unwrap_or_default();
            if names.len() < EXAMPLES && !names.iter().any(|n| n == name) {
                names.push(name.to_owned());
            }
            return;
        }
        self.stats.replayed += 1;
        let (t, here) = (l.time_unix_s, (self.sources.len() - 1, line_no));
        if self.earliest.is_none_or(|(first, _)| t < first) {
            self.earliest = Some((t, here));
        }
        if self.latest.is_none_or(|(last, _)| t > last) {
            self.latest = Some((t, here));
        }
        if !self.by_ip[route] {
            self.counts.add(l.time_unix_s, route as u32);
            return;
        }
        let client = match l.client_ip() {
            Some(ip) => {
                let next = self.clients.len() as u32;
                *self.client_index.entry(ip).or_insert_with(|| {
                    self.clients.push(ip);
                    next
                })
            }
            None => {
                self.stats.no_address += 1;
                let examples = &mut self.stats.no_address_examples;
                if examples.len() < EXAMPLES {
                    let client = String::from_utf8_lossy(l.client);
                    if !examples.iter().any(|e| *e == client) {
                        examples.push(client.into_owned());
                    }
                }
                NO_CLIENT
            }
        };
        self.keyed.push(Entry {
            second: l.time_unix_s,
            route: route as u32,
            client,
        });
    }

    /// Counts a line that is not an access-log line, and keeps the first few.
    fn unparsable(&mut self, source: &str, line_no: u64, error: LineError) {
        self.stats.unparsable += 1;
        if self.stats.first_unparsable.len() < EXAMPLES {
            self.stats.first_unparsable.push(BadLine {
                source: source.to_owned(),
                line: line_no,
                error,
            });
        }
    }

    /// Keeps an unmatched request as an example, if it is new and there is room.
    fn note_unmatched(&mut self, method: &str, path: &str) {
        if self.stats.unmatched_examples.len() < EXAMPLES {
            let example = format!("{method} {path}");
            if !self.stats.unmatched_examples.contains(&example) {
                self.stats.unmatched_examples.push(example);
            }
        }
    }

    /// [`parse_line`], reusing the last time field's value when the line repeats it.
    fn parse_cached<'l>(&mut self, line: &'l [u8]) -> Result<LogLine<'l>, LineError> {
        let (text, value) = &mut self.last_time;
        parse_line_with(line, |field| {
            // Before any time was read, `text` is empty: an empty field is no repeat.
            if field.is_empty() || field != &text[..] {
                *value = parse_time(field)?;
                text.clear();
                text.extend_from_slice(field);
            }
            Some(*value)
        })
    }

    /// What has been read so far.
    pub fn stats(&self) -> &LogStats {
        &self.stats
    }

    /// The requests read, in time order, ready to replay.
    pub fn finish(mut self) -> Result<AccessLog, LogError> {
        let s = &self.stats;
        let lines = s.lines - s.blank;
        if !self.options.lenient && s.unparsable_fraction() > MAX_UNPARSABLE_FRACTION {
            return Err(LogError::TooManyUnparsable {
                unparsable: s.unparsable,
                lines,
                first: s.first_unparsable.clone(),
            });
        }
        self.counts.flush();
        let seconds = || {
            let counted = self.counts.done.keys().map(|&(second, _)| second);
            counted.chain(self.keyed.iter().map(|e| e.second))
        };
        let (Some(first), Some(last)) = (seconds().min(), seconds().max()) else {
            return Err(LogError::NoRequests {
                stats: Box::new(self.stats),
            });
        };
        let start_s = self.from_s.unwrap_or(first);
        let end_s = self.to_s.unwrap_or(last + 1);
        let span_s = end_s - start_s;
        if span_s > MAX_SLOTS as i64 {
            let logged = |seen: Option<(i64, (usize, u64))>, which: &str| {
                let (t, (source, line)) = seen.unwrap_or((0, (0, 0)));
                let source = self.sources.get(source).map_or("", String::as_str);
                format!("{} ({which} request, {source}:{line})", unix_text(t))
            };
            let start = match self.from_s {
                Some(from) => format!("{} (the `from` bound)", unix_text(from)),
                None => logged(self.earliest, "the earliest"),
            };
            let end = match self.to_s {
                Some(to) => format!("{} (the `to` bound)", unix_text(to)),
                None => logged(self.latest, "the latest"),
            };
            return Err(LogError::TooLong { span_s, start, end });
        }
        let mut counted: Vec<(i64, u32, u32)> = std::mem::take(&mut self.counts.done)
            .into_iter()
            .map(|((second, route), n)| (second, route, n))
            .collect();
        counted.sort_unstable();
        let mut route_counts = vec![0u64; self.replayed.len()];
        // The keyed requests by second, in the log's order within each (a counting
        // sort: no copy of them but the one kept). Reading kept only those inside the
        // span.
        let index = |second: i64| (second - start_s) as usize;
        let mut keyed_end = vec![0usize; span_s as usize];
        for e in &self.keyed {
            keyed_end[index(e.second)] += 1;
            route_counts[e.route as usize] += 1;
        }
        let mut next_place = Vec::with_capacity(keyed_end.len());
        let mut total = 0;
        for end in &mut keyed_end {
            next_place.push(total);
            total += *end;
            *end = total;
        }
        let mut keyed = vec![
            Keyed {
                route: 0,
                client: NO_CLIENT
            };
            total
        ];
        for e in std::mem::take(&mut self.keyed) {
            let place = &mut next_place[index(e.second)];
            keyed[*place] = Keyed {
                route: e.route,
                client: e.client,
            };
            *place += 1;
        }
        drop(next_place);
        let mut seconds = Vec::with_capacity(span_s as usize);
        let mut c = 0;
        for (i, keyed_end) in keyed_end.into_iter().enumerate() {
            let keyed_start = seconds.last().map_or(0, |s: &Second| s.keyed_end);
            let mut requests = (keyed_end - keyed_start) as u32;
            while let Some(&(_, route, n)) = counted.get(c).filter(|e| index(e.0) == i) {
                route_counts[route as usize] += u64::from(n);
                requests += n;
                c += 1;
            }
            seconds.push(Second {
                requests,
                counted_end: c,
                keyed_end,
            });
        }
        let len = route_counts.iter().sum::<u64>() as usize;
        Ok(AccessLog {
            start_s,
            seconds,
            counted: counted
                .into_iter()
                .map(|(_, route, n)| Counted { route, n })
                .collect(),
            keyed,
            len,
            client_ips: self.clients,
            route_counts,
            spread: self.options.spread,
            stats: self.stats,
        })
    }
}

/// A uniform draw in [0, 1) from 53 random bits.
fn uniform(rng: &mut Pcg64Mcg) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// A request placed inside its second.
#[derive(Clone, Copy, Debug)]
struct Placed {
    /// Time since the start of its second, ns.
    offset_ns: u32,
    /// The route's index.
    route: u32,
    /// Index into the client addresses, or [`NO_CLIENT`].
    client: u32,
}

/// One second of an [`AccessLog`]: its requests, and where its entries end in
/// [`AccessLog::counted`] and [`AccessLog::keyed`] (they start where the previous
/// second's end).
#[derive(Clone, Copy, Debug)]
struct Second {
    requests: u32,
    counted_end: usize,
    keyed_end: usize,
}

/// A route not partitioned by client IP, and its requests in one second.
#[derive(Clone, Copy, Debug)]
struct Counted {
    route: u32,
    n: u32,
}

/// A request on a route partitioned by client IP.
#[derive(Clone, Copy, Debug)]
struct Keyed {
    route: u32,
    /// Index into the client addresses, or [`NO_CLIENT`].
    client: u32,
}

/// Unix seconds of `t`, rounded up.
fn whole_seconds_up(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64 + i64::from(d.subsec_nanos() > 0),
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

/// Requests read from access logs, in time order, each with its route (and client
/// address, on routes partitioned by client IP).
///
/// Requests are kept by the second: on a route not partitioned by client IP only their
/// count (8 bytes a route and second), on one partitioned by client IP each with its
/// client (8 bytes a request). They are placed inside their second as they are
/// replayed.
#[derive(Clone, Debug)]
pub struct AccessLog {
    /// Unix seconds of time zero.
    start_s: i64,
    /// Each second from time zero.
    seconds: Vec<Second>,
    /// Requests on routes not partitioned by client IP, by second, then route.
    counted: Vec<Counted>,
    /// Requests on routes partitioned by client IP, by second, in the log's order.
    keyed: Vec<Keyed>,
    /// Requests in all.
    len: usize,
    client_ips: Vec<IpAddr>,
    /// Requests per config route.
    route_counts: Vec<u64>,
    spread: Spread,
    stats: LogStats,
}

impl AccessLog {
    /// Wall-clock time of time zero.
    pub fn start(&self) -> SystemTime {
        super::run::unix_time(self.start_s as f64)
    }

    /// From time zero to the end of the last second replayed.
    pub fn duration(&self) -> Duration {
        Duration::from_secs(self.seconds.len() as u64)
    }

    /// Requests to replay.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is no request to replay.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What reading found.
    pub fn stats(&self) -> &LogStats {
        &self.stats
    }

    /// How requests are placed inside their second.
    pub fn spread(&self) -> Spread {
        self.spread
    }

    /// The routes that take at least one request, in config order, with their counts:
    /// each by its index in the configuration's routes.
    pub fn routes(&self) -> Vec<(usize, u64)> {
        self.route_counts
            .iter()
            .enumerate()
            .filter(|&(_, &n)| n > 0)
            .map(|(i, &n)| (i, n))
            .collect()
    }

    /// The requests, in time order, placed inside their seconds as they are generated
    /// (the same places on every call).
    pub fn requests(&self) -> LogRequests<'_> {
        LogRequests {
            log: self,
            second: 0,
            placed: Vec::new(),
            next: 0,
            left: self.len,
            in_second: vec![(0, 0); self.route_counts.len()],
            rng: match self.spread {
                Spread::Even => None,
                Spread::Random { seed } => Some(Pcg64Mcg::seed_from_u64(seed)),
            },
        }
    }
}

/// The requests of an [`AccessLog`], in time order.
#[derive(Clone, Debug)]
pub struct LogRequests<'a> {
    log: &'a AccessLog,
    /// The next second to place.
    second: usize,
    /// The requests of the second placed last, in time order; `next` is the next to
    /// yield.
    placed: Vec<Placed>,
    next: usize,
    /// Requests not yet yielded.
    left: usize,
    /// Per route, the keyed requests of the second being placed: how many, and how
    /// many are placed.
    in_second: Vec<(u32, u32)>,
    rng: Option<Pcg64Mcg>,
}

impl LogRequests<'_> {
    /// Places the requests of the next second that has any; `false` past the last.
    fn place_next_second(&mut self) -> bool {
        let log = self.log;
        let Some(index) = log.seconds[self.second..]
            .iter()
            .position(|s| s.requests > 0)
            .map(|i| self.second + i)
        else {
            self.second = log.seconds.len();
            return false;
        };
        let (counted_start, keyed_start) = match index.checked_sub(1) {
            Some(before) => (
                log.seconds[before].counted_end,
                log.seconds[before].keyed_end,
            ),
            None => (0, 0),
        };
        let this = log.seconds[index];
        self.second = index + 1;
        self.placed.clear();
        self.next = 0;
        let rng = &mut self.rng;
        // Request k of a route's n in the second: at k + ½ n-ths of it (to the nearest
        // nanosecond), or at random.
        let mut offset = |k: u32, n: u32| {
            match rng {
                None => {
                    let (k, n) = (u64::from(k), u64::from(n));
                    ((2 * k + 1) * 1_000_000_000 + n) / (2 * n)
                }
                Some(rng) => (uniform(rng) * 1e9) as u64,
            }
            .min(999_999_999) as u32
        };
        for c in &log.counted[counted_start..this.counted_end] {
            for k in 0..c.n {
                self.placed.push(Placed {
                    offset_ns: offset(k, c.n),
                    route: c.route,
                    client: NO_CLIENT,
                });
            }
        }
        let keyed = &log.keyed[keyed_start..this.keyed_end];
        for e in keyed {
            self.in_second[e.route as usize].0 += 1;
        }
        for e in keyed {
            let (n, k) = &mut self.in_second[e.route as usize];
            self.placed.push(Placed {
                offset_ns: offset(*k, *n),
                route: e.route,
                client: e.client,
            });
            *k += 1;
        }
        for e in keyed {
            self.in_second[e.route as usize] = (0, 0);
        }
        // Stable: requests at the same time keep the order placed (each route's in the
        // log's order).
        self.placed.sort_by_key(|p| p.offset_ns);
        true
    }
}

impl Iterator for LogRequests<'_> {
    type Item = Request;

    #[inline]
    fn next(&mut self) -> Option<Request> {
        if self.next == self.placed.len() && !self.place_next_second() {
            return None;
        }
        let p = self.placed[self.next];
        self.next += 1;
        self.left -= 1;
        let second_ns = (self.second as u64 - 1) * 1_000_000_000;
        Some(Request {
            at: Nanos::new(second_ns + u64::from(p.offset_ns)),
            route: p.route as usize,
            client: (p.client != NO_CLIENT).then(|| self.log.client_ips[p.client as usize]),
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for LogRequests<'_> {}
impl FusedIterator for LogRequests<'_> {}

/// Opens an access log for [`LogReader::read`]: a file, gzip-compressed or not (told
/// by its first bytes, not its name; concatenated gzip members, as `logrotate` and
/// `cat a.gz b.gz` make, are read through).
pub fn open(path: &std::path::Path) -> io::Result<Box<dyn BufRead + Send>> {
    sniffed(std::fs::File::open(path)?)
}

/// An access log read from `input` (standard input, say), gzip-compressed or not, as
/// [`open`] reads a file.
pub fn sniffed<R: io::Read + Send + 'static>(mut input: R) -> io::Result<Box<dyn BufRead + Send>> {
    // The magic's two bytes, which a pipe may hand over one at a time.
    let mut magic = Vec::with_capacity(2);
    io::Read::read_to_end(&mut io::Read::take(&mut input, 2), &mut magic)?;
    let gzip = magic == [0x1f, 0x8b];
    let input =
        io::BufReader::with_capacity(1 << 16, io::Read::chain(io::Cursor::new(magic), input));
    if !gzip {
        return Ok(Box::new(input));
    }
    gunzip(input)
}

#[cfg(feature = "gzip")]
fn gunzip<R: BufRead + Send + 'static>(input: R) -> io::Result<Box<dyn BufRead + Send>> {
    Ok(Box::new(io::BufReader::with_capacity(
        1 << 16,
        flate2::bufread::MultiGzDecoder::new(input),
    )))
}

#[cfg(not(feature = "gzip"))]
fn gunzip<R: BufRead + Send + 'static>(_: R) -> io::Result<Box<dyn BufRead + Send>> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "the input is gzip-compressed, and this build reads no gzip (feature `gzip`)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A status that is there but not three digits says what a status is: "no status
    /// code after the request" read as a field missing, beside a `2000` or `OK` there.
    #[test]
    fn a_status_not_three_digits_says_so() {
        let line = |status: &str| {
            format!("::1 - - [10/Oct/2000:13:55:36 -0700] \"GET / HTTP/1.0\" {status} 1")
        };
        for status in ["2000", "OK", "20", "-1"] {
            let e = parse_line(line(status).as_bytes()).unwrap_err();
            assert_eq!(
                e.to_string(),
                "no status code (three digits) after the request",
                "{status}"
            );
        }
        assert!(parse_line(line("200").as_bytes()).is_ok());
    }

    #[test]
    fn times_convert_with_their_offset() {
        let t = |s: &str| parse_time(s.as_bytes());
        assert_eq!(t("01/Jan/1970:00:00:00 +0000"), Some(0));
        assert_eq!(t("01/Jan/1970:01:00:00 +0100"), Some(0));
        assert_eq!(t("31/Dec/1969:23:59:59 +0000"), Some(-1));
        assert_eq!(t("29/Feb/2000:12:00:00 -0930"), Some(951_825_600 + 34_200));
        assert_eq!(
            t("29/Feb/1900:00:00:00 +0000"),
            None,
            "1900 is not a leap year"
        );
        assert_eq!(t("31/Apr/2026:00:00:00 +0000"), None);
        assert_eq!(t("27/Nov/2026:24:00:00 +0000"), None);
        assert_eq!(
            t("27/nov/2026:20:00:00 +0000"),
            None,
            "months are capitalised"
        );
        assert_eq!(t("27/Nov/2026:20:00:00 0100"), None);
        assert_eq!(t("27/Nov/2026:20:00:00.123 +0100"), None);
    }

    #[test]
    fn bounds_round_up_to_whole_seconds() {
        let at = |ms: i64| {
            let d = Duration::from_millis(ms.unsigned_abs());
            if ms >= 0 {
                UNIX_EPOCH + d
            } else {
                UNIX_EPOCH - d
            }
        };
        assert_eq!(whole_seconds_up(at(2_500)), 3);
        assert_eq!(whole_seconds_up(at(2_000)), 2);
        assert_eq!(whole_seconds_up(at(-1_500)), -1);
        assert_eq!(whole_seconds_up(at(-2_000)), -2);
    }

    #[test]
    fn escapes_are_undone_once() {
        assert_eq!(unescape(br#"a\x41\\x41\"\tb\x4"#), "aA\\x41\"\tbx4");
        assert_eq!(unescape(b"plain"), "plain");
        assert_eq!(unescape(br"\xE2\x82\xAC \xFF"), "€ \u{FFFD}");
    }

    /// A read that fails part way (a gzip file cut short: "incomplete deflate
    /// stream") names the last line read whole, where the file went wrong: it named
    /// the file alone.
    #[test]
    fn a_read_that_fails_names_the_last_line_read() {
        use crate::config::{RouteConfig, RouteMatch};
        struct Failing;
        impl io::Read for Failing {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("incomplete deflate stream"))
            }
        }
        let config = Config::new(vec![RouteConfig::new("all", RouteMatch::any())]);
        let mut reader = LogReader::new(&config, LogOptions::default()).unwrap();
        let log = "::1 - - [27/Nov/2026:20:00:00 +0000] \"GET / HTTP/1.1\" 200 1\n".repeat(2);
        let input = io::BufReader::new(io::Read::chain(io::Cursor::new(log), Failing));
        let e = reader.read("a.log.gz", input).unwrap_err();
        assert_eq!(
            e.to_string(),
            "a.log.gz: cannot read past line 2: incomplete deflate stream"
        );
    }

    #[test]
    fn an_empty_time_is_unparsable_even_on_the_first_line() {
        use crate::config::{RouteConfig, RouteMatch};
        let config = Config::new(vec![RouteConfig::new("all", RouteMatch::any())]);
        let mut reader = LogReader::new(&config, LogOptions::default()).unwrap();
        let log = "::1 - - [] \"GET / HTTP/1.1\" 200 1\n\
                   ::1 - - [27/Nov/2026:20:00:00 +0000] \"GET / HTTP/1.1\" 200 1\n";
        reader.read("a.log", log.as_bytes()).unwrap();
        let stats = reader.stats();
        assert_eq!((stats.unparsable, stats.replayed), (1, 1));
        assert_eq!(
            stats.first_unparsable[0].to_string(),
            "a.log:1: the time is not dd/Mon/yyyy:hh:mm:ss ±hhmm"
        );
    }

    /// A line at the cap is read, with either line break; one past it ends the read
    /// at once, naming the source, the line and the cap, whether it ends or not: it
    /// was counted as unparsable and skipped to its end, so a line that never ends
    /// (`/dev/zero`) was read forever.
    #[test]
    fn a_line_past_the_cap_ends_the_read_at_once() {
        use crate::config::{RouteConfig, RouteMatch};
        let config = Config::new(vec![RouteConfig::new("all", RouteMatch::any())]);
        let good = "::1 - - [27/Nov/2026:20:00:00 +0000] \"GET / HTTP/1.1\" 200 1";
        let at_cap = "x".repeat(MAX_LINE_BYTES);
        let over = "x".repeat(MAX_LINE_BYTES + 1);
        for newline in ["\n", "\r\n"] {
            let mut reader = LogReader::new(&config, LogOptions::default()).unwrap();
            let log = [good, &at_cap, good].join(newline);
            reader.read("a.log", log.as_bytes()).unwrap();
            let stats = reader.stats();
            assert_eq!((stats.lines, stats.replayed, stats.unparsable), (3, 2, 1));
            assert_eq!(stats.first_unparsable[0].error, LineError::Identity);
            let log = [good, &over, good].join(newline);
            let e = reader.read("b.log", log.as_bytes()).unwrap_err();
            assert!(
                matches!(&e, LogError::LineTooLong { name, line: 2 } if name == "b.log"),
                "{newline:?}: {e}"
            );
            assert_eq!(
                e.to_string(),
                "b.log: line 2 is longer than 1048576 bytes (1 MiB), more than an access-log \
                 line holds: not an access log?"
            );
        }
        let mut reader = LogReader::new(&config, LogOptions::default()).unwrap();
        let endless = io::BufReader::new(io::repeat(0));
        let e = reader.read("/dev/zero", endless).unwrap_err();
        assert!(matches!(e, LogError::LineTooLong { line: 1, .. }), "{e}");
    }

    /// The longest combined line nginx or Apache writes with its default limits is
    /// read: a request line and two headers of 8 KiB each (`large_client_header_buffers
    /// 4 8k`, `LimitRequestLine 8190`, `LimitRequestFieldSize 8190`), every byte of them
    /// past ASCII and so logged as `\xHH`, four bytes for one: 96 KiB, as a scanner's
    /// request in an incident's log holds. With a cap of 64 KiB, it ended the run as no
    /// access log.
    #[test]
    fn the_longest_line_a_server_writes_by_default_is_read() {
        use crate::config::{RouteConfig, RouteMatch};
        let config = Config::new(vec![RouteConfig::new("all", RouteMatch::any())]);
        let escaped = |n: usize| "\\xFF".repeat(n);
        let line = format!(
            "203.0.113.9 - - [27/Nov/2026:20:00:00 +0000] \"GET /{} HTTP/1.1\" 414 0 \"{}\" \"{}\"",
            escaped(8 << 10),
            escaped(8 << 10),
            escaped(8 << 10)
        );
        assert!(line.len() > 96 << 10, "{}", line.len());
        let mut reader = LogReader::new(&config, LogOptions::default()).unwrap();
        reader.read("a.log", line.as_bytes()).unwrap();
        let stats = reader.stats();
        assert_eq!((stats.lines, stats.replayed, stats.unparsable), (1, 1, 0));
    }

    #[test]
    fn request_targets_reduce_to_their_path() {
        assert_eq!(path_of(b"/a/b?c=d"), b"/a/b");
        assert_eq!(path_of(b"https://shop.example/a?x"), b"/a");
        assert_eq!(path_of(b"http://shop.example"), b"/");
        assert_eq!(path_of(b"/redirect?to=http://x/y"), b"/redirect");
        assert_eq!(split_request(b"GET /x HTTP/1.1 extra"), None);
        assert_eq!(split_request(b"G(T /x HTTP/1.1"), None);
        assert_eq!(split_request(b"GET /x"), Some((&b"GET"[..], &b"/x"[..])));
    }

    /// Standard input is told gzip-compressed by its first two bytes, even when a pipe
    /// hands them over one at a time (it was read as text).
    #[cfg(feature = "gzip")]
    #[test]
    fn gzip_is_told_from_a_trickle() {
        use std::io::{Read, Write};
        struct Trickle(std::io::Cursor<Vec<u8>>);
        impl Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = buf.len().min(1);
                self.0.read(&mut buf[..n])
            }
        }
        let line = "203.0.113.7 - - [27/Nov/2026:20:00:00 +0000] \"GET / HTTP/1.1\" 200 1\n";
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(line.as_bytes()).unwrap();
        for bytes in [
            gz.finish().unwrap(),
            line.as_bytes().to_vec(),
            vec![0x1f],
            vec![],
        ] {
            let plain = bytes.first() != Some(&0x1f) || bytes.len() == 1;
            let mut text = Vec::new();
            sniffed(Trickle(std::io::Cursor::new(bytes.clone())))
                .unwrap()
                .read_to_end(&mut text)
                .unwrap();
            assert_eq!(
                text,
                if plain {
                    bytes
                } else {
                    line.as_bytes().to_vec()
                }
            );
        }
        // A share just past 1% reads past it.
        let e = LogError::TooManyUnparsable {
            unparsable: 1001,
            lines: 100_000,
            first: Vec::new(),
        };
        assert!(e.to_string().contains("(1.001%)"), "{e}");
    }

    /// The path is the one `serve` matches, which the `http` crate's parser gives: a
    /// fragment is no part of it, and an absolute target's authority ends at a `?` or
    /// a `#` too. (A `/` in the query of `http://shop.example?next=/api/order` began
    /// the path, and `#top` stayed on it.)
    #[cfg(feature = "http")]
    #[test]
    fn a_targets_path_is_the_one_serve_matches() {
        for target in [
            "/api/order",
            "/api/order?id=1",
            "/api/order#top",
            "/api/order?a=b#top",
            "http://shop.example?next=/api/order",
            "http://shop.example#/api/order",
            "http://shop.example/api/order#x",
            "https://shop.example:8443/api/order?x=/y",
            "http://shop.example",
        ] {
            let uri: http::Uri = target.parse().unwrap();
            assert_eq!(
                std::str::from_utf8(path_of(target.as_bytes())).unwrap(),
                uri.path(),
                "{target}"
            );
        }
    }
}
