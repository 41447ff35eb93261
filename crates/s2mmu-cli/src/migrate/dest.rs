//! The destination: receives the stream into its own guest memory,
//! verifies every page and the whole, and resumes the guest only from a
//! complete, valid stream.

use super::error::MigrateError;
use super::hash::{digest_of, xxh64};
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
    /// Page records received (pages sent more than once count each time).
    pub page_records: u64,
    /// Stream bytes received.
    pub bytes: u64,
    /// When the guest resumed.
    pub resumed_at: Option<Instant>,
    /// Per-slot digests of the memory the guest resumed from.
    pub slot_digests: Vec<(u16, u64)>,
    /// Whether every page was compared against the source's own hashes.
    pub verified_full: bool,
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
/// [`MigrateError::MemoryMismatch`] (with a VERIFY record),
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
    let mut verify: Option<Vec<u64>> = None;
    let memory = vm.memory().clone();
    loop {
        let at_byte = rd.pos;
        match rd.next()? {
            Record::Page { gpa, hash } => {
                let off = match vm.locate(gpa) {
                    Some((_, off)) if gpa.is_multiple_of(PAGE_SIZE as u64) => off,
                    _ => return Err(MigrateError::PageOutOfRange { gpa, at_byte }),
                };
                if !memory.write_from(off, rd.page_data()) {
                    return Err(MigrateError::PageOutOfRange { gpa, at_byte });
                }
                let i = (off / PAGE_SIZE as u64) as usize;
                received[i / 64] |= 1 << (i % 64);
                page_hash[i] = hash;
            }
            Record::Control { tag: t, body, at_byte } => match t {
                tag::ROUND => {}
                tag::STATE => state = Some(GuestState::decode(&body, at_byte)?),
                tag::VERIFY => {
                    let mut d = Dec::new(&body, "VERIFY", at_byte);
                    let n = d.u64()?;
                    if n != page_count {
                        return Err(d.malformed(format!("{n} page hashes for {page_count} pages")));
                    }
                    let mut v = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        v.push(d.u64()?);
                    }
                    d.finish()?;
                    verify = Some(v);
                }
                tag::END => {
                    let mut d = Dec::new(&body, "END", at_byte);
                    let (pages, bytes) = (d.u64()?, d.u64()?);
                    d.finish()?;
                    if pages != rd.pages || bytes != at_byte {
                        return Err(d.malformed(format!(
                            "the source sent {pages} pages in {bytes} bytes, {} pages in {at_byte} bytes arrived",
                            rd.pages
                        )));
                    }
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
                        why: "a reply record in the source's stream".into(),
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
            let mask = if valid == 64 { u64::MAX } else { (1u64 << valid) - 1 };
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
    let verified_full = verify.is_some();
    if let Some(source_hashes) = verify {
        compare_every_page(&vm, &page_hash, &source_hashes)?;
    }
    let slot_digests: Vec<(u16, u64)> = vm
        .slots()
        .iter()
        .map(|s| {
            let first = (s.mem_offset / PAGE_SIZE as u64) as usize;
            let n = (s.size / PAGE_SIZE as u64) as usize;
            (s.id, digest_of(&page_hash[first..first + n]))
        })
        .collect();
    // Resume: vCPUs continue from the transferred state.
    let wl_cfg = WorkloadConfig {
        bytes_per_vcpu: state.bytes_per_vcpu,
        write_percent: state.write_percent,
        pattern: if state.pattern == 1 {
            Pattern::Random
        } else {
            Pattern::Sequential
        },
        page_size: PAGE_SIZE as u64,
    };
    let wl = Workload::start_at(vm.clone(), wl_cfg, &state.vcpus).map_err(MigrateError::Setup)?;
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
    let writes0: u64 = state.vcpus.iter().map(|v| v.writes).sum();
    std::thread::sleep(cfg.run_after);
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
        page_records: rd.pages,
        bytes: rd.pos,
        resumed_at: Some(resumed_at),
        slot_digests,
        verified_full,
        resumed_write_rate: writes1.saturating_sub(writes0) as f64 / secs.max(1e-9),
        resumed_passes,
    })
}

fn gpa_of(vm: &Vm, offset: u64) -> u64 {
    vm.slots()
        .iter()
        .find(|s| offset >= s.mem_offset && offset - s.mem_offset < s.size)
        .map(|s| s.gpa + offset - s.mem_offset)
        .unwrap_or(offset)
}

/// Re-reads every page of the destination's memory and compares it with
/// what arrived and with the source's own hash of it.
fn compare_every_page(vm: &Vm, received: &[u64], source: &[u64]) -> Result<(), MigrateError> {
    let mut buf = vec![0u8; PAGE_SIZE];
    for (i, (&got, &want)) in received.iter().zip(source).enumerate() {
        let off = i as u64 * PAGE_SIZE as u64;
        let gpa = gpa_of(vm, off);
        vm.memory().read_into(off, &mut buf);
        let here = xxh64(&buf, gpa);
        if here != want || got != want {
            let slot = vm.locate(gpa).map(|(s, _)| s.id).unwrap_or(0);
            return Err(MigrateError::MemoryMismatch {
                slot,
                detail: format!(
                    "page at gpa {gpa:#x}: source hash {want:#018x}, received {got:#018x}, destination memory {here:#018x}"
                ),
            });
        }
    }
    Ok(())
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
        policy,
        ..VmConfig::default()
    })
    .map_err(|e| MigrateError::Setup(format!("destination guest: {e}")))
}
