//! The guest console's echo to the host's stdout, off the vCPU threads and
//! made safe for a terminal.
//!
//! The UART emits a byte per guest store, with its lock held. Writing that
//! byte to stdout there let a blocked stdout (a full pipe, a paused
//! terminal) stall the storing vCPU, every other vCPU that touched the
//! UART, and with them a migration's pause. And the guest's bytes reached
//! the operator's terminal raw, so a hostile guest could send escape
//! sequences that retitle, rewrite or query it. Here a store only appends
//! to a bounded queue (dropping, and counting, what does not fit), and one
//! thread writes the queue out with control characters shown in caret
//! notation: ESC as `^[`, C1 controls (U+0080..U+009F, `C2 80..9F` in
//! UTF-8) as `^[@`..`^[_`, the 7-bit forms terminals treat them as.
//! Newline, carriage return, tab and backspace pass, as a serial console's
//! reader expects.
//!
//! The memory buffer tests and reports read ([`crate::linux::uart::ConsoleBuffer`])
//! still gets every byte unchanged.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Bytes the queue holds before it drops new ones.
pub(crate) const ECHO_QUEUE: usize = 256 * 1024;

/// How long dropping a UART waits for the echo to write what it queued.
pub(crate) const ECHO_DRAIN: Duration = Duration::from_secs(1);

struct Queue {
    bytes: VecDeque<u8>,
    cap: usize,
    /// Bytes dropped since the writer last reported drops.
    dropped: u64,
    /// Whether the writer holds bytes it took but has not written yet.
    writing: bool,
}

/// A bounded queue drained to a sink by a thread of its own.
pub(crate) struct ConsoleEcho {
    inner: Arc<(Mutex<Queue>, Condvar)>,
}

