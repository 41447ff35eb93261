//! Our side: `s2mmu migrate --guest linux` running the dirtier with the
//! cell's arguments, its consoles echoed on stdout and stamped here. On
//! loopback both machines run in one process over TCP (plain, as QEMU's);
//! across namespaces a destination `--listen`s in one and a source goes
//! `--to` it from the other, authenticated by a pre-shared key (TLS: the
//! two-process form takes no plain TCP; QEMU's side is then TLS with a
//! pre-shared key too, [`super::qemu_tls`]).

use super::cell::{Cell, Measured, Spec};
use super::console::{self, Lines};
use super::link::{Net, Procs};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a run may take beyond the guest program's own time.
const SLACK: Duration = Duration::from_secs(180);
/// Bytes of a process's stderr kept.
const MAX_ERR: usize = 64 * 1024;

/// The flags both sides take.
fn common(spec: &Spec, cell: Cell) -> Vec<String> {
    let mut v: Vec<String> = [
        "migrate",
        "--guest",
        "linux",
        "--linux-run",
        "dirtier",
        "--console-stdout",
        "--json",
        "-q",
        "--plot",
        "",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(["--linux-args".into(), cell.program_args(spec.guest_secs)]);
    v.extend(["--mem".into(), format!("{}M", spec.mem_mib)]);
    v.extend(["-v".into(), spec.vcpus.to_string()]);
    v.extend(["--dirty".into(), spec.ours_dirty.clone()]);
    v.extend(["--compress".into(), spec.ours_compress.clone()]);
    if cell.postcopy() {
        v.push("--postcopy".into());
    }
    v
}

/// A child, its stderr, and the thread reading its stdout to the end
/// (its lines are all in once that thread is joined).
type Spawned<E> = (Child, E, std::thread::JoinHandle<()>);

/// Spawns `c`, its stdout stamped into `lines`.
fn spawn(mut c: Command, lines: &Lines) -> Result<Spawned<impl Read + Send + 'static>, String> {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("s2mmu: {e}"))?;
    let out = child.stdout.take().ok_or("no stdout")?;
    let h = console::stamp(out, lines.clone()).map_err(|e| e.to_string())?;
    let err = child.stderr.take().ok_or("no stderr")?;
    Ok((child, err, h))
}

