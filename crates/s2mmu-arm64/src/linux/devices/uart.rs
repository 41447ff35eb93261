//! The guest's console: a 16550 UART (rust-vmm's `vm-superio` `Serial`)
//! on the MMIO bus, described to Linux as `ns16550a` with `reg-shift = 0`
//! and `reg-io-width = 1`.
//!
//! Output goes to stdout, a file, a bounded memory buffer the tests read,
//! or a buffer and one of the others. Stdout is written on a thread of its
//! own, terminal controls shown as text (`linux/devices/console_echo.rs`). Input
//! comes from stdin on a thread ([`Uart::spawn_stdin_reader`]) or from the host ([`Uart::enqueue`]).
//! The interrupt is a callback the vGIC supplies; [`Uart::irq_pending`]
//! gives the line's level (IIR bit 0 clear) for a level-sensitive SPI.
//! [`Uart::state`] and [`Uart::from_state`] carry the registers and the
//! receive FIFO across a migration.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use vm_superio::serial::{NoEvents, SerialState};
use vm_superio::{Serial, Trigger};

use crate::linux::bus::MmioDevice;
use crate::linux::console_echo::{stdout_echo, ECHO_DRAIN};
use crate::linux::devices::device::{Claim, Device, DeviceState};

/// The UART's register window in bytes (eight byte-wide registers).
pub const UART_REGS: u64 = 8;
/// The clock the device tree names; Linux computes the divisor from it.
pub const UART_CLOCK_HZ: u32 = 1_843_200;

/// The interrupt callback. It runs with the UART's lock held: it must not
/// call back into the same [`Uart`].
pub type IrqCallback = Arc<dyn Fn() + Send + Sync>;

struct CallbackTrigger(IrqCallback);

impl Trigger for CallbackTrigger {
    type E = std::convert::Infallible;
    fn trigger(&self) -> Result<(), Self::E> {
        (self.0)();
        Ok(())
    }
}

/// Line ends whose arrival a [`ConsoleBuffer`] remembers at most.
pub const MAX_STAMPED_LINES: usize = 1 << 16;

/// A bounded in-memory console: keeps the last `cap` bytes, wakes waiters
/// on every write, and stamps each line with the host's clock when its
/// newline arrives ([`ConsoleBuffer::stamped_lines`]).
#[derive(Clone)]
pub struct ConsoleBuffer {
    inner: Arc<(Mutex<BufInner>, Condvar)>,
}

struct BufInner {
    bytes: VecDeque<u8>,
    cap: usize,
    /// Bytes ever written (dropped ones included).
    total: u64,
    /// `total` just past each newline, and when it arrived (at most
    /// [`MAX_STAMPED_LINES`], the oldest dropped first).
    stamps: VecDeque<(u64, Instant)>,
    /// `total` past the newest newline dropped from `stamps`.
    dropped_end: u64,
}

