//! iperf3 as the wire's figure for a wire benchmark: per
//! connection one server (`-s -1`, one client then it exits) on a free
//! loopback port and one client (`-c`, `-n` bytes, `-J`), all at once; the
//! received bytes and seconds from their JSON. Each process is bounded: a deadline on the
//! whole run (then it is killed), its output read up to a bound.

use serde_json::Value;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The most output one iperf3 run may print (its JSON report).
const MAX_OUTPUT: u64 = 16 << 20;
/// How long the client retries while the server is not listening yet.
const START_WAIT: Duration = Duration::from_secs(3);

/// iperf3's version line, or None when it cannot be run.
pub fn version() -> Option<String> {
    let mut c = Command::new("iperf3")
        .arg("--version")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let out = bounded_output(&mut c, Instant::now() + Duration::from_secs(5)).ok()?;
    out.lines().next().map(str::to_string)
}

/// Bytes per second iperf3 received over `streams` connections on
/// loopback, `bytes` in all; the whole run within `limit`. Each connection
/// is its own server and client pair, all at once (iperf3 before 3.16 runs
/// every `-P` stream on one thread, so one process could not use more than
/// one core, where the probe and the migration use a thread a connection):
/// the figure is the bytes received by all over the longest one's time.
///
/// # Errors
/// iperf3 could not be started, failed, overran `limit`, or printed no
/// received figures.
pub fn loopback(streams: u16, bytes: u64, limit: Duration) -> Result<f64, String> {
    let deadline = Instant::now() + limit;
    let n = u64::from(streams.max(1));
    let mut servers = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..n {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("a free port for iperf3: {e}"))?
            .port()
            .to_string();
        let server = Command::new("iperf3")
            .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting an iperf3 server: {e}"));
        match server {
            Ok(s) => servers.push(s),
            Err(e) => {
                end_servers(servers);
                return Err(e);
            }
        }
        ports.push(port);
    }
    let results: Vec<Result<(f64, f64), String>> = std::thread::scope(|sc| {
        let hs: Vec<_> = ports
            .iter()
            .map(|port| sc.spawn(move || client(port, (bytes / n).max(1), deadline)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("an iperf3 client thread panicked".into()))
            })
            .collect()
    });
    end_servers(servers);
    let (mut got, mut secs) = (0.0, 0.0f64);
    for r in results {
        let (b, s) = r?;
        got += b;
        secs = secs.max(s);
    }
    Ok(got / secs.max(1e-9))
}

/// Servers exit after their one client; one that did not (its client
/// never reached it) is ended here.
fn end_servers(servers: Vec<Child>) {
    for mut s in servers {
        let _ = bounded_output(&mut s, Instant::now() + Duration::from_secs(2));
    }
}

/// Runs one client until it reaches its server (within [`START_WAIT`])
/// and returns the bytes its server received and in how many seconds.
fn client(port: &str, bytes: u64, deadline: Instant) -> Result<(f64, f64), String> {
    let first = Instant::now();
    loop {
        let mut c = Command::new("iperf3")
            .args([
                "-c",
                "127.0.0.1",
                "-p",
                port,
                "-J",
                "--connect-timeout",
                "2000",
            ])
            .args(["-n", &bytes.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting the iperf3 client: {e}"))?;
        let out = bounded_output(&mut c, deadline)?;
        let v: Value =
            serde_json::from_str(&out).map_err(|e| format!("iperf3's JSON report: {e}"))?;
        let sum = &v["end"]["sum_received"];
        if let (Some(b), Some(s)) = (sum["bytes"].as_f64(), sum["seconds"].as_f64()) {
            return Ok((b, s));
        }
        let why = v["error"]
            .as_str()
            .unwrap_or("no received figures in its report");
        if !why.contains("connect") || first.elapsed() > START_WAIT {
            return Err(format!("iperf3: {why}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for `c` until `deadline` (then kills it) and returns its stdout
/// (at most [`MAX_OUTPUT`] bytes).
fn bounded_output(c: &mut Child, deadline: Instant) -> Result<String, String> {
    let out = c.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = out {
            let _ = o.take(MAX_OUTPUT).read_to_string(&mut s);
        }
        s
    });
    loop {
        match c.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = c.kill();
                let _ = c.wait();
                let _ = reader.join();
                return Err("iperf3 ran past its deadline and was stopped".into());
            }
        }
    }
    reader
        .join()
        .map_err(|_| "reading iperf3's output failed".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iperf3_measures_loopback_or_says_why_not() {
        match version() {
            // Where iperf3 is installed (.ci/run installs it), it measures.
            Some(v) => {
                assert!(v.starts_with("iperf"), "{v}");
                let r = loopback(2, 64 << 20, Duration::from_secs(60)).unwrap();
                assert!(r > 0.0);
            }
            None => {
                assert!(
                    std::env::var_os("S2MMU_REQUIRE_IPERF3").is_none(),
                    "S2MMU_REQUIRE_IPERF3 is set but iperf3 cannot be run"
                );
                let e = loopback(1, 1 << 20, Duration::from_secs(10)).unwrap_err();
                assert!(e.contains("iperf3"), "{e}");
            }
        }
    }

    #[test]
    fn a_run_past_its_deadline_is_stopped() {
        let mut c = Command::new("sleep")
            .arg("30")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let e = bounded_output(&mut c, Instant::now() + Duration::from_millis(200)).unwrap_err();
        assert!(e.contains("deadline"), "{e}");
        assert!(c.try_wait().unwrap().is_some(), "the process was killed");
    }
}
