//! The guest's shape in the HEADER: a destination told which guest image
//! it builds (its kernel and initramfs, by digest) refuses a stream that
//! names another image, or none, by a typed error naming both; the source
//! keeps its guest. A destination told nothing takes any image.

mod migrate_common;

use migrate_common::{dest_cfg, plain, small};
use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::format::FormatId;
use s2mmu_migrate::sim::in_process::migrate_in_process;
use s2mmu_migrate::sim::source::SimRun;
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::wire::{Header, IMAGE_ID_LEN, PAGE_SIZE};

const A: [u8; IMAGE_ID_LEN] = [0xa1; IMAGE_ID_LEN];
const B: [u8; IMAGE_ID_LEN] = [0xb2; IMAGE_ID_LEN];

/// A 4 MiB guest naming `image` in its HEADER.
fn named(image: Option<[u8; IMAGE_ID_LEN]>) -> SimRun {
    small(4 << 20).with(|_, s| s.image = image)
}

/// Migrates `run` to a destination that builds `image`.
fn to_dest_of(run: &SimRun, image: Option<[u8; IMAGE_ID_LEN]>) -> Result<(), MigrateError> {
    let mut d = dest_cfg();
    d.dest.image = image;
    migrate_in_process(run, &d, &plain()).map(|(s, d)| {
        assert_eq!(s.slot_digests, d.slot_digests, "memory verified");
    })
}

#[test]
fn a_destination_refuses_another_image_by_name() {
    for (src, what) in [(Some(B), "b2b2b2b2b2b2b2b2"), (None, "not named")] {
        match to_dest_of(&named(src), Some(A)) {
            Err(MigrateError::Rejected { reason }) => {
                let want = MigrateError::ShapeMismatch {
                    what: "guest image (kernel and initramfs)",
                    stream: what.into(),
                    destination: "a1a1a1a1a1a1a1a1".into(),
                }
                .to_string();
                assert_eq!(reason, want);
            }
            other => panic!("{src:?}: expected the refusal, got {other:?}"),
        }
    }
}

#[test]
fn the_same_image_or_a_destination_told_none_migrates() {
    to_dest_of(&named(Some(A)), Some(A)).expect("the same image");
    to_dest_of(&named(Some(A)), None).expect("a destination that takes any");
    to_dest_of(&named(None), None).expect("no image on either side");
}

#[test]
fn the_header_carries_the_image_and_refuses_a_short_one() {
    let h = Header {
        mem_size: 16 * PAGE_SIZE as u64,
        slots: 1,
        gpa_base: 1 << 32,
        vcpus: 3,
        channels: 1,
        backing: "anonymous".into(),
        verify_full: false,
        postcopy: true,
        format: FormatId::of::<Arm64Stage2>(),
        image: Some(A),
    };
    let body = h.encode();
    assert_eq!(Header::decode(&body, 0).unwrap(), h);
    let none = Header {
        image: None,
        ..h.clone()
    };
    assert_eq!(none.encode().len() + IMAGE_ID_LEN, body.len());
    assert_eq!(Header::decode(&none.encode(), 0).unwrap(), none);
    // The flag says an image follows; a body cut inside it is refused.
    match Header::decode(&body[..body.len() - 1], 0) {
        Err(MigrateError::Truncated { .. } | MigrateError::Malformed { .. }) => {}
        other => panic!("a cut image: {other:?}"),
    }
}