impl ConsoleBuffer {
    /// A buffer keeping at most `cap` bytes (at least 1).
    pub fn new(cap: usize) -> ConsoleBuffer {
        let inner = BufInner {
            bytes: VecDeque::new(),
            cap: cap.max(1),
            total: 0,
            stamps: VecDeque::new(),
            dropped_end: 0,
        };
        ConsoleBuffer {
            inner: Arc::new((Mutex::new(inner), Condvar::new())),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BufInner> {
        // A writer that panicked leaves bytes, not broken invariants.
        self.inner.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the buffer holds now, lossily decoded.
    pub fn contents(&self) -> String {
        let g = self.lock();
        let (a, b) = g.bytes.as_slices();
        let mut v = a.to_vec();
        v.extend_from_slice(b);
        String::from_utf8_lossy(&v).into_owned()
    }

    /// The whole lines the buffer still holds, each with the host's
    /// clock when its newline arrived, its end (`\r`, `\n`) cut.
    pub fn stamped_lines(&self) -> Vec<(Instant, String)> {
        let g = self.lock();
        let held = g.total - g.bytes.len() as u64;
        let mut begin = g.dropped_end;
        let mut out = Vec::new();
        for &(end, at) in &g.stamps {
            if begin >= held {
                let line: Vec<u8> = g
                    .bytes
                    .range((begin - held) as usize..(end - held) as usize)
                    .copied()
                    .collect();
                out.push((at, String::from_utf8_lossy(&line).trim_end().to_string()));
            }
            begin = end;
        }
        out
    }

    /// Bytes ever written, including those the bound dropped.
    pub fn total_written(&self) -> u64 {
        self.lock().total
    }

    /// Waits until `pred(contents)` holds or `timeout` passes; returns the
    /// contents when it held.
    pub fn wait_until(&self, timeout: Duration, pred: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = Instant::now() + timeout;
        let mut seen = u64::MAX;
        loop {
            let total = self.lock().total;
            if total != seen {
                seen = total;
                let s = self.contents();
                if pred(&s) {
                    return Some(s);
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            let g = self.lock();
            if g.total == seen {
                let _unused = self.inner.1.wait_timeout(g, deadline - now);
            }
        }
    }

    fn push(&self, data: &[u8]) {
        let now = data.contains(&b'\n').then(Instant::now);
        let mut g = self.lock();
        for &b in data {
            if g.bytes.len() == g.cap {
                g.bytes.pop_front();
            }
            g.bytes.push_back(b);
            g.total += 1;
            if let (b'\n', Some(at)) = (b, now) {
                if g.stamps.len() == MAX_STAMPED_LINES {
                    g.dropped_end = g.stamps.pop_front().map_or(0, |s| s.0);
                }
                let end = g.total;
                g.stamps.push_back((end, at));
            }
        }
        drop(g);
        self.inner.1.notify_all();
    }
}

/// Where the guest's console output goes.
pub enum UartOutput {
    /// The host's stdout.
    Stdout,
    /// A file (created or truncated by the caller).
    File(File),
    /// Only a memory buffer.
    Buffer(ConsoleBuffer),
    /// A memory buffer, and stdout as well.
    BufferAndStdout(ConsoleBuffer),
    /// Nowhere.
    Discard,
}

impl Write for UartOutput {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        match self {
            UartOutput::Stdout => {
                echo(data);
                Ok(data.len())
            }
            UartOutput::File(f) => f.write(data),
            UartOutput::Buffer(b) => {
                b.push(data);
                Ok(data.len())
            }
            UartOutput::BufferAndStdout(b) => {
                b.push(data);
                echo(data);
                Ok(data.len())
            }
            UartOutput::Discard => Ok(data.len()),
        }
    }

    /// Never waits for stdout: the echo thread flushes what it writes.
    fn flush(&mut self) -> io::Result<()> {
        match self {
            UartOutput::File(f) => f.flush(),
            _ => Ok(()),
        }
    }
}

impl UartOutput {
    fn echoes(&self) -> bool {
        matches!(self, UartOutput::Stdout | UartOutput::BufferAndStdout(_))
    }
}

/// Hands guest bytes to the process's stdout echo, which writes them on
/// its own thread with control characters made visible
/// (`linux/devices/console_echo.rs`): a stalled stdout cannot stall a vCPU, and
/// the guest cannot drive the operator's terminal.
fn echo(data: &[u8]) {
    if let Some(e) = stdout_echo() {
        e.push(data);
    }
}

type Inner = Serial<CallbackTrigger, NoEvents, UartOutput>;

/// A 16550 UART shared between the vCPU threads (MMIO) and an input thread.
pub struct Uart {
    serial: Mutex<Inner>,
}

/// Why a saved UART state was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UartError {
    /// The saved receive FIFO holds more bytes than the device's FIFO.
    FifoTooLong(usize),
}

impl std::fmt::Display for UartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UartError::FifoTooLong(n) => {
                write!(
                    f,
                    "UART state: receive FIFO of {n} bytes exceeds the device's 64"
                )
            }
        }
    }
}

impl std::error::Error for UartError {}

impl Uart {
    /// A UART in its reset state.
    pub fn new(irq: IrqCallback, out: UartOutput) -> Uart {
        Uart {
            serial: Mutex::new(Serial::new(CallbackTrigger(irq), out)),
        }
    }

