//! Post-copy migrations of small guests over loopback TCP: a guest that
//! dirties memory as fast as it can resumes on the destination after
//! round 0 and verifies; `--postcopy auto` switches when pre-copy does not
//! converge; damaged and cut post-copy streams are refused by name, and
//! both sides then say the guest's memory is split. Behaviour only: no
//! timing is asserted.

mod migrate_common;

use migrate_common::{dest_cfg, plain, tls};
use s2mmu::mmu::DirtyMode;
use s2mmu_migrate::session::dest::DestOutcome;
use s2mmu_migrate::session::postcopy::Postcopy;
use s2mmu_migrate::session::source::{Converge, SourceOutcome};
use s2mmu_migrate::sim::dest::serve;
use s2mmu_migrate::sim::in_process::migrate_in_process;
use s2mmu_migrate::sim::source::{migrate_source, session_harvest, SimRun};
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::transport::{self as net, BoxConn, Connection, ShutdownHandle};
use s2mmu_migrate::wire::{tag, Compression, PAGE_SIZE};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

/// [`migrate_common::small`] with post-copy on, dirtying at full speed.
fn small(mem: u64) -> SimRun {
    migrate_common::small(mem).with(|g, s| {
        g.dirty_rate = 0;
        s.postcopy = Postcopy::On;
    })
}

/// The checks every post-copy run passes, and `f.requests >= 1` unless
/// `requests_may_be_zero` (a run cut and recovered: after the recovery the
/// background stream can land the last missing page before any vCPU
/// touches one, so the guest asking for a page is timing, not behaviour).
fn check_postcopy_run(
    s: &SourceOutcome,
    d: &DestOutcome,
    cfg: &SimRun,
    requests_may_be_zero: bool,
) {
    let pc = s
        .postcopy
        .as_ref()
        .expect("the migration switched to post-copy");
    let f = &pc.figures;
    assert_eq!(
        d.postcopy.as_ref(),
        Some(f),
        "both sides report the same figures"
    );
    assert!(
        f.missing_pages > 0,
        "a guest dirtying at full speed leaves pages to fetch"
    );
    assert!(f.missing_pages <= cfg.guest.mem_size / PAGE_SIZE as u64);
    // Every missing page landed exactly once, from one of the two streams.
    assert_eq!(f.background_pages + f.answered_pages, f.missing_pages);
    assert!(requests_may_be_zero || f.requests >= 1);
    assert!(f.remote_faults >= f.requests.min(1));
    assert!(f.reference_samples >= 1);
    assert_eq!(s.slot_digests.len(), cfg.guest.slots as usize);
    assert_eq!(s.slot_digests, d.slot_digests, "memory verified");
    assert!(d.resumed_progress.iter().all(|&p| p >= 1));
    // The switch's downtime is broken down on both sides: the source's
    // parts add up to it, no page is sent while paused and no digests
    // are made at a post-copy resume; the sends, the waits, the
    // destination's start and its reply each took time.
    let (p, q) = (s.downtime_parts, d.resume_parts);
    assert_eq!(p.total(), s.downtime, "the switch's parts add up: {p:?}");
    assert_eq!((p.last_pages, q.digests), (Duration::ZERO, Duration::ZERO));
    let each = [p.state_send, p.until_resumed, q.start, q.reply];
    assert!(each.iter().all(|t| !t.is_zero()), "{p:?} {q:?}");
}

fn check_postcopy(s: &SourceOutcome, d: &DestOutcome, cfg: &SimRun) {
    check_postcopy_run(s, d, cfg, false);
}

