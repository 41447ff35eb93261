//! A migration's outcomes as JSON: stages per page, the destination's keys.
use s2mmu_cli::migrate::outcome_json::{dest_json, send_stages_json};
use s2mmu_migrate::session::dest::DestOutcome;
use s2mmu_migrate::stages::SendStages;
use serde_json::Value;

#[test]
fn stages_are_given_per_page_and_zero_pages_divide_by_one() {
    let s = SendStages {
        read_ns: 4000,
        hash_ns: 2000,
        write_ns: 9000,
        socket_ns: 1000,
        cpu_ns: 20000,
        pages: 4,
    };
    let v = send_stages_json(&s);
    assert_eq!(v["encrypt_ns"], 8000);
    assert_eq!(v["ns_per_page"]["read_and_zero_check"], 1000.0);
    assert_eq!(v["ns_per_page"]["encrypt"], 2000.0);
    assert_eq!(v["ns_per_page"]["cpu"], 5000.0);
    let none = send_stages_json(&SendStages {
        pages: 0,
        hash_ns: 7,
        ..SendStages::default()
    });
    assert_eq!(none["ns_per_page"]["hash"], 7.0);
}

#[test]
fn the_destination_names_its_digests_in_hex_and_its_resume() {
    let d = DestOutcome {
        page_records: 5,
        slot_digests: vec![(1, 0xab)],
        ..DestOutcome::default()
    };
    let v = dest_json(&d);
    assert_eq!(v["pages"], 5);
    assert_eq!(v["resumed"], false);
    assert_eq!(v["slot_digests"][0]["slot"], 1);
    assert_eq!(v["slot_digests"][0]["digest"], "0x00000000000000ab");
    assert_eq!(v["postcopy"], Value::Null);
}
