//! `rocgate serve`: the reverse proxy and admin API until SIGTERM or Ctrl-C.

use super::signals::ShutdownSignals;
use super::ServeArgs;
use rocgate::config::{AdminReads, Config, ServerConfig};
use rocgate::proxy::{HeldByFlags, Proxy, ProxySettings, Reloader};
use std::process::ExitCode;
use std::time::Duration;

/// The shortest `[admin] token` not warned of at start when the admin API listens
/// beyond loopback: anyone who reaches it may try tokens, `[admin]
/// wrong_tokens_per_second` from each address past its first `wrong_tokens_burst`
/// (one a second past 10 by default), and more from more addresses.
const SHORT_TOKEN_BYTES: usize = 16;

/// What `serve` says at start of an admin API that listens beyond loopback: without a
/// token, that anyone who reaches it reads the state and only loopback changes it;
/// with a token shorter than [`SHORT_TOKEN_BYTES`], that it may be guessed; with its
/// reads open (`[admin] reads = "open"`, the default), that anyone who reaches it
/// reads the state (at `INFO`: a Prometheus without the token may be meant to).
fn tell_of_an_admin_api_beyond_loopback(settings: &ProxySettings) {
    let Some(token) = &settings.admin_token else {
        tracing::warn!(
            admin = %settings.admin_listen,
            "the admin API listens beyond loopback without a token: changes are taken from loopback only, and anyone who reaches it can read the routes' state; set [admin] token (and [admin] reads = \"token\" to keep the reads to those with it)"
        );
        return;
    };
    if token.expose().len() < SHORT_TOKEN_BYTES {
        tracing::warn!(
            admin = %settings.admin_listen,
            "the admin API listens beyond loopback with a token of {} bytes: anyone who reaches it may try tokens, {} a second from each address past its first {} and more from more addresses; set [admin] token to {SHORT_TOKEN_BYTES} random characters or more (openssl rand -hex 16 writes 32)",
            token.expose().len(),
            rocgate::config::figure(settings.admin_wrong_tokens_per_second),
            settings.admin_wrong_tokens_burst
        );
    }
    if settings.admin_reads == AdminReads::Open {
        tracing::info!(
            admin = %settings.admin_listen,
            "the admin API listens beyond loopback with its reads open ([admin] reads = \"open\"): anyone who reaches it can read the routes' state, the hints, the store and /metrics without the token; set [admin] reads = \"token\" to require it for every endpoint but /healthz and /readyz"
        );
    }
}

/// The proxy settings: the file's, then the command line's overrides.
fn settings(server: &ServerConfig, args: &ServeArgs) -> Result<ProxySettings, String> {
    // The flag is held to the file's rules (a port past 65535 or 0 was taken, and
    // every request got a 502). A refused flag is quoted with its password masked, as
    // the refusal itself quotes it.
    let checked;
    let (upstream_text, source) = match &args.upstream {
        Some(flag) => {
            checked = rocgate::config::check_upstream(flag)
                .map_err(|e| format!("--upstream {:?}: {e}", rocgate::store::masked_url(flag)))?;
            (checked.as_str(), "--upstream")
        }
        None => (server.upstream.as_str(), "server.upstream"),
    };
    let upstream: http::Uri = upstream_text
        .parse()
        .map_err(|e| format!("{source} {upstream_text:?}: {e}"))?;
    // As the file's `server.upstream`: only the authority is used, so a path, a query
    // or user info would be dropped without a word.
    let extra = upstream.path_and_query().is_some_and(|p| p.as_str() != "/")
        || upstream
            .authority()
            .is_some_and(|a| a.as_str().contains('@'));
    if upstream.scheme_str() != Some("http") || upstream.authority().is_none() || extra {
        return Err(format!(
            "{source} {upstream_text:?}: must be http://host[:port] with no path (TLS upstreams are not supported)"
        ));
    }
    let mut settings = ProxySettings::from_server(server, upstream);
    settings.listen = args.listen.unwrap_or(server.listen);
    settings.admin_listen = args.admin.unwrap_or(server.admin_listen);
    // The file's upstream is held apart from its listeners by its rules; a flag may
    // put it on one.
    for (name, addr) in [
        (
            args.listen.map_or("server.listen", |_| "--listen"),
            settings.listen,
        ),
        (
            args.admin.map_or("admin.listen", |_| "--admin"),
            settings.admin_listen,
        ),
    ] {
        if rocgate::config::upstream_is_listener(upstream_text, addr) {
            return Err(format!(
                "{source} {upstream_text:?} is rocgate's own {name} {addr}: requests would come back to it"
            ));
        }
    }
    // The file's two are held apart by its rules; a flag may put one on the other.
    if rocgate::config::listeners_clash(settings.listen, settings.admin_listen) {
        let listen = args.listen.map_or("server.listen", |_| "--listen");
        let admin = args.admin.map_or("admin.listen", |_| "--admin");
        return Err(format!(
            "{listen} {} and {admin} {} take the same port: the proxy and the admin API \
             need an address each",
            settings.listen, settings.admin_listen
        ));
    }
    Ok(settings)
}

