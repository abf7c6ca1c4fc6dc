//! `rocgate simulate`, run as a process: output files, the printed summary, exit codes.

use std::process::{Command, Output};

fn rocgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rocgate"))
        .args(args)
        .env_clear() // no ROCGATE__ overrides from the test's environment
        .output()
        .expect("run rocgate")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn flash_sale_writes_a_summary_with_a_cut_and_one_row_per_slot() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("run");
    let out = rocgate(&[
        "simulate",
        "--scenario",
        "flash-sale",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("scenario flash-sale"), "{stdout}");
    assert!(stdout.contains("normal → cut"), "{stdout}");
    assert!(stdout.contains("roc_cut"), "{stdout}");

    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["scenario"], "flash-sale");
    assert_eq!(summary["route"], "order");
    let cuts = summary["cuts"].as_array().unwrap();
    assert!(!cuts.is_empty(), "{summary}");
    assert_eq!(cuts[0]["to"], "cut");
    let first_cut = summary["first_cut_s"].as_f64().unwrap();
    assert!(first_cut > 20.0 && first_cut <= 20.6, "{first_cut}");
    let offered = summary["offered"].as_u64().unwrap();
    let admitted = summary["admitted"].as_u64().unwrap();
    let rejected = summary["rejected"].as_u64().unwrap();
    assert_eq!(admitted + rejected, offered);

    let csv = std::fs::read_to_string(out_dir.join("timeseries.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some(
            "t_s,offered,admitted,rejected,rejected_limit,rejected_roc_cut,\
             rejected_concurrency,rejected_queue_full,rejected_fallback_local,\
             shadow_rejected,roc,limit_rps,state,level,level_capacity"
        )
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 600, "60 s in slots of 100 ms");
    assert!(rows.iter().all(|r| r.len() == 15));
    let offered_sum: u64 = rows.iter().map(|r| r[1].parse::<u64>().unwrap()).sum();
    assert_eq!(offered_sum, offered);
    assert!(rows.iter().any(|r| r[12] == "cut"));
}

#[test]
fn a_malformed_profile_names_its_line_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("sale.csv");
    std::fs::write(&profile, "t_seconds,rate\n0,40\n# the sale\n\n20,6OO\n").unwrap();
    let out = rocgate(&["simulate", "--profile", profile.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("sale.csv: line 5:"), "{stderr}");
    assert!(stderr.contains("`6OO`"), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn a_good_profile_runs() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("quiet.csv");
    std::fs::write(&profile, "0,5\n30,5\n").unwrap();
    let out = rocgate(&[
        "simulate",
        "--profile",
        profile.to_str().unwrap(),
        "--seed",
        "7",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("poisson (seed 7)"), "{stdout}");
    assert!(stdout.contains("cuts          none"), "{stdout}");
}

#[test]
fn unknown_names_exit_2() {
    let out = rocgate(&["simulate", "--scenario", "black-friday"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("unknown scenario `black-friday`"),
        "{stderr}"
    );
    assert!(stderr.contains("flash-sale"), "{stderr}");

    let out = rocgate(&["simulate", "--route", "checkout"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("unknown route `checkout`"), "{stderr}");
}

#[test]
fn an_unwritable_out_dir_exits_2_before_running() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let under_a_file = file.join("out");
    let out = rocgate(&["simulate", "--out", under_a_file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("a-file"),
        "{}",
        text(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "nothing ran");
}

#[test]
fn an_invalid_config_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[[routes]]\nname = \"order\"\n").unwrap();
    let out = rocgate(&["simulate", "--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("bad.toml"),
        "{}",
        text(&out.stderr)
    );
}
