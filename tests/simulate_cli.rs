//! `rocgate simulate`, run as a process: output files, the printed summary, exit codes.

use rocgate::sim::access_log::MAX_LINE_BYTES;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn rocgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rocgate"))
        .args(args)
        .env_clear() // no ROCGATE__ overrides from the test's environment
        .output()
        .expect("run rocgate")
}

/// A file `name` holding `contents` in a temporary directory of its own, and its path:
/// the directory goes, and the file with it, when the `TempDir` is dropped, so the test
/// holds it while it runs `rocgate` on the file (and may write more files beside it).
fn file(name: &str, contents: impl AsRef<[u8]>) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, contents).unwrap();
    (dir, path)
}

/// `rocgate simulate --profile {profile}` followed by `more`, as [`rocgate`] runs it.
fn simulate_profile(profile: &Path, more: &[&str]) -> Output {
    let profile = profile.to_str().unwrap();
    rocgate(&[&["simulate", "--profile", profile][..], more].concat())
}

/// `rocgate simulate --access-log {log}` followed by `more`, as [`rocgate`] runs it.
fn simulate_log(log: &Path, more: &[&str]) -> Output {
    let log = log.to_str().unwrap();
    rocgate(&[&["simulate", "--access-log", log][..], more].concat())
}

/// The arguments of `rocgate simulate {args} --out {out_dir}`.
fn simulate_to_args<'a>(out_dir: &'a Path, args: &[&'a str]) -> Vec<&'a str> {
    [
        &["simulate"][..],
        args,
        &["--out", out_dir.to_str().unwrap()],
    ]
    .concat()
}

/// `rocgate simulate {args} --out {out_dir}`, as [`rocgate`] runs it: a run that writes
/// its files (a sweep its sweep.csv) into `out_dir`.
fn simulate_to(out_dir: &Path, args: &[&str]) -> Output {
    rocgate(&simulate_to_args(out_dir, args))
}

/// [`simulate_to`] run by bash after `setup`, whose limit or umask the run inherits (its
/// environment cleared as [`rocgate`] clears it).
fn simulate_to_after(setup: &str, out_dir: &Path, args: &[&str]) -> Output {
    Command::new("bash")
        .args(["-c", &format!("{setup}; exec \"$0\" \"$@\"")])
        .arg(env!("CARGO_BIN_EXE_rocgate"))
        .args(simulate_to_args(out_dir, args))
        .env_clear()
        .output()
        .unwrap()
}

/// `rocgate {args}` (its environment cleared as [`rocgate`] clears it) with its standard
/// output closed once it starts, as a reader gone (`| head -1`) leaves it: for a
/// simulation, before its summary is written (the simulation takes a while first).
fn with_stdout_closed(args: &[&str]) -> Output {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_rocgate"))
        .args(args)
        .env_clear()
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rocgate");
    drop(child.stdout.take());
    child.wait_with_output().expect("rocgate ends")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// What a run said on standard output; the test fails, showing both outputs, unless it
/// succeeded.
#[track_caller]
fn succeeded(out: &Output) -> String {
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    stdout
}

/// What a run said on standard error; the test fails, showing it, unless the run was
/// refused as a usage error (exit 2).
#[track_caller]
fn refused(out: &Output) -> String {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    stderr
}

/// What the run of a test's `case` said on standard error; the test fails, naming the
/// case and showing what the run said, unless it was refused (exit 2) saying `what`.
#[track_caller]
fn case_refused_saying(case: impl std::fmt::Debug, out: &Output, what: &str) -> String {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{case:?}: {stderr}");
    assert!(stderr.contains(what), "{case:?}: {stderr}");
    stderr
}

/// What a run said on standard error; the test fails, showing it, unless the run was
/// refused (exit 2) saying `what`.
#[track_caller]
fn refused_saying(out: &Output, what: &str) -> String {
    let stderr = refused(out);
    assert!(stderr.contains(what), "{stderr}");
    stderr
}

/// The summary.json a run wrote into `out_dir`, parsed.
fn summary_in(out_dir: &Path) -> serde_json::Value {
    let json = std::fs::read_to_string(out_dir.join("summary.json")).unwrap();
    serde_json::from_str(&json).unwrap()
}

/// The width and height of the chart.png a run wrote into `out_dir`, as the PNG
/// decoder reads them.
fn chart_size(out_dir: &Path) -> (u32, u32) {
    let png = std::fs::read(out_dir.join("chart.png")).unwrap();
    let decoder = png::Decoder::new(std::io::Cursor::new(png));
    let info = decoder.read_info().unwrap();
    (info.info().width, info.info().height)
}

#[test]
fn flash_sale_writes_a_summary_with_a_cut_and_one_row_per_slot() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("run");
    let out = simulate_to(&out_dir, &["--scenario", "flash-sale"]);
    let stdout = succeeded(&out);
    assert!(stdout.contains("scenario flash-sale"), "{stdout}");
    assert!(stdout.contains("normal → cut"), "{stdout}");
    assert!(stdout.contains("roc_cut"), "{stdout}");

    let summary = summary_in(&out_dir);
    assert_eq!(summary["scenario"], "flash-sale");
    assert_eq!(summary["access_logs"], serde_json::Value::Null);
    let routes = summary["routes"].as_array().unwrap();
    assert_eq!(routes.len(), 1);
    let route = &routes[0];
    assert_eq!(route["route"], "order");
    let cuts = route["cuts"].as_array().unwrap();
    assert!(!cuts.is_empty(), "{summary}");
    assert_eq!(cuts[0]["to"], "cut");
    let first_cut = route["first_cut_s"].as_f64().unwrap();
    assert!(first_cut > 20.0 && first_cut <= 20.6, "{first_cut}");
    assert_eq!(summary["first_cut_s"], route["first_cut_s"]);
    assert_eq!(summary["cut_count"], 1);
    let offered = route["offered"].as_u64().unwrap();
    let admitted = route["admitted"].as_u64().unwrap();
    let rejected = route["rejected"].as_u64().unwrap();
    assert_eq!(admitted + rejected, offered);
    assert_eq!(summary["offered"], route["offered"]);
    assert_eq!(summary["capacity_rps"], serde_json::Value::Null);
    assert_eq!(summary["overload"], 0);

    let csv = std::fs::read_to_string(out_dir.join("timeseries.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some(
            "route,t_s,offered,admitted,rejected,rejected_limit,rejected_roc_cut,\
             rejected_concurrency,rejected_queue_full,rejected_fallback_local,\
             shadow_rejected,overload,roc,danger_roc,safe_roc,limit_rps,base_limit_rps,\
             state,level,level_capacity,route_limit_rejected"
        )
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 600, "60 s in slots of 100 ms");
    assert!(rows.iter().all(|r| r.len() == 21 && r[0] == "order"));
    let offered_sum: u64 = rows.iter().map(|r| r[2].parse::<u64>().unwrap()).sum();
    assert_eq!(offered_sum, offered);
    assert!(rows.iter().any(|r| r[17] == "cut"));
    assert!(
        rows.iter().all(|r| r[13] == "80" && r[14] == "20"),
        "thresholds"
    );

    // The charts: an SVG with the thresholds, a PNG of the documented size.
    let svg = std::fs::read_to_string(out_dir.join("chart.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("danger_roc 80"),
        "{}",
        &svg[..200]
    );
    assert_eq!(chart_size(&out_dir), (1200, 560));
}

/// The flash sale's cut is set apart from the base limit: a line says what the base
/// limit alone rejects, and summary.json holds it, for the route and the run.
#[test]
fn flash_sale_says_what_the_base_limit_alone_rejects() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("run");
    let stdout = succeeded(&simulate_to(&out_dir, &["--scenario", "flash-sale"]));
    let summary = summary_in(&out_dir);
    let route = &summary["routes"][0];
    let offered = route["offered"].as_u64().unwrap();
    let rejected = route["rejected"].as_u64().unwrap();
    let without = route["rejected_without_cuts"].as_u64().unwrap();
    assert!(0 < without && without < rejected, "{summary}");
    assert_eq!(summary["rejected_without_cuts"], without);
    let pct = |n: u64| 100.0 * n as f64 / offered as f64;
    let line = format!(
        "without cuts  {without:>8}  {:5.1}%  rejected by the base limit alone; the cuts' own {}, {:.1}%",
        pct(without),
        rejected - without,
        pct(rejected - without)
    );
    assert!(stdout.contains(&line), "{line}\n{stdout}");
    // The line comes after the reasons, before the peak.
    let at = |what: &str| stdout.find(what).unwrap();
    assert!(at("  roc_cut") < at("without cuts") && at("without cuts") < at("peak admitted"));
}

/// The number after `label` up to the next comma or blank in `stdout`.
fn number_after(stdout: &str, label: &str) -> i64 {
    let at = stdout
        .find(label)
        .unwrap_or_else(|| panic!("no {label:?} in {stdout}"));
    let rest = stdout[at + label.len()..].trim_start();
    let end = rest.find([',', ' ', '\n']).unwrap_or(rest.len());
    rest[..end]
        .parse()
        .unwrap_or_else(|e| panic!("{label:?}: {e} in {stdout}"))
}

/// The cut's own as the engine counts it live (a twin bucket at the base limit, as
/// `/admin/routes`' `cut_own_net` has it) is printed beside the offline figure, and
/// on config/demo.toml's flash sale the two are the same; summary.json has it per
/// route. A partitioned route, whose cut is not counted live, prints no live figure,
/// and its field is `null`.
#[test]
fn the_cuts_own_counted_live_is_printed_beside_the_offline_figure() {
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/config/demo.toml");
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("run");
    let args = ["--config", demo, "--scenario", "flash-sale"];
    let stdout = succeeded(&simulate_to(&out_dir, &args));
    let offline = number_after(&stdout, "the cuts' own");
    let live = number_after(&stdout, "cut's own net");
    assert!(offline > 0, "{stdout}");
    assert_eq!(live, offline, "{stdout}");
    let summary = summary_in(&out_dir);
    let order = summary["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["route"] == "order")
        .unwrap();
    assert_eq!(order["cut_own_net"], live, "{summary}");
    // The line comes after the offline figure's, before the peak.
    let at = |what: &str| stdout.find(what).unwrap();
    assert!(at("without cuts") < at("cut's own net") && at("cut's own net") < at("peak admitted"));

    let (dir, keyed) = file(
        "keyed.toml",
        "[[routes]]\nname = \"order\"\npath_prefix = \"/\"\npartition = \"ip\"\n",
    );
    let out_dir = dir.path().join("run");
    let args = [
        "--config",
        keyed.to_str().unwrap(),
        "--scenario",
        "flash-sale",
    ];
    let stdout = succeeded(&simulate_to(&out_dir, &args));
    assert!(stdout.contains("normal → cut"), "{stdout}");
    assert!(!stdout.contains("cut's own net"), "{stdout}");
    let summary = summary_in(&out_dir);
    assert!(summary["routes"][0]["cut_own_net"].is_null(), "{summary}");
}

/// A shadow route enforces no cut: no line, and the field is `null`.
#[test]
fn a_shadow_route_says_nothing_of_rejections_without_cuts() {
    let (dir, config) = file(
        "shadow.toml",
        "[[routes]]\nname = \"order\"\npath_prefix = \"/\"\nmode = \"shadow_adaptive\"\n",
    );
    let out_dir = dir.path().join("run");
    let stdout = succeeded(&simulate_to(
        &out_dir,
        &[
            "--config",
            config.to_str().unwrap(),
            "--scenario",
            "flash-sale",
        ],
    ));
    assert!(stdout.contains("normal → cut"), "{stdout}");
    assert!(!stdout.contains("without cuts"), "{stdout}");
    let summary = summary_in(&out_dir);
    assert_eq!(
        summary["routes"][0]["rejected_without_cuts"],
        serde_json::Value::Null
    );
    assert_eq!(summary["rejected_without_cuts"], serde_json::Value::Null);
}

/// Output that cannot be written (a full disk) fails the command: `simulate >
/// /dev/full` exited 0 with nothing written. A reader gone (`| head -1`) is no failure.
#[cfg(target_os = "linux")]
#[test]
fn output_that_cannot_be_written_fails_the_command() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full opens");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rocgate"))
        .args(["simulate", "--scenario", "flash-sale"])
        .stdout(full)
        .output()
        .expect("rocgate runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("rocgate: cannot write to standard output: No space left"),
        "{}",
        text(&out.stderr)
    );
    let out = with_stdout_closed(&["simulate", "--scenario", "flash-sale"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// A run refused once its output directory is made (too many slots) removes the
/// directory it made: it was left behind, empty. One that was there stays.
#[test]
fn a_refused_run_leaves_no_output_directory_it_made() {
    let (dir, profile) = file("long.csv", "0,1\n1000000000,1\n");
    let out_dir = dir.path().join("out");
    let args = |out: &Path| simulate_profile(&profile, &["--out", out.to_str().unwrap()]);
    let out = args(&out_dir);
    refused_saying(&out, "slots");
    assert!(!out_dir.exists(), "the directory it made is gone");
    let out = args(dir.path());
    refused(&out);
    assert!(dir.path().is_dir(), "the directory that was there stays");
}

/// A start before 1970 says which times are taken: it said only "numeric component
/// is out of range".
#[test]
fn a_start_before_1970_says_which_times_are_taken() {
    let out = rocgate(&[
        "simulate",
        "--scenario",
        "steady",
        "--start",
        "1900-01-01T00:00:00Z",
    ]);
    refused_saying(&out, "must be an RFC 3339 time in UTC from 1970 to 9999");
}

#[test]
fn a_malformed_profile_names_its_line_and_exits_2() {
    let (_dir, profile) = file("sale.csv", "t_seconds,rate\n0,40\n# the sale\n\n20,6OO\n");
    let out = simulate_profile(&profile, &[]);
    let stderr = refused_saying(&out, "sale.csv: line 5:");
    assert!(stderr.contains("`6OO`"), "{stderr}");
    assert!(out.stdout.is_empty());
}

/// A negative time was taken, and the run said "t = 0 at unix -10 s".
#[test]
fn a_profile_time_below_zero_names_its_line_and_exits_2() {
    let (_dir, profile) = file("early.csv", "t_seconds,rate\n-10,10\n0,10\n");
    let out = simulate_profile(&profile, &[]);
    refused_saying(
        &out,
        "early.csv: line 2: t_seconds must not be negative, got -10",
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn a_profile_with_bytes_beyond_utf8_is_read_line_by_line() {
    // A Latin-1 comment made the whole file "stream did not contain valid UTF-8",
    // naming no line: a comment is now read past, and a field names its line.
    let (_dir, profile) = file("latin1.csv", b"# caf\xe9\n0,5\n30,5\n");
    let out = simulate_profile(&profile, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    std::fs::write(&profile, b"0,5\n30,5\xe9\n").unwrap();
    let out = simulate_profile(&profile, &[]);
    refused_saying(&out, "latin1.csv: line 2: rate is not a number");
}

/// A profile was read whole, however long: `--profile /dev/zero` read until memory ran
/// out, and a long file of one line was printed back whole as the field in error.
#[test]
fn a_profile_longer_than_32_mib_is_refused_once_that_much_is_read() {
    let (_dir, profile) = file("zeros.csv", "");
    let zeros = std::fs::File::options().write(true).open(&profile).unwrap();
    zeros.set_len(33 << 20).unwrap(); // sparse: 33 MiB of NUL bytes on one line
    drop(zeros);
    let out = simulate_profile(&profile, &[]);
    let stderr = text(&out.stderr);
    let head: String = stderr.chars().take(200).collect();
    assert_eq!(out.status.code(), Some(2), "{head}");
    assert!(
        stderr.contains("zeros.csv: longer than 32 MiB: not a profile"),
        "{head}"
    );
    assert!(stderr.len() < 1000, "{} bytes on stderr", stderr.len());
    assert!(out.stdout.is_empty());
}

/// `text` in UTF-16, big- or little-endian, behind its byte order mark.
fn utf16(text: &str, big_endian: bool) -> Vec<u8> {
    let units = text.encode_utf16();
    if big_endian {
        [0xFE, 0xFF]
            .into_iter()
            .chain(units.flat_map(u16::to_be_bytes))
            .collect()
    } else {
        [0xFF, 0xFE]
            .into_iter()
            .chain(units.flat_map(u16::to_le_bytes))
            .collect()
    }
}

/// A profile whose lines end in a carriage return alone (old Mac programs, a
/// spreadsheet's "CSV (Macintosh)" export) runs: it was one line, refused as
/// "line 1: expected `t_seconds,rate`, found 5 field(s)".
#[test]
fn a_profile_with_old_mac_line_ends_runs() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("mac.csv");
    std::fs::write(&profile, "t_seconds,rate\r0,40\r60,40\r").unwrap();
    let out = simulate_profile(&profile, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        stdout
            .lines()
            .any(|l| l.split_whitespace().eq(["offered", "2400"])),
        "{stdout}"
    );
}

/// PowerShell's `>` and `Out-File` write UTF-16 with a byte order mark: read as UTF-8,
/// a NUL beside every digit made "line 2: t_seconds is not a number", quoting a
/// field that showed as ` 0 `.
#[test]
fn a_profile_in_utf16_is_read_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let csv = "t_seconds,rate\r\n0,40\r\n60,40\r\n";
    for (name, bytes) in [("le.csv", utf16(csv, false)), ("be.csv", utf16(csv, true))] {
        let profile = dir.path().join(name);
        std::fs::write(&profile, bytes).unwrap();
        let out = simulate_profile(&profile, &[]);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
        assert!(stdout.contains("; 60.0 s"), "{name}: {stdout}");
        assert!(
            stdout
                .lines()
                .any(|l| l.split_whitespace().eq(["offered", "2400"])),
            "{name}: {stdout}"
        );
    }
    // An odd last byte is no character, and named as such on its line.
    let profile = dir.path().join("odd.csv");
    let mut bytes = utf16("0,40\n60,4", false);
    bytes.push(b'0');
    std::fs::write(&profile, bytes).unwrap();
    let out = simulate_profile(&profile, &[]);
    refused_saying(&out, "odd.csv: line 2: rate is not a number: `4\u{fffd}`");
}

#[test]
fn a_good_profile_runs() {
    let (_dir, profile) = file("quiet.csv", "0,5\n30,5\n");
    let out = simulate_profile(&profile, &["--seed", "7"]);
    let stdout = succeeded(&out);
    assert!(stdout.contains("poisson (seed 7)"), "{stdout}");
    assert!(stdout.contains("cuts          none"), "{stdout}");
}

#[test]
fn unknown_names_exit_2() {
    let out = rocgate(&["simulate", "--scenario", "black-friday"]);
    let stderr = refused_saying(&out, "unknown scenario `black-friday`");
    assert!(stderr.contains("flash-sale"), "{stderr}");

    let out = rocgate(&["simulate", "--route", "checkout"]);
    refused_saying(&out, "unknown route `checkout`");
}

#[test]
fn an_unwritable_out_dir_exits_2_before_running() {
    let (_dir, a_file) = file("a-file", "");
    let under_a_file = a_file.join("out");
    let out = rocgate(&["simulate", "--out", under_a_file.to_str().unwrap()]);
    refused_saying(&out, "a-file");
    assert!(out.stdout.is_empty(), "nothing ran");
}

/// The entries of `dir`, by name, with a file's contents (`None` for a directory).
fn files_of(dir: &std::path::Path) -> std::collections::BTreeMap<String, Option<Vec<u8>>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            (name, (!path.is_dir()).then(|| std::fs::read(path).unwrap()))
        })
        .collect()
}

