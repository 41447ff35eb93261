//! TCP: the transport between hosts. Every connection has `TCP_NODELAY`,
//! keepalive and a user timeout, so a peer that vanished is noticed as
//! surely as a silent one.

use super::config::NetConfig;
use super::conn::{accept_polling, BoxConn, Connection, Listener, ShutdownHandle};
use crate::stream_error::MigrateError;
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

impl Connection for TcpStream {
    fn set_io_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.set_read_timeout(timeout)?;
        self.set_write_timeout(timeout)
    }
    fn io_timeout(&self) -> Option<Duration> {
        self.read_timeout().ok().flatten()
    }
    fn configure(&self, io_timeout: Duration) -> std::io::Result<()> {
        set_liveness(self, io_timeout)
    }
    fn shutdown_handle(&self) -> std::io::Result<ShutdownHandle> {
        let s = self.try_clone()?;
        Ok(ShutdownHandle::new(move || {
            let _ = s.shutdown(Shutdown::Both);
        }))
    }
    fn unsent_bytes(&self) -> Option<u64> {
        super::outq::unsent(self)
    }
    fn peer(&self) -> String {
        self.peer_addr()
            .map_or_else(|_| "a TCP peer".into(), |a| a.to_string())
    }
}

impl Listener for TcpListener {
    fn accept_until(
        &self,
        deadline: Option<Instant>,
    ) -> std::io::Result<Option<(BoxConn, String)>> {
        self.set_nonblocking(true)?;
        let r = accept_polling(deadline, || self.accept());
        let _ = self.set_nonblocking(false);
        match r? {
            None => Ok(None),
            Some((s, peer)) => {
                s.set_nonblocking(false)?;
                Ok(Some((Box::new(s), peer.to_string())))
            }
        }
    }
    fn shutdown_handle(&self) -> std::io::Result<ShutdownHandle> {
        let l = self.try_clone()?;
        Ok(ShutdownHandle::new(move || {
            // Linux: accept on a listening socket shut down fails (EINVAL).
            let _ = socket2::SockRef::from(&l).shutdown(Shutdown::Both);
        }))
    }
    fn local(&self) -> String {
        self.local_addr()
            .map_or_else(|_| "a TCP listener".into(), |a| a.to_string())
    }
}

fn set_liveness(s: &TcpStream, io_timeout: Duration) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(io_timeout))?;
    s.set_write_timeout(Some(io_timeout))?;
    let sock = socket2::SockRef::from(s);
    let ka = socket2::TcpKeepalive::new()
        .with_time(io_timeout.max(Duration::from_secs(1)))
        .with_interval(Duration::from_secs(1))
        .with_retries(3);
    sock.set_tcp_keepalive(&ka)?;
    // Unacknowledged data older than this ends the connection: a peer
    // that vanished mid-write is noticed as surely as a silent one.
    sock.set_tcp_user_timeout(Some(io_timeout))
}

/// Sets the deadlines, keepalive and TCP_NODELAY of a connection.
///
/// # Errors
/// [`MigrateError::Io`].
pub fn configure(s: &TcpStream, io_timeout: Duration) -> Result<(), MigrateError> {
    set_liveness(s, io_timeout).map_err(|e| MigrateError::io("configuring the connection", &e))
}

/// Connects to `addr` within the I/O timeout.
///
/// # Errors
/// [`MigrateError::Io`], [`MigrateError::Timeout`].
pub fn connect_tcp(addr: &str, net: &NetConfig) -> Result<TcpStream, MigrateError> {
    let what = format!("connecting to {addr}");
    let addrs: Vec<_> = addr
        .to_socket_addrs()
        .map_err(|e| MigrateError::io(what.clone(), &e))?
        .collect();
    let mut last = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, net.io_timeout) {
            Ok(s) => {
                configure(&s, net.io_timeout)?;
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(match last {
        Some(e) => MigrateError::io(what, &e),
        None => MigrateError::Setup(format!("{what}: no address")),
    })
}
