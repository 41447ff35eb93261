//! QEMU 7.2's own migration of the guest: two `qemu-system-aarch64`
//! processes (TCG, `-M virt,gic-version=3 -cpu max,pauth-impdef=on`, the
//! kernel at EL1 with no hypervisor of ours), the destination waiting with
//! `-incoming`, the source migrating by QMP with QEMU's bandwidth cap
//! lifted (`max-bandwidth` 1 TiB/s), `auto-converge` on for pre-copy (ours
//! throttles by default) and `postcopy-ram` on both sides for post-copy
//! (`migrate-start-postcopy` right after `migrate`: QEMU switches after
//! its first pass, as ours does after round 0). Over the namespaced
//! links, where ours runs two processes with `--psk`, QEMU's post-copy is
//! TLS with a pre-shared key too ([`super::qemu_tls`]); its pre-copy there
//! is plain TCP unless [`Spec::qemu_precopy_tls`] asks for TLS: QEMU 7.2's
//! TLS channel writes each element of a write vector as its own TLS record
//! (a page and its header apart), and on a loaded host its pre-copy over
//! TLS can move too little to converge under a 64 MiB/s writer before the
//! guest program ends (the source guest then powers off and its QEMU
//! exits): give the guest time to outlast it (`Spec::guest_secs`). On loopback both sides are plain TCP (ours runs `--no-tls`).
//! Each QEMU's stderr and exit status are kept ([`super::qemu_proc`]).

use super::cell::{Cell, Measured, Spec, WARMUP_S};
use super::console::{self, Lines};
use super::link::{Net, Procs};
use super::qemu_proc::{self, QemuProc};
use super::qemu_tls::{self, PskDir};
use super::qmp::Qmp;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// QEMU's settings, as the report states them.
pub const SETTINGS: &str = "max-bandwidth 1 TiB/s (the 128 MiB/s default cap lifted), \
     downtime-limit 300 ms (its default; ours --max-downtime 300ms), auto-converge on for \
     pre-copy, postcopy-ram on both sides and migrate-start-postcopy after migrate for \
     post-copy; over the namespaced links post-copy with TLS and a pre-shared key \
     (tls-creds-psk, GnuTLS; ours: --psk, TLS 1.3) and pre-copy over plain TCP unless \
     --qemu-precopy-tls (on a loaded host QEMU 7.2's TLS pre-copy can take longer than the \
     guest program runs; each cell's transport says which ran), on loopback plain TCP \
     (ours: --no-tls); no compression (QEMU 7.2's default: multifd-compression none, \
     xbzrle and compress off; ours: the --ours-compress setting the report states)";

/// How long a run may take beyond the guest program's own time.
const SLACK: Duration = Duration::from_secs(180);
/// How long after its own end the guest program's last line may come.
const END_SLACK_S: f64 = 30.0;

/// QEMU's command line; `psk` adds its TLS credentials (the server's
/// where it listens, `incoming`).
fn qemu(
    spec: &Spec,
    cell: Cell,
    qmp: &Path,
    incoming: Option<&str>,
    psk: Option<&PskDir>,
) -> Command {
    let mut c = Command::new("qemu-system-aarch64");
    c.args(["-M", "virt,gic-version=3", "-cpu", "max,pauth-impdef=on"])
        .args(["-smp", &spec.vcpus.to_string()])
        .args(["-m", &format!("{}M", spec.mem_mib)])
        .args(["-display", "none", "-no-reboot", "-monitor", "none"])
        .arg("-kernel")
        .arg(&spec.kernel)
        .arg("-initrd")
        .arg(&spec.initrd)
        .arg("-append")
        .arg(format!(
            "console=ttyAMA0 quiet s2mmu.run=dirtier s2mmu.args={}",
            cell.program_args(spec.guest_secs)
        ))
        .args(["-serial", "stdio"])
        .arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", qmp.display()));
    if let Some(p) = psk {
        c.arg("-object").arg(p.object(incoming.is_some()));
    }
    if let Some(i) = incoming {
        c.args(["-incoming", i]);
    }
    c
}

/// Starts `c` as `role` (in `net`'s namespace `side` when given), its
/// stdout stamped into `lines`, its stderr kept in `logs`.
fn start(
    mut c: Command,
    net: Option<(&Net, &str)>,
    role: &'static str,
    logs: &Path,
    lines: &Lines,
) -> Result<QemuProc, String> {
    if let Some((n, side)) = net {
        let mut w = n.command(side, Path::new(c.get_program()));
        w.args(c.get_args());
        c = w;
    }
    QemuProc::start(c, role, logs, lines)
}