#[test]
fn a_run_refused_or_failing_part_way_leaves_the_last_runs_files_as_they_were() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("run");
    let out = simulate_to(&out_dir, &["--scenario", "flash-sale"]);
    succeeded(&out);
    let before = files_of(&out_dir);
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        ["chart.png", "chart.svg", "summary.json", "timeseries.csv"]
    );

    // Refused once the files are opened: the run is too long.
    let long = dir.path().join("long.csv");
    std::fs::write(&long, "0,0\n2000000,0\n").unwrap();
    let out = simulate_to(&out_dir, &["--profile", long.to_str().unwrap()]);
    refused_saying(&out, "more than 1000000");
    assert_eq!(files_of(&out_dir), before, "a refused run");

    // A write fails part-way: files over 60 KiB cannot be written (a full disk), so
    // the summary and the SVG chart are written and the CSV and PNG are not.
    let limited = "trap '' XFSZ; ulimit -f 60";
    let out = simulate_to_after(limited, &out_dir, &["--scenario", "steady"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("cannot write: File too large"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(files_of(&out_dir), before, "a run failing part-way");

    // And a run that succeeds replaces them all.
    let out = simulate_to(&out_dir, &["--scenario", "steady"]);
    succeeded(&out);
    let after = files_of(&out_dir);
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    assert!(
        String::from_utf8_lossy(after["summary.json"].as_deref().unwrap()).contains("\"steady\""),
        "the steady run's summary"
    );
}

/// A directory where an output file goes is refused before the run, with its path,
/// and the other files are left as they were; the files written are readable as
/// `File::create` would have made them (not the owner-only mode of a temporary file).
#[test]
fn a_directory_where_an_output_goes_is_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("run");
    let out = simulate_to_after("umask 022", &out_dir, &["--scenario", "steady"]);
    succeeded(&out);
    for name in ["summary.json", "timeseries.csv"] {
        let mode = std::fs::metadata(out_dir.join(name)).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o644,
            "{name}"
        );
    }
    std::fs::remove_file(out_dir.join("timeseries.csv")).unwrap();
    std::fs::create_dir(out_dir.join("timeseries.csv")).unwrap();
    let before = files_of(&out_dir);
    let out = simulate_to(&out_dir, &["--scenario", "flash-sale"]);
    refused_saying(
        &out,
        "timeseries.csv: is a directory, where the output file goes",
    );
    assert!(out.stdout.is_empty(), "nothing ran");
    assert_eq!(files_of(&out_dir), before);
    // A file where the directory goes is named as such: it was "cannot create the
    // output directory: File exists".
    let file = out_dir.join("summary.json");
    let out = simulate_to(&file, &["--scenario", "steady"]);
    refused_saying(
        &out,
        "summary.json: exists and is no directory, where the output files go",
    );
    // A symbolic link that leads nowhere (its target missing, or a loop) is named as
    // such: it was "cannot create the output directory: File exists". (helper-258)
    let dangling = out_dir.join("dangling");
    std::os::unix::fs::symlink(out_dir.join("no-such-dir"), &dangling).unwrap();
    let looped = out_dir.join("looped");
    std::os::unix::fs::symlink(&looped, &looped).unwrap();
    // So is one on the way to it (`--out dangling/run`), which was "File exists" too.
    // (helper-266, review)
    for (at, link, to) in [
        (dangling.clone(), &dangling, out_dir.join("no-such-dir")),
        (looped.clone(), &looped, looped.clone()),
        (dangling.join("run"), &dangling, out_dir.join("no-such-dir")),
        (looped.join("a").join("b"), &looped, looped.clone()),
    ] {
        let out = simulate_to(&at, &["--scenario", "steady"]);
        let says = refused_saying(
            &out,
            &format!(
                "{}: is a symbolic link to {}, which leads to no directory (its target \
                 is missing, or the links loop)",
                link.display(),
                to.display()
            ),
        );
        assert!(!says.contains("File exists"), "{says}");
        assert!(out.stdout.is_empty(), "nothing ran");
    }
}

