//! Our migration of the Linux guest against QEMU 7.2's own, head to head:
//! the same kernel, initramfs, vCPUs, RAM and guest program (the project's
//! dirtier, printing a progress line every 2 ms and checking every page it
//! wrote), over the same link, ours and QEMU's interleaved run by run.
//!
//! Each side is measured the same way where it can be: the consoles'
//! lines stamped by the host as they arrive (the largest gap, the guest's
//! pages per second before and during the migration), the dirtier's own
//! check (pages lost), and each side's own figures of downtime, total time
//! and bytes sent (ours: its JSON report; QEMU's: QMP `query-migrate` and
//! its STOP and RESUME events).

pub mod cell;
pub mod console;
pub mod link;
pub mod ours;
pub mod qemu;
pub mod qemu_proc;
pub mod qemu_tls;
pub mod qmp;
pub mod report;

pub use cell::{Cell, CellRuns, Measured, Spec, BEFORE_S, MIN_DURING_S, WARMUP_S};
pub use link::{LinkSpec, Net, LINKS};

/// Runs the matrix: per link, per cell, `runs` times ours then QEMU's.
/// `say` hears a line per run.
///
/// # Errors
/// A link that cannot be made (namespaces need root).
pub fn run(spec: &Spec, say: &dyn Fn(&str)) -> Result<Vec<CellRuns>, String> {
    let tmp = std::env::temp_dir().join(format!("s2mmu-vsqemu-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let mut out = Vec::new();
    for (li, l) in spec.links.iter().enumerate() {
        let net = match l.rate {
            None => None,
            Some(_) => {
                let name = format!("vq{}{li}", std::process::id() % 10_000);
                Some(Net::make(&spec.scripts, &name, l)?)
            }
        };
        let latency = net.as_ref().map_or("none", |n| n.latency);
        for &cell in &spec.cells {
            let name = |tls: bool| if tls { "TLS-PSK" } else { "plain TCP" };
            let mut c = CellRuns {
                link: l.name,
                latency,
                transport: format!(
                    "ours {}, QEMU {}",
                    name(net.is_some()),
                    name(qemu::tls(spec, cell, net.is_some()))
                ),
                cell,
                ours: Vec::new(),
                qemu: Vec::new(),
            };
            for i in 0..spec.runs {
                let o = ours::run(spec, cell, net.as_ref(), &tmp).unwrap_or_else(Measured::failed);
                say(&report::run_line(l.name, cell, "ours", i, &o));
                c.ours.push(o);
                let logs = spec.logs.join(format!("{}-{}", l.name, cell.name()));
                let q = qemu::run(spec, cell, net.as_ref(), &tmp, &logs, i)
                    .unwrap_or_else(Measured::failed);
                say(&report::run_line(l.name, cell, "qemu", i, &q));
                c.qemu.push(q);
            }
            out.push(c);
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(out)
}