/// Waits for a line containing any of `what` among `lines`; its stamp.
fn wait_line(lines: &Lines, what: &[&str], deadline: Instant) -> Result<f64, String> {
    loop {
        let now = console::snapshot(lines);
        if let Some(t) = what.iter().find_map(|w| console::first(&now, w)) {
            return Ok(t);
        }
        if Instant::now() > deadline {
            return Err(format!("QEMU's guest never printed {what:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A free TCP port on loopback.
fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// How QEMU's migration of `cell` travels: TLS with a pre-shared key
/// across namespaces for post-copy, and for pre-copy only when
/// `spec.qemu_precopy_tls` asks for it; plain TCP otherwise.
pub fn tls(spec: &Spec, cell: Cell, namespaced: bool) -> bool {
    namespaced && (cell.postcopy() || spec.qemu_precopy_tls)
}

/// One run of QEMU's own migration of `cell` over `net` (loopback when
/// `None`), run `i` of the cell, each QEMU's stderr and exit status kept
/// under `logs/run<i+1>/`.
///
/// # Errors
/// A process or QMP failed, the migration failed or did not end; the
/// error says how each QEMU ended and quotes its stderr.
pub fn run(
    spec: &Spec,
    cell: Cell,
    net: Option<&Net>,
    tmp: &Path,
    logs: &Path,
    i: u32,
) -> Result<Measured, String> {
    let dir = logs.join(format!("run{}", i + 1));
    let (src_lines, dst_lines) = (Lines::default(), Lines::default());
    let mut qemus = Vec::new();
    let r = migrate(
        spec,
        cell,
        net,
        tmp,
        i,
        (&src_lines, &dst_lines),
        |c, side, role, lines| {
            qemus.push(start(c, net.map(|n| (n, side)), role, &dir, lines)?);
            Ok(())
        },
    );
    match r {
        Ok(mut m) => {
            m.logs = Some(dir.display().to_string());
            Ok(m)
        }
        Err(e) => {
            let mut e = qemu_proc::failure(&e, &mut qemus, &src_lines);
            if console::first(&console::snapshot(&src_lines), POWER_OFF).is_some() {
                e += &format!(
                    "; the guest program ran to its end on the source (its init powered \
                     off) before QEMU's migration completed: the migration took longer than \
                     the guest's {} s",
                    spec.guest_secs
                );
            }
            Err(format!(
                "{e}; QEMU's stderr and exit status kept in {}",
                dir.display()
            ))
        }
    }
}

/// The guest's init as it powers the machine off (its program ended).
const POWER_OFF: &str = "s2mmu-init: power off";

/// The run itself; `start` starts (and keeps) each QEMU.
fn migrate(
    spec: &Spec,
    cell: Cell,
    net: Option<&Net>,
    tmp: &Path,
    i: u32,
    (src_lines, dst_lines): (&Lines, &Lines),
    mut start: impl FnMut(Command, &str, &'static str, &Lines) -> Result<(), String>,
) -> Result<Measured, String> {
    let deadline = Instant::now() + Duration::from_secs(spec.guest_secs) + SLACK;
    let (sq, dq) = (tmp.join(format!("q-s{i}")), tmp.join(format!("q-d{i}")));
    let mut procs = Procs::default();
    let (host, port) = match net {
        None => ("127.0.0.1".to_string(), free_port()?),
        Some(n) => (n.dest_ip.clone(), 47_000 + (i % 1000) as u16),
    };
    let addr = format!("{host}:{port}");
    let incoming = format!("tcp:{addr}");
    let psk = match tls(spec, cell, net.is_some()) {
        false => None,
        true => Some(PskDir::random(&tmp.join(format!("q-psk{i}")))?),
    };
    let dc = qemu(spec, cell, &dq, Some(&incoming), psk.as_ref());
    start(dc, "d", "destination", dst_lines)?;
    let sc = qemu(spec, cell, &sq, None, psk.as_ref());
    start(sc, "s", "source", src_lines)?;
    let mut s = Qmp::connect(&sq, deadline)?;
    let mut d = Qmp::connect(&dq, deadline)?;
    let target = match net {
        None => addr,
        Some(n) => n.reach(&addr, &mut procs)?,
    };
    let started = wait_line(src_lines, &["s2mmu-dirtier: start"], deadline)?;
    configure(&mut s, &mut d, cell, psk.is_some())?;
    let wait = started + WARMUP_S - console::now();
    if wait > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(wait));
    }
    let t0 = console::now();
    s.cmd("migrate", json!({ "uri": format!("tcp:{target}") }))?;
    if cell.postcopy() {
        s.cmd("migrate-start-postcopy", json!({}))?;
    }
    let st = finished(&mut s, deadline)?;
    let stop = s.event_time("STOP", deadline)?;
    let resume = d.event_time("RESUME", deadline)?;
    let ended = ["s2mmu-dirtier: ok", "s2mmu-dirtier: FAIL"];
    // The program ends `guest_secs` after it started, wherever it runs.
    let left = started + spec.guest_secs as f64 + END_SLACK_S - console::now();
    let by = Instant::now() + Duration::from_secs_f64(left.max(1.0));
    let end = wait_line(dst_lines, &ended, by.min(deadline))
        .map_err(|e| format!("after the migration completed: {e}"));
    let mut m = Measured {
        downtime_ms: (resume - stop) * 1e3,
        total_ms: st["total-time"].as_f64().unwrap_or(0.0),
        // `t0` was taken as the `migrate` command went out; RESUME is
        // stamped by the destination on the host's one real-time clock.
        to_running_ms: Some((resume - t0) * 1e3),
        wire_bytes: st["ram"]["transferred"].as_u64().unwrap_or(0),
        ..Measured::default()
    };
    let mut all = console::snapshot(src_lines);
    all.extend(console::snapshot(dst_lines));
    m.read_console(cell, &all, t0, Some((stop, resume)));
    end?;
    Ok(m)
}

/// Sets QEMU's migration capabilities and parameters on the source `s`
/// and destination `d` for `cell`, with TLS when `tls`.
fn configure(s: &mut Qmp, d: &mut Qmp, cell: Cell, tls: bool) -> Result<(), String> {
    let caps = if cell.postcopy() {
        json!([{"capability": "postcopy-ram", "state": true}])
    } else {
        json!([{"capability": "auto-converge", "state": true}])
    };
    s.cmd("migrate-set-capabilities", json!({ "capabilities": caps }))?;
    if cell.postcopy() {
        d.cmd("migrate-set-capabilities", json!({ "capabilities": caps }))?;
    }
    if tls {
        // The destination reads its parameter when the source connects.
        qemu_tls::use_creds(d).and_then(|()| qemu_tls::use_creds(s))?;
    }
    s.cmd(
        "migrate-set-parameters",
        json!({"max-bandwidth": 1u64 << 40}),
    )?;
    Ok(())
}

/// What QEMU's last `query-migrate` answer said of its progress.
pub fn progress(st: &Value) -> String {
    let ram = &st["ram"];
    let mib = |v: &Value| {
        v.as_u64()
            .map_or("-".into(), |b| format!("{:.1}", b as f64 / 1048576.0))
    };
    format!(
        "status {}, {} ms in, {} Mbit/s, cpu throttle {} %, {} MiB remaining, {} MiB sent, \
         {} dirty syncs",
        st["status"],
        st["total-time"],
        ram["mbps"]
            .as_f64()
            .map_or("-".into(), |m| format!("{m:.0}")),
        st["cpu-throttle-percentage"].as_u64().unwrap_or(0),
        mib(&ram["remaining"]),
        mib(&ram["transferred"]),
        ram["dirty-sync-count"]
    )
}

/// Polls `query-migrate` until it completes; its last answer.
fn finished(s: &mut Qmp, deadline: Instant) -> Result<Value, String> {
    let mut last = Value::Null;
    loop {
        let st = s
            .cmd("query-migrate", json!({}))
            .map_err(|e| match last.is_null() {
                true => e,
                false => format!("{e} (QEMU's last query-migrate: {})", progress(&last)),
            })?;
        match st["status"].as_str() {
            Some("completed") => return Ok(st),
            Some("failed") | Some("cancelled") => {
                return Err(format!(
                    "QEMU's migration {}: {}",
                    st["status"], st["error-desc"]
                ))
            }
            _ => {}
        }
        if Instant::now() > deadline {
            return Err(format!("QEMU's migration did not end: {}", progress(&st)));
        }
        last = st;
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn spec(qemu_precopy_tls: bool) -> Spec {
        Spec {
            cells: Cell::ALL.to_vec(),
            links: Vec::new(),
            runs: 1,
            mem_mib: 256,
            vcpus: 1,
            guest_secs: 12,
            ours_dirty: "hw".into(),
            ours_compress: "auto".into(),
            s2mmu: PathBuf::new(),
            kernel: PathBuf::new(),
            initrd: PathBuf::new(),
            scripts: PathBuf::new(),
            qemu_precopy_tls,
            logs: PathBuf::new(),
        }
    }

    #[test]
    fn pre_copy_across_namespaces_is_plain_tcp_unless_asked_post_copy_is_tls() {
        let (plain, asked) = (spec(false), spec(true));
        for c in [Cell::Idle, Cell::Write64, Cell::WriteMax] {
            assert!(!tls(&plain, c, true), "{c:?}");
            assert!(tls(&asked, c, true), "{c:?}");
            assert!(!tls(&asked, c, false), "{c:?} on loopback");
        }
        assert!(tls(&plain, Cell::Postcopy, true));
        assert!(!tls(&plain, Cell::Postcopy, false));
    }

    #[test]
    fn progress_names_what_query_migrate_said() {
        let st = json!({"status": "active", "total-time": 11186,
            "cpu-throttle-percentage": 20,
            "ram": {"mbps": 176.2, "remaining": 29_779_968u64,
                    "transferred": 253_231_104u64, "dirty-sync-count": 4}});
        assert_eq!(
            progress(&st),
            "status \"active\", 11186 ms in, 176 Mbit/s, cpu throttle 20 %, 28.4 MiB \
             remaining, 241.5 MiB sent, 4 dirty syncs"
        );
        // An answer without figures says so rather than inventing them.
        assert!(progress(&json!({"status": "setup"})).contains("- Mbit/s"));
    }
}
