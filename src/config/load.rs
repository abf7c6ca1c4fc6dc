//! Loading a configuration: the TOML file, then overrides from the environment, then
//! validation, with every problem reported in one [`ConfigError`].
//!
//! The file is read with the `config` crate, which also applies the overrides; see
//! [`Config::load`] for how variables name fields.

use super::raw::{
    bare_number, error_location, key_text, node_urls, one_line, text_refusal, written_not_0,
    RawConfig, NEARER_0, TEXT_LISTS,
};
use super::{escaped, quoted, quotes_bounded, Config};
use crate::store::masked_url;
use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::path::Path;

/// The documented default configuration, built into the binary.
const EMBEDDED_DEFAULT: &str = include_str!("../../config/rocgate.toml");

/// Prefix of the environment variables that override the file.
const ENV_PREFIX: &str = "ROCGATE";
/// Separator between the parts of an override's field path.
const ENV_SEPARATOR: &str = "__";
/// The longest name of an override, in bytes: the file's field paths run to about 60
/// (`ROCGATE__ROUTES__12__EVENTS__3__RESTORE_INTERVAL`,
/// `ROCGATE__SERVER__MAX_CONNECTIONS_PER_CLIENT`). A longer one is refused as no field
/// path, and shown bounded ([`quoted`]).
const LONGEST_ENV_NAME: usize = 256;

/// Why a configuration was refused: where it came from, and every problem found.
///
/// `Display` writes one problem per line, each prefixed with the origin:
///
/// ```text
/// config/bad.toml: routes[2].cut_limit: must be ≤ base_limit (200), got 300
/// config/bad.toml: line 4, column 9: invalid string, expected `"`
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    origin: String,
    problems: Vec<Problem>,
}

impl ConfigError {
    pub(crate) fn new(origin: &str, problems: Vec<Problem>) -> Self {
        ConfigError {
            origin: origin.to_owned(),
            problems,
        }
    }

    /// Where the configuration came from: the file path, or the origin given to
    /// [`Config::from_toml_str`].
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Every problem, in the order found (never empty).
    pub fn problems(&self) -> &[Problem] {
        &self.problems
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{}: {problem}", self.origin)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// One problem in a configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    location: String,
    message: String,
    /// Fields elsewhere whose values make the problem (the other event of two that
    /// overlap): a variable that set one is named with it.
    causes: Vec<String>,
}

impl Problem {
    pub(crate) fn new(location: impl Into<String>, message: impl Into<String>) -> Self {
        Problem {
            location: location.into(),
            message: message.into(),
            causes: Vec::new(),
        }
    }

    /// The problem, made also by the values of the fields at `causes`.
    pub(crate) fn caused_by(mut self, causes: Vec<String>) -> Self {
        self.causes = causes;
        self
    }

    /// Where: a field path as written in the file (`routes[2].cut_limit`,
    /// `defaults.hold`), a position for a syntax error (`line 4, column 9`), or empty
    /// when the problem concerns the whole file.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// What is wrong, in lower case.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.location.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.location, self.message)
        }
    }
}

/// The longest config file read: a path to something endless (`/dev/zero`) or huge is
/// refused once this much is read, not read until memory runs out.
const MAX_FILE_BYTES: u64 = 16 << 20;

impl Config {
    /// Loads and validates the file at `path`, with overrides from the process
    /// environment.
    ///
    /// Any variable named `ROCGATE__` followed by a field path, with `__` between the
    /// parts, overrides that field:
    ///
    /// ```text
    /// ROCGATE__DEFAULTS__DANGER_ROC=95           # [defaults] danger_roc = 95
    /// ROCGATE__ROUTES__0__BASE_LIMIT=300         # the first [[routes]]: base_limit = 300
    /// ROCGATE__ROUTES__1__EVENTS__0__HOLD=5s     # its first event's hold
    /// ```
    ///
    /// Names are case-insensitive; values are text, read as the field needs (`95`, `5s`,
    /// `shadow`; a number with TOML's underscores between digits, `1_000`). A part made only of digits is an index into an array of tables
    /// (`routes`, `events`, `tiers`, counted from 0), which must exist in the file: the
    /// environment can change a route, not add one. A list of values of `[server]`,
    /// `[admin]` or `[store]` (`server.trusted_proxies`) is set whole, its items
    /// separated by commas (`10.0.0.0/8, 192.168.0.0/16`), an empty item refused; a
    /// tier's `values` cannot be set from the environment, and no list's element can:
    /// an index after any other field is refused. An empty variable counts as unset.
    /// Every `ROCGATE__` variable is an override, so an unknown field is an error as it
    /// is in the file, and a problem in a value from the environment names the variable.
    ///
    /// ```
    /// use rocgate::config::Config;
    ///
    /// let text = r#"
    ///     [[routes]]
    ///     name = "order"
    ///     path = "/api/order"
    /// "#;
    /// let env = [("ROCGATE__DEFAULTS__DANGER_ROC".to_owned(), "95".to_owned())];
    /// let config = Config::from_toml_str_with_env(text, "inline.toml", env).unwrap();
    /// assert_eq!(config.routes[0].controller.danger_roc, 95.0);
    /// ```
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        // Control characters escaped: the origin begins every problem's line.
        let origin = escaped(&path.display().to_string(), char::is_control).into_owned();
        let refused = |problem: String| ConfigError::new(&origin, vec![Problem::new("", problem)]);
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|file| {
                use std::io::Read as _;
                file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)
            })
            .map_err(|e| refused(format!("cannot read the file: {e}")))?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(refused(format!(
                "longer than {} MiB: not a config file",
                MAX_FILE_BYTES >> 20
            )));
        }
        let text = String::from_utf8(bytes).map_err(|e| {
            // Where the first byte that is not UTF-8 is.
            let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
            let before = std::str::from_utf8(valid).unwrap_or_default();
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
            ConfigError::new(
                &origin,
                vec![Problem::new(
                    format!("line {line}, column {column}"),
                    "not UTF-8 text (a TOML file is UTF-8)",
                )],
            )
        })?;
        with_process_env(&text, &origin)
    }

    /// [`Config::load`], refusing a path that is not a regular file (once followed
    /// through symbolic links): a FIFO or a device would hold up the reload that reads
    /// it again, and with it everything that waits for that reload.
    #[cfg(feature = "proxy")]
    pub(crate) fn load_regular(path: &Path) -> Result<Config, ConfigError> {
        match std::fs::metadata(path) {
            Ok(m) if !m.is_file() && !m.is_dir() => Err(ConfigError::new(
                &escaped(&path.display().to_string(), char::is_control),
                vec![Problem::new(
                    "",
                    "not a regular file (a FIFO or a device): a reload reads a file",
                )],
            )),
            _ => Config::load(path),
        }
    }

    /// Parses and validates TOML text, without environment overrides. `origin` names
    /// the text in errors (a file path, or something like `"inline"`).
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str_with_env(text, origin, std::iter::empty())
    }

    /// Parses and validates TOML text with overrides from `env`, given as
    /// `(name, value)` pairs; variables without the `ROCGATE__` prefix are ignored.
    /// [`Config::load`] passes the process environment; tests pass their own.
    pub fn from_toml_str_with_env(
        text: &str,
        origin: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let fail = |problems| ConfigError::new(origin, problems);
        let file = config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()
            .map_err(|e| fail(vec![syntax_problem(text, &e)]))?;
        // As a number past the largest held is refused, before any other problem.
        if let Some(problem) = float_read_as_0(text, &file.cache) {
            return Err(fail(vec![problem]));
        }

        let mut problems = Vec::new();
        let mut overrides: Vec<Override> = Vec::new();
        let mut vars: HashMap<String, (String, String)> = HashMap::new();
        for (var, value) in env {
            let Some(o) = Override::parse(var) else {
                continue;
            };
            if value.is_empty() {
                // Skipped, as if unset, but for the admin token: a secret that came out
                // empty (a variable taken from one that was never set) would run the
                // admin API without a token, which nobody asked for by leaving it empty.
                if o.path == "admin.token" {
                    let unset = if file.get_string("admin.token").is_ok() {
                        "unset it to use the file's token"
                    } else {
                        "unset it to run without a token"
                    };
                    problems.push(Problem::new(
                        o.path.clone(),
                        format!(
                            "must not be empty (set by environment variable {}); {unset}",
                            o.var
                        ),
                    ));
                }
                continue;
            }
            if o.var.len() > LONGEST_ENV_NAME {
                problems.push(Problem::new(
                    o.shown_path(),
                    format!(
                        "not a field path: longer than {LONGEST_ENV_NAME} bytes, which no \
                         field's is (set by environment variable {})",
                        o.shown_var()
                    ),
                ));
                continue;
            }
            if !o.is_field_path() {
                problems.push(Problem::new(
                    o.shown_path(),
                    format!(
                        "not a field path: each part between `__` must be a field name \
                         (letters, digits, _) or an index (set by environment variable {})",
                        o.shown_var()
                    ),
                ));
                continue;
            }
            if let Some((named, list, indexed)) = o.unindexed_list() {
                problems.push(Problem::new(
                    named,
                    format!(
                        "not a field path: {list} is a list of tables, each named by its \
                         index from 0 ({indexed}) (set by environment variable {})",
                        o.var
                    ),
                ));
                continue;
            }
            if let Some(element) = o.list_element() {
                let how = match o.whole_list_var() {
                    Some(whole) => {
                        format!("; set the whole list, its items separated by commas ({whole}=…)")
                    }
                    None => ", and a list of values is set in the file".to_owned(),
                };
                problems.push(Problem::new(
                    element,
                    format!(
                        "cannot be set from the environment: an index may follow routes, \
                         events or tiers only{how} (set by environment variable {})",
                        o.var
                    ),
                ));
                continue;
            }
            if let Some(element) = o.missing_element(&file) {
                problems.push(Problem::new(
                    element,
                    format!(
                        "no such table in the file (set by environment variable {})",
                        o.var
                    ),
                ));
                continue;
            }
            // Names are case-insensitive: two variables may name one field.
            match vars.get(&o.config_key()) {
                Some((first, first_value)) => problems.push(Problem::new(
                    o.path.clone(),
                    format!(
                        "set by two environment variables, {first} ({:?}) and {} ({:?}): keep one",
                        quoted(&o.shown_value(first_value)),
                        o.var,
                        quoted(&o.shown_value(&value))
                    ),
                )),
                None => {
                    vars.insert(o.config_key(), (o.var.clone(), value));
                    overrides.push(o);
                }
            }
        }
        if !overrides.iter().any(|o| o.path == "admin.token") && token_is_datetime(text, &file) {
            problems.push(Problem::new(
                "admin.token",
                "must be a string, got a date-time: write it in quotes (token = \"…\"), \
                 the text a client sends",
            ));
        }
        // In the order the variables came (the environment's), not the map's: of
        // several unknown fields, the one the error names is the first set.
        let vars = overrides.iter().filter_map(|o| {
            let key = o.config_key();
            let (_, value) = vars.remove(&key)?;
            Some((key, value))
        });

        let merged = config::Config::builder()
            .add_source(file.clone())
            .add_source(
                config::Environment::with_prefix(ENV_PREFIX)
                    .separator(ENV_SEPARATOR)
                    .source(Some(vars.collect())),
            )
            .build()
            .map_err(|e| fail(vec![Problem::new("", e.to_string())]))?;
        // A value the file wrote as text is a problem of shape, reported with the
        // others and alone.
        let (written, cleaned) = file_text_for_values(&merged.cache);
        let found = match serde_path_to_error::deserialize::<_, RawConfig>(cleaned.clone()) {
            Ok(_) if !written.is_empty() => in_file_order(&merged.cache, written),
            Ok(raw) => match Config::try_from(raw) {
                Ok(config) if problems.is_empty() => return Ok(config),
                Ok(_) => Vec::new(),
                Err(found) => attribute(found, &overrides, &file),
            },
            Err(e) => {
                let mut shape = written;
                shape.extend(shape_problems(e, cleaned, &overrides));
                in_file_order(&merged.cache, shape)
            }
        };
        problems.extend(found);
        Err(fail(problems))
    }

    /// The documented default configuration (`config/rocgate.toml`, built in), without
    /// environment overrides.
    ///
    /// # Panics
    ///
    /// Never in a released build: a unit test checks that the built-in file is valid.
    pub fn embedded_default() -> Config {
        Config::from_toml_str(EMBEDDED_DEFAULT, EMBEDDED_ORIGIN)
            .expect("the built-in config/rocgate.toml is valid (checked by a unit test)")
    }

    /// The documented default configuration with overrides from the process
    /// environment, applied as [`Config::load`] applies them to a file: what `rocgate
    /// serve` and `rocgate simulate` run without `--config`. Only an override can make
    /// it invalid, and the error names its variable.
    pub fn embedded_default_with_env() -> Result<Config, ConfigError> {
        with_process_env(EMBEDDED_DEFAULT, EMBEDDED_ORIGIN)
    }
}

