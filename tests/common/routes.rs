//! A gateway's route table of any size, for the route-lookup benchmarks
//! (benches/routes.rs) and the figures at scale (tests/memory.rs).
//!
//! Routes come in families of ten, one per service `svc{f}`, a realistic mix of exact
//! paths, templates and prefixes, method-restricted and not, none shadowing another:
//!
//! | k | method | path |
//! |---|---|---|
//! | 0 | GET | `/api/v1/svc{f}/items` |
//! | 1 | POST | `/api/v1/svc{f}/items` |
//! | 2 | GET | `/api/v1/svc{f}/items/{id}` |
//! | 3 | PUT | `/api/v1/svc{f}/items/{id}` |
//! | 4 | DELETE | `/api/v1/svc{f}/items/{id}` |
//! | 5 | GET | `/api/v1/svc{f}/items/{id}/reviews/{review}` |
//! | 6 | any | `/api/v1/svc{f}/search` |
//! | 7 | any | `/api/v1/svc{f}/users/{user}/orders` |
//! | 8 | any | prefix `/api/v2/svc{f}/` |
//! | 9 | GET | prefix `/static/svc{f}/` |

use rocgate::config::{PathPattern, RouteConfig, RouteMatch};

/// Routes per family.
const FAMILY: usize = 10;

/// Route `i`'s method and path as a file writes them (a template with its braces),
/// and whether the path is a prefix.
fn written(i: usize) -> (Option<&'static str>, String, bool) {
    let f = i / FAMILY;
    let (method, path) = match i % FAMILY {
        0 => (Some("GET"), format!("/api/v1/svc{f}/items")),
        1 => (Some("POST"), format!("/api/v1/svc{f}/items")),
        2 => (Some("GET"), format!("/api/v1/svc{f}/items/{{id}}")),
        3 => (Some("PUT"), format!("/api/v1/svc{f}/items/{{id}}")),
        4 => (Some("DELETE"), format!("/api/v1/svc{f}/items/{{id}}")),
        5 => (
            Some("GET"),
            format!("/api/v1/svc{f}/items/{{id}}/reviews/{{review}}"),
        ),
        6 => (None, format!("/api/v1/svc{f}/search")),
        7 => (None, format!("/api/v1/svc{f}/users/{{user}}/orders")),
        8 => (None, format!("/api/v2/svc{f}/")),
        _ => (Some("GET"), format!("/static/svc{f}/")),
    };
    (method, path, i % FAMILY >= 8)
}

/// `n` routes of the mix above, named `r0000`, `r0001`, ….
pub(crate) fn table(n: usize) -> Vec<RouteConfig> {
    (0..n)
        .map(|i| {
            let (method, path, prefix) = written(i);
            let path = if prefix {
                PathPattern::Prefix(path)
            } else {
                PathPattern::parse_path(&path).expect("a valid path")
            };
            RouteConfig::new(format!("r{i:04}"), RouteMatch::new(method, path))
        })
        .collect()
}

/// The same `n` routes as a config file's `[[routes]]` tables.
#[allow(dead_code)]
pub(crate) fn toml(n: usize) -> String {
    let mut text = String::new();
    for i in 0..n {
        let (method, path, prefix) = written(i);
        text.push_str(&format!("[[routes]]\nname = \"r{i:04}\"\n"));
        if let Some(m) = method {
            text.push_str(&format!("method = \"{m}\"\n"));
        }
        let field = if prefix { "path_prefix" } else { "path" };
        text.push_str(&format!("{field} = \"{path}\"\n"));
    }
    text
}

/// A request that route `i` takes, and no earlier route.
#[allow(dead_code)]
pub(crate) fn request(i: usize) -> (&'static str, String) {
    let (method, path, _) = written(i);
    let path = path
        .replace("{id}", "8812")
        .replace("{review}", "3")
        .replace("{user}", "u-771");
    let path = match i % FAMILY {
        8 => path + "reports/daily",
        9 => path + "app.3f9c.js",
        _ => path,
    };
    (method.unwrap_or("GET"), path)
}

/// A request that no route of a table of `n` takes: under a family's path, but no
/// route's.
#[allow(dead_code)]
pub(crate) fn unmatched(n: usize) -> (&'static str, String) {
    let f = n / FAMILY / 2;
    ("GET", format!("/api/v1/svc{f}/carts/8812"))
}
