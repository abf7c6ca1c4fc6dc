//! The metric set: README's table gives each metric rocgate exports its type and
//! labels, dashboards and alert rules use only those metrics, labels and label
//! values, and raw paths and client addresses never become series.
#![cfg(feature = "proxy")]

use rocgate::config::{Config, KeyLimits, Partition, RouteConfig, RouteMatch};
use rocgate::controller::ControllerState;
use rocgate::http::ClientIpResolver;
use rocgate::metrics::{CONTROLLER_STATE, TRANSITIONS};
use rocgate::proxy::{Proxy, ProxySettings};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

#[path = "common/http1.rs"]
mod http1;
#[path = "common/promql.rs"]
mod promql;

/// Every `rocgate_*` metric name in `text`, histogram suffixes removed.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("rocgate_") {
        let start = i + at;
        let before_ok =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let end = text[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(text.len(), |n| start + n);
        if before_ok {
            let name = &text[start..end];
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            names.insert(base.to_owned());
        }
        i = end;
    }
    names
}

/// The rows of README's metrics table (`| names | type | labels |`).
fn readme_metrics_rows() -> Vec<&'static str> {
    let readme = include_str!("../README.md");
    let start = readme
        .find("\n### Metrics and dashboards\n")
        .expect("README's Metrics and dashboards section");
    let section = &readme[start + 1..];
    let section = &section[..section[1..].find("\n#").map_or(section.len(), |n| n + 1)];
    section
        .lines()
        .filter(|line| line.starts_with("| `rocgate_"))
        .collect()
}

/// `text` without what its parentheses hold, nested ones too.
fn without_parentheses(text: &str) -> String {
    let mut depth = 0usize;
    text.chars()
        .filter(|&c| {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth = depth.saturating_sub(1);
                    return false;
                }
                _ => {}
            }
            depth == 0
        })
        .collect()
}

/// README's metrics table as metric → (type, label names): the labels are the code
/// spans of label names in the labels column outside parentheses (those inside name
/// their values).
fn readme_metric_types_and_labels() -> std::collections::BTreeMap<String, (String, BTreeSet<String>)>
{
    let mut metrics = std::collections::BTreeMap::new();
    for row in readme_metrics_rows() {
        let cells: Vec<&str> = row.trim_matches('|').split(" | ").collect();
        assert_eq!(cells.len(), 3, "README metrics row {row:?}");
        let spans = |text: &str| -> Vec<String> {
            text.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect()
        };
        let names = spans(cells[0]);
        let types: Vec<String> = without_parentheses(cells[1])
            .split(',')
            .map(|t| t.trim().to_owned())
            .collect();
        let labels: BTreeSet<String> = spans(&without_parentheses(cells[2]))
            .into_iter()
            .filter(|l| l.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .collect();
        for (i, name) in names.iter().enumerate() {
            let kind = if types.len() == names.len() {
                &types[i]
            } else {
                &types[0]
            };
            metrics.insert(name.clone(), (kind.clone(), labels.clone()));
        }
    }
    metrics
}

/// Every metric of `exposition` has the type and the label names README's table gives
/// it, and each label value among those the table names for it, where it names any
/// ([`readme_label_values`]); and the labels whose every value is exported from 0 have
/// them all, so the table names none that rocgate does not export.
fn assert_types_and_labels_as_readme_says(exposition: &str) {
    let readme = readme_metric_types_and_labels();
    let values = readme_label_values();
    let mut scraped: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    let mut seen = 0;
    for line in exposition.lines() {
        if let Some(typed) = line.strip_prefix("# TYPE ") {
            let (name, kind) = typed.split_once(' ').expect("# TYPE name type");
            let (documented, _) = readme
                .get(name)
                .unwrap_or_else(|| panic!("{name} is not in README's table"));
            assert_eq!(documented, kind, "README's type of {name}");
            seen += 1;
        } else if line.starts_with("rocgate_") {
            let series = line.rsplit_once(' ').expect("a sample").0;
            let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
            let name = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|base| readme.get(*base).is_some_and(|(t, _)| t == "histogram"))
                .unwrap_or(name);
            let pairs: Vec<(&str, &str)> = labels
                .trim_end_matches('}')
                .split(',')
                .filter_map(|pair| pair.split_once('='))
                .map(|(k, v)| (k, v.trim_matches('"')))
                .filter(|(k, _)| *k != "le")
                .collect();
            let labels: BTreeSet<String> = pairs.iter().map(|(k, _)| (*k).to_owned()).collect();
            let (_, documented) = readme
                .get(name)
                .unwrap_or_else(|| panic!("{name} is not in README's table"));
            assert_eq!(documented, &labels, "README's labels of {name}: {line}");
            for (label, value) in pairs {
                let named = &values[name][label];
                assert!(
                    named.is_empty() || named.contains(value),
                    "README names {named:?} for {name}'s {label}, not {value:?}: {line}"
                );
                scraped
                    .entry((name.to_owned(), label.to_owned()))
                    .or_default()
                    .insert(value.to_owned());
            }
        }
    }
    assert!(seen >= 20, "only {seen} metrics in the scrape");
    for (name, label) in [
        (rocgate::metrics::UPSTREAM_ERRORS, "kind"),
        (CONTROLLER_STATE, "state"),
        (rocgate::metrics::LINGERING_CLOSES, "ended"),
        (rocgate::metrics::PROXY_PROTOCOL_REFUSED, "reason"),
    ] {
        let key = (name.to_owned(), label.to_owned());
        assert_eq!(
            scraped.get(&key),
            Some(&values[name][label]),
            "{name}'s {label}: the values exported, and README's"
        );
    }
}

/// README's metrics table names every metric rocgate exports, and no other.
#[test]
fn readme_metrics_table_lists_exactly_the_exported_metrics() {
    let table: String = readme_metrics_rows()
        .into_iter()
        .map(|line| line.split(" | ").next().unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n");
    let exported: BTreeSet<String> = rocgate::metrics::ALL
        .iter()
        .map(|s| s.to_string())
        .collect();
    let listed = metric_names(&table);
    let missing: Vec<_> = exported.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&exported).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "README's metrics table omits {missing:?} and lists metrics rocgate does not export: {unknown:?}"
    );
}

#[test]
fn dashboards_and_rules_use_only_exported_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards");
    let exported: BTreeSet<String> = rocgate::metrics::ALL
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut files = vec![root.join("alerts.yml")];
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            files.push(path);
        }
    }
    assert!(files.len() >= 2, "a dashboard and the rules: {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let used = metric_names(&text);
        assert!(
            !used.is_empty(),
            "{} uses no rocgate metric",
            file.display()
        );
        let unknown: Vec<_> = used.difference(&exported).collect();
        assert!(
            unknown.is_empty(),
            "{} uses metrics rocgate does not export: {unknown:?}",
            file.display()
        );
    }
    // The dashboard is importable and provisionable: fixed uid, datasource variable.
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("rocgate.json")).unwrap()).unwrap();
    assert_eq!(dash["uid"], "rocgate-overview");
    assert!(dash.get("__inputs").is_none());
    let vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(vars, ["datasource", "instance", "route"]);
}

/// Every alert of `dashboards/alerts.yml` has a row in README's "When an alert
/// fires", and the section names no alert the rules do not have: an operator paged
/// by one finds what to do.
#[test]
fn every_alert_has_a_runbook_row() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rules = std::fs::read_to_string(root.join("dashboards/alerts.yml")).unwrap();
    let alerts: BTreeSet<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::trim)
        .collect();
    assert!(alerts.len() >= 9, "the rules' alerts: {alerts:?}");
    let readme = include_str!("../README.md");
    let section = readme
        .split_once("#### When an alert fires\n")
        .expect("README has a section \"When an alert fires\"")
        .1;
    let section = &section[..section.find("\n#").unwrap_or(section.len())];
    let named: BTreeSet<&str> = section
        .split('`')
        .filter(|w| w.starts_with("Rocgate") && w.chars().all(char::is_alphanumeric))
        .collect();
    let missing: Vec<_> = alerts.difference(&named).collect();
    let unknown: Vec<_> = named.difference(&alerts).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "README's runbook omits {missing:?} and names alerts the rules do not have: {unknown:?}"
    );
}

