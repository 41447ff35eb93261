//! A QMP client for QEMU's own migration: commands, their answers, and the
//! events (with QEMU's host timestamps) that arrive meanwhile.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Deadline of every read and write on the socket.
const IO: Duration = Duration::from_secs(30);
/// The longest QMP line read.
const MAX_LINE: u64 = 1 << 20;

/// A QMP connection.
pub struct Qmp {
    w: UnixStream,
    r: BufReader<UnixStream>,
    /// Events seen so far, in order.
    pub events: Vec<Value>,
}

impl Qmp {
    /// Connects to QEMU's QMP socket at `path` (retrying until `deadline`)
    /// and leaves capability negotiation.
    ///
    /// # Errors
    /// No connection by the deadline, or a QMP error.
    pub fn connect(path: &Path, deadline: Instant) -> Result<Qmp, String> {
        let s = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => {
                    return Err(format!("QMP {}: {e}", path.display()))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        s.set_read_timeout(Some(IO)).map_err(|e| e.to_string())?;
        s.set_write_timeout(Some(IO)).map_err(|e| e.to_string())?;
        let r = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
        let mut q = Qmp {
            w: s,
            r,
            events: Vec::new(),
        };
        q.read()?; // the greeting
        q.cmd("qmp_capabilities", json!({}))?;
        Ok(q)
    }

    fn read(&mut self) -> Result<Value, String> {
        let mut line = String::new();
        let n = Read::take(&mut self.r, MAX_LINE)
            .read_line(&mut line)
            .map_err(|e| format!("QMP read: {e}"))?;
        if n == 0 {
            return Err("QMP: QEMU closed the socket".into());
        }
        serde_json::from_str(&line).map_err(|e| format!("QMP: {e}: {line:?}"))
    }

    /// Runs `name` with `args`, returning its `return`; events read on the
    /// way are kept.
    ///
    /// # Errors
    /// A socket error or QEMU's error answer, named.
    pub fn cmd(&mut self, name: &str, args: Value) -> Result<Value, String> {
        let mut msg = json!({ "execute": name });
        if args.as_object().is_some_and(|o| !o.is_empty()) {
            msg["arguments"] = args;
        }
        let mut bytes = msg.to_string().into_bytes();
        bytes.push(b'\n');
        self.w
            .write_all(&bytes)
            .map_err(|e| format!("QMP {name}: {e}"))?;
        loop {
            let v = self.read()?;
            if v.get("event").is_some() {
                self.events.push(v);
            } else if let Some(e) = v.get("error") {
                return Err(format!("QMP {name}: {e}"));
            } else {
                return Ok(v.get("return").cloned().unwrap_or(Value::Null));
            }
        }
    }

    /// The host time (seconds since the epoch, QEMU's stamp) of the first
    /// event `name`, polling until `deadline`.
    ///
    /// # Errors
    /// No such event by the deadline.
    pub fn event_time(&mut self, name: &str, deadline: Instant) -> Result<f64, String> {
        loop {
            if let Some(t) = self.events.iter().find(|e| e["event"] == name).map(|e| {
                let t = &e["timestamp"];
                t["seconds"].as_f64().unwrap_or(0.0)
                    + t["microseconds"].as_f64().unwrap_or(0.0) / 1e6
            }) {
                return Ok(t);
            }
            if Instant::now() > deadline {
                return Err(format!("QMP: no {name} event"));
            }
            self.cmd("query-status", json!({}))?;
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
