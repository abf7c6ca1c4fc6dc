//! `rocgate hints --admin URL`: asks a running `serve` for its tuning hints
//! (`GET /admin/hints`) and prints them as a table, or as the JSON it returned.
//!
//! The admin token, where one is needed (a request from loopback whose `Host` is none
//! of this host's names, or any from beyond loopback with `[admin] reads = "token"`),
//! is read from `--token-file PATH`, and sent only so: never
//! from a flag's value, which any user on the host reads in `ps`, nor from the variable
//! `ROCGATE__ADMIN__TOKEN` that `serve` reads `[admin] token` from, which is set
//! wherever `serve` runs with it, and was sent to whatever `--admin` named (the proxy's
//! port by mistake, which passed it on to the application). A token held in a variable
//! is passed as `--token-file <(printf %s "$ROCGATE__ADMIN__TOKEN")`: a pipe is read
//! as a file is, within the request's own bound ([`TIMEOUT`]).
//!
//! Exit codes: 0 with hints printed, 1 when the admin API cannot be reached or
//! answers with an error, 2 for a bad `--admin` URL, `--period` or token.

use super::out;
use super::HintsArgs;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rocgate::config::escaped;
use rocgate::hints::{self, HintsReport};
use rocgate::store::masked_url;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// The most of a `--token-file` read: a token is tens of bytes, and a file over this
/// (`/dev/zero`, a log named by mistake) is refused, not read whole into memory.
const TOKEN_FILE_MAX: u64 = 64 * 1024;