/// The Prometheus files work together on one host as README says: the scrape job's
/// target is the default config's admin API, and README's command starts Prometheus
/// where `datasource.yml` sends Grafana, off 9090, which that admin API holds (README
/// named no port for Prometheus, and the data source's 9091 was found only in the
/// file's comment).
#[test]
fn the_prometheus_command_listens_where_grafana_looks() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |file: &str| std::fs::read_to_string(root.join(file)).unwrap();
    let admin = Config::embedded_default().server.admin_listen.to_string();
    let scrape = read("dashboards/prometheus.yml");
    assert!(
        scrape.contains(&format!("targets: [\"{admin}\"]")),
        "dashboards/prometheus.yml does not scrape the default admin API {admin}"
    );
    let readme = include_str!("../README.md").replace('\n', " ");
    let command = "`prometheus --config.file=dashboards/prometheus.yml --web.listen-address=";
    let at = readme
        .find(command)
        .expect("README shows the command that starts Prometheus beside rocgate");
    let prometheus = readme[at + command.len()..]
        .split([' ', '`'])
        .next()
        .unwrap();
    assert_ne!(
        prometheus, admin,
        "Prometheus and the admin API on one port"
    );
    assert!(
        read("dashboards/provisioning/datasource.yml")
            .contains(&format!("url: http://{prometheus}\n")),
        "datasource.yml does not look for Prometheus at {prometheus}, where README starts it"
    );
}

/// Every state of the controller.
const STATES: [ControllerState; 3] = [
    ControllerState::Normal,
    ControllerState::Cut,
    ControllerState::Recovering,
];

/// Labels every series has once Prometheus scrapes it (its target's).
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// README's metrics table as metric → label → the values its labels column names for
/// that label (none where it names none): in the parentheses that follow the label's
/// own span, the code spans of its list, which starts the parentheses or a clause of
/// them after a `;` and goes on after `,`, `or` or `…` (`` (`admitted`, `rejected`:
/// … `` , `` (`empty`: …; `invalid`: … ``); not a span the prose mentions (`` within
/// `timeout` ``, `` in `enforce` or `shadow` mode ``), one in parentheses nested
/// deeper, nor a metric's name. `rocgate_requests_total`'s `reason` takes every
/// [`rocgate::limiter::Reason`] too, which the table leaves to the reason's section;
/// `1xx`…`5xx` stands for the five classes; the controller's `state`, `from` and `to`
/// take every [`ControllerState`]'s name.
fn readme_label_values() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    /// Where a list of values stands, in a label's parentheses.
    #[derive(PartialEq)]
    enum List {
        /// At the start of the parentheses or of a clause: a span here starts it.
        Start,
        /// After a value: a span after only a separator goes on with it.
        Value,
        /// In prose: no span is a value until the next clause.
        Prose,
    }
    let mut out = BTreeMap::new();
    for row in readme_metrics_rows() {
        let cells: Vec<&str> = row.trim_matches('|').split(" | ").collect();
        let names: Vec<&str> = cells[0].split('`').skip(1).step_by(2).collect();
        let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let (mut depth, mut current) = (0usize, None::<String>);
        let (mut list, mut between) = (List::Prose, String::new());
        for (i, part) in cells[2].split('`').enumerate() {
            if i % 2 == 1 {
                let word = part.to_owned();
                if depth == 0 {
                    if word.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                        labels.entry(word.clone()).or_default();
                        current = Some(word);
                    }
                } else if depth == 1 {
                    let separated = match list {
                        List::Start => between.trim().is_empty(),
                        List::Value => ["", ",", "or", ", or", "…"].contains(&between.trim()),
                        List::Prose => false,
                    };
                    list = List::Prose;
                    if let Some(label) = current.as_ref().filter(|_| separated) {
                        if !word.starts_with("rocgate_") {
                            labels.get_mut(label).unwrap().insert(word);
                            list = List::Value;
                        }
                    }
                    between.clear();
                }
                continue;
            }
            for c in part.chars() {
                match c {
                    '(' => {
                        depth += 1;
                        if depth == 1 {
                            (list, between) = (List::Start, String::new());
                        }
                    }
                    ')' => depth = depth.saturating_sub(1),
                    ';' if depth == 1 => (list, between) = (List::Start, String::new()),
                    _ if depth == 1 => between.push(c),
                    _ => {}
                }
            }
        }
        for values in labels.values_mut() {
            if values.contains("1xx") && values.contains("5xx") {
                values.extend(["2xx", "3xx", "4xx"].map(str::to_owned));
            }
        }
        for name in names {
            let mut labels = labels.clone();
            if name == rocgate::metrics::REQUESTS {
                let reasons = labels.get_mut("reason").expect("requests have a reason");
                reasons.extend(rocgate::limiter::Reason::ALL.map(|r| r.as_str().to_owned()));
            }
            for label in ["state", "from", "to"] {
                if let Some(values) = labels
                    .get_mut(label)
                    .filter(|_| [CONTROLLER_STATE, TRANSITIONS].contains(&name))
                {
                    values.extend(STATES.map(|s| s.as_str().to_owned()));
                }
            }
            out.insert(name.to_owned(), labels);
        }
    }
    out
}

/// Every grouping and vector matching of PromQL.
const GROUPINGS: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The label names in `expr`'s groupings and vector matchings by the `keywords` (of
/// [`GROUPINGS`]), each list's `keyword (…)`.
fn grouping_labels(expr: &str, keywords: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    for &keyword in keywords {
        let mut from = 0;
        while let Some(at) = expr[from..].find(keyword) {
            let start = from + at;
            from = start + keyword.len();
            let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
            if start > 0 && ident(bytes[start - 1]) {
                continue;
            }
            let rest = expr[from..].trim_start();
            let Some(list) = rest.strip_prefix('(') else {
                continue;
            };
            let list = &list[..list.find(')').expect("a closed label list")];
            out.extend(
                list.split(',')
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned),
            );
        }
    }
    out
}

/// What in the PromQL `expr` (and the label names `shown` of its results: a legend's,
/// an annotation's) does not match what rocgate exports, as README's table gives it:
/// a label matcher on a label its metric does not have, a literal value (of `=`, `!=`,
/// or `=~`/`!~` alternations of plain words) the table does not name for that label, a
/// grouping or a shown label that no metric of the expression has, and in an
/// expression that aggregates `by` labels (and none `without`), a shown label no `by`
/// keeps (the union of them: an `or` of two groupings shows either's).
fn label_problems(expr: &str, shown: &[String]) -> Vec<String> {
    let table = readme_label_values();
    let mut problems = Vec::new();
    let mut known: BTreeSet<String> = TARGET_LABELS.map(str::to_owned).into();
    for (name, matchers) in promql::rocgate_selectors(expr) {
        let (base, bucket) = match name.strip_suffix("_bucket") {
            Some(base) if table.contains_key(base) => (base, true),
            _ => (
                ["_count", "_sum"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|b| table.contains_key(*b)))
                    .unwrap_or(name),
                false,
            ),
        };
        let Some(labels) = table.get(base) else {
            problems.push(format!("{name}: not in README's table"));
            continue;
        };
        known.extend(labels.keys().cloned());
        if bucket {
            known.insert("le".to_owned());
        }
        if let Some(matchers) = matchers {
            for matcher in matchers.split(',').map(str::trim) {
                let op_at = matcher.find(['=', '!']).expect("a label matcher");
                let label = matcher[..op_at].trim();
                let (op, value) = matcher[op_at..].split_at(
                    if matcher[op_at..].starts_with("=~")
                        || matcher[op_at..].starts_with("!~")
                        || matcher[op_at..].starts_with("!=")
                    {
                        2
                    } else {
                        1
                    },
                );
                let value = value.trim().trim_matches('"');
                if TARGET_LABELS.contains(&label) {
                    continue;
                }
                let Some(values) = labels.get(label) else {
                    problems.push(format!("{name}: no label {label:?}"));
                    continue;
                };
                let words: Vec<&str> = if op.ends_with('~') {
                    value.split('|').collect()
                } else {
                    vec![value]
                };
                let literal = |w: &&str| w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if words.iter().all(literal) {
                    for word in words {
                        if !values.contains(word) {
                            problems.push(format!("{name}: {label} has no value {word:?}"));
                        }
                    }
                }
            }
        }
    }
    for label in grouping_labels(expr, &GROUPINGS).iter().chain(shown) {
        if !known.contains(label) {
            problems.push(format!(
                "{label:?}: a label none of the expression's metrics has"
            ));
        }
    }
    let kept = grouping_labels(expr, &["by"]);
    if !kept.is_empty() && grouping_labels(expr, &["without"]).is_empty() {
        for label in shown
            .iter()
            .filter(|l| known.contains(*l) && !kept.contains(l))
        {
            problems.push(format!(
                "{label:?}: shown, but no `by` of the expression keeps it"
            ));
        }
    }
    problems
}

/// The label names a legend or annotation template shows: Grafana's `{{name}}`, an
/// alert template's `$labels.name` (its actions, `{{ else }}`, are no labels).
fn shown_labels(template: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in template.split("{{").skip(1) {
        let inner = part.split("}}").next().unwrap_or_default();
        if inner.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !inner.is_empty() {
            out.push(inner.to_owned());
        }
    }
    for part in template.split("$labels.").skip(1) {
        let name: String = part
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        out.push(name);
    }
    out
}

