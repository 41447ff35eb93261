//! End-to-end migrations of small guests over loopback TCP, and the
//! destination's handling of damaged streams. Behaviour only: no timing
//! is asserted.

mod migrate_common;

use migrate_common::{dest_cfg, plain, reply_tags, small, tls};
use s2mmu::mmu::DirtyMode;
use s2mmu::mmu::MmuPolicy;
use s2mmu_migrate::session::dest::DestOutcome;
use s2mmu_migrate::session::source::Converge;
use s2mmu_migrate::sim::dest::{receive, receive_from};
use s2mmu_migrate::sim::in_process::migrate_in_process;
use s2mmu_migrate::sim::source::{migrate_source, session_harvest, SimRun};
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::transport::{BoxConn, NetConfig};
use s2mmu_migrate::wire::{tag, Compression, PAGE_SIZE};
use s2mmu_vm::Pattern;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A source that uses `stream` (already connected) as its one channel.
fn once(stream: TcpStream) -> impl FnMut(u16) -> Result<BoxConn, MigrateError> {
    let mut s = Some(stream);
    move |_| {
        s.take()
            .map(|s| Box::new(s) as BoxConn)
            .ok_or_else(|| MigrateError::Setup("one channel only".into()))
    }
}

fn check_equal(cfg: &SimRun) {
    check_equal_over(cfg, &plain());
}

fn check_equal_over(cfg: &SimRun, net: &NetConfig) {
    let (s, d) = migrate_in_process(cfg, &dest_cfg(), net).expect("migration succeeds");
    assert_eq!(s.channels, cfg.session.channels);
    assert_eq!(d.channels, cfg.session.channels);
    assert_eq!(d.probe_bytes, 0, "no link probe unless asked for");
    assert_eq!(s.link_bytes, 0);
    assert_eq!(s.slot_digests.len(), cfg.guest.slots as usize);
    assert_eq!(s.slot_digests, d.slot_digests, "per-slot digests agree");
    assert!(d.resumed_at.is_some());
    assert_eq!(d.verify_mismatches, cfg.session.verify_full.then_some(0));
    assert!(s.rounds.len() >= 2, "a full round and the stop-and-copy");
    assert!(s.rounds.last().unwrap().final_round);
    assert_eq!(s.rounds[0].pages, cfg.guest.mem_size / PAGE_SIZE as u64);
    // The destination's guest went on from where the source's stopped.
    assert!(d.resumed_progress.iter().all(|&p| p >= 1));
}

#[test]
fn bitmap_migration_leaves_equal_memory() {
    check_equal(&small(32 << 20).with(|_, s| {
        s.verify_full = true;
    }));
}

#[test]
fn ring_migration_leaves_equal_memory() {
    // Small rings fill during the first round: the sender reaps them.
    check_equal(&small(16 << 20).with(|g, s| {
        g.dirty = DirtyMode::Ring { entries: 256 };
        s.harvest = session_harvest(g.dirty);
        s.verify_full = true;
        g.pattern = Pattern::Random;
    }));
}

#[test]
fn every_engine_dirty_mode_migrates_with_equal_memory() {
    // Migrate offers every mode the engine has, by the engine's own names:
    // hardware dirty state and PML harvest by GET + CLEAR, the vCPUs'
    // walkers dirtying the leaves (no write fault).
    for name in DirtyMode::NAMES {
        let harvest = name.parse::<DirtyMode>().unwrap();
        let harvest = match harvest {
            DirtyMode::Ring { .. } => DirtyMode::Ring { entries: 256 },
            other => other,
        };
        check_equal(&small(16 << 20).with(|g, s| {
            g.dirty = harvest;
            s.harvest = session_harvest(harvest);
            s.verify_full = true;
            g.pattern = Pattern::Random;
        }));
    }
}

#[test]
fn three_channels_over_tls_leave_equal_memory() {
    // Each page on the channel owning its stripe, every channel its own
    // mutual-TLS connection.
    let net = tls();
    check_equal_over(
        &small(16 << 20).with(|_, s| {
            s.channels = 3;
            s.verify_full = true;
        }),
        &net,
    );
}