/// The most problems of shape reported at once.
const MAX_SHAPE_PROBLEMS: usize = 50;

/// Every problem of shape in the merged file and overrides `value`, the first of
/// which is `first`: each found is taken out of the value (an unknown field, a value
/// of the wrong type) and the value read again, until it reads or a problem cannot be
/// taken out without changing what the others say. A list's element is not removed
/// (the elements after it would be named by the wrong index), nor a table that lacks
/// a field; a missing field found once another was taken out may be that one, and is
/// not reported.
fn shape_problems(
    first: serde_path_to_error::Error<config::ConfigError>,
    mut value: config::Value,
    overrides: &[Override],
) -> Vec<Problem> {
    let mut found = Vec::new();
    let mut next = Some(first);
    while let Some(e) = next.take() {
        let message = shape_message(e.inner());
        let missing = message.starts_with("missing field");
        if missing && !found.is_empty() {
            break;
        }
        if found.len() == MAX_SHAPE_PROBLEMS {
            found.push(Problem::new(
                "",
                format!(
                    "more problems of shape follow: the first {MAX_SHAPE_PROBLEMS} are reported"
                ),
            ));
            break;
        }
        found.push(shape_problem(error_location(e.path()), message, overrides));
        if missing || !take_out(&mut value, e.path()) {
            break;
        }
        next = serde_path_to_error::deserialize::<_, RawConfig>(value.clone()).err();
    }
    found
}

/// Where the file writes a number or a boolean as a string (`base_limit = "300"`,
/// `"lots"`, `"1e400"`): a problem for each, in the file's order, naming the field,
/// what it takes and, where the text is one, how to write it; and `merged` with each
/// such string replaced by a value of its field's type, to be read for the file's other
/// problems of shape. The fields that take a number read it from text too, for the
/// environment's overrides, whose values are text (`ROCGATE__ROUTES__0__BASE_LIMIT=300`,
/// still taken); TOML has numbers and booleans, as a runtime change's JSON has, which
/// refuses them as text too. Each string of the file (its origin is not the
/// environment) is tried in its field's place as a table, on a tree of its path alone
/// (so that the file's other problems do not hide it): where the field then refuses it
/// as not a number, a whole number or a boolean, it takes one (`name = "300"` is a
/// string's field, and stays).
fn file_text_for_values(merged: &config::Value) -> (Vec<Problem>, config::Value) {
    // The strings the file wrote (not the environment), each with its path.
    let mut texts = Vec::new();
    walk(merged, &mut Vec::new(), &mut |at, v| match &v.kind {
        config::ValueKind::String(text) if v.origin().is_none() => {
            texts.push((at.to_vec(), text.clone()))
        }
        _ => {}
    });
    // What each field takes, by its path with the indices left out (`routes[].name`):
    // a field takes the same in every element of a list, so a file of many routes is
    // tried once per field, not once per route.
    let mut takes_by_field: HashMap<String, Option<&str>> = HashMap::new();
    let mut found = Vec::new();
    let mut cleaned = merged.clone();
    for (at, text) in texts {
        let field = at
            .iter()
            .map(|step| match step {
                Step::Key(key) => format!(".{}", key_text(key)),
                Step::Index(_) => "[]".to_owned(),
            })
            .collect::<String>();
        let takes = *takes_by_field
            .entry(field)
            .or_insert_with(|| field_takes(&at));
        let Some(takes) = takes else {
            continue;
        };
        let (bare, stand_in) = match takes {
            TAKES_BOOL => {
                let t = text.trim_ascii();
                let bare = (t == "true" || t == "false").then_some(t);
                (bare, config::ValueKind::Boolean(false))
            }
            TAKES_NUMBER => (bare_number(&text, false), config::ValueKind::Float(1.0)),
            _ => (bare_number(&text, true), config::ValueKind::U64(1)),
        };
        if let Some(leaf) = leaf_at(&mut cleaned, &at) {
            leaf.kind = stand_in;
        }
        found.push(Problem::new(
            path_text(&at),
            text_refusal(&text, bare, &takes),
        ));
    }
    (found, cleaned)
}

/// What a field takes that a string of the file is not, as its refusal names it.
const TAKES_NUMBER: &str = "a number";
/// See [`TAKES_NUMBER`].
const TAKES_WHOLE: &str = "a whole number ≥ 0";
/// See [`TAKES_NUMBER`].
const TAKES_BOOL: &str = "true or false";

