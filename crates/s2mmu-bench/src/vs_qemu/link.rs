//! The link a benchmark cell runs over: loopback, or two network
//! namespaces joined by a veth pair that `scripts/netns-link.sh` makes and
//! shapes (bandwidth by `tbf`, latency by `netem` where the kernel has it,
//! else by `scripts/netns_delay_relay.py` in the destination's namespace),
//! and the child processes of one run, killed when it ends.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A link of the matrix.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct LinkSpec {
    /// Its name in the report and on the command line.
    pub name: &'static str,
    /// `tbf` rate (`tc`'s words), `None` for loopback.
    pub rate: Option<&'static str>,
    /// Round-trip time added, milliseconds.
    pub rtt_ms: f64,
}

/// The three links of the matrix.
pub const LINKS: [LinkSpec; 3] = [
    LinkSpec {
        name: "loopback",
        rate: None,
        rtt_ms: 0.0,
    },
    LinkSpec {
        name: "10gbit-0.2ms",
        rate: Some("10gbit"),
        rtt_ms: 0.2,
    },
    LinkSpec {
        name: "1gbit-1ms",
        rate: Some("1gbit"),
        rtt_ms: 1.0,
    },
];

/// Two namespaces and their shaped link; removed on drop.
pub struct Net {
    /// The script's NAME: namespaces NAME-s and NAME-d.
    pub name: String,
    /// The source's address (in NAME-s).
    pub src_ip: String,
    /// The destination's address (in NAME-d).
    pub dest_ip: String,
    /// How the RTT was made: "netem", "relay" or "none".
    pub latency: &'static str,
    /// The RTT the relay adds.
    pub rtt_ms: f64,
    scripts: PathBuf,
}

/// Runs the link script; its exit code and stdout.
fn script(scripts: &Path, args: &[&str]) -> Result<(i32, String), String> {
    let s = scripts.join("netns-link.sh");
    let o = Command::new(&s)
        .args(args)
        .output()
        .map_err(|e| format!("{}: {e}", s.display()))?;
    let code = o.status.code().unwrap_or(-1);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    if code == 0 || code == 3 {
        Ok((code, out))
    } else {
        Err(format!(
            "netns-link.sh {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

impl Net {
    /// Namespaces `NAME-s`, `NAME-d` shaped as `spec` says.
    ///
    /// # Errors
    /// Not root, no `ip`, or the script failed.
    pub fn make(scripts: &Path, name: &str, spec: &LinkSpec) -> Result<Net, String> {
        script(scripts, &["up", name])?;
        let mut net = Net {
            name: name.into(),
            src_ip: String::new(),
            dest_ip: String::new(),
            latency: "none",
            rtt_ms: spec.rtt_ms,
            scripts: scripts.into(),
        };
        let (_, addr) = script(scripts, &["addr", name])?;
        let mut ips = addr.split_whitespace().map(String::from);
        net.src_ip = ips.next().unwrap_or_default();
        net.dest_ip = ips.next().unwrap_or_default();
        let rtt = format!("{}", spec.rtt_ms);
        let mut args = vec!["shape", name];
        if let Some(r) = spec.rate {
            args.extend(["--rate", r]);
        }
        if spec.rtt_ms > 0.0 {
            args.extend(["--rtt", &rtt]);
        }
        let (code, out) = script(scripts, &args)?;
        net.latency = if code == 3 {
            "relay"
        } else if out.contains("latency: netem") {
            "netem"
        } else {
            "none"
        };
        Ok(net)
    }

    /// The namespace of `side` ("s" or "d").
    pub fn ns(&self, side: &str) -> String {
        format!("{}-{side}", self.name)
    }

    /// `program` in the namespace of `side`.
    pub fn command(&self, side: &str, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(side)]).arg(program);
        c
    }

    /// Where a source connects to reach `addr` in the destination's
    /// namespace: `addr` itself, or a relay in front of it (kept in
    /// `procs`) when the RTT comes from the relay.
    ///
    /// # Errors
    /// The relay did not start.
    pub fn reach(&self, addr: &str, procs: &mut Procs) -> Result<String, String> {
        if self.latency != "relay" {
            return Ok(addr.into());
        }
        let py = Path::new("python3");
        let mut c = self.command("d", py);
        c.arg(self.scripts.join("netns_delay_relay.py"))
            .args(["--listen", &format!("{}:0", self.dest_ip), "--to", addr])
            .args(["--rtt-ms", &format!("{}", self.rtt_ms)]);
        relay(c, procs)
    }
}

/// Starts a relay by `c` and reads the address it listens on.
///
/// # Errors
/// It did not start or did not say where it listens.
pub fn relay(mut c: Command, procs: &mut Procs) -> Result<String, String> {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("relay: {e}"))?;
    let out = child.stdout.take();
    procs.0.push(child);
    let mut line = String::new();
    BufReader::new(out.ok_or("relay: no stdout")?)
        .read_line(&mut line)
        .map_err(|e| format!("relay: {e}"))?;
    line.split("listening on ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .map(String::from)
        .ok_or_else(|| format!("relay said {line:?}"))
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = script(&self.scripts, &["down", &self.name]);
    }
}

/// Child processes of one run, killed and reaped when it ends.
#[derive(Default)]
pub struct Procs(pub Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