/// With `lz4` every page that compresses goes compressed, over plain TCP
/// and TLS, one channel and three; every page is compared byte for byte
/// after the resume (verify-full) and by the per-slot digests.
#[test]
fn lz4_compressed_migrations_leave_equal_memory() {
    for (net, channels) in [(plain(), 1), (tls(), 3), (plain(), 2)] {
        let cfg = small(16 << 20).with(|_, s| {
            s.channels = channels;
            s.verify_full = true;
            s.compression = Compression::Lz4;
        });
        let (s, d) = migrate_in_process(&cfg, &dest_cfg(), &net).expect("migration succeeds");
        assert_eq!(d.verify_mismatches, Some(0));
        assert_eq!(s.slot_digests, d.slot_digests);
        assert_eq!(s.compression, Compression::Lz4);
        let data_pages = s.page_records - s.zero_pages;
        let c = s.compressed;
        assert!(c.pages <= data_pages);
        assert_eq!(c.raw_bytes, c.pages * PAGE_SIZE as u64);
        // The simulated guest's pages compress (its writes leave most of
        // each page as it was).
        assert!(c.pages > data_pages / 2, "{c:?} of {data_pages}");
        assert!(c.saved() > 0 && s.bytes < data_pages * PAGE_SIZE as u64);
    }
}

/// `off` sends no page compressed.
#[test]
fn compression_off_compresses_nothing() {
    let cfg = small(8 << 20).with(|_, s| s.compression = Compression::Off);
    let (s, _) = migrate_in_process(&cfg, &dest_cfg(), &plain()).expect("migration succeeds");
    assert_eq!(s.compressed, Default::default());
    assert_eq!(s.compression, Compression::Off);
}

#[test]
fn ring_harvest_over_two_channels_leaves_equal_memory() {
    check_equal(&small(16 << 20).with(|g, s| {
        s.channels = 2;
        g.dirty = DirtyMode::Ring { entries: 256 };
        s.harvest = session_harvest(g.dirty);
        g.pattern = Pattern::Random;
        s.verify_full = true;
    }));
}

#[test]
fn baseline_policy_with_throttle_migrates() {
    // A guest dirtying twice as fast as the link drains: auto-converge must
    // throttle it enough to finish.
    check_equal(&small(8 << 20).with(|g, s| {
        g.policy = MmuPolicy::baseline();
        g.dirty_rate = 64 << 20;
        s.bandwidth = 32 << 20;
        s.max_downtime = Duration::from_millis(50);
    }));
}

/// Reads through, keeping a copy of every byte.
struct Tee<R> {
    inner: R,
    copy: Arc<Mutex<Vec<u8>>>,
}

impl<R: Read> Read for Tee<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.copy.lock().unwrap().extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

impl<R: Write> Write for Tee<R> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A real migration whose stream is recorded on the way in.
fn recorded_stream() -> Vec<u8> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let copy = Arc::new(Mutex::new(Vec::new()));
    let c = copy.clone();
    let t = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let tee = Tee { inner: &s, copy: c };
        receive_from(tee, &s, &dest_cfg())
    });
    let stream = TcpStream::connect(addr).unwrap();
    // The raw form, which `records` parses.
    let cfg = small(8 << 20).with(|_, s| s.compression = Compression::Off);
    migrate_source(&cfg, &mut once(stream)).expect("source");
    t.join().unwrap().expect("destination");
    let v = copy.lock().unwrap().clone();
    v
}