/// How long the whole request may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The largest answer read: a report of many routes is a few hundred KiB; whatever
/// answers past this is no admin API of rocgate's.
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Fetches and prints the hints.
pub(crate) fn run(args: HintsArgs) -> ExitCode {
    match humantime::parse_duration(&args.period) {
        Ok(p) if !p.is_zero() => {}
        Ok(_) => {
            eprintln!("--period: must be longer than zero, got {:?}", args.period);
            return ExitCode::from(2);
        }
        Err(_) => {
            eprintln!(
                "--period: must be a duration such as 15m or 1h, got {:?}",
                args.period
            );
            return ExitCode::from(2);
        }
    }
    let base = match admin_root(&args.admin) {
        Ok(base) => base,
        Err(wrong) => {
            eprintln!("--admin: {wrong}, got {:?}", masked_url(&args.admin));
            return ExitCode::from(2);
        }
    };
    // Encoded: a period may hold spaces ("1h 30m").
    let query = form_urlencoded::Serializer::new(String::new())
        .append_pair("period", &args.period)
        .finish();
    let url: http::Uri = match format!("{base}/admin/hints?{query}").parse() {
        Ok(u) => u,
        Err(e) => {
            eprintln!("--admin: {e}, got {:?}", masked_url(&args.admin));
            return ExitCode::from(2);
        }
    };
    let token = match args.token_file.as_deref().map(token_from_file).transpose() {
        Ok(token) => token,
        Err(wrong) => {
            eprintln!("{wrong}");
            return ExitCode::from(2);
        }
    };
    let body = match fetch(url.clone(), token.as_ref()) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{url}: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Read either way: with `--json` too, what is printed is a hints report, not
    // whatever else answered at that address.
    match serde_json::from_str::<HintsReport>(&body) {
        Ok(_) if args.json => {
            out!("{body}\n");
            ExitCode::SUCCESS
        }
        Ok(report) => {
            // The answer is another server's: a control character in it (an escape
            // sequence in a route name or a reason) is shown, not sent to the terminal.
            let text = render(&report, &args.period);
            out!("{}", escaped(&text, |c| c.is_control() && c != '\n'));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{url}: not a hints report: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The admin API's root that `--admin` gives (`http://127.0.0.1:9090`, without a
/// trailing `/`), or what is wrong with it. Given without a scheme (`127.0.0.1:9090`,
/// as `serve --admin` takes it and its log prints it), it is read as `http://` that,
/// and must name a port as that does (`localhost` alone was read as port 80). A host
/// must be named (`:9090` had the client look the empty name up). A path or query of
/// its own would be sent before the hints'; a port given must be one (the URI takes
/// any digits, and the client asked port 80 for one past 65535); user info would be
/// sent nowhere.
fn admin_root(admin: &str) -> Result<String, String> {
    const FORM: &str = "http://host[:port]";
    const EXAMPLE: &str = "http://127.0.0.1:9090";
    const BARE: &str = "host:port, as serve --admin takes it (such as 127.0.0.1:9090), or \
                        http://host[:port]";
    let with_scheme = admin.contains("://");
    let admin = if with_scheme {
        admin.to_owned()
    } else {
        format!("http://{admin}")
    };
    let admin = admin.as_str();
    let base = admin.trim_end_matches('/');
    // With the `/` the hints' path begins with: `http://` alone is no URL.
    let uri = format!("{base}/").parse::<http::Uri>().ok();
    if uri.as_ref().and_then(http::Uri::scheme_str) != Some("http") && !admin.starts_with("http://")
    {
        return Err("must be an http:// URL (the admin API speaks plain HTTP)".to_owned());
    }
    let Some((uri, authority)) = uri.and_then(|u| u.authority().cloned().map(|a| (u, a))) else {
        return Err(format!("must be {FORM} such as {EXAMPLE}"));
    };
    if authority.host().is_empty() {
        return Err(if with_scheme {
            format!("must be {FORM} such as {EXAMPLE}: it names no host")
        } else {
            format!("must be {BARE}: it names no host")
        });
    }
    if !with_scheme && !has_port(authority.as_str()) {
        return Err(format!("must be {BARE}: it names no port"));
    }
    // Dropped without a word, they were no credential sent.
    if authority.as_str().contains('@') {
        return Err(
            "must not carry user info (user:password@): hints sends none; pass the \
             admin token with --token-file PATH"
                .to_owned(),
        );
    }
    if authority.port_u16().is_none_or(|p| p == 0) && has_port(authority.as_str()) {
        return Err(format!(
            "must be {FORM} with a port from 1 to 65535, such as {EXAMPLE}"
        ));
    }
    if uri.path() != "/" || uri.query().is_some() {
        let rest = admin
            .get("http://".len() + authority.as_str().len()..)
            .unwrap_or(admin);
        return Err(format!(
            "must be the admin API's root, {FORM} with no path or query (such as {EXAMPLE}): it ends in {rest:?}"
        ));
    }
    Ok(base.to_owned())
}

/// Whether `authority` (`host[:port]`) gives a port, a number or not.
fn has_port(authority: &str) -> bool {
    authority
        .rsplit_once(':')
        .is_some_and(|(_, port)| !port.contains(']'))
}

/// The admin token to send, and where it came from, for what a refusal says.
struct Token {
    /// `Bearer <token>`, marked sensitive.
    header: http::HeaderValue,
    /// The file's path, as shown.
    from: String,
}

impl Token {
    /// `token` (already checked to be one a header carries), read from `from`.
    fn new(token: &str, from: String) -> Result<Token, String> {
        let mut header = http::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| format!("{from}: holds what an Authorization header cannot carry"))?;
        header.set_sensitive(true);
        Ok(Token { header, from })
    }
}

/// The token held by the file at `path` (`--token-file`), without the byte order mark
/// it may begin with and the line break it may end in, or what is wrong with the file,
/// naming it: it cannot be read, is not UTF-8 text, is empty, is over
/// [`TOKEN_FILE_MAX`] (read no further), or holds what an `Authorization` header
/// cannot carry, as `[admin] token` is checked (the token itself is never shown).
///
/// The file is read on a thread of its own, waited for [`TIMEOUT`], as the request
/// is: a named pipe that no one writes to (or a process substitution whose command
/// hangs) blocks its `open` or its read for ever, which no timeout of the request's
/// would bound. Given up, the thread is left blocked, and ends with the process.
fn token_from_file(path: &Path) -> Result<Token, String> {
    use std::io::Read as _;
    let shown = super::shown(path);
    let (read, bytes) = std::sync::mpsc::sync_channel(1);
    let owned = path.to_owned();
    std::thread::Builder::new()
        .name("token-file".into())
        .spawn(move || {
            let mut bytes = Vec::new();
            let file = std::fs::File::open(owned)
                .and_then(|file| file.take(TOKEN_FILE_MAX + 1).read_to_end(&mut bytes));
            // The receiver gone (given up), there is no one to tell.
            let _ = read.send(file.map(|_| bytes));
        })
        .map_err(|e| format!("--token-file: {shown} cannot be read: no thread to read it: {e}"))?;
    let bytes = bytes
        .recv_timeout(TIMEOUT)
        .map_err(|_| {
            format!(
                "--token-file: {shown} gave no token within {}: nothing was written to it, \
                 or its writer never closed it (a named pipe no one writes to?)",
                humantime::format_duration(TIMEOUT)
            )
        })?
        .map_err(|e| format!("--token-file: {shown} cannot be read: {e}"))?;
    if bytes.len() as u64 > TOKEN_FILE_MAX {
        return Err(format!(
            "--token-file: {shown} is over {} KiB: it holds more than a token (read no further)",
            TOKEN_FILE_MAX / 1024
        ));
    }
    let text =
        String::from_utf8(bytes).map_err(|_| format!("--token-file: {shown} is not UTF-8 text"))?;
    // A byte order mark (Notepad's "UTF-8 with BOM") is no part of the token.
    let token = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let token = token.strip_suffix('\n').unwrap_or(token);
    let token = token.strip_suffix('\r').unwrap_or(token);
    if token.trim().is_empty() {
        return Err(format!("--token-file: {shown} is empty: it holds no token"));
    }
    if let Some(why) = rocgate::config::unsendable_token(token) {
        return Err(format!(
            "--token-file: {shown} holds what an Authorization header cannot carry: {why}"
        ));
    }
    Token::new(token, shown)
}

/// The response body of a GET, with `token` in `Authorization` if given, or why there
/// is none. A 401 or 403 says, after the API's answer, how to pass the token, or that
/// the one sent was not taken.
fn fetch(url: http::Uri, token: Option<&Token>) -> Result<String, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    runtime.block_on(async {
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
        let request = async {
            let mut get = http::Request::get(url);
            if let Some(token) = token {
                get = get.header(http::header::AUTHORIZATION, token.header.clone());
            }
            let get = get
                .body(Empty::new())
                .map_err(|e| format!("cannot make the request: {e}"))?;
            let res = client
                .request(get)
                .await
                .map_err(|e| format!("cannot connect: {}", with_causes(&e)))?;
            let status = res.status();
            let limited = http_body_util::Limited::new(res.into_body(), MAX_ANSWER_BYTES);
            let bytes = limited
                .collect()
                .await
                .map_err(|e| format!("reading the answer: {}", with_causes(&*e)))?
                .to_bytes();
            let text = String::from_utf8_lossy(&bytes).into_owned();
            if status.is_success() {
                return Ok(text);
            }
            let mut said = format!("answered {status}: {text}");
            if matches!(
                status,
                http::StatusCode::UNAUTHORIZED | http::StatusCode::FORBIDDEN
            ) {
                said.push('\n');
                said.push_str(&match token {
                    None => "the admin API refused the request: with [admin] token set, pass \
                             its token with --token-file PATH (one held in a variable as \
                             --token-file <(printf %s \"$ROCGATE__ADMIN__TOKEN\"))"
                        .to_owned(),
                    Some(token) => format!(
                        "the token sent, from {}, was not taken: it is not the admin API's \
                         [admin] token, or the API has none",
                        token.from
                    ),
                });
            }
            Err(said)
        };
        tokio::time::timeout(TIMEOUT, request)
            .await
            .map_err(|_| format!("no answer within {}", humantime::format_duration(TIMEOUT)))?
    })
}

/// `e` and its causes, each after a colon: the client's own error says only "client
/// error (Connect)", its cause why ("tcp connect error: Connection refused").
fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        text.push_str(&format!(": {cause}"));
        next = cause.source();
    }
    text
}

