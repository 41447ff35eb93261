//! Asking the architecture what it makes of a stage-2 table: address
//! translation instructions (AT S12E1R/W) at EL2, and single guest
//! accesses at EL1 whose aborts are reported, not handled.

use crate::layout;
use crate::machine::{Exit, Machine};
use crate::stage2;
use crate::{entry, Arm64Error, Result};

/// Most IPAs one [`at`] call takes (two lists of this many words fit the
/// scratch area).
pub const MAX_AT_BATCH: usize = ((layout::TABLES - layout::SCRATCH) / 16) as usize;

/// PAR_EL1.F: the translation faulted.
pub const PAR_F: u64 = 1;

/// What a PAR_EL1 value says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Par {
    /// Translated to this physical page address (bits \[47:12\]).
    Pa(u64),
    /// Faulted: fault status code (FST, same encoding as ESR's DFSC), and
    /// whether at stage 2 (PAR.S).
    Fault {
        /// Fault status.
        fst: u64,
        /// Stage 2 (not stage 1).
        stage2: bool,
    },
}

impl Par {
    /// Decodes a PAR_EL1 value.
    pub fn decode(par: u64) -> Par {
        if par & PAR_F != 0 {
            Par::Fault {
                fst: (par >> 1) & 0x3f,
                stage2: par & (1 << 9) != 0,
            }
        } else {
            Par::Pa(par & 0x0000_ffff_ffff_f000)
        }
    }
}

/// PAR_EL1 for each of `ipas` as CPU `cpu` translates them with the
/// tables `regs` (VTCR_EL2, VTTBR_EL2) install: AT S12E1R, or S12E1W for
/// `write`, with the guest's stage 1 off (so a VA is an IPA).
///
/// # Errors
/// [`Arm64Error::Config`] for more than [`MAX_AT_BATCH`] addresses or a
/// service CPU; [`Arm64Error::Boot`] if the stub does not answer.
pub fn at(
    m: &Machine,
    regs: (u64, u64),
    cpu: usize,
    ipas: &[u64],
    write: bool,
) -> Result<Vec<u64>> {
    if ipas.len() > MAX_AT_BATCH {
        return Err(Arm64Error::Config(format!(
            "{} addresses in one AT batch, at most {MAX_AT_BATCH}",
            ipas.len()
        )));
    }
    if cpu >= m.cpus() {
        return Err(Arm64Error::Config(format!("no CPU {cpu}")));
    }
    let ram = m.ram();
    let list = layout::SCRATCH;
    let out = layout::SCRATCH + (MAX_AT_BATCH as u64) * 8;
    for (i, &ipa) in ipas.iter().enumerate() {
        ram.write(list + 8 * i as u64, ipa);
    }
    let args = [
        regs.0,
        regs.1,
        stage2::HCR_GUEST,
        list,
        ipas.len() as u64,
        out,
        u64::from(write),
    ];
    m.mailbox(cpu).command(layout::CMD_AT, &args)?;
    Ok((0..ipas.len())
        .map(|i| ram.read(out + 8 * i as u64))
        .collect())
}

/// One guest access at EL1 on CPU `cpu` with the tables `regs` install
/// (which must map the guest code at [`layout::GUEST_TEXT`]):
/// `Ok(Ok(value))` read or written, or `Ok(Err(exit))` with the exit the
/// architecture raised instead (a stage-2 abort, unhandled).
///
/// # Errors
/// [`Arm64Error::Guest`] if the probe code itself is not mapped;
/// [`Arm64Error::Boot`] if the stub does not answer.
pub fn access(
    m: &Machine,
    regs: (u64, u64),
    cpu: usize,
    ipa: u64,
    write: Option<u64>,
) -> Result<std::result::Result<u64, Exit>> {
    if cpu >= m.cpus() {
        return Err(Arm64Error::Config(format!("no CPU {cpu}")));
    }
    let mbox = m.mailbox(cpu);
    let last = mbox.poll_exit(u64::MAX).map_or(0, |e| e.seq);
    let mut a = [0u64; 12];
    a[..4].copy_from_slice(&[regs.0, regs.1, stage2::HCR_GUEST, entry::PROBE]);
    a[4] = u64::from(write.is_some());
    a[5] = ipa;
    a[6] = write.unwrap_or(0);
    let run = mbox.post(layout::CMD_RUN, &a);
    let e = mbox.wait_exit(last)?;
    mbox.reply(&e, layout::ACT_STOP, [0, 0], &[]);
    m.wait("a stopped probe", std::time::Instant::now(), || {
        mbox.done(run)
    })?;
    if e.kind == layout::EXIT_ABORT && e.esr >> 26 == 0x20 {
        return Err(Arm64Error::Guest(format!(
            "probe code not mapped: instruction abort at {:#x}",
            e.elr
        )));
    }
    Ok(match e.kind {
        layout::EXIT_HVC if e.x[0] == layout::HVC_PROBE => Ok(e.x[1]),
        _ => Err(e),
    })
}
