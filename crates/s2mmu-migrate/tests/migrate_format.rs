//! `s2mmu migrate --format`: the whole pipeline on a guest whose stage-2
//! tables are x86 EPT (pre-copy with the byte comparison and the
//! lost-write check, dirty rings, snapshots beside it, post-copy), and a
//! destination on another format refusing the source by name.

mod migrate_common;

use migrate_common::{dest_cfg, plain, small};
use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::format::ept::EptStage2;
use s2mmu::format::FormatId;
use s2mmu::mmu::DirtyMode;
use s2mmu_migrate::session::extras::SourceExtras;
use s2mmu_migrate::session::postcopy::Postcopy;
use s2mmu_migrate::sim::dest::{receive_from, SimDestConfig};
use s2mmu_migrate::sim::in_process::migrate_in_process;
use s2mmu_migrate::sim::source::{session_harvest, SimRun};
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::wire::{tag, Header, Record, WireReader, WireWriter, PAGE_SIZE};
use std::time::Duration;

/// x86 EPT.
const EPT: FormatId = FormatId::of::<EptStage2>();
/// arm64 stage 2.
const ARM64: FormatId = FormatId::of::<Arm64Stage2>();

/// A small EPT guest dirtying at full speed.
fn ept(mem: u64) -> SimRun {
    small(mem).with(|g, _| {
        g.dirty_rate = 0;
        g.format = EPT;
    })
}

fn dest_on(format: FormatId) -> SimDestConfig {
    SimDestConfig {
        format,
        ..dest_cfg()
    }
}

#[test]
fn precopy_on_ept_verifies_byte_for_byte_with_no_lost_write() {
    let cfg = ept(16 << 20).with(|g, s| {
        s.verify_full = true;
        g.extras = SourceExtras {
            check: true,
            ..SourceExtras::default()
        };
    });
    let (s, d) =
        migrate_in_process(&cfg, &dest_on(EPT), &plain()).expect("an EPT migration succeeds");
    assert!(s.postcopy.is_none());
    assert_eq!(s.slot_digests.len(), cfg.guest.slots as usize);
    assert_eq!(s.slot_digests, d.slot_digests, "per-slot digests agree");
    assert_eq!(d.verify_mismatches, Some(0), "every page equal");
    assert_eq!(s.rounds[0].pages, cfg.guest.mem_size / PAGE_SIZE as u64);
    assert!(s.rounds.last().unwrap().final_round);
    let c = s.extras.check.expect("checked");
    assert_eq!(c.lost, 0);
    assert!(c.changed > 0, "the guest wrote while logged");
    assert!(d.resumed_progress.iter().all(|&p| p >= 1));
}

#[test]
fn precopy_on_ept_with_dirty_rings_over_two_channels() {
    let cfg = ept(16 << 20).with(|g, s| {
        g.dirty = DirtyMode::Ring { entries: 256 };
        s.harvest = session_harvest(g.dirty);
        s.channels = 2;
    });
    let (s, d) = migrate_in_process(&cfg, &dest_on(EPT), &plain())
        .expect("an EPT migration with dirty rings succeeds");
    assert_eq!(s.slot_digests, d.slot_digests);
    assert_eq!(d.channels, 2);
    assert!(s.rounds.len() >= 2, "a full round and the stop-and-copy");
}

#[test]
fn snapshots_beside_an_ept_migration_restore_to_the_source_memory() {
    let dir = std::env::temp_dir().join(format!("s2mmu-migrate-ept-snap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = ept(8 << 20).with(|g, _| {
        g.extras = SourceExtras {
            snapshot_every: Some(Duration::from_millis(20)),
            snapshot_dir: Some(dir.clone()),
            ..SourceExtras::default()
        };
    });
    let (s, d) = migrate_in_process(&cfg, &dest_on(EPT), &plain())
        .expect("an EPT migration with snapshots succeeds");
    assert_eq!(s.slot_digests, d.slot_digests);
    let snaps = s.extras.snapshots.expect("taken").expect("no error");
    assert!(snaps.taken >= 2, "a base and at least the last");
    assert_eq!(snaps.differing_pages, 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn postcopy_on_ept_fetches_every_missing_page_and_verifies() {
    let cfg = ept(16 << 20).with(|_, s| {
        s.postcopy = Postcopy::On;
    });
    let (s, d) =
        migrate_in_process(&cfg, &dest_on(EPT), &plain()).expect("an EPT post-copy succeeds");
    let pc = s.postcopy.as_ref().expect("switched to post-copy");
    let f = &pc.figures;
    assert_eq!(d.postcopy.as_ref(), Some(f), "both sides agree");
    assert!(f.missing_pages > 0, "pages were left to fetch");
    assert_eq!(f.background_pages + f.answered_pages, f.missing_pages);
    assert_eq!(s.slot_digests, d.slot_digests, "memory verified");
}

#[test]
fn a_source_on_another_format_is_refused_and_keeps_its_guest() {
    for (src, dst) in [(EPT, ARM64), (ARM64, EPT)] {
        let cfg = ept(4 << 20).with(|g, _| {
            g.format = src;
        });
        match migrate_in_process(&cfg, &dest_on(dst), &plain()) {
            Err(MigrateError::Rejected { reason }) => {
                let want = MigrateError::FormatMismatch {
                    stream: src.name(),
                    destination: dst.name(),
                }
                .to_string();
                assert_eq!(reason, want);
            }
            other => panic!("{src:?} to {dst:?}: expected the refusal, got {other:?}"),
        }
    }
}

/// The opening of a stream from a source on `format` (a 16-page guest):
/// all a destination reads before it must refuse another format.
fn opening_on(format: FormatId) -> Vec<u8> {
    let h = Header {
        mem_size: 16 * PAGE_SIZE as u64,
        slots: 1,
        gpa_base: 1 << 32,
        vcpus: 1,
        channels: 1,
        backing: "anonymous".into(),
        verify_full: false,
        postcopy: false,
        format,
        image: None,
    };
    WireWriter::new(Vec::new(), &h).unwrap().into_inner()
}

#[test]
fn a_stream_on_another_format_is_refused_before_any_guest_exists() {
    for (src, dst) in [(EPT, ARM64), (ARM64, EPT)] {
        let mut reply = Vec::new();
        let e = receive_from(&opening_on(src)[..], &mut reply, &dest_on(dst)).unwrap_err();
        assert_eq!(
            e,
            MigrateError::FormatMismatch {
                stream: src.name(),
                destination: dst.name(),
            }
        );
        let text = e.to_string();
        assert!(
            text.contains(&format!("runs on format {}", src.name()))
                && text.contains(&format!("destination on format {}", dst.name())),
            "{text}"
        );
        // The source is told why, and nothing else (no ACCEPT, no PROGRESS
        // of a guest being prepared).
        let mut rd = WireReader::replies(&reply[..]);
        match rd.next_record().unwrap() {
            Record::Control {
                tag: tag::REJECTED,
                body,
                ..
            } => assert_eq!(String::from_utf8_lossy(&body), text),
            other => panic!("expected REJECTED, got {other:?}"),
        }
        assert!(rd.next_record().is_err(), "nothing after REJECTED");
    }
}
