//! The receiving path's checks: a damaged page is refused and nothing of
//! its record stays marked received.

use super::super::shared_for;
use crate::sim::SimVm;
use crate::stream_error::MigrateError;
use crate::wire::{Header, Record, WireReader, WireWriter, PAGE_SIZE};
use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::format::FormatId;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// A simulated destination of one slot of `mem_size` bytes at 0 on the
/// arm64 format, and the HEADER it was built from.
fn one_slot_vm(mem_size: u64) -> (Header, SimVm<Arm64Stage2>) {
    let header = Header {
        mem_size,
        slots: 1,
        gpa_base: 0,
        vcpus: 1,
        channels: 1,
        backing: "anonymous".into(),
        verify_full: false,
        postcopy: false,
        format: FormatId::of::<Arm64Stage2>(),
        image: None,
    };
    let vm = crate::sim::dest::build_vm::<Arm64Stage2>(&header, Default::default()).unwrap();
    (header, SimVm::new(Arc::new(vm)))
}

/// A page received once, then again with its data damaged in flight:
/// the second copy's bytes landed in guest memory before its hash was
/// checked, so the page no longer counts as received (its stored hash
/// is the first copy's, which those bytes no longer match).
#[test]
fn a_page_that_fails_its_check_is_no_longer_received() {
    let (header, vm) = one_slot_vm(1 << 20);
    let sh = shared_for(&vm, &header, Duration::from_secs(5)).unwrap();
    let gpa = 3 * PAGE_SIZE as u64;
    let mut w = WireWriter::replies(Vec::new());
    w.page(gpa, &[5u8; PAGE_SIZE]).unwrap();
    let first = w.pos as usize;
    w.page(gpa, &[6u8; PAGE_SIZE]).unwrap();
    let mut stream = w.into_inner();
    *stream.last_mut().unwrap() ^= 1;
    let mut rd = WireReader::replies(std::io::Cursor::new(stream));
    let received = |sh: &super::ReceiveState<'_, SimVm<Arm64Stage2>>| {
        sh.received[0].load(Ordering::Relaxed) & (1 << 3) != 0
    };
    assert!(matches!(
        rd.next_record().unwrap(),
        Record::Pages { count: 1, .. }
    ));
    sh.take_pages(&mut rd, 0, 0, &mut ()).unwrap();
    assert!(received(&sh), "the good copy is received");
    assert!(matches!(
        rd.next_record().unwrap(),
        Record::Pages { count: 1, .. }
    ));
    match sh.take_pages(&mut rd, 0, first as u64, &mut ()) {
        Err(MigrateError::PageChecksum { gpa: g, .. }) => assert_eq!(g, gpa),
        other => panic!("the damaged copy was not refused: {other:?}"),
    }
    assert!(
        !received(&sh),
        "a page whose bytes failed their check is received"
    );
}

/// A stream with one good page at page 500, then one full PAGES record
/// of pages 0 to 255 (every seventh a zero page; the others' bytes their
/// index), changed by `damage` (the stream and where each data page's
/// bytes start).
fn full_record_stream(damage: impl FnOnce(&mut Vec<u8>, &[usize])) -> (Vec<u8>, u64) {
    let mut w = WireWriter::replies(Vec::new());
    w.page(500 * PAGE_SIZE as u64, &[9u8; PAGE_SIZE]).unwrap();
    let second = w.pos;
    let mut b = crate::wire::Batch::new();
    for i in 0..crate::wire::MAX_BATCH {
        let byte = if i % 7 == 0 { 0 } else { i as u8 };
        b.push(i as u64 * PAGE_SIZE as u64, |p| p.fill(byte));
    }
    w.batch(&mut b).unwrap();
    let head = 3 + 16 * crate::wire::MAX_BATCH + 8;
    let data_at: Vec<usize> = (0..crate::wire::MAX_BATCH)
        .filter(|i| i % 7 != 0)
        .enumerate()
        .map(|(j, _)| second as usize + head + j * PAGE_SIZE)
        .collect();
    let mut stream = w.into_inner();
    damage(&mut stream, &data_at);
    (stream, second)
}