/// Serves with `proxy` until the first of `signals`, then drains; a second one during
/// the drain ends it at once, the requests still in flight dropped (the instance
/// leaves the shared store first, paying what its routes owe the shared buckets,
/// within three times the store's timeout; a drain already leaving is not left
/// again: its leave goes on, and this waits for it).
async fn serve_until_signalled(proxy: Proxy, mut signals: ShutdownSignals) -> ExitCode {
    let leaving = proxy.leaving();
    let (first, first_seen) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = first_seen.await;
    };
    let signalled = async {
        signals.next().await;
        let _ = first.send(());
        signals.next().await;
    };
    tokio::select! {
        served = proxy.run(shutdown) => match served {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("rocgate serve: {e}");
                ExitCode::FAILURE
            }
        },
        () = signalled => {
            tracing::warn!("a second SIGTERM or Ctrl-C during the shutdown: exiting now, the requests in flight dropped");
            leaving.await;
            ExitCode::FAILURE
        }
    }
}

/// SIGHUP, listened for from before the proxy binds (until then a SIGHUP's default
/// action ends the process); `None` (logged) if it cannot be listened for.
#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = ();

fn listen_for_sighup() -> Hangups {
    #[cfg(unix)]
    {
        let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
        if hup.is_err() {
            tracing::warn!("cannot listen for SIGHUP: reload through POST /admin/reload only");
        }
        hup.ok()
    }
}

/// Reloads the config file on every SIGHUP of `hangups` (one that came while the proxy
/// was starting too); a bad file is logged and the running config kept (the reloader
/// logs it, as it logs the sections that wait for a restart and the runtime changes the
/// file replaced).
fn reload_on_sighup(hangups: Hangups, reloader: Reloader) {
    #[cfg(unix)]
    let Some(mut hup) = hangups
    else {
        return;
    };
    #[cfg(unix)]
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            // Whatever came of it is logged by the reloader.
            let _ = reloader.reload_async().await;
        }
    });
    #[cfg(not(unix))]
    let _ = (hangups, reloader);
}

pub(crate) fn run(args: ServeArgs) -> ExitCode {
    let loaded = match &args.config {
        Some(path) => Config::load(path),
        None => Config::embedded_default_with_env(),
    };
    let config = match loaded {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    #[allow(clippy::disallowed_methods)] // the wall clock, which events are placed on
    let now = std::time::SystemTime::now();
    rocgate::proxy::warn_ended_events(&config, now);
    let server = config.server.clone();
    let settings = match settings(&server, &args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rocgate serve: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rocgate serve: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async move {
        // Listened for before binding: a signal's default action would end the
        // process meanwhile. One that comes then is acted on once serving has begun.
        let (signals, hangups) = (ShutdownSignals::listen(), listen_for_sighup());
        let mut proxy = match Proxy::bind(settings.clone(), &config, args.config.clone()).await {
            Ok(p) => p,
            Err(e) => {
                eprintln!("rocgate serve: {e}");
                return ExitCode::FAILURE;
            }
        };
        proxy.hold(HeldByFlags {
            listen: args.listen,
            admin_listen: args.admin,
            upstream: args.upstream.as_deref().map(|flag| {
                rocgate::config::check_upstream(flag).unwrap_or_else(|_| flag.to_owned())
            }),
        });
        reload_on_sighup(hangups, proxy.reloader().clone());
        let (listen, admin) = (proxy.local_addr(), proxy.admin_addr());
        tracing::info!(
            listen = %listen.map_or_else(|e| e.to_string(), |a| a.to_string()),
            admin = %admin.map_or_else(|e| e.to_string(), |a| a.to_string()),
            upstream = %settings.forward.upstream,
            routes = proxy.reloader().engine().route_names().count(),
            config = %args.config.as_deref().map_or_else(
                || "embedded default (reload refused)".into(),
                |p| p.display().to_string(),
            ),
            "rocgate serving"
        );
        if !settings.admin_listen.ip().to_canonical().is_loopback() {
            tell_of_an_admin_api_beyond_loopback(&settings);
        }
        serve_until_signalled(proxy, signals).await
    });
    // Tasks still running (a reload stuck reading its file on a hung mount, a
    // connection past the grace) do not hold the exit: dropping the runtime waited for
    // them, with nothing listening for a second signal any more.
    runtime.shutdown_timeout(Duration::from_secs(1));
    code
}