/// Offsets and tags of the records after the opening and HEADER.
fn records(stream: &[u8]) -> Vec<(usize, u8)> {
    let hlen = u32::from_le_bytes(stream[11..15].try_into().unwrap()) as usize;
    let mut at = 10 + 1 + 4 + hlen + 8;
    let mut v = Vec::new();
    let u64_at = |a: usize| u64::from_le_bytes(stream[a..a + 8].try_into().unwrap());
    while at < stream.len() {
        let t = stream[at];
        v.push((at, t));
        at += match t {
            tag::PAGES => {
                let count = u16::from_le_bytes(stream[at + 1..at + 3].try_into().unwrap()) as usize;
                let data = (0..count)
                    .filter(|k| u64_at(at + 3 + 16 * k) & 1 == 0)
                    .count();
                3 + 16 * count + 8 + data * PAGE_SIZE
            }
            tag::PROBE => 17 + u64_at(at + 1) as usize,
            _ => {
                let len = u32::from_le_bytes(stream[at + 1..at + 5].try_into().unwrap()) as usize;
                1 + 4 + len + 8
            }
        };
    }
    assert_eq!(at, stream.len(), "records tile the stream");
    v
}

/// Feeds `stream` to a destination; returns its result and its replies.
fn replay(stream: &[u8]) -> (Result<DestOutcome, MigrateError>, Vec<u8>) {
    let mut reply = Vec::new();
    let r = receive_from(stream, &mut reply, &dest_cfg());
    (r, reply)
}

fn assert_rejected(stream: &[u8], check: impl Fn(&MigrateError) -> bool) {
    let (r, reply) = replay(stream);
    match r {
        Err(e) => assert!(check(&e), "unexpected error: {e}"),
        Ok(_) => panic!("a damaged stream was accepted and the guest resumed"),
    }
    let tags = reply_tags(&reply);
    assert_eq!(
        tags.last(),
        Some(&tag::REJECTED),
        "the source is told: {tags:x?}"
    );
    assert!(!tags.contains(&tag::RESUMED), "no RESUMED is sent");
}

#[test]
fn damaged_streams_are_rejected_and_never_resumed() {
    let good = recorded_stream();
    let recs = records(&good);
    // The untouched stream resumes (SYNCED: the source's SYNC before its
    // pause, answered once every page sent before it was taken).
    let (r, reply) = replay(&good);
    r.expect("the recorded stream is valid");
    assert_eq!(
        reply_tags(&reply),
        vec![tag::ACCEPT, tag::PROBED, tag::SYNCED, tag::RESUMED]
    );

    // A flipped byte in a page's data (the first record's first page is
    // not a zero page: the guest stamped every page).
    let (page_at, _) = *recs.iter().find(|(_, t)| *t == tag::PAGES).unwrap();
    let count = u16::from_le_bytes(good[page_at + 1..page_at + 3].try_into().unwrap()) as usize;
    let data_at = page_at + 3 + 16 * count + 8;
    let mut bad = good.clone();
    bad[data_at + 1000] ^= 0x40;
    assert_rejected(&bad, |e| matches!(e, MigrateError::PageChecksum { .. }));

    // A flipped byte in a page's address: the record's checksum covers it.
    let mut bad = good.clone();
    bad[page_at + 3 + 2] ^= 0x10;
    assert_rejected(&bad, |e| {
        matches!(
            e,
            MigrateError::RecordChecksum {
                record: "PAGES",
                ..
            }
        )
    });

    // A flipped byte in the vCPU STATE control record.
    let (state_at, _) = *recs.iter().find(|(_, t)| *t == tag::STATE).unwrap();
    let mut bad = good.clone();
    bad[state_at + 5 + 3] ^= 0x01;
    assert_rejected(&bad, |e| {
        matches!(
            e,
            MigrateError::RecordChecksum {
                record: "STATE",
                ..
            }
        )
    });

    // A record tag that does not exist.
    let mut bad = good.clone();
    bad[recs[0].0] = 0x7f;
    assert_rejected(&bad, |e| {
        matches!(e, MigrateError::UnknownRecord { tag: 0x7f, .. })
    });

    // Another format version.
    let mut bad = good.clone();
    bad[8] = 99;
    assert_rejected(&bad, |e| {
        matches!(e, MigrateError::Version { found: 99, .. })
    });

    // Truncated: in the header, inside a page, and cleanly before END.
    let (end_at, end_tag) = *recs.last().unwrap();
    assert_eq!(end_tag, tag::END);
    for cut in [5, data_at + 2048, end_at] {
        assert_rejected(&good[..cut], |e| {
            matches!(e, MigrateError::Truncated { .. })
        });
    }

    // A whole PAGES record missing, the stream otherwise intact: the
    // counts of SYNC (before the source's pause) no longer match.
    let next_at = recs.iter().find(|(a, _)| *a > page_at).unwrap().0;
    let mut bad = good[..page_at].to_vec();
    bad.extend_from_slice(&good[next_at..]);
    assert_rejected(&bad, |e| {
        matches!(e, MigrateError::Malformed { record: "SYNC", .. })
    });
}

