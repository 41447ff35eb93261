//! The migration in one process against peers that misbehave: wrong
//! credentials, streams that ask for more than the destination allows or
//! break its rules, peers that stall, stop or vanish. Every peer is on
//! 127.0.0.1. Behaviour only: no timing is asserted (the I/O timeouts are
//! short so that the tests end soon). The same between two processes:
//! `migrate_net_process.rs`.

mod migrate_common;

use migrate_common::{header, opening, reply, reply_tags};

use s2mmu::mmu::MmuPolicy;
use s2mmu_migrate::session::dest::{DestOutcome, Limits};
use s2mmu_migrate::session::source::SourceOutcome;
use s2mmu_migrate::sim::dest::{receive_from, serve, SimDestConfig};
use s2mmu_migrate::sim::source::{migrate_source, SimRun};
use s2mmu_migrate::sim::state::GuestState;
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::transport::{self as net, NetConfig, Security};
use s2mmu_migrate::wire::{tag, Batch, Header, WireReader, WireWriter, PAGE_SIZE};
use s2mmu_vm::VcpuState;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

/// The I/O deadline of the tests about deadlines (short, so that they end
/// soon).
const TIMEOUT: Duration = Duration::from_millis(400);
/// The I/O deadline everywhere else: a bound on a hung peer, never reached
/// by a working one however loaded the machine (at load 30 a TLS handshake
/// took more than 400 ms, and a refusal test saw `Timeout`, not `Auth`).
const SLOW: Duration = Duration::from_secs(20);

/// A guest of `mem` bytes in one anonymous slot, 20 ms of warm-up.
fn small(mem: u64) -> SimRun {
    migrate_common::anonymous(mem, 1, Duration::from_millis(20))
}

/// A destination that gives up waiting for an authenticated source after
/// 3 s (then `serve` returns the last refused connection's error), with
/// the I/O deadline `SLOW`.
fn dest_cfg() -> SimDestConfig {
    let mut c = SimDestConfig::new(MmuPolicy::default(), Duration::from_millis(20));
    c.dest.prefault = false;
    c.dest.io_timeout = SLOW;
    c.dest.accept_wait = Some(Duration::from_secs(3));
    c
}

/// [`dest_cfg`] with the short deadline `TIMEOUT`, for the tests of it.
fn impatient_dest() -> SimDestConfig {
    let mut c = dest_cfg();
    c.dest.io_timeout = TIMEOUT;
    c
}

fn netcfg(security: Security) -> NetConfig {
    NetConfig {
        io_timeout: SLOW,
        security,
    }
}

/// [`netcfg`] with the short deadline `TIMEOUT`, for the tests of it.
fn impatient_net(security: Security) -> NetConfig {
    NetConfig {
        io_timeout: TIMEOUT,
        security,
    }
}

fn start_dest(
    cfg: SimDestConfig,
    net: NetConfig,
) -> (String, JoinHandle<Result<DestOutcome, MigrateError>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    (addr, std::thread::spawn(move || serve(&l, &cfg, &net)))
}

fn run_source(cfg: &SimRun, addr: &str, net: &NetConfig) -> Result<SourceOutcome, MigrateError> {
    migrate_source(cfg, &mut |_| {
        let s = net::connect_tcp(addr, net)?;
        net::client(s, net)
    })
}

// ---- authentication ------------------------------------------------------

#[test]
fn the_right_pre_shared_key_migrates() {
    let key = b"a key of thirty-two bytes, yes!!";
    let (addr, d) = start_dest(dest_cfg(), netcfg(net::psk(key).unwrap()));
    let s = run_source(&small(8 << 20), &addr, &netcfg(net::psk(key).unwrap())).expect("source");
    let d = d.join().unwrap().expect("destination");
    assert_eq!(s.slot_digests, d.slot_digests);
}

#[test]
fn a_wrong_pre_shared_key_is_refused_before_any_stream() {
    let (addr, d) = start_dest(
        dest_cfg(),
        netcfg(net::psk(b"the destination's key, 32 bytes.").unwrap()),
    );
    let r = run_source(
        &small(8 << 20),
        &addr,
        &netcfg(net::psk(b"somebody else's key, also long..").unwrap()),
    );
    assert!(matches!(r, Err(MigrateError::Auth { .. })), "{r:?}");
    // The destination refused it in the handshake: no header was read, so
    // no guest memory exists to be written.
    match d.join().unwrap() {
        Err(MigrateError::Auth { why }) => assert!(why.contains("pre-shared key"), "{why}"),
        other => panic!("expected an authentication failure, got {other:?}"),
    }
}

