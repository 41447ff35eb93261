//! End-to-end migrations of small guests over loopback TCP, and the
//! destination's handling of damaged streams. Behaviour only: no timing
//! is asserted.

use s2mmu::mmu::MmuPolicy;
use s2mmu_cli::migrate::dest::{receive, receive_from, DestConfig, DestOutcome};
use s2mmu_cli::migrate::error::MigrateError;
use s2mmu_cli::migrate::migrate_in_process;
use s2mmu_cli::migrate::source::{migrate_source, Converge, Harvest, SourceConfig};
use s2mmu_cli::migrate::wire::{tag, Record, WireReader, PAGE_SIZE};
use s2mmu_vm::{Backing, Pattern};
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn small(mem: u64) -> SourceConfig {
    SourceConfig {
        mem_size: mem,
        backing: Backing::Anonymous,
        slots: 2,
        ring_entries: 256,
        clear_chunk: 1 << 20,
        warmup: Duration::from_millis(50),
        sample_every: Duration::from_millis(20),
        progress: false,
        ..SourceConfig::default()
    }
}

fn dest_cfg() -> DestConfig {
    DestConfig {
        policy: MmuPolicy::default(),
        run_after: Duration::from_millis(50),
    }
}

fn check_equal(cfg: &SourceConfig) {
    let (s, d) = migrate_in_process(cfg, &dest_cfg()).expect("migration succeeds");
    assert_eq!(s.slot_digests.len(), cfg.slots as usize);
    assert_eq!(s.slot_digests, d.slot_digests, "per-slot digests agree");
    assert!(d.resumed_at.is_some());
    assert_eq!(d.verify_mismatches, cfg.verify_full.then_some(0));
    assert!(s.rounds.len() >= 2, "a full round and the stop-and-copy");
    assert!(s.rounds.last().unwrap().final_round);
    assert_eq!(s.rounds[0].pages, cfg.mem_size / PAGE_SIZE as u64);
    // The destination's guest went on from where the source's stopped.
    assert!(d.resumed_passes.iter().all(|&p| p >= 1));
}

#[test]
fn bitmap_migration_leaves_equal_memory() {
    check_equal(&SourceConfig {
        verify_full: true,
        ..small(32 << 20)
    });
}

#[test]
fn ring_migration_leaves_equal_memory() {
    // Small rings fill during the first round: the sender reaps them.
    check_equal(&SourceConfig {
        harvest: Harvest::Ring,
        verify_full: true,
        pattern: Pattern::Random,
        ..small(16 << 20)
    });
}

#[test]
fn baseline_policy_with_throttle_migrates() {
    // A guest dirtying twice as fast as the link drains: auto-converge must
    // throttle it enough to finish.
    check_equal(&SourceConfig {
        policy: MmuPolicy::baseline(),
        dirty_rate: 64 << 20,
        bandwidth: 32 << 20,
        max_downtime: Duration::from_millis(50),
        ..small(8 << 20)
    });
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
    migrate_source(&small(8 << 20), &stream, &stream).expect("source");
    t.join().unwrap().expect("destination");
    let v = copy.lock().unwrap().clone();
    v
}