/// Waits for `c` to exit by `deadline` (killing it then); its stderr.
fn wait(
    c: &mut Child,
    err: impl Read + Send + 'static,
    deadline: Instant,
) -> Result<String, String> {
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let mut err = err.take(MAX_ERR as u64);
        let _ = err.read_to_string(&mut text);
        // What is past the bound is read and dropped, so the child never
        // blocks on a full pipe.
        let _ = std::io::copy(&mut err.into_inner(), &mut std::io::sink());
        text
    });
    loop {
        if let Some(st) = c.try_wait().map_err(|e| e.to_string())? {
            let text = reader.join().unwrap_or_default();
            return if st.success() {
                Ok(text)
            } else {
                Err(format!("s2mmu exited {st}: {}", text.trim()))
            };
        }
        if Instant::now() > deadline {
            let _ = c.kill();
            return Err("s2mmu did not end in time".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One run of our migration of `cell` over `net` (one process on
/// loopback when `None`).
///
/// # Errors
/// A process failed, the migration failed, or its report is missing.
pub fn run(spec: &Spec, cell: Cell, net: Option<&Net>, tmp: &Path) -> Result<Measured, String> {
    let deadline = Instant::now() + Duration::from_secs(spec.guest_secs) + SLACK;
    let lines = Lines::default();
    let mut procs = Procs::default();
    let args = common(spec, cell);
    let report_lines = match net {
        None => {
            let mut c = Command::new(&spec.s2mmu);
            c.args(&args).arg("--no-tls");
            let (mut child, err, out) = spawn(c, &lines)?;
            wait(&mut child, err, deadline)?;
            let _ = out.join();
            lines.clone()
        }
        Some(n) => two_processes(spec, n, &args, &lines, tmp, &mut procs, deadline)?,
    };
    let all = console::snapshot(&lines);
    let report = envelope(&console::snapshot(&report_lines), "run 1")
        .ok_or("our side printed no JSON report (the `migrate` envelope)")?;
    let r = &report["results"][row_of(&report, "run 1")?];
    let d = &r["details"];
    let resumed_ms = r["downtime_ms"].as_f64().unwrap_or(0.0);
    let downtime_ms = to_first_instruction(r, net.and_then(|_| envelope(&all, "destination")))?;
    let (total_ms, to_running_ms, setup_ms) = spans(r, downtime_ms)?;
    let (t0, pause) = start_and_pause(r)?;
    let mut m = Measured {
        downtime_ms,
        downtime_resumed_ms: Some(resumed_ms),
        total_ms,
        to_running_ms: Some(to_running_ms),
        setup_ms: Some(setup_ms),
        wire_bytes: r["stream_bytes"].as_u64().unwrap_or(0)
            + d["postcopy_bytes"].as_u64().unwrap_or(0),
        compressed_pages: r["compression"]["pages"].as_u64(),
        saved_bytes: r["compression"]["bytes_saved"].as_u64(),
        ..Measured::default()
    };
    m.read_console(cell, &all, t0, Some((pause, pause + downtime_ms / 1e3)));
    Ok(m)
}

/// The source's `row`'s spans, ms: its start to its last byte sent (the
/// span of QEMU's `total-time`; a post-copy's last page included), its
/// start to the guest running on the destination (`downtime_ms` after the
/// pause), and the setup before round 0.
fn spans(row: &Value, downtime_ms: f64) -> Result<(f64, f64, f64), String> {
    let f = |k: &str| {
        row[k]
            .as_f64()
            .ok_or_else(|| format!("our source did not report {k}"))
    };
    let setup = f("setup_ms")?;
    Ok((
        f("to_last_byte_sent_ms")?,
        setup + f("precopy_ms")? + downtime_ms,
        setup,
    ))
}

/// The source `row`'s start (its `migrate`'s start, where
/// [`spans`]' total time starts) and its pause, host seconds: the
/// migration does not start on the benchmark's clock but once machine B
/// is up and the source has seen the program's start, which takes a
/// second or more after the benchmark's own sight of that line.
fn start_and_pause(row: &Value) -> Result<(f64, f64), String> {
    let pause = pause_unix_ns(row)? as f64 / 1e9;
    let before = ["setup_ms", "precopy_ms"]
        .iter()
        .map(|k| {
            row[*k]
                .as_f64()
                .ok_or_else(|| format!("our source did not report {k}"))
        })
        .sum::<Result<f64, String>>()?;
    Ok((pause - before / 1e3, pause))
}

/// The index of `report`'s result row `case`.
fn row_of(report: &Value, case: &str) -> Result<usize, String> {
    report["results"]
        .as_array()
        .and_then(|rows| rows.iter().position(|row| row["case"] == case))
        .ok_or_else(|| format!("our side's report has no result for {case}"))
}

/// The downtime as the pause on the source to the first guest
/// instruction on the destination, ms: the source's `row` has it when
/// both ends ran in its process; else its pause and the destination's
/// first instruction (`dest`'s envelope), both on the host's real-time
/// clock, which the two namespaces share.
fn to_first_instruction(row: &Value, dest: Option<Value>) -> Result<f64, String> {
    if let Some(ms) = row["downtime_first_instruction_ms"].as_f64() {
        return Ok(ms);
    }
    let dest = dest.ok_or("our destination printed no JSON report")?;
    let first = dest["results"][row_of(&dest, "destination")?]["first_instruction_unix_ns"]
        .as_u64()
        .ok_or("our destination did not report its first guest instruction")?;
    Ok(first.saturating_sub(pause_unix_ns(row)?) as f64 / 1e6)
}

/// The source `row`'s pause, ns since the Unix epoch (0 is no pause).
fn pause_unix_ns(row: &Value) -> Result<u64, String> {
    row["pause_unix_ns"]
        .as_u64()
        .filter(|&p| p > 0)
        .ok_or_else(|| "our source did not report its pause".to_string())
}

/// The last `migrate` JSON envelope in `lines` with a result row `case`
/// (printed pretty, over several lines, after the consoles): parsed from
/// each line that opens an object, the last first. The envelope's first
/// line may follow a console line the switch cut short, so it is the
/// line's last `{` that opens it.
fn envelope(lines: &[console::Stamped], case: &str) -> Option<Value> {
    (0..lines.len()).rev().find_map(|i| {
        let first = lines[i].line.trim_end();
        if !first.ends_with('{') {
            return None;
        }
        let mut text = first[first.rfind('{')?..].to_string();
        for l in &lines[i + 1..] {
            text.push('\n');
            text.push_str(&l.line);
        }
        let v: Value = serde_json::Deserializer::from_str(&text)
            .into_iter()
            .next()?
            .ok()?;
        let has = v["results"]
            .as_array()
            .is_some_and(|rows| rows.iter().any(|r| r["case"] == case));
        (v["command"] == "migrate" && has).then_some(v)
    })
}

/// A destination in `n`'s destination namespace and a source in its
/// source namespace; both consoles into `lines`, the source's report
/// lines returned.
fn two_processes(
    spec: &Spec,
    n: &Net,
    args: &[String],
    lines: &Lines,
    tmp: &Path,
    procs: &mut Procs,
    deadline: Instant,
) -> Result<Lines, String> {
    let key = tmp.join("psk");
    std::fs::write(&key, "the benchmark's pre-shared key, both sides\n")
        .map_err(|e| e.to_string())?;
    let mut with = args.to_vec();
    with.extend(["--psk".into(), key.display().to_string()]);
    with.extend(["--io-timeout".into(), "10s".into()]);
    let mut dc = n.command("d", &spec.s2mmu);
    dc.args(&with)
        .args(["--listen", &format!("{}:0", n.dest_ip)]);
    let (dest, derr, dout) = spawn(dc, lines)?;
    let at = procs.0.len();
    procs.0.push(dest);
    let mut derr = BufReader::new(derr);
    let mut line = String::new();
    let addr = loop {
        line.clear();
        if derr.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Err("our destination ended before it listened".into());
        }
        if let Some(rest) = line.split("destination listening on ").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_string();
        }
    };
    let target = n.reach(&addr, procs)?;
    let src_lines = Lines::default();
    let mut sc = n.command("s", &spec.s2mmu);
    sc.args(&with).args(["--to", &target]);
    let (mut src, serr, sout) = spawn(sc, &src_lines)?;
    let r = wait(&mut src, serr, deadline);
    let _ = sout.join();
    let dr = wait(&mut procs.0[at], derr, deadline);
    let _ = dout.join();
    r?;
    dr?;
    let mut all = console::snapshot(lines);
    all.extend(console::snapshot(&src_lines));
    *lines.lock().unwrap_or_else(|p| p.into_inner()) = all;
    Ok(src_lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Report;
    use console::Stamped;

    fn stamped(text: &str) -> Vec<Stamped> {
        text.lines()
            .map(|l| Stamped {
                at: 0.0,
                line: l.to_string(),
            })
            .collect()
    }

    #[test]
    fn the_envelope_is_found_after_the_consoles_even_behind_a_cut_line() {
        let mut rep = Report::new("migrate", serde_json::json!({"guest": "linux"}));
        rep.result(
            "run 1",
            "s2mmu",
            serde_json::json!({"downtime_ms": 12.5, "details": {"channels": 1}}),
        );
        let pretty = serde_json::to_string_pretty(&rep.to_json()).unwrap();
        let text = format!(
            "s2mmu-dirtier: t=0.002s passes=0 pages=10\nguest {{\n}}\n\
             s2mmu-dirtier: t=0.0{pretty}\n"
        );
        let v = envelope(&stamped(&text), "run 1").expect("the envelope");
        assert_eq!(v["results"][0]["case"], "run 1");
        assert_eq!(v["results"][0]["downtime_ms"], 12.5);
        // Consoles alone, or an object that is not the envelope: none.
        assert!(envelope(&stamped("guest {\n \"command\": \"x\"\n}\n"), "run 1").is_none());
        assert!(envelope(
            &stamped(&pretty.replace("\"migrate\"", "\"linux\"")),
            "run 1"
        )
        .is_none());
        assert!(envelope(&stamped(&pretty[..pretty.len() / 2]), "run 1").is_none());
        // Another side's envelope is not this one.
        assert!(envelope(&stamped(&pretty), "destination").is_none());
    }

    #[test]
    fn our_total_spans_the_setup_to_the_last_byte_sent() {
        let row = serde_json::json!({"setup_ms": 4.0, "precopy_ms": 40.0,
            "to_last_byte_sent_ms": 50.0, "total_ms": 60.0});
        // The span of QEMU's total-time is the source's; the way to the
        // guest running adds the setup and pre-copy to the downtime.
        assert_eq!(spans(&row, 13.0), Ok((50.0, 57.0, 4.0)));
        // A source that did not report its setup is an error, not a zero.
        let old = serde_json::json!({"precopy_ms": 40.0, "total_ms": 60.0});
        assert!(spans(&old, 13.0).unwrap_err().contains("setup_ms"));
    }

    #[test]
    fn the_window_starts_where_our_migration_did() {
        // Paused at 100 s, after a 4 ms setup and 40 ms of pre-copy: the
        // migration started at 99.956 s.
        let row = serde_json::json!({"setup_ms": 4.0, "precopy_ms": 40.0,
            "pause_unix_ns": 100_000_000_000u64});
        let (t0, pause) = start_and_pause(&row).unwrap();
        assert!((t0 - 99.956).abs() < 1e-9, "{t0}");
        assert_eq!(pause, 100.0);
        let unpaused = serde_json::json!({"setup_ms": 4.0, "precopy_ms": 40.0,
            "pause_unix_ns": 0});
        assert!(start_and_pause(&unpaused).unwrap_err().contains("pause"));
        let no_setup = serde_json::json!({"precopy_ms": 40.0, "pause_unix_ns": 7});
        assert!(start_and_pause(&no_setup).unwrap_err().contains("setup_ms"));
    }

    #[test]
    fn the_downtime_ends_at_the_destinations_first_instruction() {
        // One process: the source's row has it.
        let one = serde_json::json!({"downtime_ms": 30.0, "downtime_first_instruction_ms": 21.5});
        assert_eq!(to_first_instruction(&one, None), Ok(21.5));
        // Two: the destination's first instruction less the source's pause.
        let src = serde_json::json!({"downtime_ms": 30.0, "pause_unix_ns": 1_000_000_000u64});
        let mut rep = Report::new("migrate", serde_json::json!({}));
        rep.result(
            "destination",
            "s2mmu",
            serde_json::json!({"first_instruction_unix_ns": 1_012_500_000u64}),
        );
        assert_eq!(to_first_instruction(&src, Some(rep.to_json())), Ok(12.5));
        // A side that did not say is an error, not a zero.
        assert!(to_first_instruction(&src, None).is_err());
        let mut none = Report::new("migrate", serde_json::json!({}));
        none.result(
            "destination",
            "s2mmu",
            serde_json::json!({"first_instruction_unix_ns": null}),
        );
        assert!(to_first_instruction(&src, Some(none.to_json())).is_err());
        let no_pause = serde_json::json!({"pause_unix_ns": 0});
        assert!(to_first_instruction(&no_pause, Some(rep.to_json())).is_err());
    }
}