/// What the field at `at` takes, where it is a number, a whole number or a boolean:
/// a tree of that path alone, with a table at its end, is read, and the field's
/// refusal of the table names it. Any other problem of that tree (a table that lacks a
/// field) comes after the refusal, which the path of the error tells apart.
fn field_takes(at: &[Step]) -> Option<&'static str> {
    let mut tree = config::Value::new(None, config::ValueKind::Table(config::Map::new()));
    for step in at.iter().rev() {
        tree = match step {
            Step::Key(key) => {
                let mut table = config::Map::new();
                table.insert(key.clone(), tree);
                config::Value::new(None, config::ValueKind::Table(table))
            }
            Step::Index(_) => config::Value::new(None, config::ValueKind::Array(vec![tree])),
        };
    }
    let first: Vec<Step> = at
        .iter()
        .map(|step| match step {
            Step::Index(_) => Step::Index(0),
            key => key.clone(),
        })
        .collect();
    let e = serde_path_to_error::deserialize::<_, RawConfig>(tree).err()?;
    let message = shape_message(e.inner());
    [TAKES_NUMBER, TAKES_WHOLE, TAKES_BOOL]
        .into_iter()
        .find(|takes| message.ends_with(&format!("expected {takes}")))
        .filter(|_| error_location(e.path()) == path_text(&first))
}

/// `problems`, of the file's shape, in the order of their locations in `merged` (a
/// location that names no value of it by the value above it; one of none, last), at
/// most [`MAX_SHAPE_PROBLEMS`] of them, then a line saying more follow where more do.
fn in_file_order(merged: &config::Value, mut problems: Vec<Problem>) -> Vec<Problem> {
    let more = |p: &Problem| p.location().is_empty() && p.message().starts_with("more problems");
    let cut = problems.iter().any(more);
    problems.retain(|p| !more(p));
    let mut order = HashMap::new();
    let mut paths = Vec::new();
    walk(merged, &mut Vec::new(), &mut |at, _| {
        paths.push(path_text(at))
    });
    for (i, path) in paths.into_iter().enumerate() {
        order.entry(path).or_insert(i);
    }
    problems.sort_by_key(|p| {
        let mut at = p.location();
        loop {
            if let Some(&i) = order.get(at) {
                return i;
            }
            match at.rfind(['.', '[']) {
                Some(end) if end > 0 => at = &at[..end],
                _ => return usize::MAX,
            }
        }
    });
    if cut || problems.len() > MAX_SHAPE_PROBLEMS {
        problems.truncate(MAX_SHAPE_PROBLEMS);
        problems.push(Problem::new(
            "",
            format!("more problems of shape follow: the first {MAX_SHAPE_PROBLEMS} are reported"),
        ));
    }
    problems
}

/// Calls `visit` on every value under `value` (`value` first), with its path, in the
/// file's order.
fn walk(
    value: &config::Value,
    at: &mut Vec<Step>,
    visit: &mut impl FnMut(&[Step], &config::Value),
) {
    visit(at, value);
    match &value.kind {
        config::ValueKind::Table(table) => {
            for (key, v) in table {
                at.push(Step::Key(key.clone()));
                walk(v, at, visit);
                at.pop();
            }
        }
        config::ValueKind::Array(list) => {
            for (i, v) in list.iter().enumerate() {
                at.push(Step::Index(i));
                walk(v, at, visit);
                at.pop();
            }
        }
        _ => {}
    }
}

/// A step of the path to a value in a `config` tree.
#[derive(Clone)]
enum Step {
    Key(String),
    Index(usize),
}

/// The path `steps` as a problem's location names it (`routes[0].base_limit`), as
/// [`error_location`] does.
fn path_text(steps: &[Step]) -> String {
    let mut out = String::new();
    for step in steps {
        match step {
            Step::Index(i) => out.push_str(&format!("[{i}]")),
            Step::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&key_text(key));
            }
        }
    }
    out
}

/// The value at `steps` in `value`, if there is one.
fn leaf_at<'a>(value: &'a mut config::Value, steps: &[Step]) -> Option<&'a mut config::Value> {
    let mut at = value;
    for step in steps {
        at = match (step, &mut at.kind) {
            (Step::Key(key), config::ValueKind::Table(table)) => table.get_mut(key)?,
            (Step::Index(i), config::ValueKind::Array(list)) => list.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(at)
}

/// Removes the field at `path` from `value`; false where the path ends at a list's
/// element, names nothing, or goes through what is no table or list.
fn take_out(value: &mut config::Value, path: &serde_path_to_error::Path) -> bool {
    use serde_path_to_error::Segment;
    let segments: Vec<&Segment> = path.iter().collect();
    let Some((Segment::Map { key }, above)) = segments.split_last() else {
        return false;
    };
    let mut at = value;
    for segment in above {
        at = match (segment, &mut at.kind) {
            (Segment::Map { key }, config::ValueKind::Table(table)) => match table.get_mut(key) {
                Some(v) => v,
                None => return false,
            },
            (Segment::Seq { index }, config::ValueKind::Array(list)) => {
                match list.get_mut(*index) {
                    Some(v) => v,
                    None => return false,
                }
            }
            _ => return false,
        };
    }
    match &mut at.kind {
        config::ValueKind::Table(table) => table.shift_remove(key).is_some(),
        _ => false,
    }
}

/// The problem of shape `message` at `location`, naming the environment variable that
/// set the field there or one below it.
fn shape_problem(location: String, message: String, overrides: &[Override]) -> Problem {
    // A shape error is found at the first table or field that is wrong, which may lie
    // above the field a variable set (`base_limit` for ROCGATE__BASE_LIMIT__DEFAULTS,
    // an unknown field there).
    let mut problem = Problem::new(location, message);
    let under = |o: &&Override| {
        !problem.location.is_empty()
            && o.path
                .strip_prefix(&problem.location)
                .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
    };
    let set = overrides
        .iter()
        .find(|o| lies_within(&problem.location, &o.path))
        .or_else(|| overrides.iter().find(under));
    if let Some(o) = set {
        problem.message = format!(
            "{} (set by environment variable {})",
            problem.message, o.var
        );
    }
    problem
}

/// How errors in the embedded default configuration name it.
const EMBEDDED_ORIGIN: &str = "config/rocgate.toml (built in)";

/// [`Config::from_toml_str_with_env`] with the process environment, whose overrides
/// that are not UTF-8 text are refused too.
fn with_process_env(text: &str, origin: &str) -> Result<Config, ConfigError> {
    let (env, mut problems) = process_env();
    let loaded = Config::from_toml_str_with_env(text, origin, env);
    if problems.is_empty() {
        return loaded;
    }
    if let Err(e) = loaded {
        problems.extend(e.problems);
    }
    Err(ConfigError::new(origin, problems))
}

/// The process environment as `(name, value)` text, and a problem for each override
/// whose value is not UTF-8: read with its bytes replaced (`\u{FFFD}`), it would set a
/// value nobody wrote, an admin token among them.
fn process_env() -> (Vec<(String, String)>, Vec<Problem>) {
    let (mut env, mut problems) = (Vec::new(), Vec::new());
    for (name, value) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        match value.into_string() {
            Ok(value) => env.push((name, value)),
            Err(_) => {
                if let Some(o) = Override::parse(name) {
                    problems.push(Problem::new(
                        o.shown_path(),
                        format!(
                            "not UTF-8 text (set by environment variable {})",
                            o.shown_var()
                        ),
                    ));
                }
            }
        }
    }
    (env, problems)
}

/// A `ROCGATE__…` variable's name as an error or a note shows it: its control
/// characters escaped (`ROCGATE__X\u{1b}[2J`: they acted on the terminal, or split a
/// line), and a name longer than 256 bytes, far past any field path's, as its first 64
/// characters and its length (a 100 KiB name was written whole).
///
/// ```
/// use rocgate::config::env_name_shown;
///
/// assert_eq!(env_name_shown("ROCGATE__X\u{1b}[2J"), "ROCGATE__X\\u{1b}[2J");
/// let long = format!("ROCGATE__{}", "A".repeat(300));
/// assert_eq!(env_name_shown(&long), format!("{}… (309 bytes)", &long[..64]));
/// ```
pub fn env_name_shown(name: &str) -> String {
    let shown = escaped(name, char::is_control);
    if name.len() > LONGEST_ENV_NAME {
        quoted(&shown).to_string()
    } else {
        shown.into_owned()
    }
}

/// One `ROCGATE__…` variable: its name and the field path it sets.
struct Override {
    var: String,
    /// The field path as written in errors: `routes[0].events[1].hold`.
    path: String,
}

