//! The flag vocabulary's parsers and the `migrate --guest` routing, as
//! the library half of the command offers them.

use s2mmu::mmu::{DirtyMode, HwDirtyBlocks, Protect};
use s2mmu_cli::dirty_mode::*;
use s2mmu_cli::flags::parse_duration;
use s2mmu_cli::migrate::linux::route;
use std::time::Duration;

#[test]
fn every_engine_mode_parses_by_its_own_name() {
    for name in DirtyMode::NAMES {
        let m = parse_dirty_mode(name).unwrap();
        assert_eq!(m.name(), name);
    }
    assert_eq!(
        parse_dirty_mode("hw-blocks"),
        Ok(DirtyMode::Hardware {
            protect: Protect::MANUAL,
            blocks: HwDirtyBlocks::LogWholeBlocks
        })
    );
    assert_eq!(
        parse_dirty_mode("ring:1024"),
        Ok(DirtyMode::Ring { entries: 1024 })
    );
}

#[test]
fn lists_expand_all_and_drop_repeats_and_bad_names_are_named() {
    assert_eq!(parse_dirty_modes("all,wp").unwrap().0, ALL.to_vec());
    assert_eq!(
        parse_dirty_modes("pml,hw-blocks,pml").unwrap().0,
        vec![DirtyMode::PML, DirtyMode::HW_BLOCKS]
    );
    let e = parse_dirty_modes("wp,dbm").unwrap_err();
    assert!(e.contains("\"dbm\"") && e.contains("hw-blocks"), "{e}");
    assert!(parse_dirty_mode("ring:x").is_err());
    assert!(parse_dirty_modes("").is_err());
}

#[test]
fn off_and_manual_and_engine_names_round_trip() {
    assert_eq!(parse_dirty_or_off("off"), Ok(None));
    assert_eq!(parse_dirty_or_off("manual"), Ok(Some(DirtyMode::WP)));
    assert_eq!(parse_dirty_or_off("wp"), Ok(Some(DirtyMode::WP)));
    for name in ["off", "wp", "ring:1024", "hw", "hw-blocks", "pml"] {
        assert_eq!(dirty_name(parse_dirty_or_off(name).unwrap()), name);
    }
    let e = parse_dirty_or_off("dbm").unwrap_err();
    assert_eq!(e.accepted, NAMES.to_vec());
    assert!(e.to_string().contains("\"dbm\"") && e.to_string().contains("manual"));
}

#[test]
fn durations_need_a_unit() {
    assert_eq!(parse_duration("300ms"), Ok(Duration::from_millis(300)));
    assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
    assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    assert!(parse_duration("20").unwrap_err().contains("no unit"));
    assert!(parse_duration("fast").is_err());
    assert!(parse_duration("-1s").is_err());
    assert!(parse_duration("25h").unwrap_err().contains("out of range"));
}

fn ids(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[test]
fn transport_and_security_options_never_change_the_guest() {
    let net = [
        "to", "listen", "psk", "channels", "no_tls", "tls_cert", "mem", "vcpus",
    ];
    assert_eq!(route("auto", &ids(&net)), Ok(None));
    assert_eq!(route("auto", &ids(&["no_tls", "runs"])), Ok(Some(true)));
    assert_eq!(route("auto", &ids(&["psk", "dirty_rate"])), Ok(Some(false)));
    assert_eq!(route("linux", &ids(&net)), Ok(Some(true)));
    assert_eq!(route("sim", &ids(&net)), Ok(Some(false)));
}

#[test]
fn options_of_the_other_guest_are_refused_by_name() {
    for (id, f) in [
        ("format", "--format"),
        ("check", "--check"),
        ("slots", "--slots"),
    ] {
        let e = route("linux", &ids(&["mem", id])).unwrap_err();
        assert!(e.starts_with(f), "{e}");
    }
    let e = route("sim", &ids(&["linux_run"])).unwrap_err();
    assert!(e.starts_with("--linux-run"), "{e}");
    let e = route("auto", &ids(&["backing", "kernel"])).unwrap_err();
    assert!(e.contains("--backing") && e.contains("--kernel"), "{e}");
}