#[test]
fn a_replay_is_bounded_by_the_slots_of_all_its_routes() {
    // Two requests 14 hours apart on each of the default config's two routes: 504,000
    // slots of 100 ms each, 1,008,000 in all (once, a day on ten routes took 1.3 GB).
    let line = |request: &str, at: &str| {
        format!("198.51.100.1 - - [27/Nov/2026:{at} +0000] \"{request} HTTP/1.1\" 200 5\n")
    };
    let text_of_log = [
        line("POST /api/order", "06:00:00"),
        line("GET /index.html", "06:00:00"),
        line("POST /api/order", "19:59:59"),
        line("GET /index.html", "19:59:59"),
    ]
    .concat();
    let (_dir, log) = file("access.log", text_of_log);
    let out = simulate_log(&log, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains(
            "a run of 50400s in slots of 100ms needs 1008000 slots over its 2 routes, \
             more than 1000000; replay a part with --from/--to, or fewer routes with --route"
        ),
        "{}",
        text(&out.stderr)
    );
    let out = simulate_log(&log, &["--route", "order"]);
    succeeded(&out);
}

#[test]
fn an_invalid_config_exits_2() {
    let (_dir, config) = file("bad.toml", "[[routes]]\nname = \"order\"\n");
    let out = rocgate(&["simulate", "--config", config.to_str().unwrap()]);
    refused_saying(&out, "bad.toml");
}

/// 27/Nov/2026:20:MM:SS +0100 for `s` seconds after 20:00.
fn logged(s: u64) -> String {
    format!("27/Nov/2026:20:{:02}:{:02} +0100", s / 60, s % 60)
}