/// The report as tables, under a header that says what it covers: the period looked
/// at (`period_s`, the one asked capped at `[hints] keep`), or, where the history is
/// shorter (`serve` started, or every route's settings changed, since), the history
/// it covers (`covered_s`); with the period asked (`asked`, as given) where that is
/// another.
fn render(report: &HintsReport, asked: &str) -> String {
    // The answer is input: a period no `Duration` holds is printed in seconds.
    let format = |secs: f64| {
        Duration::try_from_secs_f64(secs).map_or_else(
            |_| format!("{secs} s"),
            |d| humantime::format_duration(d).to_string(),
        )
    };
    let asked_other =
        humantime::parse_duration(asked).is_ok_and(|d| d.as_secs_f64() != report.period_s);
    let mut out = if report.routes.is_empty() {
        format!("hints (asked {asked})\n")
    } else if report.covered_s + report.interval_s < report.period_s {
        // To a tenth of a second, as the routes' lines.
        format!(
            "hints over the last {} of history (asked {asked})\n",
            format((report.covered_s * 10.0).round() / 10.0)
        )
    } else if asked_other {
        format!(
            "hints over the last {} (asked {asked})\n",
            format(report.period_s)
        )
    } else {
        format!("hints over the last {}\n", format(report.period_s))
    };
    if report.routes.is_empty() {
        out.push_str("  no history yet: the first interval has not ended\n");
    }
    for r in &report.routes {
        let during = r
            .event
            .as_ref()
            .map_or_else(String::new, |e| format!(" during event {e}"));
        // A shadow route rejects nothing (a `shadow_adaptive` one only by its base
        // limit): what it would have rejected too.
        let would = if r.shadow_rejected > 0 {
            format!(", {} would have been rejected", r.shadow_rejected)
        } else {
            String::new()
        };
        // A partitioned route's rejections: one client's flood, or many clients. After
        // the would-be rejections where there are some: the clients of both.
        let from = match r.refused_keys {
            Some(1) => " from about 1 client".to_owned(),
            Some(n) if n > 0 => format!(" from about {n} clients"),
            _ => String::new(),
        };
        let (from, would) = if would.is_empty() || from.is_empty() {
            (from, would)
        } else {
            (String::new(), format!("{would},{from}"))
        };
        // A distributed route's figures are this instance's share; its limits the
        // fleet's.
        let shared = if r.distributed {
            " (distributed: this instance's share of the fleet's requests)"
        } else {
            ""
        };
        out.push_str(&format!(
            "route {}{during}{shared}: {} interval(s), {:.1} s, {} offered, {} rejected{from}{would}\n",
            r.route, r.intervals, r.covered_s, r.offered, r.rejected
        ));
        out.push_str(&hints::table(&r.hints));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rocgate hints` says which routes are distributed, their figures this
    /// instance's share (helper-201's game day read them as the fleet's).
    #[test]
    fn a_distributed_routes_line_says_so() {
        let report = |distributed: bool| -> HintsReport {
            serde_json::from_value(serde_json::json!({
                "period_s": 60.0,
                "covered_s": 60.0,
                "interval_s": 10.0,
                "routes": [{
                    "route": "order",
                    "intervals": 6,
                    "covered_s": 60.0,
                    "offered": 2400,
                    "rejected": 780,
                    "distributed": distributed,
                    "hints": [],
                }],
            }))
            .unwrap()
        };
        let shared = render(&report(true), "1m");
        assert!(
            shared.contains("route order (distributed: this instance's share of the fleet's requests): 6 interval(s), 60.0 s, 2400 offered, 780 rejected\n"),
            "{shared}"
        );
        let own = render(&report(false), "1m");
        assert!(
            own.contains("route order: 6 interval(s)") && !own.contains("distributed"),
            "{own}"
        );
    }
}