impl Override {
    /// The override a variable stands for, if it has the prefix.
    fn parse(var: String) -> Option<Override> {
        let lower = var.to_ascii_lowercase();
        let prefix = format!("{}{ENV_SEPARATOR}", ENV_PREFIX.to_ascii_lowercase());
        // `ROCGATE__` alone is an override of no field: refused as not a field path.
        let rest = lower.strip_prefix(&prefix)?;
        let mut path = String::new();
        for part in rest.split(ENV_SEPARATOR) {
            if !path.is_empty() && !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
                // `00` is index 0; an index beyond usize stays as written (no such table).
                match part.parse::<usize>() {
                    Ok(index) => path.push_str(&format!("[{index}]")),
                    Err(_) => path.push_str(&format!("[{part}]")),
                }
            } else {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(part);
            }
        }
        Some(Override { var, path })
    }

    /// The variable's name as a problem shows it ([`env_name_shown`]). Only a name that
    /// may not be a field path needs it: a field path's prints as it is.
    fn shown_var(&self) -> String {
        env_name_shown(&self.var)
    }

    /// The field path as a problem's location shows it, as [`env_name_shown`] shows the
    /// name: its control characters escaped, and bounded when the name is longer than
    /// [`LONGEST_ENV_NAME`] (a 100 KiB name was written whole, twice).
    fn shown_path(&self) -> String {
        let path = escaped(&self.path, char::is_control);
        if self.var.len() > LONGEST_ENV_NAME {
            quoted(&path).to_string()
        } else {
            path.into_owned()
        }
    }

    /// The variable's value as a problem quotes it: a store's URL (`store.url`, each
    /// of `store.cluster_nodes`, comma-separated as [`node_urls`] cuts them) and the
    /// upstream's (`server.upstream`, refused with user info, and masked where that
    /// refusal quotes it) with the password masked ([`masked_url`]), the admin token
    /// as `***`, any other value as it is.
    fn shown_value<'a>(&self, value: &'a str) -> Cow<'a, str> {
        match self.path.as_str() {
            "admin.token" => Cow::Borrowed("***"),
            "store.url" | "server.upstream" => masked_url(value),
            "store.cluster_nodes" => Cow::Owned(
                node_urls(value)
                    .into_iter()
                    .map(masked_url)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            _ => Cow::Borrowed(value),
        }
    }

    /// Whether the name is a field path: field names (`a-z 0-9 _`) and indices between
    /// the separators, none empty. Anything else (`-1`, a `.`, an empty part) the
    /// `config` crate would read as some other path.
    fn is_field_path(&self) -> bool {
        let lower = self.var.to_ascii_lowercase();
        let rest = lower
            .strip_prefix(&format!(
                "{}{ENV_SEPARATOR}",
                ENV_PREFIX.to_ascii_lowercase()
            ))
            .unwrap_or_default();
        rest.split(ENV_SEPARATOR).all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
    }

    /// The key to give `config::Environment`, whose separator turns it back into the
    /// path (an index stays an index: `ROCGATE__routes[0]__base_limit`).
    fn config_key(&self) -> String {
        format!(
            "{ENV_PREFIX}{ENV_SEPARATOR}{}",
            self.path.replace('.', ENV_SEPARATOR)
        )
    }

    /// Where the path names an element of a list of tables (`routes`, a route's
    /// `events` or `tiers`) rather than give its index (`routes.order` for
    /// `ROCGATE__ROUTES__ORDER__HOLD`): the path up to that name, the list's, and the
    /// variable's name up to the list followed by the index it takes
    /// (`ROCGATE__ROUTES__0__…`). `config` read the name as a table's field, and the
    /// list as a table, which was refused as ``routes: invalid type: map``.
    fn unindexed_list(&self) -> Option<(String, String, String)> {
        let parts: Vec<&str> = self.path.split('.').collect();
        let list_at = (0..parts.len().saturating_sub(1)).find(|&i| {
            let (name, above) = (parts[i], &parts[..i]);
            match above {
                [] => name == "routes",
                [route] => route.starts_with("routes[") && (name == "events" || name == "tiers"),
                _ => false,
            }
        })?;
        let list = parts[..=list_at].join(".");
        let named = parts[..=list_at + 1].join(".");
        // The variable's own parts up to the list: `ROCGATE`, then one a path part
        // (`routes[0]` was two, `ROUTES__0`).
        let var_parts: Vec<&str> = self.var.split(ENV_SEPARATOR).collect();
        let upto = 1 + list
            .split('.')
            .map(|p| 1 + p.matches('[').count())
            .sum::<usize>();
        let indexed = format!(
            "{}{ENV_SEPARATOR}0{ENV_SEPARATOR}…",
            var_parts.get(..upto)?.join(ENV_SEPARATOR)
        );
        Some((named, list, indexed))
    }

    /// The first index on the path that does not follow `routes`, `events` or `tiers`
    /// (`server.trusted_proxies[0]`), up to it, if any: those are the arrays of tables,
    /// and an index elsewhere replaced an element of a list of values, which the
    /// environment sets whole if at all (a variable widened the file's trusted proxies).
    fn list_element(&self) -> Option<&str> {
        const ARRAYS_OF_TABLES: [&str; 3] = ["routes", "events", "tiers"];
        self.path.match_indices('[').find_map(|(at, _)| {
            let name = self.path[..at].rsplit('.').next().unwrap_or_default();
            let end = at + self.path[at..].find(']')?;
            (!ARRAYS_OF_TABLES.contains(&name)).then(|| &self.path[..=end])
        })
    }

    /// Where the path names an element of a list the environment sets whole
    /// ([`TEXT_LISTS`]: `server.trusted_proxies[0]`), the variable that sets it, as this
    /// one spells it (`ROCGATE__SERVER__TRUSTED_PROXIES`).
    fn whole_list_var(&self) -> Option<String> {
        let list = &self.path[..self.path.find('[')?];
        TEXT_LISTS.contains(&list).then(|| {
            let parts = 1 + list.split('.').count();
            self.var
                .split(ENV_SEPARATOR)
                .take(parts)
                .collect::<Vec<_>>()
                .join(ENV_SEPARATOR)
        })
    }

    /// The first indexed table on the path that the file does not have, if any.
    fn missing_element(&self, file: &config::Config) -> Option<String> {
        self.path
            .match_indices(']')
            .map(|(end, _)| &self.path[..=end])
            .find(|element| file.get::<config::Value>(element).is_err())
            .map(str::to_owned)
    }
}

/// Appends, to each problem in a value set from the environment, the variable that set it.
///
/// A problem between two fields is reported at one of them (`routes[0].cut_limit: must
/// be ≤ base_limit (50)`); when a variable set the other one, the field the message
/// names, in the problem's table, a table above it or `[defaults]` (which every route
/// inherits), the problem says so: `(base_limit set by environment variable …)`, after
/// the variable that set the field it is reported at, if one did. So does a problem
/// at a route's field that the route inherits from `[defaults]`, where a variable set
/// it (`(defaults.mode set by …)`); and one whose message names, in another table, the
/// field a variable set in full (`duplicate of routes[0].name`, `the port of
/// server.listen`) or that table and the field (`routes[0] ("all") comes first and
/// its path_prefix …`), or a field the problem gives as one of its causes (the start
/// and duration of the event another overlaps).
fn attribute(
    problems: Vec<Problem>,
    overrides: &[Override],
    file: &config::Config,
) -> Vec<Problem> {
    problems
        .into_iter()
        .map(|mut problem| {
            let within = |path: &str| lies_within(&problem.location, path);
            let at = overrides.iter().find(|o| within(&o.path));
            let inherited = match at {
                None => inherited_from(&problem.location, overrides, file),
                Some(_) => None,
            };
            let message = &problem.message;
            let named = overrides
                .iter()
                .filter(|o| ![at, inherited].iter().flatten().any(|a| a.var == o.var))
                .filter_map(|o| {
                    if problem.causes.contains(&o.path) {
                        return Some(format!("{} set by environment variable {}", o.path, o.var));
                    }
                    let (table, field) = o.path.rsplit_once('.')?;
                    let inherited = table == "defaults" || within(table);
                    if inherited && names_field(message, field) {
                        Some(format!("{field} set by environment variable {}", o.var))
                    } else if names_field(message, &o.path)
                        || (names_field(message, table) && names_field(message, field))
                    {
                        Some(format!("{} set by environment variable {}", o.path, o.var))
                    } else {
                        None
                    }
                });
            let parts: Vec<String> = at
                .map(|o| format!("set by environment variable {}", o.var))
                .into_iter()
                .chain(
                    inherited.map(|o| format!("{} set by environment variable {}", o.path, o.var)),
                )
                .chain(named)
                .collect();
            if !parts.is_empty() {
                problem.message = format!("{} ({})", problem.message, parts.join("; "));
            }
            problem
        })
        .collect()
}

/// The variable that set `[defaults]`' value of the route's field at `location`
/// (`routes[0].mode`), if the route does not set that field in the file: the route
/// took its value from there.
fn inherited_from<'a>(
    location: &str,
    overrides: &'a [Override],
    file: &config::Config,
) -> Option<&'a Override> {
    let (route, field) = location.split_once('.')?;
    if !route.starts_with("routes[") || field.contains(['.', '[']) {
        return None;
    }
    if file.get::<config::Value>(location).is_ok() {
        return None;
    }
    let path = format!("defaults.{field}");
    overrides.iter().find(|o| o.path == path)
}

