//! A socket's unsent queue: the bytes written to it that its peer has
//! not yet acknowledged (TCP) or taken (a Unix socket), which a sender
//! ahead of its link sees grow ([`super::Connection::unsent_bytes`]).

use std::os::fd::AsRawFd;

/// The unsent bytes of socket `s` (`SIOCOUTQ`, the same request as
/// `TIOCOUTQ`); `None` when the kernel does not say.
pub(super) fn unsent(s: &impl AsRawFd) -> Option<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: `s` owns an open descriptor for the call's duration, and
    // TIOCOUTQ writes one `int` through the pointer, which points to `n`,
    // a live `c_int` on this stack.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
    (r == 0).then(|| u64::try_from(n).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    /// Bytes the peer does not read stay in the queue (some of them: the
    /// peer's receive buffer takes the rest); an idle socket has none.
    #[test]
    fn bytes_the_peer_has_not_taken_are_counted() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_r, _) = l.accept().unwrap();
        assert_eq!(unsent(&w), Some(0));
        w.set_nonblocking(true).unwrap();
        let chunk = vec![7u8; 1 << 20];
        let mut sent = 0usize;
        for _ in 0..64 {
            match w.write(&chunk) {
                Ok(n) => sent += n,
                Err(_) => break,
            }
        }
        let q = unsent(&w).unwrap();
        assert!(q > 0 && q <= sent as u64, "{q} of {sent}");
    }
}