/// A combined-format log: `orders(s)` orders in second `s` of 60, plus one page view
/// per second from an IPv6 client.
fn sale_log(orders: impl Fn(u64) -> u64) -> String {
    let mut text = String::new();
    for s in 0..60 {
        for i in 0..orders(s) {
            text.push_str(&format!(
                "198.51.100.{} - - [{}] \"POST /api/order?item={i} HTTP/1.1\" 201 88 \"https://shop.example/cart\" \"Mozilla/5.0 (\\\"sale\\\")\"\n",
                i % 250,
                logged(s)
            ));
        }
        text.push_str(&format!(
            "2001:db8::1 - - [{}] \"GET /index.html HTTP/1.1\" 200 5120 \"-\" \"curl/8.5\"\n",
            logged(s)
        ));
    }
    text
}

/// [`sale_log`] of one order a second (120 lines) with the `bad` lines inserted, each
/// at its index once those before it are in, and no newline after the last line.
fn quiet_log_with(bad: &[(usize, &str)]) -> String {
    let log = sale_log(|_| 1);
    let mut lines: Vec<&str> = log.lines().collect();
    for &(at, line) in bad {
        lines.insert(at, line);
    }
    lines.join("\n")
}

fn flash_sale_log() -> String {
    sale_log(|s| if (20..40).contains(&s) { 600 } else { 40 })
}

fn gzip(text: &str) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(text.as_bytes()).unwrap();
    gz.finish().unwrap()
}

/// A line past the cap ([`MAX_LINE_BYTES`], 1 MiB) ends the run at once, naming the
/// file, the line and the cap, `--lenient` or not, gzip-compressed or not: it was
/// skipped as one unparsable line (exit 0, a warning), and one that never ends
/// (`/dev/zero`) was read forever.
#[test]
fn an_access_log_line_past_the_cap_ends_the_run() {
    let over = "x".repeat(MAX_LINE_BYTES + 1);
    let log = quiet_log_with(&[(60, &over)]);
    let cap = format!("longer than {MAX_LINE_BYTES} bytes");
    let said = format!("line 61 is {cap} (1 MiB), more than an access-log line holds");
    for (name, bytes) in [
        ("a.log", log.clone().into_bytes()),
        ("a.log.gz", gzip(&log)),
    ] {
        let (_dir, path) = file(name, bytes);
        for more in [&[][..], &["--lenient"]] {
            let stderr = refused_saying(&simulate_log(&path, more), &said);
            assert!(stderr.contains(&format!("{name}: line 61")), "{stderr}");
        }
    }
    // A gzip stream of zeros, which has no line break: read up to the cap, not to its end.
    let zeros = String::from_utf8(vec![0; 4 * MAX_LINE_BYTES]).unwrap();
    let (_dir, path) = file("zero.gz", gzip(&zeros));
    refused_saying(
        &simulate_log(&path, &[]),
        &format!("zero.gz: line 1 is {cap}"),
    );
}

/// A path is shown with its control characters escaped, in what is written and in
/// errors: `--out` holding a line break split the `wrote` line in two, and an escape
/// sequence in a file's name (a glob over a shared log directory) went to the
/// terminal to act on.
#[test]
fn a_path_is_shown_with_its_control_characters_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("a\nb");
    let out = rocgate(&[
        "simulate",
        "--scenario",
        "steady",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    let stdout = succeeded(&out);
    let wrote = stdout.lines().find(|l| l.starts_with("wrote")).unwrap();
    assert!(wrote.ends_with("a\\nb/chart.png"), "{stdout}");
    assert!(out_dir.join("summary.json").is_file());
    let log = dir.path().join("x\u{1b}[2J.log");
    std::fs::write(&log, "not a log\n").unwrap();
    let stderr = refused(&simulate_log(&log, &[]));
    assert!(stderr.contains("x\\u{1b}[2J.log: 1 of 1 lines"), "{stderr}");
    assert!(!stderr.contains('\u{1b}'), "{stderr}");
    for flag in ["--profile", "--config"] {
        let missing = dir.path().join("gone\u{1b}[2J");
        let stderr = refused(&rocgate(&["simulate", flag, missing.to_str().unwrap()]));
        assert!(
            stderr.contains("gone\\u{1b}[2J: cannot read"),
            "{flag}: {stderr}"
        );
        assert!(!stderr.contains('\u{1b}'), "{flag}: {stderr}");
    }
}

/// A scenario or route name that is none is quoted with its control characters
/// escaped: an escape sequence in it went to the terminal to act on.
#[test]
fn an_unknown_name_is_quoted_escaped() {
    let (_dir, log) = file("a.log", sale_log(|_| 1));
    let name = "x\u{1b}[2Jy";
    for (args, said) in [
        (
            vec!["simulate", "--scenario", name],
            "--scenario: unknown scenario `x\\u{1b}[2Jy`",
        ),
        (
            vec!["simulate", "--route", name],
            "--route: unknown route `x\\u{1b}[2Jy`",
        ),
        (
            vec![
                "simulate",
                "--access-log",
                log.to_str().unwrap(),
                "--route",
                name,
            ],
            "--route: unknown route `x\\u{1b}[2Jy`",
        ),
    ] {
        let stderr = refused_saying(&rocgate(&args), said);
        assert!(!stderr.contains('\u{1b}'), "{args:?}: {stderr}");
    }
}

/// `--access-log -` reads standard input gzip-compressed or not, as a file is read
/// (it was read as text only, and a compressed log was refused as not an access log).
#[test]
fn an_access_log_on_stdin_may_be_gzip_compressed() {
    use std::io::Write;
    use std::process::Stdio;
    for input in [gzip(&flash_sale_log()), flash_sale_log().into_bytes()] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rocgate"))
            .args(["simulate", "--access-log", "-"])
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run rocgate");
        let mut stdin = child.stdin.take().unwrap();
        let writer = std::thread::spawn(move || stdin.write_all(&input));
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        let stdout = succeeded(&out);
        assert!(stdout.contains("13660 requests replayed"), "{stdout}");
    }
}

/// A log given twice (`--access-log a.log --access-log ./a.log`, a glob that also
/// matches a file named beside it, `-` twice) is refused naming both: its requests
/// were replayed twice, twice the traffic logged, and a second `-` read nothing.
#[test]
fn an_access_log_given_twice_is_refused() {
    let (dir, log) = file("access.log", sale_log(|_| 1));
    let same = dir.path().join(".").join("access.log");
    let (log, same) = (log.to_str().unwrap(), same.to_str().unwrap());
    for (first, second) in [(log, log), (log, same), ("-", "-")] {
        let out = rocgate(&["simulate", "--access-log", first, "--access-log", second]);
        refused_saying(
            &out,
            &format!(
                "--access-log: {second} is {first} again: its requests would be replayed twice"
            ),
        );
    }
    let out = rocgate(&["simulate", "--access-log", log]);
    assert!(succeeded(&out).contains("120 requests replayed"));
}

/// Requests on routes `--route` leaves out are counted with the routes they are on
/// named: "2 on routes not replayed" left `--route order` over `GET /api/order` lines
/// (route `order` takes `POST` alone) to guess where they went.
#[test]
fn requests_on_routes_not_replayed_name_those_routes() {
    let line = |s: u64| {
        format!(
            "198.51.100.1 - - [{}] \"GET /api/order HTTP/1.1\" 200 1\n",
            logged(s)
        )
    };
    let (_dir, log) = file("get.log", format!("{}{}", line(0), line(1)));
    let out = simulate_log(&log, &["--route", "order"]);
    refused_saying(
        &out,
        "get.log: no request to replay: 2 lines read, 2 on routes not replayed (default)",
    );
}

/// A route partitioned by client IP replays each logged address as its client; a
/// client logged as no address (a host name, as Apache logs with `HostnameLookups
/// On`, or `-`) is one keyless client for all of them, and `simulate` says so, counting
/// them with the first few named: they were all held to one key's limit without a
/// word.
#[test]
fn clients_logged_as_no_address_are_named_as_one_keyless_client() {
    let mut log = String::new();
    for s in 0..3 {
        for client in ["shop.example", "-", "203.0.113.7"] {
            log.push_str(&format!(
                "{client} - - [{}] \"GET /api/x HTTP/1.1\" 200 1\n",
                logged(s)
            ));
        }
    }
    let (_dir, log) = file("hosts.log", log);
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/config/examples/per-ip.toml");
    let out = rocgate(&[
        "simulate",
        "--config",
        config,
        "--access-log",
        log.to_str().unwrap(),
    ]);
    succeeded(&out);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "note: 6 requests on routes partitioned by client IP logged no IP address \
             (shop.example, -): they are replayed as one keyless client, held to one key's limit"
        ),
        "{stderr}"
    );
}

