//! The destination: receives the stream into its own guest memory,
//! verifies every page and the whole, and resumes the guest only from a
//! complete, valid stream.

use super::error::MigrateError;
use super::hash::digest_of;
use super::wire::{
    tag, tag_name, Dec, Enc, GuestState, Header, Record, WireReader, WireWriter, PAGE_SIZE,
};
use s2mmu::mmu::MmuPolicy;
use s2mmu_vm::{Backing, Pattern, Vm, VmConfig, Workload, WorkloadConfig};
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the destination runs.
#[derive(Clone, Debug)]
pub struct DestConfig {
    /// The destination MMU's policies.
    pub policy: MmuPolicy,
    /// How long to run the resumed guest before stopping (it proves the
    /// guest runs; the source has stopped it by then).
    pub run_after: Duration,
}

/// What the destination did.
#[derive(Clone, Debug, Default)]
pub struct DestOutcome {
    /// Page records received up to END (pages sent more than once count
    /// each time; the verification pass not included).
    pub page_records: u64,
    /// Stream bytes received up to END.
    pub bytes: u64,
    /// When the guest resumed.
    pub resumed_at: Option<Instant>,
    /// Per-slot digests of the memory the guest resumed from.
    pub slot_digests: Vec<(u16, u64)>,
    /// With verify-full: pages that differ byte for byte from the source's.
    pub verify_mismatches: Option<u64>,
    /// Guest writes per second after the resume.
    pub resumed_write_rate: f64,
    /// Passes each vCPU had reached when the destination stopped it.
    pub resumed_passes: Vec<u64>,
}

/// Receives one migration from a TCP connection and resumes the guest.
///
/// # Errors
/// As [`receive_from`].
pub fn receive(stream: &TcpStream, cfg: &DestConfig) -> Result<DestOutcome, MigrateError> {
    let _ = stream.set_nodelay(true);
    receive_from(BufReader::with_capacity(1 << 18, stream), stream, cfg)
}

/// Receives one migration from `input`, replying on `reply`.
///
/// # Errors
/// Any stream error ([`MigrateError::Truncated`],
/// [`MigrateError::PageChecksum`], ...), [`MigrateError::Incomplete`],
/// [`MigrateError::Aborted`]. On an error the guest is not resumed and the
/// source is told why when the connection still works.
pub fn receive_from<R: Read, W: Write>(
    input: R,
    mut reply: W,
    cfg: &DestConfig,
) -> Result<DestOutcome, MigrateError> {
    let result = receive_inner(input, &mut reply, cfg);
    if let Err(e) = &result {
        if !matches!(e, MigrateError::Aborted { .. }) {
            let mut r = WireWriter::replies(&mut reply);
            let _ = r.control(tag::REJECTED, e.to_string().as_bytes());
            let _ = r.flush();
        }
    }
    result
}