/// Paced at 16 MiB/s, round 0 and the background stream each take about
/// 2 s: the guest's vCPUs dirty pages during round 0 and touch a missing
/// page before the stream brings it even on a loaded machine (unpaced,
/// a machine at load 30 ran the whole stream before a vCPU thread got a
/// core: 0 requests).
#[test]
fn a_guest_dirtying_as_fast_as_it_can_migrates_with_postcopy() {
    let cfg = small(32 << 20).with(|_, s| {
        s.bandwidth = 16 << 20;
        // Raw pages: compressed, the simulated guest's take a hundredth of
        // the time on the paced link.
        s.compression = Compression::Off;
    });
    let (s, d) = migrate_in_process(&cfg, &dest_cfg(), &plain()).expect("post-copy succeeds");
    check_postcopy(&s, &d, &cfg);
    assert_eq!(s.postcopy.as_ref().unwrap().after_round, 0);
    assert_eq!(s.rounds.len(), 1, "round 0, then post-copy");
}

/// Post-copy from the start with every page compressed: the background
/// stream and the answers carry LZ4 pages, and the digests agree. Paced
/// at 256 KiB/s, the compressed pages (a hundredth of their size) take
/// about as long as raw ones at 16 MiB/s above, so a vCPU asks first.
#[test]
fn postcopy_with_compressed_answers_and_background_pages() {
    let cfg = small(32 << 20).with(|_, s| {
        s.postcopy = Postcopy::Start;
        s.compression = Compression::Lz4;
        s.bandwidth = 256 << 10;
    });
    let (s, d) = migrate_in_process(&cfg, &dest_cfg(), &plain()).expect("post-copy succeeds");
    check_postcopy(&s, &d, &cfg);
    let pc = s.postcopy.as_ref().unwrap();
    // Nothing was sent before the switch: every compressed page went as
    // a background page or an answer.
    assert!(s.compressed.pages > 0, "{:?}", s.compressed);
    assert!(s.compressed.pages <= pc.background_pages + pc.answered_pages);
    assert!(pc.bytes < (pc.background_pages + pc.answered_pages) * PAGE_SIZE as u64);
}

#[test]
fn postcopy_with_dirty_rings_and_two_channels_over_tls() {
    let cfg = small(32 << 20).with(|g, s| {
        g.dirty = DirtyMode::Ring { entries: 256 };
        s.harvest = session_harvest(g.dirty);
        s.channels = 2;
        s.bandwidth = 16 << 20; // as above: a request must come first
        s.compression = Compression::Off;
    });
    let net = tls();
    let (s, d) = migrate_in_process(&cfg, &dest_cfg(), &net).expect("post-copy succeeds");
    check_postcopy(&s, &d, &cfg);
}

#[test]
fn postcopy_auto_switches_when_precopy_does_not_converge() {
    let cfg = small(16 << 20).with(|_, s| {
        s.postcopy = Postcopy::Auto;
        // Paced as above (64 MiB/s before): the background stream of the
        // missing pages takes about a second, so a vCPU asks for one first
        // even on a loaded machine.
        s.bandwidth = 16 << 20;
        s.compression = Compression::Off;
        s.converge = Converge::None;
        s.max_rounds = 6;
        s.max_downtime = Duration::from_millis(5);
    });
    let (s, d) = migrate_in_process(&cfg, &dest_cfg(), &plain()).expect("post-copy succeeds");
    check_postcopy(&s, &d, &cfg);
    let after = s.postcopy.as_ref().unwrap().after_round;
    assert!(after >= 1, "pre-copy ran rounds before the switch");
    assert_eq!(s.rounds.len() as u32, after + 1);
}

/// A stream that may switch (`--postcopy auto`) but converges ends by
/// stop-and-copy: its SYNC announces the stop-and-copy (so the
/// destination readies no post-copy resume), the destination resumes from
/// END, and the memories agree.
#[test]
fn postcopy_auto_that_converges_ends_by_stop_and_copy() {
    let cfg = migrate_common::small(8 << 20).with(|g, s| {
        g.dirty_rate = 1 << 20;
        s.postcopy = Postcopy::Auto;
    });
    let (s, d) = migrate_in_process(&cfg, &dest_cfg(), &plain()).expect("the migration succeeds");
    assert!(s.postcopy.is_none(), "pre-copy converged: no switch");
    assert!(d.postcopy.is_none());
    assert!(d.resumed_at.is_some(), "the destination resumed from END");
    assert_eq!(s.slot_digests, d.slot_digests, "memory verified");
    assert!(s.pause_at.is_some(), "the source paused its guest");
}