/// Receives [`full_record_stream`]'s two records: the second's error, and
/// how many of its 256 pages count as received after it.
fn receive_damaged(damage: impl FnOnce(&mut Vec<u8>, &[usize])) -> (MigrateError, u32) {
    let (header, vm) = one_slot_vm(2 << 20);
    let sh = shared_for(&vm, &header, Duration::from_secs(5)).unwrap();
    let (stream, second) = full_record_stream(damage);
    let mut rd = WireReader::replies(std::io::Cursor::new(stream));
    assert!(matches!(rd.next_record().unwrap(), Record::Pages { .. }));
    sh.take_pages(&mut rd, 0, 0, &mut ()).unwrap();
    assert!(matches!(
        rd.next_record().unwrap(),
        Record::Pages { count: 256, .. }
    ));
    let e = sh
        .take_pages(&mut rd, 0, second, &mut ())
        .expect_err("a damaged record is refused");
    let bit = |i: u64| sh.received[(i / 64) as usize].load(Ordering::Relaxed) & (1 << (i % 64));
    assert_ne!(bit(500), 0, "the page received before stays received");
    // SAFETY: page 500 lies in the 2 MiB of guest memory; nothing else
    // touches it now.
    let kept = unsafe { sh.raw.page(500 * PAGE_SIZE as u64) };
    assert!(kept.iter().all(|&b| b == 9), "page 500's bytes changed");
    let received = (0..256).filter(|&i| bit(i) != 0).count() as u32;
    (e, received)
}

/// The destination reads a record's data straight into guest memory and
/// checks it there: a page damaged anywhere in a full record (the first
/// data page, the last, and between) is refused with its address, and
/// afterwards no page of the record counts as received, those before it
/// that passed their check included (their bytes are the new copy's; the
/// run fails anyway, but nothing reading the received marks may take a
/// page of a refused record for a checked one).
#[test]
fn a_damaged_page_anywhere_leaves_no_page_of_its_record_received() {
    // Data pages (zero pages not counted): the first, between, the last.
    for j in [0usize, 63, 150, 218] {
        let (e, received) = receive_damaged(|s, at| s[at[j] + 4095] ^= 0x40);
        let gpa = (0..256u64).filter(|i| i % 7 != 0).nth(j).unwrap() * PAGE_SIZE as u64;
        match e {
            MigrateError::PageChecksum { gpa: g, .. } => assert_eq!(g, gpa, "data page {j}"),
            other => panic!("data page {j}: {other:?}"),
        }
        assert_eq!(
            received, 0,
            "data page {j}: pages of the record still received"
        );
    }
}

/// A stream cut inside a record's data: the record is
/// [`MigrateError::Truncated`] and none of its pages counts as received.
#[test]
fn a_record_cut_in_its_data_leaves_no_page_received() {
    let (e, received) = receive_damaged(|s, at| s.truncate(at[150] + 100));
    assert!(matches!(e, MigrateError::Truncated { .. }), "{e:?}");
    assert_eq!(received, 0);
}

/// Each page is checked as it arrives: a record whose third data page is
/// damaged and whose stream is cut at its hundredth is refused for the
/// damaged page (not as truncated: the rest never came), and none of its
/// pages counts as received.
#[test]
fn a_damaged_page_is_refused_before_the_rest_of_its_record() {
    let (e, received) = receive_damaged(|s, at| {
        s[at[3] + 9] ^= 1;
        s.truncate(at[100]);
    });
    let gpa = (0..256u64).filter(|i| i % 7 != 0).nth(3).unwrap() * PAGE_SIZE as u64;
    match e {
        MigrateError::PageChecksum { gpa: g, .. } => assert_eq!(g, gpa),
        other => panic!("{other:?}"),
    }
    assert_eq!(received, 0);
}

/// SYNC's wait counts the pages taken on a channel: it returns once
/// the source's count is here, and a count that stops short of it is
/// named once it has not grown for the wait.
#[test]
fn sync_waits_for_every_page_the_source_sent() {
    let (header, vm) = one_slot_vm(1 << 20);
    let sh = shared_for(&vm, &header, Duration::from_millis(50)).unwrap();
    let mut w = WireWriter::replies(Vec::new());
    w.page(0, &[5u8; PAGE_SIZE]).unwrap();
    w.page(PAGE_SIZE as u64, &[7u8; PAGE_SIZE]).unwrap();
    let mut rd = WireReader::replies(std::io::Cursor::new(w.into_inner()));
    for _ in 0..2 {
        assert!(matches!(
            rd.next_record().unwrap(),
            Record::Pages { count: 1, .. }
        ));
        sh.take_pages(&mut rd, 0, 0, &mut ()).unwrap();
    }
    assert_eq!(sh.sync.taken[0].load(Ordering::Relaxed), 2);
    super::super::sync::wait_for(&sh.sync, 0, 2).expect("both pages are here");
    match super::super::sync::wait_for(&sh.sync, 0, 3) {
        Err(MigrateError::Timeout { what }) => {
            assert!(what.contains("2 of the 3 pages"), "{what}")
        }
        other => panic!("a count short of the source's: {other:?}"),
    }
}
