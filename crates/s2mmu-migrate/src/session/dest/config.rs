//! What the destination accepts and how it runs, and what it did: the
//! settings and the outcome its parts (and post-copy's destination)
//! share.

use crate::stream_error::MigrateError;
use crate::wire::{Header, MAX_CHANNELS, MAX_MEM, MAX_SLOTS, MAX_VCPUS};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the destination accepts: a stream that asks for more is rejected
/// before anything is allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of guest memory.
    pub max_mem: u64,
    /// vCPUs.
    pub max_vcpus: u32,
    /// Memslots.
    pub max_slots: u32,
    /// Channels (connections) of one migration.
    pub max_channels: u16,
}

impl Limits {
    /// Only this build's own bounds.
    pub fn of_build() -> Self {
        Limits {
            max_mem: MAX_MEM,
            max_vcpus: MAX_VCPUS,
            max_slots: MAX_SLOTS,
            max_channels: MAX_CHANNELS,
        }
    }

    /// Checks a header's image against the one `image` expects.
    ///
    /// # Errors
    /// [`MigrateError::ShapeMismatch`] naming both.
    pub fn check_image(
        image: Option<&[u8; crate::wire::IMAGE_ID_LEN]>,
        h: &Header,
    ) -> Result<(), MigrateError> {
        let short = |id: &[u8; crate::wire::IMAGE_ID_LEN]| {
            id[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        match (image, &h.image) {
            (Some(ours), theirs) if theirs.as_ref() != Some(ours) => {
                Err(MigrateError::ShapeMismatch {
                    what: "guest image (kernel and initramfs)",
                    stream: theirs.as_ref().map_or("not named".into(), short),
                    destination: short(ours),
                })
            }
            _ => Ok(()),
        }
    }

    /// Checks a header against these limits.
    ///
    /// # Errors
    /// [`MigrateError::OverLimit`].
    pub fn check(&self, h: &Header) -> Result<(), MigrateError> {
        let over = |what, asked: u64, allowed: u64| {
            if asked > allowed {
                Err(MigrateError::OverLimit {
                    what,
                    asked,
                    allowed,
                })
            } else {
                Ok(())
            }
        };
        over("bytes of guest memory", h.mem_size, self.max_mem)?;
        over("vCPUs", u64::from(h.vcpus), u64::from(self.max_vcpus))?;
        over("memslots", u64::from(h.slots), u64::from(self.max_slots))?;
        over(
            "channels",
            u64::from(h.channels),
            u64::from(self.max_channels),
        )
    }
}

/// How the destination runs, whatever guest it resumes (the guest's own
/// description, such as the simulated guest's MMU policy and format, is
/// its factory's: see `crate::sim::dest::SimDestConfig`).
#[derive(Clone, Debug)]
pub struct DestConfig {
    /// How long to run the resumed guest before stopping (it proves the
    /// guest runs; the source has stopped it by then).
    pub run_after: Duration,
    /// What it accepts.
    pub limits: Limits,
    /// How long it waits for the source's further channels.
    pub io_timeout: Duration,
    /// Log connections on stderr.
    pub progress: bool,
    /// Back all of guest memory with RAM before the stream starts.
    pub prefault: bool,
    /// What post-copy does when a connection breaks.
    pub recovery: crate::session::postcopy::control::Recovery,
    /// How long [`super::serve_with`] waits for a source that authenticates (None:
    /// for ever). Connections that fail before they authenticate never
    /// end the wait.
    pub accept_wait: Option<Duration>,
    /// Set: [`super::serve_with`] stops waiting for a source (the in-process
    /// migration's source failed before it connected).
    pub stop: Arc<AtomicBool>,
    /// The guest image this destination builds (see
    /// [`crate::wire::Header::image`]): a stream naming another image, or
    /// none, is refused ([`MigrateError::ShapeMismatch`]). None: any.
    pub image: Option<[u8; crate::wire::IMAGE_ID_LEN]>,
}

impl DestConfig {
    /// A destination that runs the resumed guest for `run_after` and
    /// accepts what this build can take.
    pub fn with_run_after(run_after: Duration) -> Self {
        DestConfig {
            run_after,
            limits: Limits::of_build(),
            io_timeout: Duration::from_secs(5),
            progress: false,
            prefault: true,
            recovery: crate::session::postcopy::control::Recovery::default(),
            accept_wait: None,
            stop: Arc::default(),
            image: None,
        }
    }
}

/// The destination's part of a downtime, on its own clock: from the
/// STATE record's arrival (the source sends it right after the last
/// pages, or right before POSTCOPY) to RESUMED (POSTCOPY_RESUMED) sent.
/// The parts follow each other and add up to [`ResumeParts::total`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResumeParts {
    /// From STATE to every channel's END, and the check that every page
    /// arrived.
    pub drain: Duration,
    /// The guest checking the state (`DestGuest::decode_state`).
    pub decode: Duration,
    /// Post-copy only (zero after a complete stream): the dirty log and
    /// the page fetch set up for the missing pages (`SessionVm::set_page_fetch`).
    pub page_fetch: Duration,
    /// Loading the state and starting the guest (`DestGuest::start`,
    /// which returns at its first instruction). The per-slot digests of
    /// the memory the guest resumes from are made on another thread
    /// meanwhile.
    pub start: Duration,
    /// From the first instruction until the digests were done: what they
    /// took beyond the start (zero, or near it, where the start took
    /// longer).
    pub digests: Duration,
    /// RESUMED (POSTCOPY_RESUMED) written and flushed. Its end is read after the write, so
    /// the source may have read RESUMED before it: of the parts, only
    /// this one can outlast the source's view of the downtime.
    pub reply: Duration,
}

impl ResumeParts {
    /// The parts' sum.
    pub fn total(&self) -> Duration {
        self.until_reply() + self.reply
    }