/// What a [`Tamper`] does once armed.
#[derive(Clone, Copy)]
enum Harm {
    /// Flip a byte this many bytes after arming.
    Flip(u64),
    /// Fail every write this many bytes after arming (the connection is
    /// shut down: a cut cable).
    Cut(u64),
    /// Flip this byte of the POSTCOPY record itself.
    FlipPostcopy(usize),
}

/// A connection that arms when it writes the POSTCOPY record (or at once)
/// and then damages or cuts what it writes.
struct Tamper {
    inner: BoxConn,
    armed_at: Option<u64>,
    arm_on_postcopy: bool,
    pos: u64,
    harm: Harm,
    done: bool,
}

impl Read for Tamper {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(b)
    }
}

impl Write for Tamper {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let mut data = b.to_vec();
        if self.armed_at.is_none()
            && self.arm_on_postcopy
            && b.len() >= 5
            && b[0] == tag::POSTCOPY
            && u32::from_le_bytes(b[1..5].try_into().unwrap()) as usize == b.len() - 13
        {
            self.armed_at = Some(self.pos + b.len() as u64);
            if let Harm::FlipPostcopy(k) = self.harm {
                data[k.min(b.len() - 1)] ^= 0x40;
                self.done = true;
            }
        }
        if self.armed_at.is_none() && !self.arm_on_postcopy {
            self.armed_at = Some(0);
        }
        if let (Some(at), false) = (self.armed_at, self.done) {
            match self.harm {
                Harm::Flip(k) if self.pos + data.len() as u64 > at + k && self.pos <= at + k => {
                    data[(at + k - self.pos) as usize] ^= 0x40;
                    self.done = true;
                }
                Harm::Cut(k) if self.pos + data.len() as u64 > at + k => {
                    self.done = true;
                    if let Ok(s) = self.inner.shutdown_handle() {
                        s.shutdown();
                    }
                    return Err(std::io::Error::other("cut"));
                }
                _ => {}
            }
        }
        self.inner.write_all(&data)?;
        self.pos += data.len() as u64;
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl Connection for Tamper {
    fn set_io_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.inner.set_io_timeout(timeout)
    }
    fn io_timeout(&self) -> Option<Duration> {
        self.inner.io_timeout()
    }
    fn shutdown_handle(&self) -> std::io::Result<ShutdownHandle> {
        self.inner.shutdown_handle()
    }
    fn peer(&self) -> String {
        self.inner.peer()
    }
}

/// Runs a post-copy migration whose connection `victim` is a [`Tamper`]
/// (only the first one opened for that channel unless `every`); returns
/// both sides' results.
fn tampered(
    cfg: &SimRun,
    victim: u16,
    arm_on_postcopy: bool,
    harm: Harm,
    every: bool,
) -> (
    Result<SourceOutcome, MigrateError>,
    Result<DestOutcome, MigrateError>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let n = plain();
    let dn = n.clone();
    let dest = std::thread::spawn(move || serve(&listener, &dest_cfg(), &dn));
    let mut opened = 0;
    let src = migrate_source(cfg, &mut |c| {
        let s = net::connect_tcp(&addr.to_string(), &n)?;
        let conn = net::client(s, &n)?;
        opened += u32::from(c == victim);
        Ok(if c == victim && (every || opened == 1) {
            Box::new(Tamper {
                inner: conn,
                armed_at: None,
                arm_on_postcopy,
                pos: 0,
                harm,
                done: false,
            }) as BoxConn
        } else {
            conn
        })
    });
    (src, dest.join().unwrap())
}