/// PEM files of a CA and a certificate for localhost/127.0.0.1 it signed.
fn pki_files(dir: &str) -> (PathBuf, PathBuf, PathBuf) {
    let d = std::env::temp_dir().join(format!("s2mmu-tls-{}-{dir}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let (pki, _, _) = net::make_pki(&["localhost", "127.0.0.1"]).unwrap();
    let (c, k, a) = (d.join("cert.pem"), d.join("key.pem"), d.join("ca.pem"));
    std::fs::write(&c, pki.cert_pem).unwrap();
    std::fs::write(&k, pki.key_pem).unwrap();
    std::fs::write(&a, pki.ca_pem).unwrap();
    (c, k, a)
}

#[test]
fn tls_from_files_migrates_and_another_ca_is_refused() {
    let (c, k, a) = pki_files("good");
    let sec = || net::tls_from_files(&c, &k, &a, "127.0.0.1").unwrap();
    let (addr, d) = start_dest(dest_cfg(), netcfg(sec()));
    run_source(&small(8 << 20), &addr, &netcfg(sec())).expect("source");
    d.join().unwrap().expect("destination");

    // A source whose certificate another CA signed (and which trusts only
    // that CA): both sides refuse the handshake.
    let (c2, k2, a2) = pki_files("other");
    let (addr, d) = start_dest(dest_cfg(), netcfg(sec()));
    let r = run_source(
        &small(8 << 20),
        &addr,
        &netcfg(net::tls_from_files(&c2, &k2, &a2, "127.0.0.1").unwrap()),
    );
    assert!(matches!(r, Err(MigrateError::Auth { .. })), "{r:?}");
    assert!(matches!(d.join().unwrap(), Err(MigrateError::Auth { .. })));

    // A source that trusts the destination's CA but presents a
    // certificate of another: the destination refuses it.
    let (addr, d) = start_dest(dest_cfg(), netcfg(sec()));
    let r = run_source(
        &small(8 << 20),
        &addr,
        &netcfg(net::tls_from_files(&c2, &k2, &a, "127.0.0.1").unwrap()),
    );
    assert!(r.is_err(), "a source with an unknown certificate migrated");
    assert!(matches!(d.join().unwrap(), Err(MigrateError::Auth { .. })));
    let _ = std::fs::remove_dir_all(c.parent().unwrap());
    let _ = std::fs::remove_dir_all(c2.parent().unwrap());
}

#[test]
fn plain_tcp_to_a_tls_destination_is_refused() {
    let (addr, d) = start_dest(dest_cfg(), netcfg(net::ephemeral_tls().unwrap()));
    let r = run_source(&small(8 << 20), &addr, &netcfg(Security::Plain));
    assert!(r.is_err());
    assert!(matches!(d.join().unwrap(), Err(MigrateError::Auth { .. })));
}

// ---- the destination's limits -------------------------------------------

fn limited(l: Limits) -> SimDestConfig {
    let mut c = dest_cfg();
    c.dest.limits = l;
    c
}

const LIMITS: Limits = Limits {
    max_mem: 8 << 20,
    max_vcpus: 2,
    max_slots: 2,
    max_channels: 2,
};

#[test]
fn a_stream_asking_for_more_than_the_destination_allows_is_rejected() {
    for (cfg, what) in [
        (small(16 << 20), "bytes of guest memory"),
        (
            small(8 << 20).with(|g, _| {
                g.vcpus = 3;
            }),
            "vCPUs",
        ),
        (
            small(8 << 20).with(|g, _| {
                g.slots = 4;
            }),
            "memslots",
        ),
        (
            small(8 << 20).with(|_, s| {
                s.channels = 3;
            }),
            "channels",
        ),
    ] {
        let (addr, d) = start_dest(limited(LIMITS), netcfg(Security::Plain));
        match run_source(&cfg, &addr, &netcfg(Security::Plain)) {
            Err(MigrateError::Rejected { reason }) => {
                assert!(reason.contains(what), "{reason}")
            }
            other => panic!("expected a rejection for {what}, got {other:?}"),
        }
        match d.join().unwrap() {
            Err(MigrateError::OverLimit { what: w, .. }) => assert_eq!(w, what),
            other => panic!("expected OverLimit for {what}, got {other:?}"),
        }
    }
}

/// A complete stream for a 16-page guest with 2 vCPUs whose STATE is
/// `state` (all pages sent as zero pages).
fn stream_with_state(vcpus_in_header: u32, state: &GuestState) -> Vec<u8> {
    let h = Header {
        vcpus: vcpus_in_header,
        ..header(16 * PAGE_SIZE as u64)
    };
    let mut w = WireWriter::new(Vec::new(), &h).unwrap();
    w.probe(0, &[1], &mut |_| {}).unwrap();
    let mut b = Batch::new();
    for i in 0..16u64 {
        b.push((1 << 32) + i * PAGE_SIZE as u64, |p| p.fill(0));
    }
    w.batch(&mut b).unwrap();
    w.control(tag::STATE, &state.encode()).unwrap();
    w.end().unwrap();
    std::mem::take(w.get_mut())
}

fn vcpu(pass: u64, next_page: u64) -> VcpuState {
    VcpuState {
        pass,
        next_page,
        rng: 1,
        writes: 0,
    }
}

/// The sim guest's state with `vcpus`: 8 pages each, every access a
/// write, no pace.
fn guest_state(vcpus: Vec<VcpuState>) -> GuestState {
    GuestState {
        bytes_per_vcpu: 8 * PAGE_SIZE as u64,
        write_percent: 100,
        pattern: 0,
        pace_pages_per_sec: 0,
        vcpus,
    }
}

#[test]
fn vcpu_state_that_does_not_fit_guest_memory_is_rejected_before_any_vcpu_starts() {
    let good = guest_state(vec![vcpu(1, 0), vcpu(1, 3)]);
    let mut reply = Vec::new();
    receive_from(&stream_with_state(2, &good)[..], &mut reply, &dest_cfg())
        .expect("a state that fits resumes");
    assert_eq!(reply_tags(&reply).last(), Some(&tag::RESUMED));

    let bad = [
        // Regions beyond guest memory.
        (
            2,
            GuestState {
                bytes_per_vcpu: 1 << 20,
                ..good.clone()
            },
        ),
        // A product that overflows.
        (
            2,
            GuestState {
                bytes_per_vcpu: (u64::MAX / 2 + 1) / PAGE_SIZE as u64 * PAGE_SIZE as u64,
                ..good.clone()
            },
        ),
        // More vCPUs than the header announced (and than the limit).
        (
            2,
            GuestState {
                vcpus: vec![vcpu(1, 0); 3],
                ..good.clone()
            },
        ),
        // A vCPU past the end of its region.
        (
            2,
            GuestState {
                vcpus: vec![vcpu(1, 0), vcpu(1, 9)],
                ..good.clone()
            },
        ),
        // Nonsense workload fields.
        (
            2,
            GuestState {
                write_percent: 1000,
                ..good.clone()
            },
        ),
    ];
    for (n, state) in bad {
        let mut reply = Vec::new();
        let r = receive_from(&stream_with_state(n, &state)[..], &mut reply, &dest_cfg());
        assert!(
            matches!(r, Err(MigrateError::BadState { .. })),
            "{state:?}: {r:?}"
        );
        let tags = reply_tags(&reply);
        assert_eq!(tags.last(), Some(&tag::REJECTED));
        assert!(!tags.contains(&tag::RESUMED));
    }
    // A header asking for more vCPUs than the build allows at all.
    let mut reply = Vec::new();
    let r = receive_from(
        &stream_with_state(100_000, &good)[..],
        &mut reply,
        &dest_cfg(),
    );
    assert!(matches!(r, Err(MigrateError::Malformed { .. })), "{r:?}");
}

// ---- deadlines ------------------------------------------------------------

#[test]
fn a_silent_source_times_out_on_the_destination() {
    for sec in [Security::Plain, net::ephemeral_tls().unwrap()] {
        let (addr, d) = start_dest(impatient_dest(), impatient_net(sec));
        // Connects, then says nothing.
        let _quiet = TcpStream::connect(&addr).unwrap();
        match d.join().unwrap() {
            Err(MigrateError::Timeout { .. }) => {}
            other => panic!("expected a timeout, got {other:?}"),
        }
    }
}

#[test]
fn a_channel_connected_before_the_header_joins_and_another_sessions_join_is_refused() {
    let (addr, d) = start_dest(dest_cfg(), netcfg(Security::Plain));
    // The further channel's connection comes first: the destination
    // accepts it while it waits for the main one's HEADER, and must keep
    // it for the JOIN that follows ACCEPT.
    let early = TcpStream::connect(&addr).unwrap();
    let mut main = TcpStream::connect(&addr).unwrap();
    main.set_read_timeout(Some(SLOW)).unwrap();
    let mut h = header(1 << 20);
    h.channels = 2;
    main.write_all(&opening(&h)).unwrap();
    let (t, body) = reply(&mut main);
    assert_eq!(t, tag::ACCEPT);
    let session: [u8; 16] = body.as_slice().try_into().unwrap();
    // A JOIN of another session's id is refused: the connection is closed.
    let mut other = session;
    other[0] ^= 1;
    let stranger = TcpStream::connect(&addr).unwrap();
    stranger.set_read_timeout(Some(SLOW)).unwrap();
    let mut stranger = WireWriter::join(stranger, &other, 1).unwrap().into_inner();
    let mut b = [0u8; 1];
    assert!(matches!(stranger.read(&mut b), Ok(0) | Err(_)));
    // The early connection joins; with both channels' (empty) probes in,
    // the destination answers PROBED: the session has its two channels.
    let mut early = WireWriter::join(early, &session, 1).unwrap();
    early.probe(0, &[], &mut |_| {}).unwrap();
    let mut w = WireWriter::replies(&mut main);
    w.probe(0, &[], &mut |_| {}).unwrap();
    let (t, body) = reply(&mut main);
    assert_eq!(t, tag::PROBED);
    assert_eq!(body, 0u64.to_le_bytes());
    drop((main, early));
    assert!(
        d.join().unwrap().is_err(),
        "the stream ended after the probe"
    );
}

#[test]
fn a_source_that_stalls_or_vanishes_mid_stream_ends_the_destination() {
    // Stalls inside the probe.
    let (addr, d) = start_dest(impatient_dest(), impatient_net(Security::Plain));
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(&opening(&header(1 << 20))).unwrap();
    let mut w = WireWriter::replies(Vec::new());
    w.probe(0, &[], &mut |_| {}).unwrap();
    let mut probe = w.into_inner();
    probe[1..9].copy_from_slice(&(1u64 << 20).to_le_bytes());
    // (the check of a 1 MiB probe)
    let check = s2mmu_migrate::hash::checksum(&(1u64 << 20).to_le_bytes(), u64::from(tag::PROBE));
    probe[9..17].copy_from_slice(&check.to_le_bytes());
    s.write_all(&probe).unwrap();
    s.write_all(&[7u8; 1000]).unwrap();
    match d.join().unwrap() {
        Err(MigrateError::Timeout { .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    drop(s);

    // Vanishes after the header.
    let (addr, d) = start_dest(impatient_dest(), impatient_net(Security::Plain));
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(&opening(&header(1 << 20))).unwrap();
    drop(s);
    match d.join().unwrap() {
        Err(MigrateError::Truncated { .. }) | Err(MigrateError::Io { .. }) => {}
        other => panic!("expected a cut stream, got {other:?}"),
    }
}

#[test]
fn a_destination_that_stops_answering_or_reading_ends_the_source() {
    // Accepts, never answers.
    source_times_out_against(8 << 20, |_| {});
    // Accepts the stream, then stops reading it (the socket buffers fill).
    source_times_out_against(64 << 20, |s| {
        let (mut rd, _) = WireReader::new(s).unwrap();
        let mut w = WireWriter::replies(rd.get_mut());
        w.control(tag::ACCEPT, &[0u8; 16]).unwrap();
        w.flush().unwrap();
    });
}

/// Runs a source of `mem` bytes with the short deadline against a fake
/// destination that accepts, does what `serve` does with the connection,
/// then holds it until the source ended (not for a fixed time, which a
/// loaded machine could outlast and turn the timeout into a reset; 60 s: a
/// hang): the source times out.
fn source_times_out_against(mem: u64, serve: impl FnOnce(&mut TcpStream) + Send + 'static) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (ended, done) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        serve(&mut s);
        let _ = done.recv_timeout(Duration::from_secs(60));
        drop(s);
    });
    let r = run_source(&small(mem), &addr, &impatient_net(Security::Plain));
    ended.send(()).unwrap();
    match r {
        Err(MigrateError::Timeout { .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    t.join().unwrap();
}

// ---- the stream's own rules ---------------------------------------------------

/// A stream for a 16-page guest: `pages` as given (None: a zero page),
/// then a good STATE.
fn stream_of(records: &[Vec<(u64, Option<u8>)>]) -> Vec<u8> {
    let mut w = WireWriter::new(Vec::new(), &header(16 * PAGE_SIZE as u64)).unwrap();
    w.probe(0, &[1], &mut |_| {}).unwrap();
    for r in records {
        let mut b = Batch::new();
        for &(page, fill) in r {
            b.push((1 << 32) + page * PAGE_SIZE as u64, |p| {
                p.fill(fill.unwrap_or(0))
            });
        }
        w.batch(&mut b).unwrap();
    }
    let state = guest_state(vec![vcpu(1, 0), vcpu(1, 0)]);
    w.control(tag::STATE, &state.encode()).unwrap();
    w.end().unwrap();
    std::mem::take(w.get_mut())
}

#[test]
fn a_zero_page_after_data_clears_the_page_and_duplicates_are_refused() {
    use s2mmu_migrate::hash::{digest_of, page_hash};
    // Every page with data, then page 3 again as a zero page: the
    // destination must hold zeros there, which its digest shows.
    let all: Vec<(u64, Option<u8>)> = (0..16).map(|p| (p, Some(0x11))).collect();
    let stream = stream_of(&[all, vec![(3, None)]]);
    let mut reply = Vec::new();
    let d = receive_from(&stream[..], &mut reply, &dest_cfg()).expect("valid stream");
    assert_eq!(d.zero_pages, 1);
    let hashes: Vec<u64> = (0..16u64)
        .map(|p| {
            let fill = if p == 3 { 0 } else { 0x11 };
            page_hash(&[fill; PAGE_SIZE], (1 << 32) + p * PAGE_SIZE as u64)
        })
        .collect();
    assert_eq!(d.slot_digests, vec![(0, digest_of(&hashes))]);

    // The same page twice in one record.
    let mut all: Vec<(u64, Option<u8>)> = (0..16).map(|p| (p, Some(0x22))).collect();
    all.push((5, Some(0x33)));
    let mut reply = Vec::new();
    let r = receive_from(&stream_of(&[all])[..], &mut reply, &dest_cfg());
    match r {
        Err(MigrateError::Malformed {
            record: "PAGES",
            why,
            ..
        }) => {
            assert!(why.contains("twice"), "{why}")
        }
        other => panic!("expected a refused duplicate, got {other:?}"),
    }
}

#[test]
fn a_damaged_page_on_a_further_channel_is_named_and_the_guest_stays_on_the_source() {
    // Generous deadlines: this test is about which error is reported, and a
    // loaded machine must not turn the source's wait for REJECTED into a
    // timeout.
    let long = Duration::from_secs(10);
    let mut dcfg = dest_cfg();
    dcfg.dest.io_timeout = long;
    let (dest_addr, d) = start_dest(
        dcfg,
        NetConfig {
            io_timeout: long,
            security: Security::Plain,
        },
    );
    // Channel 1's proxy flips a byte past its opening, inside its pages.
    let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_addr = proxy.local_addr().unwrap().to_string();
    let to = dest_addr.clone();
    std::thread::spawn(move || {
        let (mut from, _) = proxy.accept().unwrap();
        let mut out = TcpStream::connect(&to).unwrap();
        let (mut back_from, mut back_to) = (out.try_clone().unwrap(), from.try_clone().unwrap());
        std::thread::spawn(move || std::io::copy(&mut back_from, &mut back_to));
        let flip_at = 8192u64 + 12345;
        let mut at = 0u64;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if at <= flip_at && flip_at < at + n as u64 {
                buf[(flip_at - at) as usize] ^= 0x20;
            }
            at += n as u64;
            if out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    let net = NetConfig {
        io_timeout: long,
        security: Security::Plain,
    };
    let cfg = small(16 << 20).with(|_, s| {
        s.channels = 2;
    });
    let r = migrate_source(&cfg, &mut |c| {
        let a = if c == 1 { &proxy_addr } else { &dest_addr };
        let s = net::connect_tcp(a, &net)?;
        net::client(s, &net)
    });
    let dr = d.join().unwrap();
    match &r {
        Err(MigrateError::Rejected { reason }) => assert!(
            reason.contains("checksum")
                || reason.contains("malformed")
                || reason.contains("compressed page"),
            "{reason}"
        ),
        other => panic!("expected the destination's reason, got {other:?} (destination: {dr:?})"),
    }
    match dr {
        Err(
            MigrateError::PageChecksum { .. }
            | MigrateError::BadCompressedPage { .. }
            | MigrateError::RecordChecksum { .. }
            | MigrateError::Malformed { .. }
            | MigrateError::UnknownRecord { .. },
        ) => {}
        other => panic!("expected the damaged channel's error, got {other:?}"),
    }
}