#[test]
fn an_access_log_replays_every_route_it_reaches() {
    let (dir, log) = file("access.log.1.gz", gzip(&flash_sale_log()));
    let out_dir = dir.path().join("run");
    let log_arg = log.to_str().unwrap();
    let out = simulate_to(&out_dir, &["--access-log", log_arg, "--capacity", "250"]);
    let stdout = succeeded(&out);
    assert!(stdout.contains("13660 requests replayed"), "{stdout}");
    assert!(stdout.contains("route         order (enforce)"), "{stdout}");
    assert!(
        stdout.contains("route         default (enforce)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("cuts          1, first at 20.500 s"),
        "{stdout}"
    );
    assert!(stdout.contains("admitted above 250 req/s"), "{stdout}");

    let summary = summary_in(&out_dir);
    assert_eq!(summary["access_logs"][0], log.to_str().unwrap());
    assert_eq!(summary["log"]["lines"], 13_660);
    assert_eq!(summary["log"]["replayed"], 13_660);
    assert_eq!(summary["start_unix_s"], 1_795_806_000.0);
    assert_eq!(summary["capacity_rps"], 250);
    assert!(summary["overload"].as_u64().unwrap() > 0, "{summary}");
    let names: Vec<&str> = summary["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["route"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["order", "default"]);
    // Each route has the cuts' own as its engine counted it live; only `order` cut,
    // so only it prints the line, and `default`'s reads 0.
    assert!(summary["routes"][0]["cut_own_net"].as_i64().unwrap() > 0);
    assert_eq!(summary["routes"][1]["cut_own_net"], 0);
    assert_eq!(stdout.matches("cut's own net").count(), 1, "{stdout}");
    // Both routes enforce: the run's rejections without cuts are theirs together,
    // and the line of all routes gives them beside the rejections.
    let without: u64 = summary["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rejected_without_cuts"].as_u64().unwrap())
        .sum();
    assert_eq!(summary["rejected_without_cuts"], without);
    let offered = summary["offered"].as_u64().unwrap();
    let all = format!(
        ", {without} ({:.1}%) without cuts, 1 cut(s)",
        100.0 * without as f64 / offered as f64
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("all routes"))
        .unwrap();
    assert!(line.contains(&all), "{all}\n{line}");
    let csv = std::fs::read_to_string(out_dir.join("timeseries.csv")).unwrap();
    assert_eq!(csv.lines().filter(|l| l.starts_with("order,")).count(), 600);
    assert_eq!(
        csv.lines().filter(|l| l.starts_with("default,")).count(),
        600
    );
    assert_eq!(chart_size(&out_dir), (1200, 1120), "one panel per route");
}

#[test]
fn a_route_and_time_bounds_narrow_the_replay() {
    let (_dir, log) = file("access.log", flash_sale_log());
    let out = simulate_log(
        &log,
        &[
            "--route",
            "order",
            "--from",
            "2026-11-27T19:00:10Z",
            "--to",
            "27/Nov/2026:20:00:50 +0100",
        ],
    );
    let stdout = succeeded(&out);
    assert!(
        stdout.contains(
            "(12800 requests replayed, 40 on other routes (default), 820 outside --from/--to)"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("t = 0 at 2026-11-27T19:00:10.000Z; 40.0 s"),
        "{stdout}"
    );
    assert!(!stdout.contains("route         default"), "{stdout}");
}

#[test]
fn too_many_bad_lines_exit_2_naming_them_unless_lenient() {
    let unclosed = "198.51.100.1 - - [27/Nov/2026:20:00:03 +0100] \"GET / HTTP/1.1";
    let bad = quiet_log_with(&[(3, "[error] upstream timed out"), (7, unclosed)]);
    let (_dir, log) = file("access.log", bad);
    let out = simulate_log(&log, &[]);
    let stderr = refused_saying(&out, "2 of 122 lines (1.64%) are not access-log lines");
    assert!(
        stderr.contains("access.log:4: no [time] after the user field"),
        "{stderr}"
    );
    assert!(
        stderr.contains("access.log:8: a quoted field has no closing quote"),
        "{stderr}"
    );
    assert!(stderr.contains("--lenient"), "{stderr}");
    assert!(out.stdout.is_empty());

    let out = simulate_log(&log, &["--lenient"]);
    succeeded(&out);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("warning: 2 unparsable line(s) skipped"),
        "{stderr}"
    );
    assert!(text(&out.stdout).contains("120 requests replayed"));
}

/// The access log's header counts in words that agree with the count: it said "1
/// unparsable lines".
#[test]
fn one_unparsable_line_is_counted_in_the_singular() {
    let bad = quiet_log_with(&[(3, "[error] upstream timed out")]);
    let (_dir, log) = file("access.log", bad);
    let out = simulate_log(&log, &["--lenient"]);
    let stdout = succeeded(&out);
    assert!(
        stdout.contains("120 requests replayed, 1 unparsable line,")
            || stdout.contains("120 requests replayed, 1 unparsable line)"),
        "{stdout}"
    );
}

#[test]
fn same_input_and_seed_give_identical_files() {
    let (dir, log) = file("access.log", flash_sale_log());
    let files = ["summary.json", "timeseries.csv", "chart.svg", "chart.png"];
    let run = |name: &str, traffic: &[&str]| -> Vec<Vec<u8>> {
        let out_dir = dir.path().join(name);
        let out = simulate_to(
            &out_dir,
            &[&["--seed", "11", "--capacity", "300"], traffic].concat(),
        );
        succeeded(&out);
        files
            .iter()
            .map(|f| std::fs::read(out_dir.join(f)).unwrap())
            .collect()
    };
    let log_args = ["--access-log", log.to_str().unwrap()];
    let (a, b) = (run("a", &log_args), run("b", &log_args));
    for (f, (x, y)) in files.iter().zip(a.iter().zip(&b)) {
        assert!(x == y, "{f} differs between two runs");
    }
    let profile_args = ["--scenario", "double-spike"];
    let (c, d) = (run("c", &profile_args), run("d", &profile_args));
    assert_eq!(c, d);
    // The seed matters: another one places the requests elsewhere.
    let out_dir = dir.path().join("e");
    let seed_12 = ["--seed", "12", "--capacity", "300"];
    let out = simulate_to(&out_dir, &[&seed_12[..], &log_args].concat());
    assert!(out.status.success());
    assert_ne!(std::fs::read(out_dir.join("timeseries.csv")).unwrap(), a[1]);
}

#[test]
fn a_sweep_prints_a_table_and_writes_sweep_csv() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("sweep");
    let flash_sale = ["--scenario", "flash-sale", "--capacity", "250"];
    let out = simulate_to(
        &out_dir,
        &[&flash_sale[..], &["--sweep", "danger_roc=40..160:20"]].concat(),
    );
    let stdout = succeeded(&out);
    assert!(stdout.contains("sweep         7 run(s)"), "{stdout}");
    assert!(
        stdout.contains("danger_roc  rejected   cuts  first cut    in cut  peak 1 s    overload"),
        "{stdout}"
    );
    assert!(
        stdout
            .contains("\n        80     66.0%      1     20.5 s     7.4 s       329        0.5%\n"),
        "{stdout}"
    );
    let csv = std::fs::read_to_string(out_dir.join("sweep.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 8);
    assert!(lines[0].starts_with("danger_roc,offered,admitted,rejected,rejected_pct,"));
    assert!(
        lines[3].starts_with("80,16400,5574,10826,66.012,0,1,20.5,7.4,329,79,"),
        "{}",
        lines[3]
    );
    assert!(
        !out_dir.join("summary.json").exists(),
        "a sweep writes sweep.csv only"
    );
}

/// A run and a sweep into one `--out` each remove the other kind's files, and say so:
/// an earlier run's summary.json beside a sweep's sweep.csv (README's examples write
/// both kinds into `run/`) was read as the sweep's. A directory of such a name is
/// left alone, as is a file of another name.
#[test]
fn a_run_and_a_sweep_remove_each_others_earlier_files() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("run");
    let steady = ["--scenario", "steady", "--seed", "3"];
    succeeded(&simulate_to(&out_dir, &steady));
    std::fs::write(out_dir.join("notes.txt"), "mine").unwrap();
    let run_files = ["summary.json", "timeseries.csv", "chart.svg", "chart.png"];
    for name in run_files {
        assert!(out_dir.join(name).is_file(), "{name}");
    }
    let sweep = [&steady[..], &["--sweep", "danger_roc=60..80:20"]].concat();
    let stdout = succeeded(&simulate_to(&out_dir, &sweep));
    let removed = stdout.lines().find(|l| l.starts_with("removed")).unwrap();
    for name in run_files {
        assert!(!out_dir.join(name).exists(), "{name} left beside sweep.csv");
        assert!(removed.contains(&format!("run/{name}")), "{removed}");
    }
    assert!(
        removed.ends_with("(an earlier run's, of the other kind)"),
        "{removed}"
    );
    assert!(out_dir.join("sweep.csv").is_file());
    // A sweep again removes nothing, and leaves a directory of a run file's name be;
    // a run removes the sweep's file, and no file of another name.
    std::fs::create_dir(out_dir.join("chart.svg")).unwrap();
    let stdout = succeeded(&simulate_to(&out_dir, &sweep));
    assert!(!stdout.contains("removed"), "{stdout}");
    std::fs::remove_dir(out_dir.join("chart.svg")).unwrap();
    let stdout = succeeded(&simulate_to(&out_dir, &steady));
    let removed = stdout.lines().find(|l| l.starts_with("removed")).unwrap();
    assert!(removed.contains("run/sweep.csv"), "{removed}");
    assert!(!out_dir.join("sweep.csv").exists());
    assert_eq!(
        std::fs::read_to_string(out_dir.join("notes.txt")).unwrap(),
        "mine"
    );
}

/// An earlier run's file that cannot be removed (immutable, `chattr +i`) is named in a
/// warning, and the run still says what it wrote and exits 0: its files are in place.
/// The failed removal ended the run with an error, after its files were written,
/// without a word of them. Needs `chattr +i` (root on ext4, as in CI); elsewhere the
/// test says so and checks nothing.
#[test]
fn an_earlier_runs_file_that_cannot_be_removed_is_named_and_the_run_ends_well() {
    /// `chattr -i` on drop, so that the directory can go.
    struct Immutable(PathBuf);
    impl Drop for Immutable {
        fn drop(&mut self) {
            let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("run");
    let steady = ["--scenario", "steady", "--seed", "3"];
    succeeded(&simulate_to(&out_dir, &steady));
    let chart = out_dir.join("chart.svg");
    let made = Command::new("chattr").arg("+i").arg(&chart).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("skipped: chattr +i is not permitted here");
        return;
    }
    let _immutable = Immutable(chart.clone());
    let sweep = [&steady[..], &["--sweep", "danger_roc=60..80:20"]].concat();
    let out = simulate_to(&out_dir, &sweep);
    let stdout = succeeded(&out);
    assert!(
        stdout.contains("wrote") && stdout.contains("sweep.csv"),
        "{stdout}"
    );
    let removed = stdout.lines().find(|l| l.starts_with("removed")).unwrap();
    assert!(removed.contains("run/summary.json"), "{removed}");
    assert!(!removed.contains("chart.svg"), "{removed}");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("warning: cannot remove an earlier run's file, not this run's: ")
            && stderr.contains("run/chart.svg: "),
        "{stderr}"
    );
    assert!(chart.is_file() && out_dir.join("sweep.csv").is_file());
}

/// Files of those names that no earlier run wrote are the user's, and are left alone:
/// a sweep into a directory used for other things (`--out .`) deleted a `summary.json`
/// and a `chart.png` of the user's own, and a run a `sweep.csv`.
#[test]
fn a_run_and_a_sweep_leave_files_of_those_names_they_did_not_write() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("project");
    std::fs::create_dir(&out_dir).unwrap();
    let mine = [
        ("summary.json", "{\"project\": \"mine\"}\n"),
        ("chart.png", "not rocgate's"),
        ("timeseries.csv", "t,temperature\n0,21\n"),
    ];
    for (name, text) in mine {
        std::fs::write(out_dir.join(name), text).unwrap();
    }
    let steady = ["--scenario", "steady", "--seed", "3"];
    let sweep = [&steady[..], &["--sweep", "danger_roc=60..80:20"]].concat();
    let stdout = succeeded(&simulate_to(&out_dir, &sweep));
    assert!(!stdout.contains("removed"), "{stdout}");
    for (name, text) in mine {
        assert_eq!(
            std::fs::read_to_string(out_dir.join(name)).unwrap(),
            text,
            "{name}"
        );
    }
    // A run into a directory with a sweep.csv of the user's own leaves it too.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("sweep.csv"), "size,time\n1,2\n").unwrap();
    let stdout = succeeded(&simulate_to(&other, &steady));
    assert!(!stdout.contains("removed"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(other.join("sweep.csv")).unwrap(),
        "size,time\n1,2\n"
    );
}

#[test]
fn bad_sweeps_exit_2_with_the_reason() {
    for (args, expected) in [
        (
            vec!["--sweep", "danger_roc=40-160"],
            "invalid value 'danger_roc=40-160' for '--sweep <PARAM>'",
        ),
        (
            vec!["--sweep", "danger_roc=40..160"],
            "a range needs a step, `:STEP`",
        ),
        (
            vec!["--sweep", "dangerroc=1,2"],
            "unknown parameter `dangerroc`; parameters: base_limit",
        ),
        (
            vec!["--sweep", "danger_roc=21..40:1", "--sweep", "hold=1..21:1"],
            "--sweep: danger_roc (20) × hold (21) = 420 runs, more than 400",
        ),
        (
            vec!["--sweep", "danger_roc=10,80"],
            "--sweep: at danger_roc=10: route `order`: danger_roc: must be > safe_roc (20), got 10",
        ),
        (
            vec!["--sweep", "burst=1,5184000"],
            "--sweep: at burst=5184000: route `order`: burst: must be at most 4294967295ms (49.7 days, what a token bucket keeps), got 5184000000ms",
        ),
        (
            vec!["--sweep", "checkout.hold=1"],
            "--sweep: `checkout.hold`: route `checkout` is not one of the routes run: order",
        ),
    ] {
        let mut all = vec!["simulate"];
        all.extend(args.iter().copied());
        let out = rocgate(&all);
        case_refused_saying(&args, &out, expected);
        assert!(out.stdout.is_empty(), "{args:?}: nothing ran");
    }
}

/// A sweep whose runs together offer more than 10^10 requests is refused at once,
/// naming the flag, the total and the bound: each run was bounded (10^9), the sum not,
/// and 100 runs of 2 × 10^8 requests were taken (at about 110 ns a request, over half
/// an hour of one core; the run is given 60 s here, the refusal taking milliseconds).
#[test]
fn a_sweep_past_its_total_of_requests_is_refused() {
    let (_dir, profile) = file("busy.csv", "t_seconds,rate\n0,2000000\n100,2000000\n");
    let out = Command::new("timeout")
        .arg("60")
        .arg(env!("CARGO_BIN_EXE_rocgate"))
        .args(["simulate", "--profile", profile.to_str().unwrap()])
        .args(["--sweep", "hold=1..100:1"])
        .env_clear()
        .output()
        .expect("run rocgate under timeout");
    refused_saying(
        &out,
        "--sweep: 100 runs × 200000000 requests = 20000000000 requests, more than 10000000000 in all",
    );
    assert!(out.stdout.is_empty(), "nothing ran");
}

/// `--start` takes UTC only: an offset is refused, naming it, where one after a
/// fraction of a second (`19:00:00.0+01:00`) was dropped and the time read as UTC,
/// placing the run's events an hour off.
#[test]
fn a_start_with_an_offset_is_refused_not_read_as_utc() {
    for start in ["2026-11-27T19:00:00.0+01:00", "2026-11-27T19:00:00-05:00"] {
        let out = rocgate(&["simulate", "--start", start]);
        case_refused_saying(start, &out, "is not UTC");
    }
    let out = rocgate(&["simulate", "--start", "2026-11-27T19:00:00.5+00:00"]);
    succeeded(&out);
}

/// A seed that is no whole number says what a seed is (it said only "invalid digit
/// found in string").
#[test]
fn a_bad_seed_says_what_a_seed_is() {
    for seed in ["-1", "1.5", "x"] {
        let out = rocgate(&["simulate", "--seed", seed]);
        let what = "a seed is a whole number from 0 to 18446744073709551615";
        case_refused_saying(seed, &out, what);
    }
}

/// A point whose run cannot be made (too many slots for the traffic's span) is named
/// in the error, with the flag: the error said only what the run needed, and suggested
/// `--from/--to`, where the swept `slot` was the cause.
#[test]
fn a_sweep_point_whose_run_fails_is_named() {
    let (_dir, profile) = file("long.csv", "t_seconds,rate\n0,10\n2000,10\n");
    let out = simulate_profile(&profile, &["--sweep", "slot=0.1,0.001"]);
    let stderr = refused(&out);
    assert!(
        stderr.starts_with("--sweep at slot=0.001: profile "),
        "{stderr}"
    );
    assert!(
        stderr.contains("needs 2000000 slots, more than 1000000"),
        "{stderr}"
    );
}

#[test]
fn a_profile_drives_one_route() {
    let out = rocgate(&["simulate", "--route", "order", "--route", "seckill"]);
    refused_saying(&out, "a profile drives one route");
    let out = rocgate(&["simulate", "--from", "2026-11-27T19:00:10Z"]);
    refused_saying(&out, "--access-log");
}

/// A reader that has gone (`rocgate simulate | head -1`) ends the output quietly:
/// `print!` panicked on the closed pipe (exit 101).
#[test]
fn a_closed_stdout_ends_the_output_without_a_panic() {
    let out = with_stdout_closed(&["simulate", "--scenario", "flash-sale"]);
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

/// Without `--config`, the embedded default takes environment overrides as a file
/// does: a variable changes the run, and a bad one is an error naming it (exit 2).
#[test]
fn environment_overrides_apply_to_the_embedded_default() {
    let run = |var: Option<(&str, &str)>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rocgate"));
        command
            .args(["simulate", "--scenario", "flash-sale"])
            .env_clear();
        if let Some((name, value)) = var {
            command.env(name, value);
        }
        command.output().expect("run rocgate")
    };
    let plain = run(None);
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    assert!(text(&plain.stdout).contains("first at 20.500 s"));

    let raised = run(Some(("ROCGATE__DEFAULTS__DANGER_ROC", "1000")));
    let stdout = text(&raised.stdout);
    assert!(raised.status.success(), "{}", text(&raised.stderr));
    assert!(stdout.contains("cuts          none"), "{stdout}");

    let bad = run(Some(("ROCGATE__DEFAULTS__DANGER_ROC", "abc")));
    let stderr = text(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("defaults.danger_roc") && stderr.contains("ROCGATE__DEFAULTS__DANGER_ROC"),
        "{stderr}"
    );
}

/// A negative number given to a numeric flag is refused by the flag's own check,
/// which names it, rather than taken for an unknown flag (`unexpected argument '-5'`).
#[test]
fn a_negative_number_is_refused_naming_its_flag() {
    for (flags, named) in [
        (&["simulate", "--capacity", "-5"][..], "'--capacity <RPS>'"),
        (&["simulate", "--seed", "-1"][..], "'--seed <SEED>'"),
        (&["demo", "--duration", "-5"][..], "'--duration <DURATION>'"),
        (&["demo", "--seed", "-1"][..], "'--seed <SEED>'"),
    ] {
        let out = rocgate(flags);
        let what = format!("invalid value '{}' for {named}", flags[2]);
        case_refused_saying(flags, &out, &what);
    }
}

/// A `--capacity` that is no whole number of req/s from 1 is refused saying what it
/// must be, where a fraction, a negative number or `NaN` was refused as "invalid
/// digit found in string". (helper-167)
#[test]
fn a_capacity_that_is_no_whole_number_is_refused_saying_so() {
    for value in ["1.5", "-5", "NaN", "", "0", "18446744073709551616"] {
        let out = rocgate(&["simulate", "--capacity", value]);
        let what = format!("invalid value '{value}' for '--capacity <RPS>'");
        let stderr = case_refused_saying(value, &out, &what);
        assert!(
            stderr.contains("whole number of req/s from 1 to 18446744073709551615"),
            "{value:?}: {stderr}"
        );
    }
}

/// `--start` takes an RFC 3339 time in UTC; another offset is refused, saying so.
#[test]
fn start_is_a_utc_time() {
    let out = rocgate(&["simulate", "--start", "2026-11-27T20:00:00Z"]);
    succeeded(&out);
    assert!(
        text(&out.stdout).contains("t = 0 at 2026-11-27T20:00:00.000Z"),
        "{}",
        text(&out.stdout)
    );
    let out = rocgate(&["simulate", "--start", "2026-11-27T21:00:00+01:00"]);
    let stderr = refused(&out);
    assert!(
        stderr.contains("'--start <START>'") && stderr.contains("UTC"),
        "{stderr}"
    );
}

/// A profile has no clients: on a partitioned route its requests are one keyless
/// client, held to one key's limit, and `simulate` says so (as it does for a log's
/// header-partitioned routes).
#[test]
fn a_profile_on_a_partitioned_route_is_one_client_and_says_so() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/config/examples/per-ip.toml");
    let out = rocgate(&["simulate", "--config", config, "--route", "api"]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("note: route `api` is partitioned by client IP")
            && stderr.contains("one keyless client"),
        "{stderr}"
    );
    let out = rocgate(&["simulate"]);
    assert!(out.status.success());
    assert!(
        !text(&out.stderr).contains("note:"),
        "{}",
        text(&out.stderr)
    );
}