/// Offsets and tags of the records after the header.
fn records(stream: &[u8]) -> Vec<(usize, u8)> {
    let hlen = u32::from_le_bytes(stream[10..14].try_into().unwrap()) as usize;
    let mut at = 14 + hlen + 8;
    let mut v = Vec::new();
    while at < stream.len() {
        let t = stream[at];
        v.push((at, t));
        at += if t == tag::PAGE {
            17 + PAGE_SIZE
        } else {
            let len = u32::from_le_bytes(stream[at + 1..at + 5].try_into().unwrap()) as usize;
            1 + 4 + len + 8
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

fn reply_tags(reply: &[u8]) -> Vec<u8> {
    let mut rd = WireReader::replies(reply);
    let mut tags = Vec::new();
    while let Ok(Record::Control { tag, .. }) = rd.next_record() {
        tags.push(tag);
    }
    tags
}

fn assert_rejected(stream: &[u8], check: impl Fn(&MigrateError) -> bool) {
    let (r, reply) = replay(stream);
    match r {
        Err(e) => assert!(check(&e), "unexpected error: {e}"),
        Ok(_) => panic!("a damaged stream was accepted and the guest resumed"),
    }
    assert_eq!(
        reply_tags(&reply),
        vec![tag::REJECTED],
        "the source is told, and no RESUMED is sent"
    );
}

#[test]
fn damaged_streams_are_rejected_and_never_resumed() {
    let good = recorded_stream();
    let recs = records(&good);
    // The untouched stream resumes.
    let (r, reply) = replay(&good);
    r.expect("the recorded stream is valid");
    assert_eq!(reply_tags(&reply), vec![tag::RESUMED]);

    // A flipped byte in a page's data.
    let (page_at, _) = *recs.iter().find(|(_, t)| *t == tag::PAGE).unwrap();
    let mut bad = good.clone();
    bad[page_at + 17 + 1000] ^= 0x40;
    assert_rejected(&bad, |e| matches!(e, MigrateError::PageChecksum { .. }));

    // A flipped byte in a page's address: its checksum is seeded with it.
    let mut bad = good.clone();
    bad[page_at + 2] ^= 0x10;
    assert_rejected(&bad, |e| matches!(e, MigrateError::PageChecksum { .. }));

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
    for cut in [5, page_at + 17 + 2048, end_at] {
        assert_rejected(&good[..cut], |e| {
            matches!(e, MigrateError::Truncated { .. })
        });
    }

    // A whole page record missing, the stream otherwise intact: END's
    // counts no longer match.
    let mut bad = good[..page_at].to_vec();
    bad.extend_from_slice(&good[page_at + 17 + PAGE_SIZE..]);
    assert_rejected(&bad, |e| {
        matches!(e, MigrateError::Malformed { record: "END", .. })
    });
}

#[test]
fn a_migration_that_cannot_converge_fails_cleanly() {
    // The guest dirties all of its memory every round and the link is too
    // slow to send it within the budget; no convergence help.
    let cfg = SourceConfig {
        dirty_rate: 0,
        bandwidth: 16 << 20,
        converge: Converge::None,
        max_rounds: 2,
        max_downtime: Duration::from_millis(50),
        ..small(8 << 20)
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        receive(&s, &dest_cfg())
    });
    let stream = TcpStream::connect(addr).unwrap();
    let src = migrate_source(&cfg, &stream, &stream);
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
/// data *and* its checksum: a stream that is valid but carries the wrong
/// memory, as a dirty-tracking bug would produce.
fn tampering_proxy(mut from: TcpStream, mut to: TcpStream, victim: u64) -> std::io::Result<()> {
    use s2mmu_cli::migrate::hash::xxh64;
    use std::io::Write;
    let (mut back_from, mut back_to) = (to.try_clone()?, from.try_clone()?);
    std::thread::spawn(move || std::io::copy(&mut back_from, &mut back_to));
    let head = read_n(&mut from, 14)?;
    let len = u32::from_le_bytes(head[10..14].try_into().unwrap()) as usize;
    to.write_all(&head)?;
    to.write_all(&read_n(&mut from, len + 8)?)?;
    let mut tampered = false;
    loop {
        let t = read_n(&mut from, 1)?;
        to.write_all(&t)?;
        if t[0] == tag::PAGE {
            let mut rec = read_n(&mut from, 16 + PAGE_SIZE)?;
            let gpa = u64::from_le_bytes(rec[0..8].try_into().unwrap());
            if !tampered && gpa == victim {
                tampered = true;
                rec[16 + 8] ^= 0xff;
                let h = xxh64(&rec[16..], gpa);
                rec[8..16].copy_from_slice(&h.to_le_bytes());
            }
            to.write_all(&rec)?;
        } else {
            let l = read_n(&mut from, 4)?;
            let n = u32::from_le_bytes(l[..].try_into().unwrap()) as usize;
            to.write_all(&l)?;
            to.write_all(&read_n(&mut from, n + 8)?)?;
        }
    }
}

#[test]
fn wrong_memory_on_the_destination_fails_verification() {
    let dest_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let dest_addr = dest_listener.local_addr().unwrap();
    let dest = std::thread::spawn(move || {
        let (s, _) = dest_listener.accept().unwrap();
        receive(&s, &dest_cfg())
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
    let cfg = SourceConfig {
        // A guest writing a page per second per vCPU: the tampered page is
        // sent once, so the wrong byte stays on the destination.
        dirty_rate: 2 * PAGE_SIZE as u64,
        ..small(8 << 20)
    };
    let r = migrate_source(&cfg, &stream, &stream);
    match &r {
        Err(MigrateError::MemoryMismatch { slot: 1, .. }) => {}
        other => panic!("expected a verification failure, got {other:?}"),
    }
    assert!(r.unwrap_err().to_string().contains("VERIFICATION FAILED"));
    // The destination itself saw a valid stream.
    assert!(dest.join().unwrap().is_ok());
}