impl ConsoleEcho {
    /// An echo to `sink` holding at most `cap` queued bytes (at least 1).
    ///
    /// # Errors
    /// The writer thread could not be spawned.
    pub(crate) fn spawn(sink: Box<dyn Write + Send>, cap: usize) -> io::Result<ConsoleEcho> {
        let q = Queue {
            bytes: VecDeque::new(),
            cap: cap.max(1),
            dropped: 0,
            writing: false,
        };
        let inner = Arc::new((Mutex::new(q), Condvar::new()));
        let w = Arc::clone(&inner);
        std::thread::Builder::new()
            .name("console-echo".into())
            .spawn(move || write_out(&w, sink))?;
        Ok(ConsoleEcho { inner })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.inner.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `data`; never waits for the sink. Bytes beyond the queue's
    /// room are dropped and reported in the output once room returns.
    pub(crate) fn push(&self, data: &[u8]) {
        let mut q = self.lock();
        let room = q.cap - q.bytes.len();
        let take = room.min(data.len());
        q.bytes.extend(&data[..take]);
        q.dropped += (data.len() - take) as u64;
        drop(q);
        self.inner.1.notify_all();
    }

    /// Waits until the writer has written everything queued, or `timeout`
    /// passes; returns whether it did.
    pub(crate) fn drain(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut q = self.lock();
        loop {
            if q.bytes.is_empty() && !q.writing {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            q = match self.inner.1.wait_timeout(q, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

/// The process's echo to stdout, started by the first UART that echoes;
/// `None` when its thread could not be spawned (the echo is then lost, as
/// a console with no terminal; the memory buffer still has every byte).
pub(crate) fn stdout_echo() -> Option<&'static ConsoleEcho> {
    static ECHO: OnceLock<Option<ConsoleEcho>> = OnceLock::new();
    ECHO.get_or_init(|| ConsoleEcho::spawn(Box::new(io::stdout()), ECHO_QUEUE).ok())
        .as_ref()
}

/// The writer thread: takes what is queued, writes it made safe, for as
/// long as the process lives (the echo is a process-wide singleton) or
/// until the sink fails.
fn write_out(inner: &(Mutex<Queue>, Condvar), mut sink: Box<dyn Write + Send>) {
    let mut safe = TerminalSafe::default();
    let mut out = Vec::new();
    loop {
        let (chunk, dropped) = {
            let mut q = inner.0.lock().unwrap_or_else(|p| p.into_inner());
            q.writing = false;
            inner.1.notify_all();
            while q.bytes.is_empty() && q.dropped == 0 {
                q = inner.1.wait(q).unwrap_or_else(|p| p.into_inner());
            }
            q.writing = true;
            let chunk: Vec<u8> = q.bytes.drain(..).collect();
            (chunk, std::mem::take(&mut q.dropped))
        };
        out.clear();
        safe.escape(&chunk, &mut out);
        if dropped > 0 {
            out.extend_from_slice(
                format!("\n[s2mmu: {dropped} console bytes dropped: stdout was not keeping up]\n")
                    .as_bytes(),
            );
        }
        if sink.write_all(&out).and_then(|()| sink.flush()).is_err() {
            let mut q = inner.0.lock().unwrap_or_else(|p| p.into_inner());
            // A sink that failed stays failed: drop from now on, without
            // holding anyone who waits to drain.
            q.cap = 0;
            q.bytes.clear();
            q.writing = false;
            inner.1.notify_all();
            return;
        }
    }
}

/// Caret notation for the control characters a terminal would act on. It
/// keeps state across calls: the UART hands over one byte at a time, so a
/// C1 control's `C2` may end one call and its second byte begin the next.
#[derive(Default)]
pub(crate) struct TerminalSafe {
    after_c2: bool,
}

impl TerminalSafe {
    /// Appends `data`, made safe, to `out`.
    pub(crate) fn escape(&mut self, data: &[u8], out: &mut Vec<u8>) {
        for &b in data {
            if std::mem::take(&mut self.after_c2) {
                if (0x80..=0x9f).contains(&b) {
                    // U+0080..U+009F: ESC followed by 0x40..0x5f.
                    out.extend_from_slice(&[b'^', b'[', b - 0x40]);
                    continue;
                }
                out.push(0xc2);
            }
            match b {
                0xc2 => self.after_c2 = true,
                b'\n' | b'\r' | b'\t' | 0x08 => out.push(b),
                0x00..=0x1f => out.extend_from_slice(&[b'^', b + 0x40]),
                0x7f => out.extend_from_slice(b"^?"),
                _ => out.push(b),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn safe(parts: &[&[u8]]) -> Vec<u8> {
        let mut s = TerminalSafe::default();
        let mut out = Vec::new();
        for p in parts {
            s.escape(p, &mut out);
        }
        out
    }

    #[test]
    fn escape_sequences_reach_the_terminal_as_text() {
        // A title change and a screen clear, as a hostile guest would send.
        assert_eq!(safe(&[b"\x1b]0;owned\x07\x1b[2J"]), b"^[]0;owned^G^[[2J");
        assert_eq!(safe(&[b"a\x00b\x7f"]), b"a^@b^?");
    }

    #[test]
    fn a_console_line_passes_unchanged() {
        let line = "login: root\r\n\tcaf\u{e9} \u{2713} 100%\x08\n".as_bytes();
        assert_eq!(safe(&[line]), line);
    }

    #[test]
    fn c1_controls_are_caught_when_split_byte_by_byte() {
        // U+009B (CSI) and U+0090 (DCS), one byte per call as the UART
        // hands them over; U+00E9 (C3 A9) and U+00A0 (C2 A0) pass.
        let bytes = "\u{9b}2J\u{90}x\u{e9}\u{a0}".as_bytes();
        let split: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(safe(&split), "^[[2J^[Px\u{e9}\u{a0}".as_bytes());
    }

    /// A sink that blocks every write until told to go on.
    struct Stuck(Arc<(Mutex<bool>, Condvar)>, mpsc::Sender<Vec<u8>>);

    impl Write for Stuck {
        fn write(&mut self, data: &[u8]) -> io::Result<usize> {
            let (m, c) = &*self.0;
            let mut go = m.lock().unwrap();
            while !*go {
                go = c.wait(go).unwrap();
            }
            self.1.send(data.to_vec()).ok();
            Ok(data.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_blocked_sink_never_holds_the_writer_and_drops_are_reported() {
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let (tx, rx) = mpsc::channel();
        let echo = ConsoleEcho::spawn(Box::new(Stuck(gate.clone(), tx)), 64).unwrap();
        // 10,000 one-byte stores, as the guest's UART makes them, while
        // the sink is stuck: each returns at once.
        let (done_tx, done_rx) = mpsc::channel();
        let pusher = std::thread::spawn(move || {
            for i in 0..10_000u32 {
                echo.push(&[b'a' + (i % 26) as u8]);
            }
            done_tx.send(()).unwrap();
            echo
        });
        done_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("pushing blocked on a stuck sink");
        let echo = pusher.join().unwrap();
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        assert!(echo.drain(Duration::from_secs(60)));
        let written: Vec<u8> = rx.try_iter().flatten().collect();
        let text = String::from_utf8(written).unwrap();
        // The writer took what was queued when it woke and stuck writing
        // it; the queue then held at most 64 more: every byte is either
        // written or counted in a report, none lost silently.
        let mut kept = 0;
        let mut dropped = 0;
        for line in text.lines() {
            match line.strip_prefix("[s2mmu: ") {
                Some(rest) => dropped += rest.split(' ').next().unwrap().parse::<usize>().unwrap(),
                None => kept += line.len(),
            }
        }
        assert!(kept <= 128 && dropped > 0, "{text}");
        assert_eq!(kept + dropped, 10_000, "{text}");
    }

    #[test]
    fn drain_waits_for_what_was_queued() {
        let (tx, rx) = mpsc::channel();
        let gate = Arc::new((Mutex::new(true), Condvar::new()));
        let echo = ConsoleEcho::spawn(Box::new(Stuck(gate, tx)), 1024).unwrap();
        echo.push(b"hello\x1b[0m\n");
        assert!(echo.drain(Duration::from_secs(60)));
        let written: Vec<u8> = rx.try_iter().flatten().collect();
        assert_eq!(written, b"hello^[[0m\n");
    }
}
