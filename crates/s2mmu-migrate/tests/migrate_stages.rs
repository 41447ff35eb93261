//! The stream's figures are measured, not made up: an in-process migration
//! with its link probe sends as many bytes as guest memory before round
//! 0, and the stage clocks counted every page on both sides with time in each stage; the channel
//! count `auto_channels` chooses is the one its probes measured best.
//! Behaviour only: no timing is compared.

mod migrate_common;

use migrate_common::{dest_cfg, plain, small, tls};
use s2mmu_migrate::sim::in_process::migrate_in_process;
use s2mmu_migrate::sim::source::SimRun;
use s2mmu_migrate::transport::NetConfig;
use std::time::Duration;

fn check(cfg: &SimRun, net: &NetConfig, tls: bool) {
    // The stack's link is measured only when asked for.
    let mut cfg = cfg.clone();
    cfg.session.link_probe = true;
    let cfg = &cfg;
    let (s, d) = migrate_in_process(cfg, &dest_cfg(), net).expect("migration succeeds");
    assert_eq!(d.probe_bytes, cfg.guest.mem_size, "the stack's link probe");
    assert_eq!(s.link_bytes, cfg.guest.mem_size, "the source's count of it");
    assert!(s.link > 0.0);
    let x = s.send_stages;
    assert_eq!(x.pages, s.page_records, "the sender's clock saw every page");
    assert!(x.read_ns > 0 && x.hash_ns > 0 && x.write_ns > 0 && x.socket_ns > 0);
    assert!(
        x.socket_ns <= x.write_ns,
        "the socket is part of the writes"
    );
    let r = d.recv_stages;
    assert_eq!(
        r.pages, d.page_records,
        "the receiver's clock saw every page"
    );
    assert!(r.read_ns > 0 && r.check_ns > 0);
    assert!(r.socket_ns <= r.read_ns, "the socket is part of the reads");
    assert!(x.cpu_ns > 0 && r.cpu_ns > 0, "CPU time read on both sides");
    if tls {
        assert!(x.encrypt_ns() > 0, "TLS costs time beyond the socket");
    }
    let p = s.downtime_parts;
    assert_eq!(p.total(), s.downtime, "the downtime's parts add up: {p:?}");
    // The setup before round 0 is timed, outside `total`; the span to the
    // last byte sent adds it and leaves out the wait for RESUMED.
    let u = s.setup;
    assert!(
        u.connect > Duration::ZERO && u.link_probe > Duration::ZERO,
        "{u:?}"
    );
    assert_eq!(
        u.channel_probe,
        Duration::ZERO,
        "no channel-count probe asked"
    );
    assert_eq!(
        s.to_last_byte_sent(),
        u.total() + s.total - p.until_resumed,
        "{u:?} {p:?}"
    );
    assert!(
        p.last_pages > Duration::ZERO
            && p.state_send > Duration::ZERO
            && p.until_resumed > Duration::ZERO,
        "{p:?}"
    );
    // The destination's part, on its clock (the same process's): from
    // STATE's arrival, after the source began to send it, to the moment
    // before RESUMED is written, before the source can read it. The
    // reply's own end is read after the write, so the source may read
    // RESUMED first and a descheduled destination thread can read its
    // clock late (CI saw a 1.7 ms reply against 0.9 ms until_resumed):
    // only the parts before it are bounded.
    let q = d.resume_parts;
    assert!(
        q.start > Duration::ZERO && q.reply > Duration::ZERO,
        "{q:?}"
    );
    assert!(
        q.until_reply() <= p.state_send + p.until_resumed,
        "the destination's part {q:?} lies inside the source's view of it {p:?}"
    );
}

#[test]
fn plain_tcp_and_the_stages_are_measured_without_tls() {
    check(&small(16 << 20), &plain(), false);
}

#[test]
fn plain_tcp_and_the_stages_are_measured_with_tls_over_two_channels() {
    let net = tls();
    check(
        &small(16 << 20).with(|_, s| {
            s.channels = 2;
        }),
        &net,
        true,
    );
}

/// `--channels auto`: each candidate count is probed with real pages (at
/// most its byte bound), the fastest wins unless a smaller count is within
/// the margin, and the migration runs with the count chosen (HEADER and
/// destination agree).
#[test]
fn channels_auto_probes_every_count_and_migrates_with_the_one_chosen() {
    use s2mmu_migrate::session::source::{AutoChannels, AUTO_MARGIN_PCT};
    for (tls, net) in [(false, plain()), (true, tls())] {
        let auto = AutoChannels {
            tls,
            per_count: Duration::from_millis(200),
            max_bytes: 4 << 20,
            ..AutoChannels::default()
        };
        let cfg = small(16 << 20).with(|_, s| s.auto_channels = Some(auto.clone()));
        let (s, d) = migrate_in_process(&cfg, &dest_cfg(), &net).expect("migration succeeds");
        let c = s.channel_choice.expect("auto reports its choice");
        let counts: Vec<u16> = c.probes.iter().map(|p| p.channels).collect();
        assert_eq!(counts, [1, 2, 4], "every candidate probed, in order");
        for p in &c.probes {
            assert!(p.pages > 0 && p.pages <= 1024, "{p:?}: 1 to 4 MiB of pages");
            assert!(p.elapsed > Duration::ZERO);
        }
        let mut best = &c.probes[0];
        for p in &c.probes[1..] {
            if p.pages_per_s() > best.pages_per_s() * (1.0 + f64::from(AUTO_MARGIN_PCT) / 100.0) {
                best = p;
            }
        }
        assert_eq!(c.chosen, best.channels, "the rule over {:?}", c.probes);
        // The probe is part of the migration's setup, each count's included.
        let spent: Duration = c.probes.iter().map(|p| p.elapsed).sum();
        assert!(s.setup.channel_probe >= spent, "{:?} {c:?}", s.setup);
        assert!(s.setup.connect > Duration::ZERO, "{:?}", s.setup);
        assert_eq!(s.channels, c.chosen, "the migration ran with the choice");
        assert_eq!(d.channels, c.chosen, "and the destination saw as many");
    }
}

#[test]
fn channels_auto_refuses_settings_out_of_bounds() {
    use s2mmu_migrate::session::source::{AutoChannels, MAX_AUTO_PROBE_BYTES};
    let bad = [
        AutoChannels {
            candidates: vec![],
            ..AutoChannels::default()
        },
        AutoChannels {
            candidates: vec![1, 0],
            ..AutoChannels::default()
        },
        AutoChannels {
            candidates: vec![2, 2],
            ..AutoChannels::default()
        },
        AutoChannels {
            candidates: vec![1, 65],
            ..AutoChannels::default()
        },
        AutoChannels {
            per_count: Duration::from_secs(11),
            ..AutoChannels::default()
        },
        AutoChannels {
            max_bytes: 1 << 40,
            ..AutoChannels::default()
        },
        // The probe is bounded to a few MiB, never a guest-sized transfer.
        AutoChannels {
            max_bytes: MAX_AUTO_PROBE_BYTES + 1,
            ..AutoChannels::default()
        },
    ];
    for a in bad {
        let cfg = small(16 << 20).with(|_, s| s.auto_channels = Some(a.clone()));
        let e = migrate_in_process(&cfg, &dest_cfg(), &plain()).expect_err(&format!("{a:?}"));
        assert!(e.to_string().contains("auto_channels"), "{a:?}: {e}");
    }
    assert!(AutoChannels::default().validate().is_ok());
}