/// Every label a dashboard or alert rule matches on, groups by or shows is one the
/// metrics it reads have, and every label value it names is one rocgate exports, as
/// README's table gives them (whose label names and values
/// `ten_thousand_paths_and_clients_add_no_series` checks against a real scrape: every
/// value scraped is one the table names, and the table names no other `kind` of
/// upstream error, controller `state`, lingering close's `ended` or PROXY header
/// refusal's `reason`): a rule on a value no series has stays quiet for ever, a panel
/// on one draws nothing.
#[test]
fn dashboards_and_rules_use_only_exported_labels() {
    // The check itself finds what is wrong.
    assert_eq!(
        label_problems(
            r#"sum by (kind) (rate(rocgate_requests_total{decision="refused",reason=~"roc_cut|limit",rout="a"}[5m])) > 0 and on (instance, route) rocgate_keys"#,
            &["half".to_owned()],
        ),
        [
            r#"rocgate_requests_total: decision has no value "refused""#,
            r#"rocgate_requests_total: no label "rout""#,
            r#""kind": a label none of the expression's metrics has"#,
            r#""half": a label none of the expression's metrics has"#,
        ]
    );
    assert!(label_problems(
        r#"histogram_quantile(0.99, sum by (le, route) (rate(rocgate_upstream_request_duration_seconds_bucket{status_class="5xx"}[1m])))"#,
        &["route".to_owned()],
    )
    .is_empty());
    // A label the aggregation drops shows nothing, though the metric has it.
    assert_eq!(
        label_problems(
            r#"max by (route) (rocgate_limiter_level{route=~"$route"})"#,
            &["route".to_owned(), "algorithm".to_owned()],
        ),
        [r#""algorithm": shown, but no `by` of the expression keeps it"#]
    );
    // Words README's labels column names in its prose, not as a label's values: the
    // setting a timeout waited, the functions that read a counter, the modes a count
    // is kept in.
    assert_eq!(
        label_problems(
            r#"rocgate_upstream_request_duration_seconds_count{status_class="response_timeout"} + rocgate_upstream_errors_total{kind="rate"} + rocgate_cut_vs_base_total{decision="shadow"}"#,
            &[],
        ),
        [
            r#"rocgate_upstream_request_duration_seconds_count: status_class has no value "response_timeout""#,
            r#"rocgate_upstream_errors_total: kind has no value "rate""#,
            r#"rocgate_cut_vs_base_total: decision has no value "shadow""#,
        ]
    );

    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards");
    let mut problems = Vec::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let dash: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let mut exprs: Vec<(String, String)> = Vec::new();
        for panel in dash["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                exprs.push((
                    target["expr"].as_str().unwrap().to_owned(),
                    target["legendFormat"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                ));
            }
        }
        for a in dash["annotations"]["list"].as_array().unwrap() {
            if let Some(expr) = a["expr"].as_str() {
                let shown = format!(
                    "{} {}",
                    a["titleFormat"].as_str().unwrap_or_default(),
                    a["textFormat"].as_str().unwrap_or_default()
                );
                exprs.push((expr.to_owned(), shown));
            }
        }
        for v in dash["templating"]["list"].as_array().unwrap() {
            if let Some(q) = v["query"]["query"].as_str() {
                let (selector, label) = q
                    .strip_prefix("label_values(")
                    .and_then(|r| r.strip_suffix(')'))
                    .and_then(|r| r.rsplit_once(','))
                    .unwrap_or_else(|| panic!("unexpected variable query {q}"));
                exprs.push((selector.to_owned(), format!("{{{{{}}}}}", label.trim())));
            }
        }
        for (expr, shown) in exprs {
            checked += 1;
            for p in label_problems(&expr, &shown_labels(&shown)) {
                problems.push(format!("{}: {p}\n  in {expr}", path.display()));
            }
        }
    }
    let rules = std::fs::read_to_string(root.join("alerts.yml")).unwrap();
    let rules: String = rules
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    for rule in rules.split("- alert: ").skip(1) {
        let name = rule.lines().next().unwrap().trim();
        let expr = rule
            .split_once("expr:")
            .map(|(_, r)| r)
            .and_then(|r| r.split("\n        for:").next())
            .and_then(|r| r.split("\n        labels:").next())
            .unwrap_or_else(|| panic!("{name} has an expr"))
            .trim_start_matches([' ', '|']);
        let annotations = rule.split_once("annotations:").map_or("", |(_, a)| a);
        checked += 1;
        for p in label_problems(expr, &shown_labels(annotations)) {
            problems.push(format!("alerts.yml {name}: {p}"));
        }
    }
    assert!(checked >= 40, "{checked} expressions");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn names_are_found_in_expressions() {
    let names = metric_names(
        r#"histogram_quantile(0.99, rate(rocgate_upstream_request_duration_seconds_bucket[1m])) / xrocgate_no"#,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["rocgate_upstream_request_duration_seconds"]
    );
}

/// Series in an exposition: every non-comment line without its value.
fn series(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s.to_owned()))
        .collect()
}