/// Whether the field at `location` is the one at `path` or lies in it.
fn lies_within(location: &str, path: &str) -> bool {
    location
        .strip_prefix(path)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.') || rest.starts_with('['))
}

/// Whether `message` names `field` as a word of its own (`base_limit`, not
/// `base_limit_x` or `my_base_limit`).
fn names_field(message: &str, field: &str) -> bool {
    let part_of_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    message.match_indices(field).any(|(at, _)| {
        let before = message[..at].chars().next_back();
        let after = message[at + field.len()..].chars().next();
        !before.is_some_and(part_of_name) && !after.is_some_and(part_of_name)
    })
}

/// The problem for a file the TOML parser refused, at its line and column.
fn syntax_problem(text: &str, error: &config::ConfigError) -> Problem {
    let cause = match error {
        config::ConfigError::FileParse { cause, .. } => cause,
        other => return Problem::new("", other.to_string()),
    };
    let Some(e) = cause.downcast_ref::<toml::de::Error>() else {
        // A value the parser accepted but could not convert, such as an integer
        // beyond 64 bits: the `config` crate gives no position for these, so the
        // value is looked for.
        return match out_of_range_number(text) {
            Some((field, at)) => Problem::new(
                field,
                format!("number out of range at {}: {cause}", position(text, at)),
            ),
            None => Problem::new("", format!("invalid TOML: {cause}")),
        };
    };
    let message = e.message().lines().collect::<Vec<_>>().join("; ");
    let Some(span) = e.span() else {
        // A key of more than 80 parts is refused with no position: it was the file
        // alone, "recursion limit".
        return match first_line_refused(text, e.message()) {
            Some(line) if e.message() == "recursion limit" => Problem::new(
                format!("line {line}"),
                format!(
                    "{message}: a key of more than 80 parts (a.b.c…, a table's header too) \
                     is more than the TOML parser reads"
                ),
            ),
            Some(line) => Problem::new(format!("line {line}"), message),
            None => Problem::new("", message),
        };
    };
    Problem::new(position(text, span.start), message)
}

/// The first line of `text` by which the TOML parser refuses it with `message` and no
/// position: the fewest leading lines it refuses so (a key once read stays refused
/// whatever follows it), found by bisection, a parse each step. Each step finds the end
/// of its lines afresh, a scan cheaper than its parse: a vector of every line's end
/// held 8 B a line, 15.7 MB beside the parse of a file of 1 MiB of blank lines.
fn first_line_refused(text: &str, message: &str) -> Option<usize> {
    let lines = text.split_inclusive('\n').count();
    let refused = |lines: usize| {
        let end = text
            .match_indices('\n')
            .nth(lines - 1)
            .map_or(text.len(), |(at, _)| at + 1);
        toml::de::DeTable::parse_recoverable(&text[..end])
            .1
            .iter()
            .any(|e| e.span().is_none() && e.message() == message)
    };
    if lines == 0 || !refused(lines) {
        return None;
    }
    let (mut fine, mut refusing) = (0, lines);
    while refusing - fine > 1 {
        let mid = fine + (refusing - fine) / 2;
        if refused(mid) {
            refusing = mid;
        } else {
            fine = mid;
        }
    }
    Some(refusing)
}

/// `line L, column C` of the byte offset `at` in `text`.
fn position(text: &str, at: usize) -> String {
    let before = text.get(..at.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    format!("line {line}, column {column}")
}

/// The first number in `text` that TOML reads but 64 bits cannot hold (an integer
/// beyond `i64`, a float that overflows to infinity), as the `config` crate converts
/// them: its field path (`routes[0].base_limit`) and byte offset.
fn out_of_range_number(text: &str) -> Option<(String, usize)> {
    use toml::de::DeValue;
    let (field, at, _) = first_number(text, &|value| match value {
        DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix()).is_err(),
        DeValue::Float(f) => f
            .as_str()
            .parse::<f64>()
            .map_or(true, |x| x.is_infinite() && !f.as_str().contains("inf")),
        _ => false,
    })?;
    Some((field, at))
}

/// The problem of the first float in `file`'s `text` written not 0 but nearer 0 than
/// any number held (`1e-400`), which TOML reads as 0 ([`written_not_0`]): it was taken
/// as 0, or refused as `got 0`, a 0 nobody wrote. The text is read again only where
/// the file (`file`, read from it) holds a float 0.
fn float_read_as_0(text: &str, file: &config::Value) -> Option<Problem> {
    use toml::de::DeValue;
    let mut zero = false;
    walk(file, &mut Vec::new(), &mut |_, v| {
        zero |= matches!(v.kind, config::ValueKind::Float(x) if x == 0.0)
    });
    if !zero {
        return None;
    }
    let (field, at, written) = first_number(text, &|value| match value {
        DeValue::Float(f) => {
            let digits = f.as_str();
            digits
                .parse::<f64>()
                .is_ok_and(|x| written_not_0(digits, x))
        }
        _ => false,
    })?;
    Some(Problem::new(
        field,
        format!(
            "number out of range at {}, got {written}: {NEARER_0}",
            position(text, at)
        ),
    ))
}

/// The first number of `text`, a TOML file, that `refused` refuses: its field path
/// (`routes[0].base_limit`), byte offset and text as written (the parser's own is
/// without underscores).
fn first_number(
    text: &str,
    refused: &dyn Fn(&toml::de::DeValue<'_>) -> bool,
) -> Option<(String, usize, String)> {
    use toml::de::{DeTable, DeValue};
    use toml::Spanned;

    type Found = Option<(String, std::ops::Range<usize>)>;
    fn in_value(
        path: String,
        value: &Spanned<DeValue<'_>>,
        refused: &dyn Fn(&DeValue<'_>) -> bool,
    ) -> Found {
        match value.get_ref() {
            DeValue::Table(table) => in_table(&format!("{path}."), table, refused),
            DeValue::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, item)| in_value(format!("{path}[{i}]"), item, refused)),
            number @ (DeValue::Integer(_) | DeValue::Float(_)) => {
                refused(number).then(|| (path, value.span()))
            }
            DeValue::String(_) | DeValue::Boolean(_) | DeValue::Datetime(_) => None,
        }
    }
    fn in_table(
        prefix: &str,
        table: &DeTable<'_>,
        refused: &dyn Fn(&DeValue<'_>) -> bool,
    ) -> Found {
        table.iter().find_map(|(key, value)| {
            in_value(
                format!("{prefix}{}", key_text(key.get_ref())),
                value,
                refused,
            )
        })
    }
    let (field, span) = in_table("", DeTable::parse(text).ok()?.get_ref(), refused)?;
    let written = text.get(span.clone()).unwrap_or_default().to_owned();
    Some((field, span.start, written))
}

/// Whether the file's `[admin] token` is a TOML date-time, which the `config` crate
/// reads as the text it writes for it (`1979-05-27 07:32:00Z` as
/// `1979-05-27T07:32:00Z`), where a number or a boolean is refused by its type. The
/// file is parsed again only where the token reads as a date-time.
fn token_is_datetime(text: &str, file: &config::Config) -> bool {
    use toml::de::{DeTable, DeValue};
    let Ok(token) = file.get_string("admin.token") else {
        return false;
    };
    if !DeValue::parse(&token).is_ok_and(|v| matches!(v.get_ref(), DeValue::Datetime(_))) {
        return false;
    }
    DeTable::parse(text).is_ok_and(|table| {
        let admin = table.get_ref().get("admin").map(|a| a.get_ref());
        let token = match admin {
            Some(DeValue::Table(admin)) => admin.get("token").map(|t| t.get_ref()),
            _ => None,
        };
        matches!(token, Some(DeValue::Datetime(_)))
    })
}

/// A deserialization error's message without the key and origin the `config` crate
/// appends (the location is reported separately, and more precisely).
fn shape_message(error: &config::ConfigError) -> String {
    match error {
        config::ConfigError::At { error, .. } => shape_message(error),
        // Either quotes a value or a key as written (`string "…"`, unknown field
        // `…`): bounded as a value is.
        config::ConfigError::Type {
            unexpected,
            expected,
            ..
        } => one_line(tables_named(quotes_bounded(&format!(
            "invalid type: {unexpected}, expected {expected}"
        )))),
        other => one_line(tables_named(quotes_bounded(&other.to_string()))),
    }
}

/// `message` with the names of the file's tables in the code (`struct RawRoute`) said
/// as the file has them: `a table`.
fn tables_named(message: String) -> String {
    const CODE: &str = "struct Raw";
    let mut out = String::with_capacity(message.len());
    let mut rest = message.as_str();
    while let Some(at) = rest.find(CODE) {
        out.push_str(&rest[..at]);
        out.push_str("a table");
        rest = rest[at + CODE.len()..].trim_start_matches(|c: char| c.is_ascii_alphanumeric());
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Mode, Partition, PathPattern};
    use crate::controller::ControllerParams;
    use crate::limiter::Algorithm;
    use crate::window::WindowSpec;
    use std::time::Duration;

    const ROUTE: &str = "[[routes]]\nname = \"order\"\npath = \"/api/order\"\n";

    fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        vars.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn error(text: &str, vars: &[(&str, &str)]) -> String {
        Config::from_toml_str_with_env(text, "t.toml", env(vars))
            .expect_err("the config is invalid")
            .to_string()
    }

    #[test]
    fn the_embedded_default_is_valid_and_classic() {
        let c = Config::embedded_default();
        let order = &c.routes[0];
        assert_eq!(order.name, "order");
        assert_eq!(order.matcher.method.as_deref(), Some("POST"));
        assert_eq!(order.matcher.path, PathPattern::Exact("/api/order".into()));
        assert_eq!(order.controller, ControllerParams::default());
        assert_eq!(order.window, WindowSpec::default());
        assert_eq!(order.algorithm, Algorithm::default());
        assert_eq!(order.mode, Mode::Enforce);
        assert_eq!(order.partition, Partition::Route);
        let names: Vec<&str> = c.routes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["order", "seckill", "default"]);
        let catch_all = &c.routes[2];
        assert_eq!(catch_all.matcher.path, PathPattern::Prefix("/".into()));
        assert!(catch_all.controller.base_limit_rps > order.controller.base_limit_rps);
    }

    /// A vertical tab (U+000B), whitespace that `trim_ascii` keeps, is refused in a
    /// duration as in every other value read from text: a number, an address and a
    /// time refused it, where a duration took it (`"5s\u{b}"` read as 5s, humantime
    /// reading it as a space).
    #[test]
    fn a_vertical_tab_is_refused_in_a_duration_as_in_any_value() {
        for (var, value, field) in [
            ("ROUTES__0__HOLD", "5s\u{b}", "routes[0].hold"),
            ("ROUTES__0__MAX_CUT", "1m\u{b}30s", "routes[0].max_cut"),
            ("ROUTES__0__BASE_LIMIT", "300\u{b}", "routes[0].base_limit"),
            ("SERVER__LISTEN", "127.0.0.1:8080\u{b}", "server.listen"),
        ] {
            let e = error(ROUTE, &[(&format!("ROCGATE__{var}"), value)]);
            assert!(e.starts_with(&format!("t.toml: {field}: ")), "{e}");
            assert!(e.contains("\\u{b}"), "{e}");
        }
        let file = format!("{ROUTE}hold = \"5s\\u000B\"\n");
        assert_eq!(
            error(&file, &[]),
            "t.toml: routes[0].hold: invalid duration \"5s\\u{b}\": holds U+000B, \
             whitespace other than a space, tab, line break or form feed"
        );
    }

    /// Whitespace other than ASCII's (a no-break space, U+2003, U+3000) around a value
    /// read from text (a duration, a number or `true` from the environment, an
    /// address, a network, an upstream, a store's URL, a time, a word of `[server]` or
    /// `[store]`) is no whitespace a value is read without: the
    /// value is refused naming its field, the character shown escaped. It was dropped
    /// silently (`"5s\u{a0}"` read as 5s), as spaces and tabs still are.
    #[test]
    fn a_value_with_unicode_whitespace_around_it_is_refused() {
        let event = "[[routes.events]]\nname = \"e\"\nduration = \"1h\"\n";
        let tier = "[[routes.tiers]]\nname = \"t\"\nbase_limit = 5\ncut_limit = 2\n";
        let redis = "[store]\nbackend = \"redis\"\n";
        for (file, field, shown) in [
            (
                format!("{ROUTE}hold = \"5s\u{a0}\"\n"),
                "routes[0].hold",
                "5s\\u{a0}",
            ),
            (
                format!("{ROUTE}{event}start = \"\u{2003}2030-01-01T00:00:00Z\"\n"),
                "routes[0].events[0].start",
                "\\u{2003}2030",
            ),
            (
                format!("{ROUTE}[server]\nlisten = \"127.0.0.1:8080\u{3000}\"\n"),
                "server.listen",
                "8080\\u{3000}",
            ),
            (
                format!("{ROUTE}[server]\nupstream = \"http://127.0.0.1:9000\u{a0}\"\n"),
                "server.upstream",
                "9000\\u{a0}",
            ),
            (
                format!("{ROUTE}[server]\ntrusted_proxies = [\"10.0.0.0/8\u{a0}\"]\n"),
                "server.trusted_proxies[0]",
                "8\\u{a0}",
            ),
            (
                format!("{ROUTE}[server]\nproxy_protocol = \"off\u{2003}\"\n"),
                "server.proxy_protocol",
                "off\\u{2003}",
            ),
            (
                format!("{ROUTE}[server]\nclient_ip_header = \"forwarded\u{3000}\"\n"),
                "server.client_ip_header",
                "forwarded\\u{3000}",
            ),
            (
                format!("{ROUTE}partition = \"ip\"\n{tier}values = [\"10.0.0.1\u{a0}\"]\n"),
                "routes[0].tiers[0].values[0]",
                "1\\u{a0}",
            ),
            (
                format!("{ROUTE}[store]\nbackend = \"local\u{a0}\"\n"),
                "store.backend",
                "local\\u{a0}",
            ),
            (
                format!("{ROUTE}{redis}url = \"redis://127.0.0.1:6379\u{a0}\"\n"),
                "store.url",
                "6379\\u{a0}",
            ),
            (
                format!("{ROUTE}{redis}url = \"redis://127.0.0.1\"\nfail_mode = \"open\u{a0}\"\n"),
                "store.fail_mode",
                "open\\u{a0}",
            ),
            (
                format!("{ROUTE}{redis}url = \"redis://127.0.0.1\"\nmode = \"exact\u{a0}\"\n"),
                "store.mode",
                "exact\\u{a0}",
            ),
        ] {
            let e = error(&file, &[]);
            assert!(e.starts_with(&format!("t.toml: {field}: ")), "{e}");
            assert!(e.contains(shown), "{e}");
        }
        for (var, value, field, shown) in [
            (
                "ROUTES__0__HOLD",
                "\u{2003}5s",
                "routes[0].hold",
                "\\u{2003}5s",
            ),
            (
                "ROUTES__0__BASE_LIMIT",
                "300\u{a0}",
                "routes[0].base_limit",
                "300\\u{a0}",
            ),
            (
                "ROUTES__0__MIN_SAMPLES",
                "3\u{3000}",
                "routes[0].min_samples",
                "3\\u{3000}",
            ),
            (
                "SERVER__NORMALIZE_PATH",
                "true\u{a0}",
                "server.normalize_path",
                "true\\u{a0}",
            ),
        ] {
            let e = error(ROUTE, &[(&format!("ROCGATE__{var}"), value)]);
            assert!(e.starts_with(&format!("t.toml: {field}: ")), "{e}");
            assert!(e.contains(shown), "{e}");
            assert!(
                e.ends_with(&format!("(set by environment variable ROCGATE__{var})")),
                "{e}"
            );
        }
        let file = format!("{ROUTE}hold = \" 5s\t\"\n[server]\nlisten = \" 127.0.0.1:8080 \"\n");
        let env = env(&[("ROCGATE__ROUTES__0__BASE_LIMIT", " 300\t")]);
        let c = Config::from_toml_str_with_env(&file, "t.toml", env).unwrap();
        assert_eq!(c.routes[0].controller.hold, Duration::from_secs(5));
        assert_eq!(c.routes[0].controller.base_limit_rps, 300.0);
        assert_eq!(c.server.listen, "127.0.0.1:8080".parse().unwrap());
    }

    /// A number written not 0 but nearer 0 than any number held (`1e-400`), which
    /// reads as 0, is refused naming its field and the number as written, in the file
    /// and from the environment alike: it was taken as 0 where 0 is allowed
    /// (`min_rps`), or refused as `must be a number > 0, got 0`, a 0 nobody wrote. A
    /// 0 written so (`0e-400`, `0.0`) is 0, and a number as small as a number holds
    /// (`5e-324`) is taken.
    #[test]
    fn a_number_nearer_0_than_any_held_is_refused_as_written() {
        const WHY: &str =
            "nearer 0 than any number held, it would read as 0 (write 0 if 0 is meant)";
        for (var, value) in [
            ("MIN_RPS", "1e-400"),
            ("BASE_LIMIT", "-1E-400"),
            ("BASE_LIMIT", "1_0e-4_00"),
        ] {
            let e = error(ROUTE, &[(&format!("ROCGATE__ROUTES__0__{var}"), value)]);
            assert_eq!(
                e,
                format!(
                    "t.toml: routes[0].{}: number out of range, got {value:?}: {WHY} \
                     (set by environment variable ROCGATE__ROUTES__0__{var})",
                    var.to_lowercase()
                )
            );
        }
        assert_eq!(
            error(&format!("{ROUTE}min_rps = 1e-400\n"), &[]),
            format!("t.toml: routes[0].min_rps: number out of range at line 4, column 11, got 1e-400: {WHY}")
        );
        assert_eq!(
            error(&format!("{ROUTE}[[routes.tiers]]\nname = \"t\"\nvalues = [\"a\"]\nbase_limit = 0.000_1e-3_99\n"), &[]),
            format!("t.toml: routes[0].tiers[0].base_limit: number out of range at line 7, column 14, got 0.000_1e-3_99: {WHY}")
        );
        for (written, read) in [("0e-400", 0.0), ("0.0", 0.0), ("5e-324", 5e-324)] {
            let env = env(&[("ROCGATE__ROUTES__0__MIN_RPS", written)]);
            let c = Config::from_toml_str_with_env(ROUTE, "t.toml", env).unwrap();
            assert_eq!(c.routes[0].controller.min_rps, read, "{written}");
            let file = format!("{ROUTE}min_rps = {written}\n");
            let c = Config::from_toml_str(&file, "t.toml").unwrap();
            assert_eq!(c.routes[0].controller.min_rps, read, "{written}");
        }
    }

    /// A number from the environment takes TOML's underscores between digits
    /// (`1_000`, `2_5.0_5e1_0`), as the file does: it was refused, where the file took
    /// it. One anywhere else (`1__0`, `_1`, `1_`, `1_.5`, `1e_5`) is refused as TOML
    /// refuses it, saying where an underscore goes.
    #[test]
    fn an_env_number_takes_underscores_between_digits_as_toml_does() {
        let vars = env(&[
            ("ROCGATE__ROUTES__0__BASE_LIMIT", "1_000"),
            ("ROCGATE__ROUTES__0__CUT_LIMIT", "2_5.0_5e0_1"),
            ("ROCGATE__ROUTES__0__MIN_SAMPLES", "1_2"),
        ]);
        let c = Config::from_toml_str_with_env(ROUTE, "t.toml", vars).unwrap();
        let r = &c.routes[0].controller;
        assert_eq!(r.base_limit_rps, 1000.0);
        assert_eq!(r.cut_limit_rps, 250.5);
        assert_eq!(r.min_samples, 12);
        for (var, value, expected) in [
            ("BASE_LIMIT", "1__0", "a number"),
            ("BASE_LIMIT", "_1", "a number"),
            ("BASE_LIMIT", "1_", "a number"),
            ("BASE_LIMIT", "1_.5", "a number"),
            ("BASE_LIMIT", "1e_5", "a number"),
            ("MIN_SAMPLES", "1__2", "a whole number ≥ 0"),
        ] {
            let e = error(ROUTE, &[(&format!("ROCGATE__ROUTES__0__{var}"), value)]);
            assert_eq!(
                e,
                format!(
                    "t.toml: routes[0].{}: invalid value: string {value:?}, expected \
                     {expected} (an underscore goes between two digits, as in 1_000) \
                     (set by environment variable ROCGATE__ROUTES__0__{var})",
                    var.to_lowercase()
                )
            );
        }
    }

    #[test]
    fn env_overrides_defaults_routes_and_events() {
        let text = format!("{ROUTE}[[routes.events]]\nname = \"sale\"\nstart = \"2030-01-01T00:00:00Z\"\nduration = \"30m\"\n");
        let vars = env(&[
            ("ROCGATE__DEFAULTS__DANGER_ROC", "95"),
            ("rocgate__routes__0__base_limit", "300"),
            ("ROCGATE__ROUTES__0__EVENTS__0__HOLD", "5s"),
            ("ROCGATE__DEFAULTS__MODE", "shadow"),
            ("ROCGATE__DEFAULTS__CUT_LIMIT", ""),
            ("OTHER__DEFAULTS__BASE_LIMIT", "1"),
        ]);
        let c = Config::from_toml_str_with_env(&text, "t.toml", vars).unwrap();
        let r = &c.routes[0];
        assert_eq!(r.controller.danger_roc, 95.0);
        assert_eq!(r.controller.base_limit_rps, 300.0);
        assert_eq!(r.controller.cut_limit_rps, 60.0);
        assert_eq!(r.mode, Mode::Shadow);
        assert_eq!(r.events[0].controller.hold, Duration::from_secs(5));
        assert_eq!(r.events[0].controller.base_limit_rps, 300.0);
    }

    #[test]
    fn of_several_unknown_overrides_the_first_set_is_named_every_time() {
        // Found by fuzzing (fuzz/fuzz_targets/config.rs): the overrides went to the
        // config crate in a hash map's order, so the variable named changed from one
        // load to the next.
        let vars = [
            ("ROCGATE__ZULU", "1"),
            ("ROCGATE__YANKEE", "1"),
            ("ROCGATE__XRAY", "1"),
            ("ROCGATE__WHISKEY", "1"),
            ("ROCGATE__VICTOR", "1"),
            ("ROCGATE__DEFAULTS__UNIFORM", "1"),
        ];
        let first = error(ROUTE, &vars);
        // Each is reported, in the order the variables came, naming its variable.
        let lines: Vec<&str> = first.lines().collect();
        assert_eq!(lines.len(), vars.len(), "{first}");
        for (line, (var, _)) in lines.iter().zip(&vars) {
            let field = var.rsplit("__").next().unwrap().to_lowercase();
            assert!(
                line.contains(&format!(": unknown field `{field}`")),
                "{first}"
            );
            assert!(
                line.ends_with(&format!("(set by environment variable {var})")),
                "{first}"
            );
        }
        assert!(
            first.starts_with("t.toml: zulu: unknown field `zulu`"),
            "{first}"
        );
        for _ in 0..32 {
            assert_eq!(error(ROUTE, &vars), first);
        }
    }

    /// A key longer than a value is quoted by is named whole in the field path: the
    /// path locates the problem, and a variable that set it is found by it.
    #[test]
    fn a_long_key_keeps_its_whole_path_and_its_variable() {
        let field = "a".repeat(70);
        let var = format!("ROCGATE__DEFAULTS__{}", field.to_uppercase());
        let e = error(ROUTE, &[(&var, "1")]);
        assert!(
            e.starts_with(&format!("t.toml: defaults.{field}: unknown field")),
            "{e}"
        );
        assert!(
            e.ends_with(&format!("(set by environment variable {var})")),
            "{e}"
        );
        let key = format!("{field}.b");
        let e = error(&format!("{ROUTE}\"{key}\" = 1\n"), &[]);
        assert!(
            e.starts_with(&format!("t.toml: routes[0].\"{key}\": unknown field")),
            "{e}"
        );
    }

    #[test]
    fn env_problems_name_the_variable() {
        let e = error(ROUTE, &[("ROCGATE__DEFAULTS__HOLD", "soon")]);
        assert!(
            e.starts_with("t.toml: defaults.hold: invalid duration \"soon\""),
            "{e}"
        );
        assert!(
            e.ends_with("(set by environment variable ROCGATE__DEFAULTS__HOLD)"),
            "{e}"
        );
        let e = error(ROUTE, &[("ROCGATE__ROUTES__3__BASE_LIMIT", "5")]);
        assert_eq!(
            e,
            "t.toml: routes[3]: no such table in the file (set by environment variable ROCGATE__ROUTES__3__BASE_LIMIT)"
        );
        let e = error(ROUTE, &[("ROCGATE__DEFAULTS__DANGER", "5")]);
        assert!(
            e.starts_with("t.toml: defaults.danger: unknown field"),
            "{e}"
        );
        assert!(e.contains("ROCGATE__DEFAULTS__DANGER)"), "{e}");
        let e = error(ROUTE, &[("ROCGATE__ROUTES__0__CUT_LIMIT", "500")]);
        assert!(
            e.starts_with(
                "t.toml: routes[0].cut_limit: must be ≤ base_limit (200), got 500 (set by"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_problem_with_a_field_set_by_a_variable_names_it() {
        let file = "[[routes]]\nname = \"order\"\npath = \"/api/order\"\ncut_limit = 60\n";
        let e = error(file, &[("ROCGATE__ROUTES__0__BASE_LIMIT", "50")]);
        assert!(
            e.ends_with("(base_limit set by environment variable ROCGATE__ROUTES__0__BASE_LIMIT)"),
            "{e}"
        );
        // `[defaults]` feeds every route: the route's problem names the variable too.
        let e = error(file, &[("ROCGATE__DEFAULTS__BASE_LIMIT", "50")]);
        assert!(
            e.ends_with("(base_limit set by environment variable ROCGATE__DEFAULTS__BASE_LIMIT)"),
            "{e}"
        );
        // A variable on another route, or on a field the message does not name, is not
        // the cause.
        let two = format!("{file}[[routes]]\nname = \"cart\"\npath = \"/api/cart\"\n");
        let e = error(
            &two,
            &[
                ("ROCGATE__ROUTES__0__BASE_LIMIT", "50"),
                ("ROCGATE__ROUTES__1__BASE_LIMIT", "150"),
                ("ROCGATE__ROUTES__0__HOLD", "5s"),
            ],
        );
        assert_eq!(e.matches("set by environment variable").count(), 1, "{e}");
        assert!(e.contains("ROCGATE__ROUTES__0__BASE_LIMIT)"), "{e}");
    }

    #[test]
    fn an_overlap_names_the_variable_that_set_the_other_events_start_or_duration() {
        let event = |start: &str| {
            format!("[[routes.events]]\nname = \"sale\"\nstart = \"{start}\"\nduration = \"30m\"\n")
        };
        let file = format!(
            "{ROUTE}{}{}",
            event("2030-01-01T00:00:00Z"),
            event("2030-01-01T01:00:00Z")
        );
        // The overlap is reported at the later event's start, but the variable made the
        // earlier one run into it: it went unnamed (helper-151).
        for (var, value) in [
            ("ROCGATE__ROUTES__0__EVENTS__0__DURATION", "2h"),
            (
                "ROCGATE__ROUTES__0__EVENTS__0__START",
                "2030-01-01T00:45:00Z",
            ),
        ] {
            let e = error(&file, &[(var, value)]);
            let field = var.rsplit("__").next().unwrap().to_lowercase();
            let said = format!("(routes[0].events[0].{field} set by environment variable {var})");
            assert!(
                e.contains("routes[0].events[1].start: overlaps routes[0].events[0]"),
                "{e}"
            );
            assert!(e.ends_with(&said), "{e}");
        }
        // The later event's own duration makes no overlap: its variable is not named.
        let e = error(
            &file,
            &[
                ("ROCGATE__ROUTES__0__EVENTS__0__DURATION", "2h"),
                ("ROCGATE__ROUTES__0__EVENTS__1__DURATION", "1h"),
            ],
        );
        assert_eq!(e.matches("set by environment variable").count(), 1, "{e}");
    }

    #[test]
    fn each_problem_of_shape_names_its_variable() {
        let file = format!("{ROUTE}colour = \"red\"\n");
        let e = error(&file, &[("ROCGATE__SERVER__FOO", "1")]);
        let lines: Vec<&str> = e.lines().collect();
        assert_eq!(lines.len(), 2, "{e}");
        assert!(
            lines[0].starts_with("t.toml: routes[0].colour: unknown field"),
            "{e}"
        );
        assert!(!lines[0].contains("environment variable"), "{e}");
        assert!(
            lines[1].starts_with("t.toml: server.foo: unknown field"),
            "{e}"
        );
        assert!(
            lines[1].ends_with("(set by environment variable ROCGATE__SERVER__FOO)"),
            "{e}"
        );
    }

    #[test]
    fn names_field_takes_whole_words_only() {
        assert!(names_field(
            "must be ≤ base_limit (50), got 60",
            "base_limit"
        ));
        assert!(names_field("base_limit", "base_limit"));
        assert!(!names_field("must be ≤ base_limit_x (50)", "base_limit"));
        assert!(!names_field("must be ≤ my_base_limit (50)", "base_limit"));
        assert!(!names_field("must be > 0", "hold"));
    }

    #[test]
    fn an_override_that_is_not_a_field_path_names_its_variable() {
        // Such names reached the `config` crate, which made `routes` a map ("routes:
        // invalid type: map", no variable named) or reported an unknown top-level field.
        for var in [
            "ROCGATE__ROUTES__-1__BASE_LIMIT",
            "ROCGATE__ROUTES__0.BASE_LIMIT",
            "ROCGATE__DEFAULTS____HOLD",
            "ROCGATE__DEFAULTS__HOLD__",
            "ROCGATE__DEFAULTS__HOLDſ",
        ] {
            let e = error(ROUTE, &[(var, "5")]);
            assert!(
                e.ends_with(&format!("(set by environment variable {var})")),
                "{e}"
            );
            assert!(e.contains("not a field path"), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }

    /// A variable's name is shown with its control characters escaped, in the path and
    /// where the variable is named, and a name longer than any field path's is refused
    /// as none, shown bounded: an escape sequence in a name went to the terminal to act
    /// on, a line break split the problem, and a 100 KiB name was written whole twice.
    #[test]
    fn a_variable_name_is_shown_escaped_and_bounded() {
        let e = error(ROUTE, &[("ROCGATE__SERVER__X\u{1b}[31mY", "1")]);
        assert_eq!(
            e,
            "t.toml: server.x\\u{1b}[31my: not a field path: each part between `__` must be \
             a field name (letters, digits, _) or an index (set by environment variable \
             ROCGATE__SERVER__X\\u{1b}[31mY)"
        );
        let e = error(ROUTE, &[("ROCGATE__SERVER__LISTEN\n", "1")]);
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(
            e.ends_with("(set by environment variable ROCGATE__SERVER__LISTEN\\n)"),
            "{e}"
        );
        let long = format!("ROCGATE__SERVER__{}", "A".repeat(100 << 10));
        let e = error(ROUTE, &[(&long, "1")]);
        let path = format!("server.{}", "a".repeat(100 << 10));
        assert_eq!(
            e,
            format!(
                "t.toml: {}… ({} bytes): not a field path: longer than {LONGEST_ENV_NAME} \
                 bytes, which no field's is (set by environment variable {}… ({} bytes))",
                &path[..64],
                path.len(),
                &long[..64],
                long.len(),
            )
        );
        // A name at the bound is a path like another, named whole.
        let at_bound = format!("ROCGATE__DEFAULTS__{}", "B".repeat(LONGEST_ENV_NAME - 19));
        assert_eq!(at_bound.len(), LONGEST_ENV_NAME);
        let e = error(ROUTE, &[(&at_bound, "1")]);
        assert!(
            e.contains("unknown field")
                && e.ends_with(&format!("(set by environment variable {at_bound})")),
            "{e}"
        );
    }

    #[test]
    fn an_index_with_leading_zeros_is_that_index() {
        let var = "ROCGATE__ROUTES__00__BASE_LIMIT";
        let e = error(ROUTE, &[(var, "5")]);
        assert!(
            e.ends_with(&format!("(set by environment variable {var})")),
            "{e}"
        );
        let c = Config::from_toml_str_with_env(ROUTE, "t.toml", env(&[(var, "300")])).unwrap();
        assert_eq!(c.routes[0].controller.base_limit_rps, 300.0);
    }

    #[test]
    fn a_field_set_by_two_variables_is_refused() {
        // Names are case-insensitive: one of the two values was dropped silently.
        let e = error(
            ROUTE,
            &[
                ("ROCGATE__DEFAULTS__HOLD", "5s"),
                ("rocgate__defaults__hold", "7s"),
            ],
        );
        assert_eq!(
            e,
            "t.toml: defaults.hold: set by two environment variables, \
             ROCGATE__DEFAULTS__HOLD (\"5s\") and rocgate__defaults__hold (\"7s\"): keep one"
        );
    }

    #[test]
    fn an_unknown_field_above_the_one_set_names_the_variable() {
        let e = error(ROUTE, &[("ROCGATE__BASE_LIMIT__DEFAULTS", "5")]);
        assert!(e.starts_with("t.toml: base_limit: unknown field"), "{e}");
        assert!(
            e.ends_with("(set by environment variable ROCGATE__BASE_LIMIT__DEFAULTS)"),
            "{e}"
        );
    }

    #[test]
    fn a_table_of_the_wrong_type_is_called_a_table() {
        let e = error(ROUTE, &[("ROCGATE__ROUTES__0", "x")]);
        assert!(
            e.starts_with("t.toml: routes[0]: invalid type: string \"x\", expected a table"),
            "{e}"
        );
        let e = error("routes = [\"x\"]\n", &[]);
        assert!(e.ends_with("expected a table"), "{e}");
    }

    #[test]
    fn syntax_errors_carry_line_and_column() {
        let e = error("[defaults]\nhold = \"2s\"\nslot = \n", &[]);
        assert!(e.starts_with("t.toml: line 3, column 8: "), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        let e = error("[defaults]\nhold = \"2s\"\nhold = \"3s\"\n", &[]);
        assert!(e.starts_with("t.toml: line 3, column 1: "), "{e}");
        assert!(e.contains("duplicate key"), "{e}");
    }

    #[test]
    fn an_unreadable_file_is_an_error_naming_it() {
        let e = Config::load(Path::new("/nonexistent/rocgate.toml")).unwrap_err();
        assert_eq!(e.origin(), "/nonexistent/rocgate.toml");
        assert!(e
            .to_string()
            .starts_with("/nonexistent/rocgate.toml: cannot read the file: "));
    }

    #[test]
    fn a_file_that_is_not_utf8_is_refused_at_the_first_bad_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("latin1.toml");
        std::fs::write(&path, b"[defaults]\nhold = \"caf\xe9\"\n").unwrap();
        let e = Config::load(&path).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}: line 2, column 12: not UTF-8 text (a TOML file is UTF-8)",
                path.display()
            )
        );
    }

    #[test]
    fn override_paths_turn_digits_into_indices() {
        let o = Override::parse("ROCGATE__ROUTES__12__TIERS__0__BASE_LIMIT".into()).unwrap();
        assert_eq!(o.path, "routes[12].tiers[0].base_limit");
        assert_eq!(o.config_key(), "ROCGATE__routes[12]__tiers[0]__base_limit");
        assert!(Override::parse("ROCGATEX__DEFAULTS__HOLD".into()).is_none());
        assert!(Override::parse("ROCGATE_DEFAULTS_HOLD".into()).is_none());
        // The prefix alone is an override of no field, refused as not a field path.
        let o = Override::parse("ROCGATE__".into()).unwrap();
        assert!(!o.is_field_path());
    }
}
