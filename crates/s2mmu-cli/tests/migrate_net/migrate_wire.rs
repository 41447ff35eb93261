//! The command's wire figures: `migrate --json` breaks the downtime down,
//! `--wire-bench` measures every cell against plain TCP, the memory floor
//! and iperf3, and `--channels auto` reports its choice. The library's own
//! figures are tested with it (crates/s2mmu-migrate/tests/migrate_stages.rs).
//! Behaviour only: no timing is compared.

#[path = "../cli_common/mod.rs"]
mod cli_common;

use cli_common::json_of;

/// `s2mmu migrate --json` on a 16 MiB anonymous simulated guest with
/// short warm-up and run-after, no plot, quiet, and `extra`.
fn small_sim_json(extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "migrate",
        "--guest",
        "sim",
        "--mem",
        "16M",
        "-s",
        "anonymous",
    ];
    args.extend_from_slice(extra);
    args.extend(["--warmup", "20ms", "--run-after", "20ms"]);
    args.extend(["--plot", "", "--json", "-q"]);
    json_of(&args)
}

/// The JSON report carries the downtime's parts, adding up to it.
#[test]
fn the_report_breaks_the_downtime_down() {
    let v = small_sim_json(&[]);
    let r = &v["results"][0];
    let parts = r["downtime_parts_ns"]
        .as_object()
        .expect("downtime_parts_ns");
    let names: Vec<&str> = parts.keys().map(String::as_str).collect();
    for k in [
        "pause",
        "harvest",
        "last_pages",
        "state_save",
        "state_send",
        "until_resumed",
    ] {
        assert!(names.contains(&k), "{k} in {names:?}");
    }
    let sum: u64 = parts.values().map(|x| x.as_u64().unwrap()).sum();
    assert_eq!(Some(sum), r["downtime_ns"].as_u64(), "{r}");
    let dest = r["destination"]["resume_parts_ns"]
        .as_object()
        .expect("the destination's resume_parts_ns");
    let names: Vec<&str> = dest.keys().map(String::as_str).collect();
    for k in ["drain", "decode", "digests", "start", "reply"] {
        assert!(names.contains(&k), "{k} in {names:?}");
    }
    // The reply ends after RESUMED is written, when the source may
    // have read it already: bound the parts before it.
    let dest_sum: u64 = dest.values().map(|x| x.as_u64().unwrap()).sum();
    let before_reply = dest_sum - dest["reply"].as_u64().unwrap();
    assert!(
        dest_sum > 0 && before_reply <= sum,
        "{dest:?} within {parts:?}"
    );
}

/// `--link-probe` in one process: plain TCP over loopback is measured
/// just before the migration, with the guest's bytes over the run's
/// connections, and round 0 and the stack's link are quoted against it.
#[test]
fn a_link_probe_in_one_process_measures_plain_tcp_with_the_guests_bytes() {
    let v = small_sim_json(&["--link-probe", "--channels", "2"]);
    let r = &v["results"][0];
    let pt = &r["plain_tcp"];
    assert_eq!(pt["plain_tcp_bytes"].as_u64(), Some(16 << 20), "{r}");
    assert!(pt["plain_tcp_bytes_per_s"].as_f64().unwrap() > 0.0, "{r}");
    assert!(pt["round0_pct_of_plain_tcp"].as_f64().unwrap() > 0.0, "{r}");
    assert!(pt["link_pct_of_plain_tcp"].as_f64().unwrap() > 0.0, "{r}");
    assert_eq!(r["link_bytes"].as_u64(), Some(16 << 20), "{r}");
    // Without it, none is made up.
    let v = small_sim_json(&[]);
    assert!(
        v["results"][0]["plain_tcp"]["plain_tcp_bytes"].is_null(),
        "{v}"
    );
}

/// `--wire-bench`: every cell measured, the memory floor in each run,
/// iperf3's figures wherever iperf3 runs (and required where CI installed
/// it), none made up where not.
#[test]
fn the_wire_bench_measures_every_cell_against_plain_tcp_and_iperf3() {
    let v = small_sim_json(&["--wire-bench", "2", "--channels", "1,2"]);
    let iperf3 = v["params"]["iperf3"].as_str().map(str::to_string);
    if std::env::var_os("S2MMU_REQUIRE_IPERF3").is_some() {
        assert!(iperf3.is_some(), "iperf3 is required here but was not run");
    }
    let rows = v["results"].as_array().unwrap();
    let cases: Vec<&str> = rows.iter().map(|r| r["case"].as_str().unwrap()).collect();
    assert_eq!(
        cases,
        [
            "tls_channels_1",
            "plain_channels_1",
            "tls_channels_2",
            "plain_channels_2"
        ]
    );
    for r in rows {
        let each = |k: &str| -> Vec<f64> {
            r[k]["each_run"]
                .as_array()
                .unwrap_or_else(|| panic!("{k} in {r}"))
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        };
        for k in [
            "plain_tcp_bytes_per_s",
            "round0_bytes_per_s",
            "round0_pct_of_plain_tcp",
            "memory_floor_bytes_per_s",
            "memory_floor_source_cpu_ns_per_page",
            "memory_floor_destination_cpu_ns_per_page",
            "round0_pct_of_memory_floor",
        ] {
            let v = each(k);
            assert_eq!(v.len(), 2, "{k}: one figure per run");
            assert!(v.iter().all(|&x| x > 0.0), "{k}: {v:?}");
        }
        let pct = each("round0_pct_of_plain_tcp");
        let (r0, plain) = (each("round0_bytes_per_s"), each("plain_tcp_bytes_per_s"));
        let (of_floor, floor) = (
            each("round0_pct_of_memory_floor"),
            each("memory_floor_bytes_per_s"),
        );
        for i in 0..2 {
            assert!((pct[i] - 100.0 * r0[i] / plain[i]).abs() < 1e-6 * pct[i]);
            assert!((of_floor[i] - 100.0 * r0[i] / floor[i]).abs() < 1e-6 * of_floor[i]);
        }
        match iperf3 {
            Some(_) => assert!(each("iperf3_bytes_per_s").iter().all(|&x| x > 0.0)),
            None => assert!(r["iperf3_bytes_per_s"].is_null()),
        }
    }
}

#[test]
fn the_wire_bench_refuses_a_run_count_out_of_bounds() {
    for n in ["0", "51"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_s2mmu"))
            .args([
                "migrate",
                "--guest",
                "sim",
                "--wire-bench",
                n,
                "--plot",
                "",
                "-q",
            ])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--wire-bench") && err.contains("1 to 50"),
            "{err}"
        );
    }
}

/// `--channels auto` through the command: the JSON names the count chosen
/// and each probe.
#[test]
fn the_command_reports_the_count_auto_chose() {
    let v = small_sim_json(&["--channels", "auto"]);
    let r = &v["results"][0];
    let chosen = r["channel_choice"]["chosen"]
        .as_u64()
        .expect("the choice in --json");
    assert!([1, 2, 4].contains(&chosen), "{r}");
    assert_eq!(r["channels"].as_u64(), Some(chosen));
    let probes = r["channel_choice"]["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 3);
    assert!(probes
        .iter()
        .all(|p| p["bytes_per_s"].as_f64().unwrap() > 0.0));
}
