//! STATE of the simulated guest: its vCPUs' state and the workload they
//! run, as the stream carries it (and post-copy's FINAL carries the
//! vCPUs).

use crate::stream_error::MigrateError;
use crate::wire::{Dec, Enc, MAX_VCPUS, PAGE_SIZE};
use s2mmu_vm::{Pattern, VcpuState, WorkloadConfig};

/// The guest's vCPU state and the workload they run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestState {
    /// Bytes each vCPU's region has.
    pub bytes_per_vcpu: u64,
    /// Percent of accesses that write.
    pub write_percent: u32,
    /// 0 sequential, 1 random.
    pub pattern: u8,
    /// Pages per second per vCPU (0 unpaced).
    pub pace_pages_per_sec: u64,
    /// One per vCPU.
    pub vcpus: Vec<VcpuState>,
}
impl GuestState {
    /// The STATE record's body.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        e.u64(self.bytes_per_vcpu)
            .u32(self.write_percent)
            .u8(self.pattern)
            .u64(self.pace_pages_per_sec)
            .u32(self.vcpus.len() as u32);
        for v in &self.vcpus {
            encode_vcpu(&mut e, v);
        }
        e.0
    }

    /// Parses a STATE record's body.
    ///
    /// # Errors
    /// [`MigrateError::Malformed`].
    pub fn decode(body: &[u8], at_byte: u64) -> Result<Self, MigrateError> {
        let mut d = Dec::new(body, "STATE", at_byte);
        let bytes_per_vcpu = d.u64()?;
        let write_percent = d.u32()?;
        let pattern = d.u8()?;
        let pace_pages_per_sec = d.u64()?;
        let n = d.u32()?;
        if n == 0 || n > MAX_VCPUS {
            return Err(d.malformed(format!("{n} vCPUs")));
        }
        let mut vcpus = Vec::new();
        for _ in 0..n {
            vcpus.push(decode_vcpu(&mut d)?);
        }
        d.finish()?;
        Ok(GuestState {
            bytes_per_vcpu,
            write_percent,
            pattern,
            pace_pages_per_sec,
            vcpus,
        })
    }
}

/// Appends one vCPU's state, as STATE and post-copy's FINAL carry it.
pub fn encode_vcpu(e: &mut Enc, v: &VcpuState) {
    e.u64(v.pass).u64(v.next_page).u64(v.rng).u64(v.writes);
}

/// Reads one vCPU's state ([`encode_vcpu`]).
///
/// # Errors
/// [`MigrateError::Malformed`] when the body is short.
pub fn decode_vcpu(d: &mut Dec<'_>) -> Result<VcpuState, MigrateError> {
    Ok(VcpuState {
        pass: d.u64()?,
        next_page: d.u64()?,
        rng: d.u64()?,
        writes: d.u64()?,
    })
}

/// The vCPUs' states as post-copy's FINAL carries them: a count, then
/// each one ([`encode_vcpu`]).
pub fn encode_vcpus(vcpus: &[VcpuState]) -> Vec<u8> {
    let mut e = Enc::default();
    e.u32(vcpus.len() as u32);
    for v in vcpus {
        encode_vcpu(&mut e, v);
    }
    e.0
}

/// Reads [`encode_vcpus`]'s bytes: at most [`MAX_VCPUS`] states, nothing
/// after them.
///
/// # Errors
/// [`MigrateError::Malformed`] naming what is wrong.
pub fn decode_vcpus(body: &[u8]) -> Result<Vec<VcpuState>, MigrateError> {
    let mut d = Dec::new(body, "FINAL's vCPU states", 0);
    let n = d.u32()?;
    if n > MAX_VCPUS {
        return Err(d.malformed(format!("{n} vCPUs (at most {MAX_VCPUS})")));
    }
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(decode_vcpu(&mut d)?);
    }
    d.finish()?;
    Ok(v)
}

/// The workload the transferred state describes (what the source's
/// vCPUs ran).
pub fn workload_config(state: &GuestState) -> WorkloadConfig {
    WorkloadConfig {
        bytes_per_vcpu: state.bytes_per_vcpu,
        write_percent: state.write_percent,
        pattern: if state.pattern == 1 {
            Pattern::Random
        } else {
            Pattern::Sequential
        },
        page_size: PAGE_SIZE as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_and_rejects_nonsense() {
        let s = GuestState {
            bytes_per_vcpu: 1 << 20,
            write_percent: 100,
            pattern: 0,
            pace_pages_per_sec: 8192,
            vcpus: vec![VcpuState {
                pass: 3,
                next_page: 7,
                rng: 99,
                writes: 1000,
            }],
        };
        assert_eq!(GuestState::decode(&s.encode(), 0).unwrap(), s);
        let mut b = s.encode();
        b.pop();
        assert!(matches!(
            GuestState::decode(&b, 0),
            Err(MigrateError::Malformed {
                record: "STATE",
                ..
            })
        ));
    }
}