    /// A UART with the registers and FIFO of `state` (a migration's
    /// destination). Re-raises the interrupt if the state has one enabled
    /// and set.
    ///
    /// # Errors
    /// [`UartError::FifoTooLong`] when `state` holds more than 64 bytes.
    pub fn from_state(
        state: &SerialState,
        irq: IrqCallback,
        out: UartOutput,
    ) -> Result<Uart, UartError> {
        let serial = Serial::from_state(state, CallbackTrigger(irq), NoEvents, out)
            .map_err(|_| UartError::FifoTooLong(state.in_buffer.len()))?;
        Ok(Uart {
            serial: Mutex::new(serial),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.serial.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The registers and receive FIFO, for a migration's source.
    pub fn state(&self) -> SerialState {
        self.lock().state()
    }

    /// Whether the interrupt line is asserted now (IIR bit 0 clear): the
    /// level a level-sensitive SPI should have after each access.
    pub fn irq_pending(&self) -> bool {
        self.lock().state().interrupt_identification & 1 == 0
    }

    /// Queues host input for the guest; returns how many bytes fitted in
    /// the 64-byte FIFO (0 when it is full).
    pub fn enqueue(&self, input: &[u8]) -> usize {
        let mut s = self.lock();
        let room = s.fifo_capacity().min(input.len());
        if room == 0 {
            return 0;
        }
        s.enqueue_raw_bytes(&input[..room]).unwrap_or(0)
    }

    /// Feeds stdin to the guest on a new thread, waiting while the FIFO is
    /// full. The thread ends at end of input or on a read error.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn spawn_stdin_reader(self: &Arc<Self>) -> io::Result<std::thread::JoinHandle<()>> {
        let uart = Arc::clone(self);
        std::thread::Builder::new()
            .name("uart-stdin".into())
            .spawn(move || {
                let mut buf = [0u8; 64];
                let mut stdin = io::stdin();
                while let Ok(n) = stdin.read(&mut buf) {
                    if n == 0 {
                        return;
                    }
                    let mut rest = &buf[..n];
                    while !rest.is_empty() {
                        let k = uart.enqueue(rest);
                        rest = &rest[k..];
                        if k == 0 {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                }
            })
    }
}

impl Drop for Uart {
    /// Lets the echo write out what this UART queued (up to
    /// 1 s, `ECHO_DRAIN`), so a guest's last lines reach stdout before the
    /// process that ran it ends.
    fn drop(&mut self) {
        if self.lock().writer().echoes() {
            if let Some(e) = stdout_echo() {
                e.drain(ECHO_DRAIN);
            }
        }
    }
}

impl MmioDevice for Uart {
    /// Registers are bytes at offsets 0-7; a wider load returns the byte
    /// in its low lane and zeros above; beyond offset 7 reads as zero.
    fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if let (true, Some(low)) = (offset < UART_REGS, data.first_mut()) {
            *low = self.lock().read(offset as u8);
        }
    }

    /// Stores go to the register at `offset` (low byte); beyond offset 7
    /// they are ignored. An output error loses the byte, as a UART with no
    /// cable does.
    fn write(&self, offset: u64, data: &[u8]) {
        if let (true, Some(&low)) = (offset < UART_REGS, data.first()) {
            let _lost = self.lock().write(offset as u8, low);
        }
    }
}

/// The 16550 as the bus's device, at `base`.
pub(crate) struct UartDevice {
    /// The UART.
    pub(crate) uart: Arc<Uart>,
    /// Its registers' base.
    pub(crate) base: u64,
}

impl Device for UartDevice {
    fn name(&self) -> &'static str {
        "uart"
    }

    fn claims(&self) -> Vec<Claim> {
        vec![Claim::Mmio {
            range: "uart",
            base: self.base,
            size: UART_REGS,
            regs: self.uart.clone(),
        }]
    }

    fn save(&self, _vcts: &[u64]) -> DeviceState {
        DeviceState::Uart(self.uart.state())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const THR: u64 = 0;
    const IER: u64 = 1;
    const IIR: u64 = 2;
    const LSR: u64 = 5;

    fn reg(u: &Uart, off: u64) -> u8 {
        let mut b = [0u8; 1];
        u.read(off, &mut b);
        b[0]
    }

    #[test]
    fn output_reaches_the_buffer_and_input_raises_the_interrupt() {
        let irqs = Arc::new(AtomicUsize::new(0));
        let i2 = irqs.clone();
        let buf = ConsoleBuffer::new(1024);
        let u = Uart::new(
            Arc::new(move || {
                i2.fetch_add(1, Ordering::SeqCst);
            }),
            UartOutput::Buffer(buf.clone()),
        );
        for b in b"hello\n" {
            u.write(THR, &[*b]);
        }
        assert_eq!(buf.contents(), "hello\n");
        assert!(!u.irq_pending());
        // Receive-data interrupt enabled, then a byte arrives.
        u.write(IER, &[0x01]);
        assert_eq!(u.enqueue(b"x"), 1);
        assert_eq!(irqs.load(Ordering::SeqCst), 1);
        assert!(u.irq_pending());
        assert_eq!(reg(&u, LSR) & 1, 1, "data ready");
        assert_eq!(reg(&u, IIR) & 0x0f, 0x04, "received data available");
        assert_eq!(reg(&u, THR), b'x');
        assert!(!u.irq_pending(), "reading the data clears the interrupt");
        assert_eq!(u.enqueue(&[0u8; 100]), 64, "the FIFO holds 64 bytes");
        assert_eq!(u.enqueue(b"y"), 0);
        // Accesses the bus never makes, made directly: no panic.
        u.read(0, &mut []);
        u.write(0, &[]);
        let mut wide = [0xffu8; 8];
        u.read(100, &mut wide);
        assert_eq!(wide, [0; 8], "beyond the registers reads as zero");
    }

    #[test]
    fn state_round_trips_and_a_long_fifo_is_refused() {
        let u = Uart::new(Arc::new(|| {}), UartOutput::Discard);
        u.write(7, &[0x5a]); // scratch
        u.enqueue(b"abc");
        let s = u.state();
        let v = Uart::from_state(&s, Arc::new(|| {}), UartOutput::Discard).unwrap();
        assert_eq!(v.state(), s);
        assert_eq!(reg(&v, 7), 0x5a);
        assert_eq!(reg(&v, THR), b'a');
        let mut bad = s.clone();
        bad.in_buffer = vec![0; 65];
        let e = Uart::from_state(&bad, Arc::new(|| {}), UartOutput::Discard).err();
        assert_eq!(e, Some(UartError::FifoTooLong(65)));
    }

    #[test]
    fn output_reaches_a_file() {
        let path = std::env::temp_dir().join(format!("s2mmu-uart-{}", std::process::id()));
        let f = File::create(&path).unwrap();
        let u = Uart::new(Arc::new(|| {}), UartOutput::File(f));
        for b in b"console\n" {
            u.write(THR, &[*b]);
        }
        drop(u);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "console\n");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn lines_are_stamped_in_order_and_only_whole_held_lines_return() {
        let buf = ConsoleBuffer::new(16);
        buf.push(b"one\r\ntw");
        buf.push(b"o\n");
        buf.push(b"three\npart");
        let l = buf.stamped_lines();
        let text: Vec<&str> = l.iter().map(|(_, s)| s.as_str()).collect();
        // 16 bytes hold the end of "one", then "two", "three" and "part":
        // only lines whose start is held and whose end came back.
        assert_eq!(text, ["two", "three"]);
        let big = ConsoleBuffer::new(1 << 20);
        big.push(b"a\nb\n");
        let l = big.stamped_lines();
        assert_eq!(l.len(), 2);
        assert!(l[0].0 <= l[1].0);
        assert_eq!((l[0].1.as_str(), l[1].1.as_str()), ("a", "b"));
        for _ in 0..MAX_STAMPED_LINES {
            big.push(b"x\n");
        }
        let l = big.stamped_lines();
        assert_eq!(l.len(), MAX_STAMPED_LINES);
        assert!(
            l.iter().all(|(_, s)| s == "x"),
            "the oldest stamps go first"
        );
    }

    #[test]
    fn the_buffer_keeps_the_last_bytes_and_wakes_waiters() {
        let buf = ConsoleBuffer::new(4);
        buf.push(b"abcdef");
        assert_eq!(buf.contents(), "cdef");
        assert_eq!(buf.total_written(), 6);
        let b2 = buf.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            b2.push(b"ok");
        });
        let got = buf.wait_until(Duration::from_secs(5), |s| s.ends_with("ok"));
        t.join().unwrap();
        assert_eq!(got.as_deref(), Some("efok"));
        assert_eq!(
            buf.wait_until(Duration::from_millis(10), |s| s.contains("zz")),
            None
        );
    }
}