/// With one route the run's overload is the route's: one line says it, with the
/// capacity it was measured against (it was printed twice, once without).
#[test]
fn one_routes_overload_is_printed_once() {
    let out = rocgate(&["simulate", "--scenario", "flash-sale", "--capacity", "300"]);
    let stdout = succeeded(&out);
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("overload"))
        .collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    assert!(lines[0].contains("admitted above 300 req/s"), "{stdout}");
}

/// README's code block that follows the first line containing `after`.
fn readme_block_after(after: &str) -> &'static str {
    let readme = include_str!("../README.md");
    let at = readme
        .find(after)
        .unwrap_or_else(|| panic!("README has no {after:?}"));
    let body = &readme[at..];
    let body = &body[body.find("\n```").expect("a code block after it") + 4..];
    let body = &body[body.find('\n').expect("the block's first line") + 1..];
    &body[..body.find("```").expect("a closed code block")]
}

/// The two `simulate` outputs README quotes are what `simulate` prints today (its runs
/// are deterministic: evenly spaced arrivals on a virtual clock).
#[test]
fn readme_quotes_what_simulate_prints() {
    let out = rocgate(&["simulate", "--scenario", "flash-sale"]);
    succeeded(&out);
    assert_eq!(
        readme_block_after("prints what the `order` route of the embedded default"),
        text(&out.stdout),
        "README's \"The two commands\" against `rocgate simulate --scenario flash-sale`"
    );

    let out = rocgate(&["simulate", "--scenario", "flash-sale", "--capacity", "1000"]);
    let stdout = succeeded(&out);
    let hints = &stdout[stdout.find("\nhints\n").expect("the hints") + 1..];
    assert_eq!(
        readme_block_after(
            "What `rocgate simulate --scenario flash-sale --capacity 1000` ends with"
        ),
        hints,
        "README's Tuning hints against `rocgate simulate --scenario flash-sale --capacity 1000`"
    );
}