/// SYNC's last byte names the ending that follows: the recorded
/// stop-and-copy says 0; one that announces post-copy on a HEADER that
/// did not allow it, or an ending that does not exist, is refused by
/// name, with its checksum intact.
#[test]
fn a_sync_that_announces_another_ending_is_refused() {
    use s2mmu_migrate::hash::checksum;
    use s2mmu_migrate::wire::{SYNC_THEN_POSTCOPY, SYNC_THEN_STOP};
    let good = recorded_stream();
    let (sync_at, _) = *records(&good)
        .iter()
        .find(|(_, t)| *t == tag::SYNC)
        .expect("the source sends SYNC before its pause");
    let len = u32::from_le_bytes(good[sync_at + 1..sync_at + 5].try_into().unwrap()) as usize;
    let body = sync_at + 5;
    assert_eq!(
        good[body + len - 1],
        SYNC_THEN_STOP,
        "stop-and-copy follows"
    );
    for (then, why) in [
        (SYNC_THEN_POSTCOPY, "the HEADER did not allow"),
        (7, "neither 0"),
    ] {
        let mut bad = good.clone();
        bad[body + len - 1] = then;
        let sum = checksum(&bad[body..body + len], u64::from(tag::SYNC));
        bad[body + len..body + len + 8].copy_from_slice(&sum.to_le_bytes());
        assert_rejected(
            &bad,
            |e| matches!(e, MigrateError::Malformed { record: "SYNC", why: w, .. } if w.contains(why)),
        );
    }
}

#[test]
fn a_migration_that_cannot_converge_fails_cleanly() {
    // The guest dirties all of its memory every round and the link is too
    // slow to send it within the budget; no convergence help.
    let cfg = small(8 << 20).with(|g, s| {
        g.dirty_rate = 0;
        s.bandwidth = 16 << 20;
        s.converge = Converge::None;
        s.max_rounds = 2;
        s.max_downtime = Duration::from_millis(50);
        // The simulated guest's pages compress a hundredfold: compressed,
        // they would fit the budget.
        s.compression = Compression::Off;
    });
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        receive(s, &dest_cfg())
    });
    let stream = TcpStream::connect(addr).unwrap();
    let src = migrate_source(&cfg, &mut once(stream));
    match &src {
        Err(MigrateError::NotConverged { rounds, .. }) => assert_eq!(*rounds, 3),
        other => panic!("expected NotConverged, got {other:?}"),
    }
    let msg = src.unwrap_err().to_string();
    assert!(msg.contains("did not converge"), "{msg}");
    match t.join().unwrap() {
        Err(MigrateError::Aborted { .. }) => {}
        other => panic!("the destination must not resume: {other:?}"),
    }
}

fn read_n(r: &mut impl Read, n: usize) -> std::io::Result<Vec<u8>> {
    let mut v = vec![0u8; n];
    r.read_exact(&mut v)?;
    Ok(v)
}