fn receive_inner<R: Read, W: Write>(
    input: R,
    mut reply: W,
    cfg: &DestConfig,
) -> Result<DestOutcome, MigrateError> {
    let (mut rd, header) = WireReader::new(input)?;
    let vm = Arc::new(build_vm(&header, cfg.policy)?);
    let page_count = header.mem_size / PAGE_SIZE as u64;
    let mut received = vec![0u64; page_count.div_ceil(64) as usize];
    let mut page_hash = vec![0u64; page_count as usize];
    let mut state = None;
    let memory = vm.memory().clone();
    // With verify-full, what the guest will resume from, read back from
    // guest memory as each page lands (the guest does not run here before
    // the resume, so at END it equals guest memory; keeping it up to date
    // costs no downtime).
    let mut snapshot = match header.verify_full {
        true => {
            let n = header.mem_size as usize;
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| {
                MigrateError::Setup(format!(
                    "no memory for a {n}-byte copy of the guest (--verify-full)"
                ))
            })?;
            v.resize(n, 0u8);
            Some(v)
        }
        false => None,
    };
    loop {
        let at_byte = rd.pos;
        match rd.next_record()? {
            Record::Page { gpa, hash } => {
                let off = page_offset(&vm, gpa, at_byte)?;
                if !memory.write_from(off, rd.page_data()) {
                    return Err(MigrateError::PageOutOfRange { gpa, at_byte });
                }
                if let Some(snap) = snapshot.as_mut() {
                    let o = off as usize;
                    memory.read_into(off, &mut snap[o..o + PAGE_SIZE]);
                }
                let i = (off / PAGE_SIZE as u64) as usize;
                received[i / 64] |= 1 << (i % 64);
                page_hash[i] = hash;
            }
            Record::Control {
                tag: t,
                body,
                at_byte,
            } => match t {
                tag::ROUND => {}
                tag::STATE => state = Some(GuestState::decode(&body, at_byte)?),
                tag::END => {
                    check_end(&body, at_byte, rd.pages)?;
                    break;
                }
                tag::ABORT => {
                    return Err(MigrateError::Aborted {
                        reason: String::from_utf8_lossy(&body).into_owned(),
                    })
                }
                other => {
                    return Err(MigrateError::Malformed {
                        record: tag_name(other),
                        at_byte,
                        why: "not expected before the stream's END".into(),
                    })
                }
            },
        }
    }
    // Never resume from incomplete memory.
    let missing: u64 = received
        .iter()
        .enumerate()
        .map(|(w, &m)| {
            let valid = (page_count - w as u64 * 64).min(64);
            let mask = if valid == 64 {
                u64::MAX
            } else {
                (1u64 << valid) - 1
            };
            u64::from((!m & mask).count_ones())
        })
        .sum();
    if missing > 0 {
        let first = (0..page_count)
            .find(|&i| received[(i / 64) as usize] & (1 << (i % 64)) == 0)
            .unwrap_or(0);
        return Err(MigrateError::Incomplete {
            missing_pages: missing,
            first_missing_gpa: gpa_of(&vm, first * PAGE_SIZE as u64),
        });
    }
    let state = state.ok_or(MigrateError::Malformed {
        record: "END",
        at_byte: rd.pos,
        why: "the stream carried no vCPU STATE".into(),
    })?;
    let slot_digests: Vec<(u16, u64)> = vm
        .slots()
        .iter()
        .map(|s| {
            let first = (s.mem_offset / PAGE_SIZE as u64) as usize;
            let n = (s.size / PAGE_SIZE as u64) as usize;
            (s.id, digest_of(&page_hash[first..first + n]))
        })
        .collect();
    let wl_cfg = WorkloadConfig {
        bytes_per_vcpu: state.bytes_per_vcpu,
        write_percent: state.write_percent.min(100),
        pattern: if state.pattern == 1 {
            Pattern::Random
        } else {
            Pattern::Sequential
        },
        page_size: PAGE_SIZE as u64,
    };
    // Resume: vCPUs continue from the transferred state.
    let wl = Workload::start_at(vm.clone(), wl_cfg, &state.vcpus).map_err(|e| {
        MigrateError::Malformed {
            record: "STATE",
            at_byte: rd.pos,
            why: e,
        }
    })?;
    wl.control()
        .pace_pages_per_sec
        .store(state.pace_pages_per_sec, Ordering::Relaxed);
    wl.run_free();
    let resumed_at = Instant::now();
    let mut e = Enc::default();
    e.u32(slot_digests.len() as u32);
    for (id, d) in &slot_digests {
        e.u16(*id).u64(*d);
    }
    let mut w = WireWriter::replies(&mut reply);
    w.control(tag::RESUMED, &e.0)?;
    w.flush()?;
    let (page_records, bytes) = (rd.pages, rd.pos);
    let mut verify_mismatches = None;
    if let Some(snapshot) = snapshot {
        let (bad, first) = compare_with_snapshot(&mut rd, &vm, &snapshot)?;
        let mut e = Enc::default();
        e.u64(bad).u64(first);
        w.control(tag::VERIFIED, &e.0)?;
        w.flush()?;
        verify_mismatches = Some(bad);
    }
    let writes0: u64 = state.vcpus.iter().map(|v| v.writes).sum();
    if let Some(rest) = cfg.run_after.checked_sub(resumed_at.elapsed()) {
        std::thread::sleep(rest);
    }
    let writes1: u64 = wl
        .control()
        .live
        .iter()
        .map(|l| l.writes.load(Ordering::Relaxed))
        .sum();
    let secs = resumed_at.elapsed().as_secs_f64();
    wl.pause();
    let resumed_passes = wl.vcpu_states().iter().map(|s| s.pass).collect();
    drop(wl);
    Ok(DestOutcome {
        page_records,
        bytes,
        resumed_at: Some(resumed_at),
        slot_digests,
        verify_mismatches,
        resumed_write_rate: writes1.saturating_sub(writes0) as f64 / secs.max(1e-9),
        resumed_passes,
    })
}

