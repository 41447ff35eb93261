//! The stub's doorbell: a guest's exit wakes the host thread that sleeps
//! on its CPU, instead of that thread polling the mailbox in naps.
//!
//! The host sets [`mb::HOST_WAITING`] before it sleeps, then reads the
//! exit sequence again; the stub, after it has posted an exit, reads the
//! flag and, if it is set, writes one byte (its CPU index plus one) to
//! QEMU virt's PL011 UART (`UARTDR`). Each side has a full barrier
//! between its store and its load (the host a `SeqCst` fence, the stub a
//! `DMB ISH`), so at least one of them sees the other: the host finds the
//! exit, or the stub rings. QEMU writes the byte to its stdout from that
//! CPU's own thread, without its main loop; [`Bells::split`] takes it out
//! of the console text and wakes the sleeper. A sleeper also wakes after
//! its timeout, so a lost byte costs latency, never a hang.
//!
//! [`mb::HOST_WAITING`]: crate::layout::mb::HOST_WAITING

use crate::layout::MAX_CPUS;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// One CPU's doorbell.
#[derive(Default)]
struct Bell {
    rung: Mutex<bool>,
    cv: Condvar,
    /// Rings received.
    count: AtomicU64,
}

/// The doorbells of a machine's CPUs.
pub(crate) struct Bells {
    bells: Vec<Bell>,
}

impl Bells {
    /// A doorbell for each of [`MAX_CPUS`] CPUs.
    pub(crate) fn new() -> Bells {
        Bells {
            bells: (0..MAX_CPUS).map(|_| Bell::default()).collect(),
        }
    }

    /// Rings CPU `cpu`'s doorbell (a CPU the machine does not have: none).
    fn ring(&self, cpu: usize) {
        let Some(b) = self.bells.get(cpu) else {
            return;
        };
        b.count.fetch_add(1, Ordering::Relaxed);
        *b.rung.lock().unwrap_or_else(|p| p.into_inner()) = true;
        b.cv.notify_all();
    }

    /// Waits until CPU `cpu`'s doorbell rings or `timeout` passes; whether
    /// it rang (a ring before the call counts, once).
    pub(crate) fn wait(&self, cpu: usize, timeout: Duration) -> bool {
        let Some(b) = self.bells.get(cpu) else {
            return false;
        };
        let g = b.rung.lock().unwrap_or_else(|p| p.into_inner());
        let (mut g, _) =
            b.cv.wait_timeout_while(g, timeout, |rung| !*rung)
                .unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *g)
    }

    /// Rings CPU `cpu`'s doorbell has received.
    pub(crate) fn count(&self, cpu: usize) -> u64 {
        self.bells
            .get(cpu)
            .map_or(0, |b| b.count.load(Ordering::Relaxed))
    }

    /// Takes the doorbell bytes (1 to [`MAX_CPUS`]: CPU byte − 1) out of
    /// `buf`, which QEMU wrote, rings them, and appends the rest (the
    /// stub's console text, which has no such control bytes) to `text`.
    pub(crate) fn split(&self, buf: &[u8], text: &mut Vec<u8>) {
        for &b in buf {
            match usize::from(b) {
                n @ 1..=MAX_CPUS => self.ring(n - 1),
                _ => text.push(b),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes 1..=MAX_CPUS ring CPUs 0..MAX_CPUS and leave the text; a
    /// ring before the wait is kept for it, and counted.
    #[test]
    fn doorbell_bytes_ring_and_the_rest_is_text() {
        let bells = Bells::new();
        let mut text = Vec::new();
        bells.split(b"ab\x01c\x08\n", &mut text);
        assert_eq!(text, b"abc\n");
        assert!(bells.wait(0, Duration::ZERO), "CPU 0 rang");
        assert!(!bells.wait(0, Duration::ZERO), "one ring wakes once");
        assert!(bells.wait(MAX_CPUS - 1, Duration::ZERO));
        assert!(!bells.wait(1, Duration::from_millis(1)), "CPU 1 did not");
        assert_eq!((bells.count(0), bells.count(1)), (1, 0));
        assert!(!bells.wait(MAX_CPUS, Duration::ZERO), "no such CPU");
    }

    /// A sleeper on another thread wakes on the ring, long before its
    /// timeout.
    #[test]
    fn a_ring_wakes_a_sleeper() {
        let bells = std::sync::Arc::new(Bells::new());
        let b2 = bells.clone();
        let sleeper = std::thread::spawn(move || b2.wait(2, Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(20));
        let mut text = Vec::new();
        bells.split(&[3], &mut text);
        assert!(
            sleeper.join().unwrap(),
            "woken by the ring, not the timeout"
        );
        assert!(text.is_empty());
    }
}