fn assert_split(r: &Result<impl std::fmt::Debug, MigrateError>, side: &str) -> String {
    match r {
        Err(e @ MigrateError::PostcopyBroken { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("SPLIT between the two hosts"), "{msg}");
            msg
        }
        other => panic!("{side}: expected PostcopyBroken, got {other:?}"),
    }
}

#[test]
fn a_damaged_answer_is_refused_and_both_sides_say_memory_is_split() {
    let cfg = small(16 << 20);
    // The answer connection carries only post-copy pages: byte 200 after
    // its opening and JOIN (41 bytes) lies in the first answer's page data.
    let (s, d) = tampered(
        &cfg,
        cfg.session.channels + 1,
        false,
        Harm::Flip(41 + 200),
        true,
    );
    let msg = assert_split(&d, "destination");
    assert!(msg.contains("checksum mismatch"), "{msg}");
    assert_split(&s, "source");
}

#[test]
fn a_damaged_postcopy_record_is_refused_before_the_resume() {
    let cfg = small(16 << 20);
    // A bit of the missing pages' bitmap: the record's checksum fails and
    // the destination never resumes (the source's guest goes on there).
    let (s, d) = tampered(&cfg, 0, true, Harm::FlipPostcopy(7), true);
    match &d {
        Err(MigrateError::RecordChecksum { record, .. }) => assert_eq!(*record, "POSTCOPY"),
        other => panic!("destination: expected a POSTCOPY checksum error, got {other:?}"),
    }
    match &s {
        Err(MigrateError::Rejected { reason }) => {
            assert!(reason.contains("checksum mismatch"), "{reason}")
        }
        other => panic!("source: expected Rejected, got {other:?}"),
    }
}

#[test]
fn a_damaged_background_record_is_refused() {
    // Raw pages: the flipped byte lands in a page's data, not in a
    // compressed page's bytes (a damaged compressed page: the wire's tests).
    let cfg = small(16 << 20).with(|_, s| s.compression = Compression::Off);
    let (s, d) = tampered(&cfg, 0, true, Harm::Flip(3000), true);
    let msg = assert_split(&d, "destination");
    assert!(msg.contains("checksum mismatch"), "{msg}");
    assert_split(&s, "source");
}

/// Offsets into a stream, pseudo-random from the clock (printed, so a
/// failing run can be repeated).
fn random_offsets(n: usize, below: u64) -> Vec<u64> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    eprintln!("cut offsets from seed {seed:#x}");
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % below
        })
        .collect()
}

fn cut_and_recover(harvest: DirtyMode) {
    // The background stream of a 16 MiB guest is about 16 MiB: cut it
    // somewhere in its first half; then cut the answer connection.
    let mut cuts: Vec<(u16, bool, u64)> = random_offsets(2, 8 << 20)
        .into_iter()
        .map(|k| (0, true, k))
        .collect();
    cuts.push((3, false, 41 + 5));
    for (victim, arm_on_postcopy, at) in cuts {
        let cfg = small(16 << 20).with(|g, s| {
            g.dirty = harvest;
            s.harvest = session_harvest(harvest);
            // Raw pages, so the cut falls inside the background stream.
            s.compression = Compression::Off;
        });
        let victim = if victim == 0 {
            0
        } else {
            cfg.session.channels + 1
        };
        let (s, d) = tampered(&cfg, victim, arm_on_postcopy, Harm::Cut(at), false);
        let (s, d) = match (s, d) {
            (Ok(s), Ok(d)) => (s, d),
            other => panic!("cut of channel {victim} at {at}: not recovered: {other:?}"),
        };
        check_postcopy_run(&s, &d, &cfg, true);
        let pc = s.postcopy.as_ref().unwrap();
        assert_eq!(pc.recoveries, 1, "cut of channel {victim} at {at}");
        assert_eq!(pc.figures.recoveries, 1);
    }
}