fn page_offset(vm: &Vm, gpa: u64, at_byte: u64) -> Result<u64, MigrateError> {
    match vm.locate(gpa) {
        Some((_, off)) if gpa.is_multiple_of(PAGE_SIZE as u64) => Ok(off),
        _ => Err(MigrateError::PageOutOfRange { gpa, at_byte }),
    }
}

/// END's counts must be what arrived: a stream that lost records is not
/// complete even when every page happened to arrive.
fn check_end(body: &[u8], at_byte: u64, pages_seen: u64) -> Result<(), MigrateError> {
    let mut d = Dec::new(body, "END", at_byte);
    let (pages, bytes) = (d.u64()?, d.u64()?);
    d.finish()?;
    if pages != pages_seen || bytes != at_byte {
        return Err(d.malformed(format!(
            "the source sent {pages} pages in {bytes} bytes, {pages_seen} pages in {at_byte} bytes arrived"
        )));
    }
    Ok(())
}

/// The verification pass: VERIFY, all of the source's memory as PAGE
/// records, END; each page is compared byte for byte with the memory the
/// guest resumed from. Returns the number of differing pages and the
/// first one's address.
fn compare_with_snapshot<R: Read>(
    rd: &mut WireReader<R>,
    vm: &Vm,
    snapshot: &[u8],
) -> Result<(u64, u64), MigrateError> {
    match rd.next_record()? {
        Record::Control {
            tag: tag::VERIFY, ..
        } => {}
        Record::Control {
            tag: tag::ABORT,
            body,
            ..
        } => {
            return Err(MigrateError::Aborted {
                reason: String::from_utf8_lossy(&body).into_owned(),
            })
        }
        other => {
            return Err(MigrateError::Malformed {
                record: "VERIFY",
                at_byte: rd.pos,
                why: format!("expected the verification pass, got {other:?}"),
            })
        }
    }
    let page_count = snapshot.len() as u64 / PAGE_SIZE as u64;
    let mut seen = vec![false; page_count as usize];
    let (mut bad, mut first) = (0u64, 0u64);
    loop {
        let at_byte = rd.pos;
        match rd.next_record()? {
            Record::Page { gpa, .. } => {
                let off = page_offset(vm, gpa, at_byte)? as usize;
                seen[off / PAGE_SIZE] = true;
                if snapshot[off..off + PAGE_SIZE] != rd.page_data()[..] {
                    if bad == 0 {
                        first = gpa;
                    }
                    bad += 1;
                }
            }
            Record::Control {
                tag: tag::END,
                body,
                at_byte,
            } => {
                check_end(&body, at_byte, rd.pages)?;
                break;
            }
            Record::Control {
                tag: t, at_byte, ..
            } => {
                return Err(MigrateError::Malformed {
                    record: tag_name(t),
                    at_byte,
                    why: "not expected in the verification pass".into(),
                })
            }
        }
    }
    if let Some(i) = seen.iter().position(|s| !s) {
        return Err(MigrateError::Incomplete {
            missing_pages: seen.iter().filter(|s| !**s).count() as u64,
            first_missing_gpa: gpa_of(vm, i as u64 * PAGE_SIZE as u64),
        });
    }
    Ok((bad, first))
}

fn gpa_of(vm: &Vm, offset: u64) -> u64 {
    vm.slots()
        .iter()
        .find(|s| offset >= s.mem_offset && offset - s.mem_offset < s.size)
        .map(|s| s.gpa + offset - s.mem_offset)
        .unwrap_or(offset)
}

/// The destination's VM: the source's geometry with the destination's
/// own MMU policy.
///
/// # Errors
/// [`MigrateError::Setup`].
pub fn build_vm(h: &Header, policy: MmuPolicy) -> Result<Vm, MigrateError> {
    let backing = Backing::parse(&h.backing).map_err(MigrateError::Setup)?;
    Vm::new(VmConfig {
        mem_size: h.mem_size,
        backing,
        slots: h.slots,
        gpa_base: h.gpa_base,
        // The destination does not log dirty pages.
        policy: MmuPolicy {
            dirty_ring_entries: None,
            ..policy
        },
        ..VmConfig::default()
    })
    .map_err(|e| MigrateError::Setup(format!("destination guest: {e}")))
}
