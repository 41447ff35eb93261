//! The operator's terminal as the guest's console: what the user types on
//! stdin goes to the UART's receive FIFO, as QEMU's `-nographic` forwards
//! it, and the escape `Ctrl-A x` stops the VM (`Ctrl-A Ctrl-A` sends one
//! `Ctrl-A`). [`RawTerminal`] puts the terminal into raw mode, so every key
//! (Ctrl-C, Ctrl-Z, Tab included) reaches the guest, and restores it when
//! dropped: on return, on error and on a panic's unwinding; a `SIGTERM`,
//! `SIGHUP` or `SIGQUIT` restores it before the process ends.

use std::io;
use std::sync::OnceLock;
use std::time::Duration;

/// The escape byte, `Ctrl-A`.
pub const ESCAPE: u8 = 0x01;
/// The command after [`ESCAPE`] that stops the VM.
pub const ESCAPE_STOP: u8 = b'x';

/// Separates the operator's escape commands from the bytes for the guest;
/// an escape split across two reads is kept until the next one.
#[derive(Clone, Copy, Debug, Default)]
pub struct EscapeFilter {
    pending: bool,
}

impl EscapeFilter {
    /// Appends to `out` the bytes of `input` meant for the guest; returns
    /// `true` once `Ctrl-A x` was typed (nothing after it is forwarded).
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> bool {
        for &b in input {
            if !self.pending {
                if b == ESCAPE {
                    self.pending = true;
                } else {
                    out.push(b);
                }
                continue;
            }
            self.pending = false;
            match b {
                ESCAPE_STOP | b'X' => return true,
                ESCAPE => out.push(ESCAPE),
                // Not a command: both bytes are the guest's.
                _ => out.extend_from_slice(&[ESCAPE, b]),
            }
        }
        false
    }
}

/// Whether stdin is a terminal.
pub fn stdin_is_terminal() -> bool {
    // SAFETY: isatty only reads the descriptor's state.
    unsafe { libc::isatty(libc::STDIN_FILENO) == 1 }
}

/// Waits up to `timeout` for stdin to be readable, then reads what is
/// there: `Ok(None)` when nothing came in time, `Ok(Some(0))` at its end.
///
/// # Errors
/// The poll or the read failed.
pub fn read_stdin(buf: &mut [u8], timeout: Duration) -> io::Result<Option<usize>> {
    let mut p = libc::pollfd {
        fd: libc::STDIN_FILENO,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd, its count 1.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    match n {
        0 => Ok(None),
        n if n < 0 => match io::Error::last_os_error() {
            e if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            e => Err(e),
        },
        _ => {
            // SAFETY: `buf` is valid for writes of its length.
            let r = unsafe { libc::read(libc::STDIN_FILENO, buf.as_mut_ptr().cast(), buf.len()) };
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(Some(r as usize))
        }
    }
}

/// The terminal's settings before raw mode, for the signal handler.
static SAVED: OnceLock<libc::termios> = OnceLock::new();

extern "C" fn restore_and_reraise(sig: libc::c_int) {
    if let Some(t) = SAVED.get() {
        // SAFETY: tcsetattr, signal and raise are async-signal-safe; `t`
        // is a termios tcgetattr filled.
        unsafe {
            libc::tcsetattr(libc::STDIN_FILENO, libc::TCSAFLUSH, t);
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
}

/// Stdin's terminal in raw mode while this lives; dropping it restores
/// the settings it found.
pub struct RawTerminal {
    saved: libc::termios,
}

impl RawTerminal {
    /// Puts stdin's terminal into raw mode (output processing kept, so
    /// the host's own lines still start at the left).
    ///
    /// # Errors
    /// Stdin is not a terminal, or its settings could not be changed.
    pub fn enter() -> io::Result<RawTerminal> {
        // SAFETY: termios is plain data; tcgetattr fills it or fails.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and a termios to fill.
        if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut saved) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut raw = saved;
        // SAFETY: cfmakeraw edits the termios it is given.
        unsafe { libc::cfmakeraw(&mut raw) };
        raw.c_oflag |= libc::OPOST | libc::ONLCR;
        let _ = SAVED.set(saved);
        for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            // SAFETY: the handler only calls async-signal-safe functions.
            unsafe { libc::signal(sig, restore_and_reraise as *const () as libc::sighandler_t) };
        }
        // SAFETY: a valid descriptor and settings tcgetattr gave.
        if unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSAFLUSH, &raw) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RawTerminal { saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // SAFETY: the settings tcgetattr gave for the same descriptor.
        unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSAFLUSH, &self.saved) };
        for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            // SAFETY: back to the default action.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(f: &mut EscapeFilter, s: &[u8]) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        let stop = f.feed(s, &mut out);
        (out, stop)
    }

    #[test]
    fn ctrl_a_x_stops_and_other_bytes_pass() {
        let mut f = EscapeFilter::default();
        assert_eq!(feed(&mut f, b"ls\r"), (b"ls\r".to_vec(), false));
        assert_eq!(
            feed(&mut f, &[ESCAPE, ESCAPE, b'a']),
            (vec![ESCAPE, b'a'], false)
        );
        assert_eq!(feed(&mut f, &[ESCAPE, b'q']), (vec![ESCAPE, b'q'], false));
        // An escape split across two reads.
        assert_eq!(feed(&mut f, b"z\x01"), (b"z".to_vec(), false));
        assert_eq!(feed(&mut f, b"xrest"), (Vec::new(), true));
    }
}