#[test]
fn a_cut_connection_during_postcopy_is_recovered() {
    cut_and_recover(DirtyMode::WP);
}

#[test]
fn a_cut_connection_during_postcopy_is_recovered_with_dirty_rings() {
    cut_and_recover(DirtyMode::Ring { entries: 256 });
}

#[test]
fn a_connection_that_keeps_breaking_ends_in_split_memory() {
    let cfg = small(16 << 20);
    // Every answer connection is cut at its first answer: the recoveries
    // run out.
    let (s, d) = tampered(
        &cfg,
        cfg.session.channels + 1,
        false,
        Harm::Cut(41 + 5),
        true,
    );
    let msg = assert_split(&d, "destination");
    assert!(msg.contains("recoveries already"), "{msg}");
    assert_split(&s, "source");
}

/// A 1 MiB simulated VM in two slots, for post-copy's check.
fn small_sim_vm() -> s2mmu_migrate::sim::SimVm<s2mmu::format::arm64::Arm64Stage2> {
    use s2mmu_vm::{Vm, VmConfig};
    s2mmu_migrate::sim::SimVm::new(std::sync::Arc::new(
        Vm::new(VmConfig {
            mem_size: 1 << 20,
            slots: 2,
            ..VmConfig::default()
        })
        .unwrap(),
    ))
}

/// Post-copy's check on its own: the destination's FINAL must be the
/// source's memory plus exactly the writes of the states it reports.
#[test]
fn the_postcopy_check_refuses_wrong_memory_and_unreachable_states() {
    use s2mmu_migrate::session::digests::source_digests;
    use s2mmu_migrate::session::postcopy::Final;
    use s2mmu_migrate::sim::source::verify;
    use s2mmu_migrate::sim::state::encode_vcpus;
    use s2mmu_migrate::sim::state::GuestState;
    use s2mmu_vm::{stamp, VcpuState};

    let vm = small_sim_vm();
    let from = VcpuState {
        pass: 3,
        next_page: 10,
        rng: 5,
        writes: 100,
    };
    let state = GuestState {
        bytes_per_vcpu: 512 << 10,
        write_percent: 100,
        pattern: 0,
        pace_pages_per_sec: 0,
        vcpus: vec![from; 2],
    };
    // The destination ran vCPU 0 two pages on (pages 10 and 11 of its
    // region, pass 3) and vCPU 1 not at all.
    let to = VcpuState {
        next_page: 12,
        writes: 102,
        ..from
    };
    let dest_mem = small_sim_vm();
    for p in [10u64, 11] {
        dest_mem.vm().memory().write_u64(p * 4096, stamp(0, 3, p));
    }
    let good = Final {
        state: encode_vcpus(&[to, from]),
        digests: source_digests(&dest_mem),
        ..Final::default()
    };
    assert_eq!(verify(&vm, &state, &good).unwrap(), good.digests);
    // A write the replay does not explain (a late copy overwrote one, say).
    dest_mem.vm().memory().write_u64(11 * 4096, 0);
    let wrong = Final {
        digests: source_digests(&dest_mem),
        ..good.clone()
    };
    match verify(&vm, &state, &wrong) {
        Err(MigrateError::MemoryMismatch { slot: 0, .. }) => {}
        other => panic!("expected a mismatch in slot 0, got {other:?}"),
    }
    // States the guest cannot have reached.
    let backwards = Final {
        state: encode_vcpus(&[
            VcpuState {
                next_page: 5,
                ..from
            },
            from,
        ]),
        ..good.clone()
    };
    assert!(matches!(
        verify(&vm, &state, &backwards),
        Err(MigrateError::MemoryMismatch { .. })
    ));
    let too_few = Final {
        state: encode_vcpus(&[to]),
        ..good
    };
    assert!(matches!(
        verify(&vm, &state, &too_few),
        Err(MigrateError::MemoryMismatch { .. })
    ));
}