    /// The parts before RESUMED is written (all but the reply): they end
    /// before the source can read RESUMED, so, unlike
    /// [`ResumeParts::total`], this lies inside the source's view of the
    /// downtime.
    pub fn until_reply(&self) -> Duration {
        self.drain + self.decode + self.page_fetch + self.start + self.digests
    }
}

/// What the destination did.
#[derive(Clone, Debug, Default)]
pub struct DestOutcome {
    /// Page records received up to END on all channels (pages sent more
    /// than once count each time; the verification pass not included).
    pub page_records: u64,
    /// Of those, zero pages.
    pub zero_pages: u64,
    /// Stream bytes received up to END on all channels.
    pub bytes: u64,
    /// Channels the stream came over.
    pub channels: u16,
    /// Bytes of the link probe.
    pub probe_bytes: u64,
    /// How long backing guest memory with RAM took (before the stream).
    pub prefault: Duration,
    /// When the guest resumed.
    pub resumed_at: Option<Instant>,
    /// Per-slot digests of the memory the guest resumed from.
    pub slot_digests: Vec<(u16, u64)>,
    /// With verify-full: pages that differ byte for byte from the source's.
    pub verify_mismatches: Option<u64>,
    /// With verify-full: why the byte comparison broke after the guest had
    /// resumed (the guest then ran on here, unverified; never dropped).
    pub verify_error: Option<String>,
    /// Guest writes per second after the resume.
    pub resumed_write_rate: f64,
    /// Each vCPU's progress count ([`super::ResumedGuest::progress`]) when
    /// the destination stopped it.
    pub resumed_progress: Vec<u64>,
    /// Post-copy's figures (None: pre-copy only).
    pub postcopy: Option<crate::session::postcopy::PostcopyFigures>,
    /// Where the receiving time went up to END, over all channels.
    pub recv_stages: crate::stages::RecvStages,
    /// Where the destination's part of the downtime went (pre-copy; all
    /// zero after a switch to post-copy).
    pub resume_parts: ResumeParts,
}

impl DestOutcome {
    /// Whether the source's byte comparison (with verify-full) found this
    /// memory equal to its own; `Ok` when none ran.
    ///
    /// # Errors
    /// Pages that differ, or a comparison that broke after the resume, in
    /// words.
    pub fn verified(&self) -> Result<(), String> {
        match (self.verify_mismatches, &self.verify_error) {
            (Some(n), _) if n > 0 => Err(format!(
                "VERIFICATION FAILED: {n} pages differ from the source's"
            )),
            (_, Some(e)) => Err(format!(
                "VERIFICATION INCOMPLETE: the guest resumed here and ran, but the byte comparison broke: {e}"
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DestOutcome;

    #[test]
    fn verified_names_differing_pages_and_a_broken_comparison() {
        let mut d = DestOutcome::default();
        assert_eq!(d.verified(), Ok(()));
        d.verify_mismatches = Some(0);
        assert_eq!(d.verified(), Ok(()));
        d.verify_mismatches = Some(3);
        let e = d.verified().unwrap_err();
        assert!(e.contains("VERIFICATION FAILED: 3 pages differ"), "{e}");
        d.verify_mismatches = Some(0);
        d.verify_error = Some("reset by peer".into());
        let e = d.verified().unwrap_err();
        assert!(
            e.contains("INCOMPLETE") && e.contains("reset by peer"),
            "{e}"
        );
    }
}