/// Every flag README gives a subcommand (`rocgate serve --upstream …`, also after
/// `cargo run --release --`, over lines ending in `\`) is one that subcommand takes.
#[test]
fn every_flag_readme_gives_a_subcommand_is_one_it_takes() {
    let readme = include_str!("../README.md").replace("\\\n", " ");
    let mut checked = 0;
    for sub in ["demo", "serve", "simulate", "hints", "check-config"] {
        let help = rocgate(&[sub, "--help"]);
        assert!(
            help.status.success(),
            "{sub} --help: {}",
            text(&help.stderr)
        );
        let help = text(&help.stdout);
        let invocation = format!("rocgate {sub} ");
        let alias = format!("-- {sub} ");
        for line in readme.lines() {
            let starts = line
                .match_indices(&invocation)
                .map(|(at, _)| at + invocation.len())
                .chain(line.match_indices(&alias).map(|(at, _)| at + alias.len()));
            for start in starts {
                // The command runs to the end of its code span, or of a shell line
                // (before a comment).
                let command = &line[start..];
                let command = &command[..command.find(['`', '#']).unwrap_or(command.len())];
                for word in command.split([' ', '[', ']']) {
                    if let Some(flag) = word.strip_prefix("--") {
                        let flag = flag.split('=').next().unwrap_or(flag);
                        assert!(
                            help.contains(&format!("--{flag} ")),
                            "README gives `rocgate {sub}` --{flag}, which it does not take: {line:?}"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked >= 20, "only {checked} flags found in README");
}

/// `--from`, `--to` and `--lenient` apply to an access log: beside a scenario or a
/// profile they are refused, naming the flag. (clap's requirement of an access log
/// gave way beside those flags, which conflict with one: the run ignored them.)
#[test]
fn log_only_flags_beside_a_scenario_or_profile_are_refused() {
    let (_dir, profile) = file("p.csv", "0,40\n60,40\n");
    let p = profile.to_str().unwrap();
    for (args, flag) in [
        (
            vec!["--scenario", "steady", "--from", "2026-11-26T18:55:00Z"],
            "--from",
        ),
        (
            vec!["--scenario", "steady", "--to", "2026-11-26T18:55:00Z"],
            "--to",
        ),
        (vec!["--profile", p, "--lenient"], "--lenient"),
    ] {
        let out = rocgate(&[&["simulate"][..], &args].concat());
        case_refused_saying(&args, &out, &format!("{flag} applies to an access log"));
        assert!(out.stdout.is_empty(), "{args:?} ran");
    }
}

/// A config file of one route, `checkout`, taking every path, in `mode` (the shadow
/// modes' tests), with its directory as [`file`] gives it.
fn checkout_config(mode: &str) -> (tempfile::TempDir, PathBuf) {
    let route =
        format!("[[routes]]\nname = \"checkout\"\npath_prefix = \"/\"\nmode = \"{mode}\"\n");
    file("shadow.toml", route)
}

/// A sweep over a shadow route shows what each point would have rejected, beside the
/// nothing it rejected. (Its table said 0.0% rejected for every point; the counts were
/// in sweep.csv only.)
#[test]
fn a_sweep_over_a_shadow_route_shows_what_it_would_have_rejected() {
    let (_dir, config) = checkout_config("shadow");
    let out = rocgate(&[
        "simulate",
        "--config",
        config.to_str().unwrap(),
        "--sweep",
        "danger_roc=60,120",
    ]);
    let stdout = succeeded(&out);
    let header = stdout
        .lines()
        .find(|l| l.starts_with("danger_roc"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(header.contains("rejected  would reject"), "{header}");
    for value in ["60", "120"] {
        let row = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(value))
            .unwrap_or_else(|| panic!("{stdout}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[1], "0.0%", "{row}");
        let would: f64 = cells[2].trim_end_matches('%').parse().unwrap();
        assert!(would > 50.0, "{row}");
    }
    assert!(
        stdout.contains("(would reject: admitted but counted rejected by a shadow mode"),
        "{stdout}"
    );
}

/// shadow_adaptive rejects at its base limit; its summary says the count it would
/// reject is the cut's, besides those rejected, not the total.
#[test]
fn a_shadow_adaptive_summary_says_the_cut_would_reject_more() {
    let (_dir, config) = checkout_config("shadow_adaptive");
    let out = rocgate(&["simulate", "--config", config.to_str().unwrap()]);
    let stdout = succeeded(&out);
    let rejected = stdout
        .lines()
        .find(|l| l.starts_with("rejected "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert_ne!(rejected.split_whitespace().nth(1), Some("0"), "{stdout}");
    let would = stdout
        .lines()
        .find(|l| l.starts_with("would reject "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        would.ends_with("(shadow: by the cut, besides those rejected)"),
        "{would}"
    );
}

/// A profile spanning less than one slot of its route ran one partial slot and
/// printed a summary of it: 50 ms against the default 100 ms slots. It is refused,
/// naming the file, its span and the route's slot; at a slot it spans it runs.
#[test]
fn a_profile_shorter_than_its_routes_slot_is_refused() {
    let (_dir, profile) = file("blip.csv", "t_seconds,rate\n0,100\n0.05,100\n");
    let out = simulate_profile(&profile, &[]);
    let stderr = refused(&out);
    assert!(
        stderr.contains("blip.csv")
            && stderr.contains("spans 50ms, less than one slot of route `")
            && stderr.contains("(100ms)"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    let out = simulate_profile(&profile, &["--sweep", "slot=0.01,0.1"]);
    let stderr = refused(&out);
    assert!(
        stderr.starts_with("--sweep at slot=0.1: profile ") && stderr.contains("spans 50ms"),
        "{stderr}"
    );
}

/// On a partitioned route `raise_base_limit` counts the clients refused: replaying
/// config/examples/per-ip.toml's login route, one keyless client at 273 req/s (a
/// profile's requests carry no address) against 5 req/s per key is refused as about
/// 1 client, an `info` (the limit working); an access log of 30 addresses at 10 req/s
/// each is refused as about 30, a `warn` to raise it. summary.json's hint says so.
#[test]
fn a_partitioned_routes_raise_says_how_many_clients_were_refused() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/config/examples/per-ip.toml");
    let raise = |more: &[&str]| {
        let out_dir = tempfile::tempdir().unwrap();
        let args = [&["--config", config, "--capacity", "1000"][..], more].concat();
        succeeded(&simulate_to(out_dir.path(), &args));
        let summary = summary_in(out_dir.path());
        let hints = summary["hints"].as_array().unwrap().clone();
        hints
            .into_iter()
            .find(|h| h["rule"] == "raise_base_limit" && h["route"] == "login")
            .unwrap_or_else(|| panic!("no raise_base_limit: {summary}"))
    };
    let one = raise(&[]);
    assert_eq!(one["severity"], "info", "{one}");
    let reason = one["reason"].as_str().unwrap();
    assert!(
        reason.contains("from about 1 client (")
            && reason.contains("about 1 was (one client's flood, held to its own limit"),
        "{reason}"
    );

    let mut log = String::new();
    for s in 0..60 {
        for _ in 0..10 {
            for client in 1..=30 {
                log.push_str(&format!(
                    "203.0.113.{client} - - [{}] \"POST /api/login HTTP/1.1\" 200 1\n",
                    logged(s)
                ));
            }
        }
    }
    let (_dir, log) = file("logins.log", log);
    let many = raise(&["--access-log", log.to_str().unwrap()]);
    assert_eq!(many["severity"], "warn", "{many}");
    let reason = many["reason"].as_str().unwrap();
    let about: u64 = reason
        .split("from about ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{reason}"));
    assert!(
        (18..=45).contains(&about),
        "30 clients read as {about}: {reason}"
    );
    assert!(reason.ends_with("raise it about 30%"), "{reason}");

    // The same route in `shadow`: the clients enforcing would have refused, counted
    // all the same, are quoted by the verdict.
    let shadow = std::fs::read_to_string(config).unwrap().replace(
        "name = \"login\"\n",
        "name = \"login\"\nmode = \"shadow\"\n",
    );
    let (_shadow_dir, shadow) = file("shadow.toml", shadow);
    let out_dir = tempfile::tempdir().unwrap();
    let args = [
        "--config",
        shadow.to_str().unwrap(),
        "--capacity",
        "1000",
        "--access-log",
        log.to_str().unwrap(),
    ];
    succeeded(&simulate_to(out_dir.path(), &args));
    let summary = summary_in(out_dir.path());
    let verdict = summary["hints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["rule"] == "shadow_verdict" && h["route"] == "login")
        .unwrap_or_else(|| panic!("no shadow_verdict: {summary}"))["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    let about: u64 = verdict
        .split("which would refuse about ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{verdict}"));
    assert!(
        (18..=45).contains(&about) && !verdict.contains("if many clients"),
        "30 clients read as {about}: {verdict}"
    );
}

/// A swept value far from 1 is printed in the table with an exponent, as a refusal
/// quotes it: `danger_roc=1e308` was printed in 309 digits, `hold=1e-300` in 302, and
/// the refusal of `hold=1e308` quoted it in 309 too.
#[test]
fn a_swept_value_far_from_one_is_shown_with_an_exponent() {
    let sweep =
        |values: &str| rocgate(&["simulate", "--scenario", "flash-sale", "--sweep", values]);
    let stdout = succeeded(&sweep("danger_roc=80,1e308"));
    // Right-aligned under `danger_roc`, as written.
    assert!(stdout.contains("\n        80  "), "{stdout}");
    assert!(stdout.contains("\n     1e308  "), "{stdout}");
    assert!(stdout.lines().all(|l| l.len() < 80), "{stdout}");
    let stdout = succeeded(&sweep("hold=1e-300"));
    assert!(stdout.contains("\n  1e-300  "), "{stdout}");
    assert!(stdout.lines().all(|l| l.len() < 80), "{stdout}");
    let stderr = refused(&sweep("hold=1e308"));
    assert!(
        stderr.contains("at hold=1e308: route `order`: 1e308 s is not a duration"),
        "{stderr}"
    );
    assert!(stderr.len() < 200, "{stderr}");
}