/// Forwards the source's stream to the destination, rewriting one page's
/// data, *its* checksum and its record's: a stream that is valid but
/// carries the wrong memory, as a dirty-tracking bug would produce.
fn tampering_proxy(mut from: TcpStream, mut to: TcpStream, victim: u64) -> std::io::Result<()> {
    use s2mmu_migrate::hash::{checksum, page_hash};
    let (mut back_from, mut back_to) = (to.try_clone()?, from.try_clone()?);
    std::thread::spawn(move || std::io::copy(&mut back_from, &mut back_to));
    // The opening and HEADER.
    let head = read_n(&mut from, 15)?;
    let len = u32::from_le_bytes(head[11..15].try_into().unwrap()) as usize;
    to.write_all(&head)?;
    to.write_all(&read_n(&mut from, len + 8)?)?;
    let mut tampered = false;
    loop {
        let t = read_n(&mut from, 1)?;
        to.write_all(&t)?;
        match t[0] {
            tag::PAGES => {
                let c = read_n(&mut from, 2)?;
                let count = u16::from_le_bytes(c[..].try_into().unwrap()) as usize;
                let mut entries = read_n(&mut from, 16 * count + 8)?;
                let mut datas = Vec::new();
                for k in 0..count {
                    let word = u64::from_le_bytes(entries[16 * k..16 * k + 8].try_into().unwrap());
                    if word & 1 == 0 {
                        datas.push((k, word, read_n(&mut from, PAGE_SIZE)?));
                    }
                }
                for (k, gpa, data) in &mut datas {
                    if !tampered && *gpa == victim {
                        tampered = true;
                        data[8] ^= 0xff;
                        let h = page_hash(data, *gpa);
                        entries[16 * *k + 8..16 * *k + 16].copy_from_slice(&h.to_le_bytes());
                        let mut covered = c.clone();
                        covered.extend_from_slice(&entries[..16 * count]);
                        let check = checksum(&covered, u64::from(tag::PAGES));
                        entries[16 * count..].copy_from_slice(&check.to_le_bytes());
                    }
                }
                to.write_all(&c)?;
                to.write_all(&entries)?;
                for (_, _, d) in datas {
                    to.write_all(&d)?;
                }
            }
            tag::PROBE => {
                let l = read_n(&mut from, 16)?;
                let n = u64::from_le_bytes(l[..8].try_into().unwrap()) as usize;
                to.write_all(&l)?;
                to.write_all(&read_n(&mut from, n)?)?;
            }
            _ => {
                let l = read_n(&mut from, 4)?;
                let n = u32::from_le_bytes(l[..].try_into().unwrap()) as usize;
                to.write_all(&l)?;
                to.write_all(&read_n(&mut from, n + 8)?)?;
            }
        }
    }
}

#[test]
fn wrong_memory_on_the_destination_fails_verification() {
    let dest_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let dest_addr = dest_listener.local_addr().unwrap();
    let dest = std::thread::spawn(move || {
        let (s, _) = dest_listener.accept().unwrap();
        receive(s, &dest_cfg())
    });
    let proxy_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_addr = proxy_listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let (from, _) = proxy_listener.accept().unwrap();
        let to = TcpStream::connect(dest_addr).unwrap();
        // The last page of guest memory, which the slow guest below does
        // not reach during the migration.
        let _ = tampering_proxy(from, to, (1 << 32) + (8 << 20) - PAGE_SIZE as u64);
    });
    let stream = TcpStream::connect(proxy_addr).unwrap();
    let cfg = small(8 << 20).with(|g, s| {
        // A guest writing a page per second per vCPU: the tampered page is
        // sent once, so the wrong byte stays on the destination.
        g.dirty_rate = 2 * PAGE_SIZE as u64;
        // The raw form, which the proxy parses.
        s.compression = Compression::Off;
    });
    let r = migrate_source(&cfg, &mut once(stream));
    match &r {
        Err(MigrateError::MemoryMismatch { slot: 1, .. }) => {}
        other => panic!("expected a verification failure, got {other:?}"),
    }
    assert!(r.unwrap_err().to_string().contains("VERIFICATION FAILED"));
    // The destination itself saw a valid stream.
    assert!(dest.join().unwrap().is_ok());
}