/// `GET path` on `addr` (the proxy or the admin API, which answers no host but its own
/// names from loopback: `localhost`).
async fn get(addr: std::net::SocketAddr, path: &str, xff: Option<String>) -> (u16, String) {
    let mut sender = http1::connect(addr).await;
    let mut req = http::Request::get(path).header("host", "localhost");
    if let Some(x) = xff {
        req = req.header("x-forwarded-for", x);
    }
    let req = req
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let res = tokio::time::timeout(Duration::from_secs(10), sender.send_request(req))
        .await
        .unwrap()
        .unwrap();
    let status = res.status().as_u16();
    use http_body_util::BodyExt;
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_paths_and_clients_add_no_series() {
    let app = axum::Router::new().fallback(|| async { "ok" });
    let up = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up_addr = up.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(up, app).await });
    let mut per_ip = RouteConfig::new("per-ip", RouteMatch::prefix("/ip/"));
    per_ip.partition = Partition::ClientIp(KeyLimits::default());
    per_ip.controller.base_limit_rps = 1e6;
    per_ip.controller.cut_limit_rps = 1e5;
    per_ip.route_limit_rps = Some(2e6);
    let mut rest = RouteConfig::new("rest", RouteMatch::any());
    rest.controller.base_limit_rps = 1e6;
    rest.controller.cut_limit_rps = 1e5;
    // A short window, so that the ROC histogram (recorded from the end of the first
    // window on) has its series before the warm-up ends.
    let window =
        rocgate::window::WindowSpec::new(Duration::from_millis(400), Duration::from_millis(100))
            .unwrap();
    per_ip.window = window;
    rest.window = window;
    let settings = {
        let mut built = ProxySettings::from_server(
            &rocgate::config::ServerConfig::default(),
            format!("http://{up_addr}").parse().unwrap(),
        );
        built.listen = "127.0.0.1:0".parse().unwrap();
        built.admin_listen = "127.0.0.1:0".parse().unwrap();
        built.header_read_timeout = Duration::from_secs(5);
        built.shutdown_grace = Duration::from_secs(2);
        built.forward.connect_timeout = Duration::from_secs(1);
        built.forward.response_timeout = Duration::from_secs(5);
        built.forward.max_body_bytes = 1024;
        built.forward.resolver = ClientIpResolver::new(vec!["127.0.0.0/8".parse().unwrap()]);
        built
    };
    let proxy = Proxy::bind(settings, &Config::new(vec![per_ip, rest]), None)
        .await
        .unwrap();
    let (addr, admin) = (proxy.local_addr().unwrap(), proxy.admin_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(proxy.run(async {
        let _ = stopped.await;
    }));

    // Requests of each kind, over slots past the first window (the ROC histogram is
    // recorded at slot rollover once the controller is armed), create every series
    // there is to be.
    for _ in 0..5 {
        assert_eq!(get(addr, "/ip/warm", Some("10.9.9.9".into())).await.0, 200);
        assert_eq!(get(addr, "/warm", None).await.0, 200);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let (_, before) = get(admin, "/metrics", None).await;
    assert_types_and_labels_as_readme_says(&before);
    let before = series(&before);
    assert!(
        before.iter().any(|s| s.contains(r#"route="per-ip""#)),
        "{before:?}"
    );

    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..20u32 {
        tasks.spawn(async move {
            for n in 0..500u32 {
                let id = worker * 500 + n;
                let path = if id % 2 == 0 {
                    format!("/ip/item/{id}")
                } else {
                    format!("/page/{id}?q={id}")
                };
                let xff = format!("203.0.{}.{}", id / 256 % 256, id % 256);
                assert_eq!(get(addr, &path, Some(xff)).await.0, 200);
            }
        });
    }
    while let Some(done) = tokio::time::timeout(Duration::from_secs(120), tasks.join_next())
        .await
        .unwrap()
    {
        done.unwrap();
    }
    let (_, after_text) = get(admin, "/metrics", None).await;
    let after = series(&after_text);
    let added: Vec<_> = after.difference(&before).collect();
    assert!(added.is_empty(), "new series: {added:?}");
    assert!(
        !after_text.contains("203.0."),
        "no client address in any label"
    );
    assert!(!after_text.contains("/ip/item"), "no raw path in any label");
    assert!(
        after_text.contains(r#"rocgate_keys{route="per-ip"} 5001"#),
        "keys are counted, not labelled"
    );
    let max_keys = KeyLimits::default().max_keys;
    assert!(
        after_text.contains(&format!(r#"rocgate_max_keys{{route="per-ip"}} {max_keys}"#))
            && after_text.contains(r#"rocgate_max_keys{route="rest"} 0"#),
        "a partitioned route's max_keys, 0 for one limited as a whole"
    );
    // 2,000,000 req/s, or its cut's share (the traffic above may cut the route).
    let total = after_text
        .lines()
        .find_map(|l| l.strip_prefix(r#"rocgate_route_limit_rps{route="per-ip"} "#))
        .and_then(|v| v.parse::<f64>().ok());
    assert!(
        matches!(total, Some(t) if (2e5..=2e6).contains(&t)),
        "a partitioned route's total: {total:?}"
    );
    assert!(
        after_text.contains(r#"rocgate_route_limit_rejected_total{route="per-ip"} 0"#)
            && !after_text.contains(r#"rocgate_route_limit_rps{route="rest"}"#),
        "the total's refusals, and no total for a route without one"
    );
    let _ = stop.send(());
    run.await.unwrap().unwrap();
}

/// A route a shared store decides shows the store's limit, controller state and
/// bucket level, not the local engine's (whose controller does not step, nor its
/// limiter decide, for such a route); other routes show their own. It shows the
/// fleet's demand the store last answered with too, beside this instance's own
/// (`rocgate_store_demand_rps`: helper-207 put it on each answer, not on `/metrics`).
#[test]
fn shared_routes_show_the_stores_limit_and_state() {
    use rocgate::clock::Nanos;
    use rocgate::controller::TransitionCounts;
    use rocgate::engine::Engine;
    use rocgate::metrics::{Collector, SharedControl};
    let engine = Engine::new(
        &Config::new(vec![
            RouteConfig::new("local", RouteMatch::prefix("/local/")),
            RouteConfig::new("shared", RouteMatch::any()),
        ]),
        Nanos::ZERO,
        std::time::SystemTime::UNIX_EPOCH,
    )
    .unwrap();
    // The shared bucket as the store reports it: 60 tokens, 48 taken.
    let drained = rocgate::limiter::TokenBucket::new(60.0, Duration::from_secs(1), Nanos::ZERO);
    for _ in 0..48 {
        assert!(drained.check(Nanos::ZERO).is_admit());
    }
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        Collector::new().collect_with(&engine, Nanos::from_secs(1), |route| {
            (route == "shared").then_some(SharedControl {
                limit_rps: 60.0,
                state: ControllerState::Cut,
                roc: 95.5,
                demand_rps: 290.0,
                stepped: TransitionCounts {
                    transitions: [[0, 2, 0], [0, 0, 1], [0, 1, 0]],
                    cuts: 2,
                    time_in_cut: Duration::from_secs(7),
                },
                level: Some(drained.level(Nanos::ZERO)),
            })
        });
    });
    let text = handle.render();
    for line in [
        r#"rocgate_limit_rps{route="shared"} 60"#,
        r#"rocgate_controller_state{route="shared",state="cut"} 1"#,
        r#"rocgate_controller_state{route="shared",state="normal"} 0"#,
        r#"rocgate_limit_rps{route="local"} 200"#,
        r#"rocgate_controller_state{route="local",state="normal"} 1"#,
        r#"rocgate_store_roc{route="shared"} 95.5"#,
        r#"rocgate_store_demand_rps{route="shared"} 290"#,
        r#"rocgate_cuts_total{route="shared"} 2"#,
        r#"rocgate_cut_seconds_total{route="shared"} 7"#,
        r#"rocgate_controller_transitions_total{route="shared",from="normal",to="cut"} 2"#,
        r#"rocgate_controller_transitions_total{route="shared",from="recovering",to="cut"} 1"#,
        r#"rocgate_cuts_total{route="local"} 0"#,
        r#"rocgate_limiter_level{route="shared",algorithm="token_bucket"} 12"#,
        r#"rocgate_limiter_capacity{route="shared",algorithm="token_bucket"} 60"#,
        r#"rocgate_limiter_level{route="local",algorithm="token_bucket"} 200"#,
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
    // A local route has no shared ROC, nor a fleet's demand; its own traffic stays in
    // `rocgate_roc` and `rocgate_demand_rps`.
    for series in [
        r#"rocgate_store_roc{route="local"}"#,
        r#"rocgate_store_demand_rps{route="local"}"#,
    ] {
        assert!(!text.contains(series), "{series} in {text}");
    }
    assert!(
        text.contains(r#"rocgate_roc{route="shared",mode="absolute"} 0"#),
        "{text}"
    );
}

/// Once a route is gone (removed by a reload), its gauges read NaN, so no alert rule
/// fires on its last readings; so do a route's limiter gauges of an algorithm it no
/// longer uses, and its shared ROC and fleet's demand once no store decides it. A
/// scrape of `/metrics` leaves them out.
#[test]
fn gauges_of_what_is_gone_read_nan() {
    use rocgate::clock::Nanos;
    use rocgate::controller::ControllerState;
    use rocgate::engine::Engine;
    use rocgate::limiter::Algorithm;
    use rocgate::metrics::{Collector, SharedControl};
    let engine = |routes| {
        Engine::new(
            &Config::new(routes),
            Nanos::ZERO,
            std::time::SystemTime::UNIX_EPOCH,
        )
        .unwrap()
    };
    let stays = RouteConfig::new("stays", RouteMatch::prefix("/s/"));
    let before = engine(vec![
        stays.clone(),
        RouteConfig::new("goes", RouteMatch::any()),
    ]);
    let mut windowed = stays;
    windowed.algorithm = Algorithm::FixedWindow {
        window: Duration::from_secs(1),
    };
    let after = engine(vec![windowed]);
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let collector = Collector::new();
    let line = |text: &str, series: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_owned))
            .unwrap_or_else(|| panic!("no {series} in {text}"))
    };
    metrics::with_local_recorder(&recorder, || {
        collector.collect_with(&before, Nanos::from_secs(1), |route| {
            (route == "goes").then_some(SharedControl {
                limit_rps: 60.0,
                state: ControllerState::Cut,
                roc: 95.5,
                demand_rps: 290.0,
                stepped: Default::default(),
                level: None,
            })
        });
    });
    let text = handle.render();
    assert_eq!(
        line(
            &text,
            r#"rocgate_controller_state{route="goes",state="cut"}"#
        ),
        "1"
    );
    assert_eq!(line(&text, r#"rocgate_store_roc{route="goes"}"#), "95.5");
    assert_eq!(
        line(&text, r#"rocgate_store_demand_rps{route="goes"}"#),
        "290"
    );
    metrics::with_local_recorder(&recorder, || {
        collector.collect(&after, Nanos::from_secs(2));
    });
    let text = handle.render();
    let blanked = [
        r#"rocgate_controller_state{route="goes",state="cut"}"#,
        r#"rocgate_controller_state{route="goes",state="normal"}"#,
        r#"rocgate_limit_rps{route="goes"}"#,
        r#"rocgate_roc{route="goes",mode="absolute"}"#,
        r#"rocgate_controller_roc{route="goes"}"#,
        r#"rocgate_rejection_ratio{route="goes"}"#,
        r#"rocgate_store_roc{route="goes"}"#,
        r#"rocgate_store_demand_rps{route="goes"}"#,
        r#"rocgate_limiter_level{route="stays",algorithm="token_bucket"}"#,
    ];
    for series in blanked {
        assert_eq!(line(&text, series), "NaN", "{series}");
    }
    assert_eq!(line(&text, r#"rocgate_limit_rps{route="stays"}"#), "200");
    assert_eq!(
        line(
            &text,
            r#"rocgate_limiter_capacity{route="stays",algorithm="fixed_window"}"#
        ),
        "200"
    );
    assert_eq!(
        line(
            &text,
            r#"rocgate_controller_state{route="stays",state="normal"}"#
        ),
        "1"
    );

    // What a scrape reads leaves the blanked gauges out, and keeps the live ones and
    // every counter (the gone route's included).
    let scraped = rocgate::metrics::omit_blank_gauges(&text);
    assert!(!scraped.contains("NaN"), "{scraped}");
    for series in blanked {
        let found = scraped.lines().find(|l| l.starts_with(series));
        assert_eq!(found, None, "{series}");
    }
    assert_eq!(line(&scraped, r#"rocgate_cuts_total{route="goes"}"#), "0");
    assert_eq!(line(&scraped, r#"rocgate_limit_rps{route="stays"}"#), "200");
    let kept = |t: &str| t.lines().filter(|l| !l.ends_with(" NaN")).count();
    assert_eq!(scraped.lines().count(), kept(&text), "only NaN samples go");
    assert!(
        scraped.contains("# TYPE rocgate_limit_rps gauge"),
        "{scraped}"
    );
}

/// `rocgate_rejection_ratio` is what clients were refused: a shadow route's would-be
/// rejections (counted under `decision="shadow_rejected"`) are not in it, so the
/// high-rejection alert does not fire on a route that refuses nothing.
#[test]
fn the_rejection_ratio_counts_only_what_was_refused() {
    use rocgate::clock::Nanos;
    use rocgate::config::Mode;
    use rocgate::engine::{Engine, Key};
    use rocgate::metrics::Collector;
    let route = |name: &str, mode| {
        let mut r = RouteConfig::new(name, RouteMatch::prefix(format!("/{name}/")));
        r.controller.base_limit_rps = 10.0;
        r.controller.cut_limit_rps = 5.0;
        r.mode = mode;
        r
    };
    let engine = Engine::new(
        &Config::new(vec![
            route("enforced", Mode::Enforce),
            route("shadowed", Mode::Shadow),
        ]),
        Nanos::ZERO,
        std::time::SystemTime::UNIX_EPOCH,
    )
    .unwrap();
    // 40 requests at once on each: a bucket of 10 admits 10.
    for name in ["enforced", "shadowed"] {
        let id = engine.route_id(name).unwrap();
        for _ in 0..40 {
            let _ = engine.check(id, Key::None, Nanos::from_millis(1));
        }
    }
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        Collector::new().collect(&engine, Nanos::from_secs(1));
    });
    let text = handle.render();
    for line in [
        r#"rocgate_rejection_ratio{route="enforced"} 0.75"#,
        r#"rocgate_rejection_ratio{route="shadowed"} 0"#,
        r#"rocgate_requests_total{route="shadowed",decision="shadow_rejected",reason="limit"} 30"#,
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
}

/// A full key table's overflow decisions and the keys its sweeps evict are counted:
/// `rocgate_keys` reads below `max_keys` between a full table's sweeps while the
/// overflow limiter is in use, and an alert on the gauge missed it.
#[test]
fn a_full_key_tables_overflow_and_evictions_are_counted() {
    use rocgate::clock::Nanos;
    use rocgate::engine::{Engine, Key};
    use rocgate::metrics::Collector;
    let mut r = RouteConfig::new("per-ip", RouteMatch::any());
    let mut limits = KeyLimits::default();
    limits.max_keys = 2;
    limits.idle_timeout = Duration::from_secs(10);
    r.partition = Partition::ClientIp(limits);
    let engine = Engine::new(
        &Config::new(vec![r]),
        Nanos::ZERO,
        std::time::SystemTime::UNIX_EPOCH,
    )
    .unwrap();
    let id = engine.route_id("per-ip").unwrap();
    let ip = |n: u8| Key::Ip(std::net::IpAddr::from([10, 0, 0, n]));
    for n in 0..5 {
        let _ = engine.check(id, ip(n), Nanos::ZERO);
    }
    // Idle past idle_timeout: both keys are evicted at the next rollover.
    let _ = engine.check(id, ip(9), Nanos::from_secs(30));
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        Collector::new().collect(&engine, Nanos::from_secs(30));
    });
    let text = handle.render();
    for line in [
        r#"rocgate_key_overflow_total{route="per-ip"} 3"#,
        r#"rocgate_keys_evicted_total{route="per-ip"} 2"#,
        r#"rocgate_keys{route="per-ip"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
}

/// One route, `r`, taking every request, with a window of `secs` in slots of 100 ms.
fn r_with_window(secs: u64) -> Config {
    let mut r = RouteConfig::new("r", RouteMatch::any());
    r.window =
        rocgate::window::WindowSpec::new(Duration::from_secs(secs), Duration::from_millis(100))
            .unwrap();
    Config::new(vec![r])
}

/// Offers `n` requests to the route `r` of `e` at `at`.
fn offer_to_r(e: &rocgate::engine::Engine, n: usize, at: rocgate::clock::Nanos) {
    let id = e.route_id("r").unwrap();
    for _ in 0..n {
        let _ = e.check(id, rocgate::engine::Key::None, at);
    }
}

/// A reload that rebuilds a route (here, a new window) restarts its engine counters
/// from zero; the exported counters carry on from their totals instead of standing
/// still (the registry never lowers a counter), and so does a route removed and added
/// back, and one whose new count passes its old total before the next scrape.
#[test]
fn counters_carry_on_across_a_reload_that_rebuilds_the_route() {
    use rocgate::clock::Nanos;
    use rocgate::engine::Engine;
    use rocgate::metrics::Collector;
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let collector = Collector::new();
    // One collection; the admitted count and the rejection ratio.
    let read = |e: &Engine, at: Nanos| {
        metrics::with_local_recorder(&recorder, || collector.collect(e, at));
        let text = handle.render();
        let value = |series: &str| {
            let value = text.lines().find_map(|l| l.strip_prefix(series));
            value
                .unwrap_or_else(|| panic!("no {series} in {text}"))
                .to_owned()
        };
        (
            value(r#"rocgate_requests_total{route="r",decision="admitted",reason="none"} "#),
            value(r#"rocgate_rejection_ratio{route="r"} "#),
        )
    };
    let admitted = |e: &Engine, at: Nanos| read(e, at).0;
    let t = Nanos::from_secs;
    let first = Engine::new(&r_with_window(6), t(0), std::time::SystemTime::UNIX_EPOCH).unwrap();
    offer_to_r(&first, 100, t(1));
    assert_eq!(admitted(&first, t(1)), "100");
    let rebuilt = first
        .reload(&r_with_window(4), t(2), std::time::SystemTime::UNIX_EPOCH)
        .unwrap();
    assert_eq!(
        rebuilt
            .route_snapshot(rebuilt.route_id("r").unwrap(), t(2))
            .unwrap()
            .offered,
        0
    );
    offer_to_r(&rebuilt, 50, t(3));
    assert_eq!(admitted(&rebuilt, t(3)), "150");
    // Removed, then back: its series goes on from 150.
    let other = Config::new(vec![RouteConfig::new("other", RouteMatch::any())]);
    let removed = rebuilt
        .reload(&other, t(4), std::time::SystemTime::UNIX_EPOCH)
        .unwrap();
    metrics::with_local_recorder(&recorder, || collector.collect(&removed, t(4)));
    let back = removed
        .reload(&r_with_window(4), t(5), std::time::SystemTime::UNIX_EPOCH)
        .unwrap();
    offer_to_r(&back, 20, t(6));
    assert_eq!(admitted(&back, t(6)), "170");
    // Rebuilt again, and past the old count (20) before the next scrape: still known
    // for a restart (by the route's serial), so nothing is lost. A fresh bucket of 200
    // admits 200 of 300; the rejection ratio is over the new counts only.
    let again = back
        .reload(&r_with_window(6), t(7), std::time::SystemTime::UNIX_EPOCH)
        .unwrap();
    offer_to_r(&again, 300, t(8));
    let (admitted, ratio) = read(&again, t(8));
    assert_eq!(admitted, "370");
    assert_eq!(ratio.parse::<f64>().unwrap(), 1.0 / 3.0);
}

/// Requests decided between the last scrape and a reload that rebuilds their route
/// (or removes it) are counted: the reload's `Collector::replace` reads the engine it
/// replaces once more. They were lost: the exported total read 150 here, not 180.
/// (helper-146)
#[test]
fn requests_decided_after_the_last_scrape_count_across_a_reload() {
    use rocgate::clock::Nanos;
    use rocgate::engine::Engine;
    use rocgate::http::SharedEngine;
    use rocgate::metrics::Collector;
    let epoch = std::time::SystemTime::UNIX_EPOCH;
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let collector = Collector::new();
    let admitted = r#"rocgate_requests_total{route="r",decision="admitted",reason="none"}"#;
    let scrape = |shared: &SharedEngine, at: Nanos| {
        metrics::with_local_recorder(&recorder, || collector.collect(&shared.load(), at));
        scraped(&handle.render(), admitted)
    };
    let reload = |shared: &SharedEngine, config: &Config, at: Nanos| {
        let next = shared.load().reload(config, at, epoch).unwrap();
        metrics::with_local_recorder(&recorder, || {
            collector.replace(at, || shared.replace(next));
        });
    };
    let t = Nanos::from_secs;
    let shared = SharedEngine::new(Engine::new(&r_with_window(6), t(0), epoch).unwrap());
    offer_to_r(&shared.load(), 100, t(1));
    assert_eq!(scrape(&shared, t(1)), 100.0);
    // 30 more after that scrape, then a reload that rebuilds the route (a new window).
    offer_to_r(&shared.load(), 30, Nanos::from_millis(1500));
    reload(&shared, &r_with_window(4), t(2));
    offer_to_r(&shared.load(), 50, t(3));
    assert_eq!(scrape(&shared, t(3)), 180.0, "100 + 30 + 50");
    // 10 more, then a reload that removes the route: they are counted too.
    offer_to_r(&shared.load(), 10, t(4));
    let other = Config::new(vec![RouteConfig::new("other", RouteMatch::any())]);
    reload(&shared, &other, t(5));
    assert_eq!(scrape(&shared, t(5)), 190.0);
    // A reload that keeps the route as it was reads what the next scrape reads.
    reload(&shared, &r_with_window(4), t(6));
    offer_to_r(&shared.load(), 5, t(7));
    reload(&shared, &r_with_window(4), t(8));
    assert_eq!(scrape(&shared, t(8)), 195.0);
}

/// A reload that rebuilds a route during a cut: the seconds of that cut exported so
/// far stay counted, and the rebuilt route's own cut adds to them. The cut under way
/// was left out of the total carried over, so the next cut's first seconds were
/// swallowed by it (helper-146).
#[test]
fn cut_seconds_carry_on_across_a_rebuild_during_a_cut() {
    use rocgate::clock::Nanos;
    use rocgate::controller::ControllerState;
    use rocgate::engine::{Engine, Key};
    use rocgate::metrics::Collector;
    let epoch = std::time::SystemTime::UNIX_EPOCH;
    // 100 req/s for a window and more, then 1,000 req/s for 1 s: a cut.
    let drive = |e: &Engine, from_ms: u64, calm_slots: u64| {
        let id = e.route_id("r").unwrap();
        for slot in 0..calm_slots + 10 {
            let n = if slot < calm_slots { 10 } else { 100 };
            for i in 0..n {
                let at = Nanos::from_millis(from_ms + slot * 100 + i * 100 / n);
                let _ = e.check(id, Key::None, at);
            }
        }
    };
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let collector = Collector::new();
    let series = r#"rocgate_cut_seconds_total{route="r"}"#;
    let collect = |e: &Engine, at: Nanos| {
        metrics::with_local_recorder(&recorder, || collector.collect(e, at));
        scraped(&handle.render(), series)
    };
    let first = Engine::new(&r_with_window(8), Nanos::ZERO, epoch).unwrap();
    drive(&first, 0, 80);
    let at = Nanos::from_secs(38);
    let s = first.snapshot(at).remove(0);
    assert_eq!(s.state, ControllerState::Cut, "{s:?}");
    let before = collect(&first, at);
    assert!(
        before >= 25.0,
        "{before} s into a cut of {:?}",
        s.time_in_cut
    );
    // Rebuilt (a new window: a fresh controller), then cut again.
    let rebuilt = first.reload(&r_with_window(6), at, epoch).unwrap();
    drive(&rebuilt, 38_000, 60);
    let at = Nanos::from_secs(65);
    let s = rebuilt.snapshot(at).remove(0);
    assert_eq!((s.state, s.cuts), (ControllerState::Cut, 1), "{s:?}");
    assert!(s.time_in_cut >= Duration::from_secs(10), "{s:?}");
    let after = collect(&rebuilt, at);
    // Whole seconds of the two cuts' sum: the new cut's, give or take the rounding.
    let cut = s.time_in_cut.as_secs_f64();
    assert!(
        (before + cut.floor()..=before + cut.ceil()).contains(&after),
        "{before} s before the rebuild, {after} after a cut of {cut} s"
    );
}

/// A reload that rebuilds a route its own controller cut into one a shared store
/// decides (`shadow_adaptive` to `enforce` under Redis): the local cut under way stays
/// counted, and the store's cuts and seconds add to it. The counts went on from the
/// local controller's as if the store's were the same count: its cut was taken for
/// the one under way, and 29 s of it plus the store's 10 s read 29 s, 2 cuts read 1.
/// (helper-151)
#[test]
fn a_local_cut_stays_counted_when_a_rebuild_hands_the_route_to_a_shared_store() {
    use rocgate::clock::Nanos;
    use rocgate::controller::TransitionCounts;
    use rocgate::engine::{Engine, Key};
    use rocgate::metrics::{Collector, SharedControl};
    let epoch = std::time::SystemTime::UNIX_EPOCH;
    let first = Engine::new(&r_with_window(8), Nanos::ZERO, epoch).unwrap();
    // 100 req/s for 8 s, then 1,000 req/s for 1 s: a cut.
    let id = first.route_id("r").unwrap();
    for slot in 0..90u64 {
        let n = if slot < 80 { 10 } else { 100 };
        for i in 0..n {
            let _ = first.check(id, Key::None, Nanos::from_millis(slot * 100 + i * 100 / n));
        }
    }
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let collector = Collector::new().with_shared_store();
    let seconds = r#"rocgate_cut_seconds_total{route="r"}"#;
    let cuts = r#"rocgate_cuts_total{route="r"}"#;
    let at = Nanos::from_secs(38);
    let s = first.snapshot(at).remove(0);
    assert_eq!((s.state, s.cuts), (ControllerState::Cut, 1), "{s:?}");
    metrics::with_local_recorder(&recorder, || collector.collect(&first, at));
    let before = scraped(&handle.render(), seconds);
    assert!(
        before >= 25.0,
        "{before} s into a cut of {:?}",
        s.time_in_cut
    );
    // Rebuilt (a new window); now the store's controller decides it, and has cut once
    // for 10 s.
    let rebuilt = first.reload(&r_with_window(6), at, epoch).unwrap();
    let store = SharedControl {
        limit_rps: 60.0,
        state: ControllerState::Cut,
        roc: 120.0,
        demand_rps: f64::NAN,
        stepped: TransitionCounts {
            transitions: [[0, 1, 0], [0, 0, 0], [0, 0, 0]],
            cuts: 1,
            time_in_cut: Duration::from_secs(10),
        },
        level: None,
    };
    metrics::with_local_recorder(&recorder, || {
        collector.collect_with(&rebuilt, Nanos::from_secs(50), |_| Some(store));
    });
    let text = handle.render();
    assert_eq!(scraped(&text, seconds), before + 10.0, "{text}");
    assert_eq!(scraped(&text, cuts), 2.0, "{text}");
    // No answer gave the fleet's demand: NaN, which a scrape leaves out, not 0.
    assert!(
        text.contains(r#"rocgate_store_demand_rps{route="r"} NaN"#),
        "{text}"
    );
}

/// `rocgate_rejection_ratio` covers a window at least from the first scrape on: a
/// second scrape a second after the first read 0 (the one request since the first
/// was admitted), where over the last 6 s 100 of 301 were refused. (helper-146)
#[test]
fn the_rejection_ratio_covers_a_window_from_the_first_scrape() {
    use rocgate::clock::Nanos;
    use rocgate::engine::{Engine, Key};
    use rocgate::metrics::Collector;
    let epoch = std::time::SystemTime::UNIX_EPOCH;
    let routes = vec![RouteConfig::new("r", RouteMatch::any())];
    let engine = Engine::new(&Config::new(routes), Nanos::ZERO, epoch).unwrap();
    let id = engine.route_id("r").unwrap();
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let collector = Collector::new();
    let ratio = |at: Nanos| {
        metrics::with_local_recorder(&recorder, || collector.collect(&engine, at));
        scraped(&handle.render(), r#"rocgate_rejection_ratio{route="r"}"#)
    };
    let t = Nanos::from_secs;
    // A bucket of 200 admits 200 of 300 at once.
    for _ in 0..300 {
        let _ = engine.check(id, Key::None, t(1));
    }
    assert_eq!(ratio(t(1)), 100.0 / 300.0);
    let _ = engine.check(id, Key::None, t(2));
    assert_eq!(ratio(t(2)), 100.0 / 301.0);
    // A window after the first scrape, the ratio is over the window since it.
    for _ in 0..9 {
        let _ = engine.check(id, Key::None, t(7));
    }
    assert_eq!(ratio(t(7)), 0.0, "10 admitted since the scrape at 1 s");
}

/// `rocgate_controller_roc` is the ROC each route's thresholds are compared with: the
/// absolute one for an absolute-mode route, the relative one for a relative-mode
/// route, so the dashboard draws each beside thresholds of its own kind.
#[test]
fn the_controller_roc_is_in_each_routes_mode() {
    use rocgate::clock::Nanos;
    use rocgate::engine::{Engine, Key};
    use rocgate::metrics::Collector;
    use rocgate::window::RocMode;
    let route = |name: &str, mode| {
        let mut r = RouteConfig::new(name, RouteMatch::prefix(format!("/{name}/")));
        r.controller.roc_mode = mode;
        r.controller.danger_roc = if mode == RocMode::Relative { 4.0 } else { 80.0 };
        r.controller.safe_roc = if mode == RocMode::Relative { 1.0 } else { 20.0 };
        r
    };
    // An absolute route may have a min_rps of 0: after a silent first half, its
    // relative ROC has no value (it was +Inf).
    let mut quiet = route("quiet", RocMode::Absolute);
    quiet.controller.min_rps = 0.0;
    let engine = Engine::new(
        &Config::new(vec![
            route("abs", RocMode::Absolute),
            route("rel", RocMode::Relative),
            quiet,
        ]),
        Nanos::ZERO,
        std::time::SystemTime::UNIX_EPOCH,
    )
    .unwrap();
    // 20 req/s for the window's first half (3 s), then 50 req/s: in the last completed
    // slot the halves read 20 and 50 req/s, so ROC is 30 absolute, 1.5 relative.
    for name in ["abs", "rel", "quiet"] {
        let id = engine.route_id(name).unwrap();
        for ms in (0..6_000).step_by(10) {
            let every = if ms < 3_000 { 50 } else { 20 };
            if ms % every == 0 && (name != "quiet" || ms >= 3_000) {
                let _ = engine.check(id, Key::None, Nanos::from_millis(ms));
            }
        }
        let _ = engine.check(id, Key::None, Nanos::from_millis(6_000));
    }
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        Collector::new().collect(&engine, Nanos::from_millis(6_000));
    });
    let text = handle.render();
    for line in [
        r#"rocgate_roc{route="rel",mode="absolute"} 30"#,
        r#"rocgate_roc{route="rel",mode="relative"} 1.5"#,
        r#"rocgate_controller_roc{route="abs"} 30"#,
        r#"rocgate_controller_roc{route="rel"} 1.5"#,
        r#"rocgate_roc{route="quiet",mode="absolute"} 50"#,
        r#"rocgate_roc{route="quiet",mode="relative"} NaN"#,
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
}

/// `rocgate_roc_observed`, which the dashboard's ROC quantiles and threshold tuning
/// read, leaves out the slots before the controller is armed: in the first window one
/// half is still empty, so ROC there is about the whole rate (150 req/s of steady
/// traffic read as ROC 150 and set the quantiles far above the noise).
#[test]
fn the_roc_histogram_leaves_out_the_first_window() {
    use rocgate::clock::Nanos;
    use rocgate::engine::{Engine, Key};
    use std::sync::{Arc, Mutex};
    let reports = Arc::new(Mutex::new(Vec::new()));
    let hook = rocgate::metrics::roc_sample_hook();
    let seen = Arc::clone(&reports);
    let engine = Engine::new(
        &Config::new(vec![RouteConfig::new(
            "roc_observed_steady",
            RouteMatch::prefix("/"),
        )]),
        Nanos::ZERO,
        std::time::SystemTime::UNIX_EPOCH,
    )
    .unwrap()
    .with_sample_hook(Arc::new(move |route, report| {
        seen.lock().unwrap().push((report.armed, report.roc));
        hook(route, report);
    }));
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let id = engine.route_id("roc_observed_steady").unwrap();
    // 50 req/s for twice the window (6 s).
    metrics::with_local_recorder(&recorder, || {
        for ms in (0..12_000).step_by(20) {
            let _ = engine.check(id, Key::None, Nanos::from_millis(ms));
        }
    });
    let reports = reports.lock().unwrap();
    let armed = reports.iter().filter(|(armed, _)| *armed).count();
    assert!(armed > 0 && armed < reports.len(), "{reports:?}");
    // Steady traffic: every armed slot's ROC is near 0, the first window's near 50.
    assert!(
        reports.iter().any(|&(armed, roc)| !armed && roc > 20.0),
        "{reports:?}"
    );
    let text = handle.render();
    let count = format!(r#"rocgate_roc_observed_count{{route="roc_observed_steady"}} {armed}"#);
    assert!(text.lines().any(|l| l == count), "no `{count}` in:\n{text}");
}

/// What a [`Registrations`] recorder's handles update: nothing.
#[derive(Default)]
struct Ignored;

impl metrics::CounterFn for Ignored {
    fn increment(&self, _: u64) {}
    fn absolute(&self, _: u64) {}
}

impl metrics::GaugeFn for Ignored {
    fn increment(&self, _: f64) {}
    fn decrement(&self, _: f64) {}
    fn set(&self, _: f64) {}
}

/// A recorder that counts the series registered with it (and records nothing). Its
/// counters and gauges share one `Arc`, whose strong count tells how many are held.
#[derive(Default)]
struct Registrations {
    registered: std::sync::atomic::AtomicUsize,
    handle: std::sync::Arc<Ignored>,
}

impl Registrations {
    fn count(&self) -> usize {
        self.registered.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn add(&self) {
        self.registered
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The counters and gauges registered with it that are still held.
    fn live(&self) -> usize {
        std::sync::Arc::strong_count(&self.handle) - 1
    }
}

impl metrics::Recorder for Registrations {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        self.add();
        metrics::Counter::from_arc(std::sync::Arc::clone(&self.handle))
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        self.add();
        metrics::Gauge::from_arc(std::sync::Arc::clone(&self.handle))
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        self.add();
        metrics::Histogram::noop()
    }
}

/// An engine of three routes, `{prefix}0` to `{prefix}2`, each on a path of its own.
fn three_routes(prefix: &str) -> rocgate::engine::Engine {
    let routes = (0..3)
        .map(|i| {
            RouteConfig::new(
                format!("{prefix}{i}"),
                RouteMatch::exact("GET", format!("/{prefix}/{i}")),
            )
        })
        .collect();
    rocgate::engine::Engine::new(
        &Config::new(routes),
        rocgate::clock::Nanos::ZERO,
        std::time::SystemTime::UNIX_EPOCH,
    )
    .unwrap()
}

/// A collector for the global recorder, as `rocgate serve`'s, registers each route's
/// series with the recorder once and keeps the handles: a scrape sets them, instead of
/// looking every series up again by its name and labels (41 a route limited as a
/// whole by a token bucket, most of a collection's time at 1,000 routes). A `Collector::new()` registers them at every
/// collection.
#[test]
fn a_collector_for_the_global_recorder_registers_each_series_once() {
    use rocgate::clock::Nanos;
    use rocgate::metrics::Collector;
    let engine = three_routes("once");
    // Series registered by each of 4 collections.
    let registered = |collector: &Collector| {
        let recorder = Registrations::default();
        (1..5)
            .map(|s| {
                let before = recorder.count();
                metrics::with_local_recorder(&recorder, || {
                    collector.collect(&engine, Nanos::from_secs(s))
                });
                recorder.count() - before
            })
            .collect::<Vec<_>>()
    };
    let kept = registered(&Collector::new().for_global_recorder());
    // Every route's 41, then only the 2 process-wide gauges (build info, store mode).
    assert_eq!(kept, [3 * 41 + 2, 2, 2, 2]);
    let each_time = registered(&Collector::new());
    assert_eq!(each_time, [3 * 41 + 2; 4]);
}

/// Handles belong to the recorder they were registered with. A `Collector::new()`
/// registers its series at every collection, so each recorder it is used with (here
/// two in turn at one address on the stack) shows every series; one for the global
/// recorder registers them again with a recorder at another address (the global one
/// installed after a first collection).
#[test]
fn the_collector_follows_the_recorder_in_use() {
    use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusRecorder};
    use rocgate::clock::Nanos;
    use rocgate::engine::{Engine, Key};
    use rocgate::metrics::Collector;
    let config = Config::new(vec![RouteConfig::new("follows", RouteMatch::any())]);
    let engine = Engine::new(&config, Nanos::ZERO, std::time::SystemTime::UNIX_EPOCH).unwrap();
    let id = engine.route_id("follows").unwrap();
    let mut offered = 0;
    // Offers 4 requests, collects through `recorder`; what it renders.
    let mut collect = |collector: &Collector, recorder: &PrometheusRecorder| {
        offered += 4;
        for _ in 0..4 {
            let _ = engine.check(id, Key::None, Nanos::from_secs(offered));
        }
        metrics::with_local_recorder(recorder, || {
            collector.collect(&engine, Nanos::from_secs(offered))
        });
        let text = recorder.handle().render();
        let line = format!(
            r#"rocgate_requests_total{{route="follows",decision="admitted",reason="none"}} {offered}"#
        );
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        assert!(
            text.contains(r#"rocgate_limit_rps{route="follows"} "#),
            "{text}"
        );
    };
    let each_time = Collector::new();
    for _ in 0..2 {
        let recorder = PrometheusBuilder::new().build_recorder();
        collect(&each_time, &recorder);
    }
    let kept = Collector::new().for_global_recorder();
    let (first, second) = (
        PrometheusBuilder::new().build_recorder(),
        PrometheusBuilder::new().build_recorder(),
    );
    collect(&kept, &first);
    collect(&kept, &second);
}

/// A collector for the global recorder keeps the handles of the routes in force, not
/// those of every route a reload removed or renamed: each of 20 reloads renaming 3
/// routes left their 41 handles each held, 2,460 by the last where 123 are in use,
/// however long the process runs (a route added back registers its series again, and
/// continues them).
#[test]
fn a_collector_lets_go_of_the_handles_of_routes_a_reload_removed() {
    use rocgate::clock::Nanos;
    use rocgate::metrics::Collector;
    let recorder = Registrations::default();
    let collector = Collector::new().for_global_recorder();
    let mut held = Vec::new();
    for reload in 0..20 {
        let engine = three_routes(&format!("renamed{reload}_"));
        metrics::with_local_recorder(&recorder, || {
            collector.collect(&engine, Nanos::from_secs(reload + 1))
        });
        held.push(recorder.live());
    }
    assert_eq!(held, [3 * 41; 20]);
}

/// The value of the series `series` (name and labels) in a rendered scrape.
fn scraped(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// A partitioned route's `rocgate_limiter_level` is NaN, not the route-level
/// limiter's, which decides none of its requests: it read full (10 of 10) while both
/// keys' buckets were empty and 60 requests were refused. The capacity is a key's.
/// (helper-123)
#[test]
fn a_partitioned_routes_limiter_level_is_no_level() {
    use rocgate::clock::Nanos;
    use rocgate::engine::{Engine, Key};
    use rocgate::metrics::Collector;
    let mut r = RouteConfig::new("per_ip", RouteMatch::any());
    r.controller.base_limit_rps = 10.0;
    r.controller.cut_limit_rps = 5.0;
    r.partition = Partition::ClientIp(KeyLimits::default());
    let epoch = std::time::SystemTime::UNIX_EPOCH;
    let engine = Engine::new(&Config::new(vec![r]), Nanos::ZERO, epoch).unwrap();
    let id = engine.route_id("per_ip").unwrap();
    // Two clients, 40 requests each at once: each key's bucket of 10 admits 10.
    for ip in ["10.0.0.1", "10.0.0.2"] {
        for _ in 0..40 {
            let _ = engine.check(id, Key::Ip(ip.parse().unwrap()), Nanos::from_millis(1));
        }
    }
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        Collector::new().collect(&engine, Nanos::from_millis(2));
    });
    let text = handle.render();
    let series = |name: &str| format!(r#"{name}{{route="per_ip",algorithm="token_bucket"}}"#);
    let rejected = r#"rocgate_requests_total{route="per_ip",decision="rejected",reason="limit"}"#;
    assert_eq!(scraped(&text, rejected), 60.0);
    assert!(scraped(&text, &series("rocgate_limiter_level")).is_nan());
    assert_eq!(scraped(&text, &series("rocgate_limiter_capacity")), 10.0);
}

/// `rocgate_cut_seconds_total` of a cut that a silence outlasted: a scrape counts the
/// cut under way to its time; brought up to date later, the cut is found to have
/// ended earlier. The engine's lower total was taken for a restarted count and the
/// whole previous total added again (11 s exported, then 16 for one cut of 5.1 s).
/// (helper-123)
#[test]
fn cut_seconds_do_not_jump_when_a_silent_cut_is_caught_up() {
    use rocgate::clock::Nanos;
    use rocgate::controller::ControllerState;
    use rocgate::engine::{Engine, Key};
    use rocgate::metrics::Collector;
    let epoch = std::time::SystemTime::UNIX_EPOCH;
    let routes = vec![RouteConfig::new("r", RouteMatch::any())];
    let engine = Engine::new(&Config::new(routes), Nanos::ZERO, epoch).unwrap();
    let id = engine.route_id("r").unwrap();
    // 100 req/s for 8 s (the first window arms the controller), then 1,000 req/s
    // for 1 s: cut. Then silence.
    for slot in 0..90u64 {
        let n = if slot < 80 { 10 } else { 100 };
        for i in 0..n {
            let at = Nanos::from_millis(slot * 100 + i * 100 / n);
            let _ = engine.check(id, Key::None, at);
        }
    }
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let collector = Collector::new();
    let series = r#"rocgate_cut_seconds_total{route="r"}"#;
    // A scrape at 20 s, before any upkeep: still in cut for the snapshot.
    let at = Nanos::from_secs(20);
    metrics::with_local_recorder(&recorder, || collector.collect(&engine, at));
    let first = scraped(&handle.render(), series);
    assert_eq!(engine.snapshot(at)[0].state, ControllerState::Cut);
    // The upkeep brings the route up to date (as `rocgate serve` does every 5 s).
    let at = Nanos::from_millis(20_050);
    engine.catch_up(id, at);
    metrics::with_local_recorder(&recorder, || collector.collect(&engine, at));
    let s = &engine.snapshot(at)[0];
    let second = scraped(&handle.render(), series);
    assert_eq!(s.cuts, 1);
    assert!(s.time_in_cut.as_secs_f64() < first, "{s:?}");
    assert_eq!(second, first, "one cut of {:?}", s.time_in_cut);
}

/// `rocgate_cut_vs_base_total` is the snapshot's counts of the cut's decisions the
/// base limit would have made the other way, by decision, for the routes that count
/// them only: a route-wide token bucket that cut, and one that did not (at 0); the
/// `rejected` side only on a `shadow_adaptive` route; neither on a partitioned route,
/// nor a route a shared store decides.
#[test]
fn the_cut_against_the_base_limit_is_exported_where_counted() {
    use rocgate::clock::Nanos;
    use rocgate::controller::TransitionCounts;
    use rocgate::engine::{Engine, Key};
    use rocgate::metrics::{Collector, SharedControl};
    let route = |name: &str| {
        let mut r = RouteConfig::new(name, RouteMatch::prefix(format!("/{name}/")));
        r.controller.base_limit_rps = 10.0;
        r.controller.cut_limit_rps = 3.0;
        r.controller.danger_roc = 50.0;
        r.controller.safe_roc = 10.0;
        r
    };
    let mut keyed = route("keyed");
    keyed.partition = Partition::ClientIp(KeyLimits::default());
    let mut adaptive = route("adaptive");
    adaptive.mode = rocgate::config::Mode::ShadowAdaptive;
    let engine = Engine::new(
        &Config::new(vec![
            route("sale"),
            route("calm"),
            keyed,
            route("shared"),
            adaptive,
        ]),
        Nanos::ZERO,
        std::time::SystemTime::UNIX_EPOCH,
    )
    .unwrap();
    // 12 req/s for 10 s, then 200 req/s for 1 s and 20 req/s for 3 s: cut.
    for name in ["sale", "keyed", "adaptive"] {
        let id = engine.route_id(name).unwrap();
        for (from, to, rate) in [(0.0, 10.0, 12.0), (10.0, 11.0, 200.0), (11.0, 14.0, 20.0)] {
            let n = ((to - from) * rate) as u64;
            for k in 0..n {
                let now = Nanos::from_secs_f64(from + k as f64 / rate);
                let _ = engine.check(id, Key::None, now);
            }
        }
    }
    let now = Nanos::from_secs(14);
    let sale = engine
        .route_snapshot(engine.route_id("sale").unwrap(), now)
        .unwrap();
    assert_eq!(sale.state, ControllerState::Cut);
    let rejected = sale.cut_vs_base_rejected.unwrap();
    let admitted = sale.cut_vs_base_admitted.unwrap();
    assert!(rejected > 0 && rejected < sale.rejected_for(rocgate::limiter::Reason::RocCut));
    assert!(admitted > 0);
    let adaptive = engine
        .route_snapshot(engine.route_id("adaptive").unwrap(), now)
        .unwrap();
    let adaptive_rejected = adaptive.cut_vs_base_rejected.unwrap();
    assert!(adaptive_rejected > 0);
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        rocgate::metrics::describe();
        Collector::new().collect_with(&engine, now, |route| {
            (route == "shared").then_some(SharedControl {
                limit_rps: 10.0,
                state: ControllerState::Normal,
                roc: 0.0,
                demand_rps: 10.0,
                stepped: TransitionCounts::default(),
                level: None,
            })
        });
    });
    let text = handle.render();
    let series = |route: &str, decision: &str| {
        format!(r#"rocgate_cut_vs_base_total{{route="{route}",decision="{decision}"}}"#)
    };
    for (route, decision, n) in [
        ("sale", "rejected", rejected),
        ("sale", "admitted", admitted),
        ("calm", "rejected", 0),
        ("calm", "admitted", 0),
        ("adaptive", "rejected", adaptive_rejected),
    ] {
        let line = format!("{} {n}", series(route, decision));
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }
    for (route, decision) in [
        ("adaptive", "admitted"),
        ("keyed", "rejected"),
        ("keyed", "admitted"),
        ("shared", "rejected"),
        ("shared", "admitted"),
    ] {
        let series = series(route, decision);
        assert!(!text.contains(&series), "{series} in:\n{text}");
    }
    assert!(text.contains("# HELP rocgate_cut_vs_base_total "));
}
