//! What the tower layer's key of a request costs by how the value is folded: one
//! admitted request through `AdmissionLayer`, around a service that answers at once,
//! on one catch-all route that admits everything, partitioned by a header.
//!
//! Group `layer_keys`, each benchmark one request (built, decided and answered):
//!
//! - `as_sent/short`: `header:x-api-key`, the 12-byte value keyed as sent: the
//!   baseline with no folding.
//! - `host/lower`, `host/upper`: `header:host`, `shop.example` and `Shop.Example`
//!   (12 bytes, kept whole as the key).
//! - `host/lower_long`, `host/upper_long`: `header:host`, `api.shop-example.com` and
//!   `API.Shop-Example.com` (20 bytes, keyed by their SHA-256).
//!
//! Each spelling's key is made once, checked to be its lower-case spelling's (the
//! route's key count stays 1), before it is measured. Each value is copied to the heap,
//! so that its alignment (which the layer's word-at-a-time reads of it depend on) is
//! the same in every case and every build.
//!
//! Run with bounded times:
//! `cargo bench --bench keys -- --warm-up-time 1 --measurement-time 3`; instructions
//! per request: run the bench binary under `valgrind --tool=callgrind` with
//! `--bench --profile-time 2 layer_keys/host/upper`, and read the inclusive count of
//! the layer's `call` over its calls in `callgrind_annotate --inclusive=yes
//! --tree=caller`.

use criterion::Criterion;
use http::HeaderValue;
use rocgate::clock::Nanos;
use rocgate::config::{Config, KeyLimits, Partition, RouteConfig, RouteMatch};
use rocgate::http::AdmissionLayer;
use std::convert::Infallible;
use tower::{Layer as _, Service as _, ServiceExt as _};

/// A layer over one catch-all route partitioned by `header`, admitting everything: the
/// highest limit the config takes, far above the rate one thread reaches here.
fn layer(header: &str) -> AdmissionLayer {
    let mut route = RouteConfig::new("any", RouteMatch::any());
    route.controller.base_limit_rps = rocgate::limiter::MAX_SPACED_RATE;
    route.controller.cut_limit_rps = rocgate::limiter::MAX_SPACED_RATE;
    route.controller.danger_roc = f64::MAX;
    route.partition = Partition::Header(header.into(), KeyLimits::default());
    AdmissionLayer::from_config(&Config::new(vec![route])).unwrap()
}

fn layer_keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("layer_keys");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let cases = [
        ("as_sent/short", "x-api-key", "shop.example"),
        ("host/lower", "host", "shop.example"),
        ("host/upper", "host", "Shop.Example"),
        ("host/lower_long", "host", "api.shop-example.com"),
        ("host/upper_long", "host", "API.Shop-Example.com"),
    ];
    for (case, header, value) in cases {
        let layer = layer(header);
        let svc = layer.layer(tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, Infallible>(http::Response::new(bytes::Bytes::new()))
        }));
        // On the heap, not a literal in the binary: the layer's UTF-8 check and its
        // search for a port read a value a word at a time from its first aligned
        // byte, so a literal's place in the binary moved a case's count by up to 150
        // instructions from one build (or one spelling) to the next. The allocator
        // aligns every value alike.
        let value = HeaderValue::from_str(value).unwrap();
        let request = || {
            http::Request::builder()
                .uri("/hello")
                .header(header, value.clone())
                .body(())
                .unwrap()
        };
        // The lower-case spelling, then this one: one key between them.
        let lower = HeaderValue::from_str(&value.to_str().unwrap().to_ascii_lowercase()).unwrap();
        for req in [
            http::Request::builder()
                .uri("/hello")
                .header(header, lower)
                .body(())
                .unwrap(),
            request(),
        ] {
            let response = rt.block_on(svc.clone().oneshot(req)).unwrap();
            assert_eq!(response.status(), http::StatusCode::OK, "{case}");
        }
        let keys = layer.engine().snapshot(Nanos::ZERO)[0].keys;
        assert_eq!(keys, 1, "{case}: the spellings made {keys} keys");
        g.bench_function(case, |b| {
            b.iter(|| {
                let mut svc = svc.clone();
                rt.block_on(async { svc.ready().await.unwrap().call(request()).await.unwrap() })
            })
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    layer_keys(&mut c);
    c.final_summary();
}
