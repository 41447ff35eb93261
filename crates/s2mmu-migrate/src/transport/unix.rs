//! Unix sockets: the transport of a same-host upgrade (the old VMM
//! process hands its guest to the new one). No keepalive is needed (the
//! kernel ends the connection when the peer process dies); the deadlines
//! of every read and write, the handshake's deadline, the write rate and
//! the TLS and key layers apply as over TCP.

use super::config::NetConfig;
use super::conn::{accept_polling, BoxConn, Connection, Listener, ShutdownHandle};
use crate::stream_error::MigrateError;
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Connection for UnixStream {
    fn set_io_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.set_read_timeout(timeout)?;
        self.set_write_timeout(timeout)
    }
    fn io_timeout(&self) -> Option<Duration> {
        self.read_timeout().ok().flatten()
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
        match self
            .peer_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(Path::to_path_buf))
        {
            Some(p) => format!("unix:{}", p.display()),
            None => "a Unix-socket peer".into(),
        }
    }
}

/// A listening Unix socket. Shutting a listening Unix socket down does
/// not make Linux fail its accepts (TCP's does), so a flag the accept
/// loop checks does; the socket's file is removed when it is dropped.
pub struct UnixListen {
    listener: UnixListener,
    path: PathBuf,
    closed: Arc<AtomicBool>,
}

impl UnixListen {
    /// Listens at `path` (which must not exist yet).
    ///
    /// # Errors
    /// [`MigrateError::Io`] naming the path.
    pub fn bind(path: &Path) -> Result<Self, MigrateError> {
        let listener = UnixListener::bind(path)
            .map_err(|e| MigrateError::io(format!("listening on unix:{}", path.display()), &e))?;
        Ok(UnixListen {
            listener,
            path: path.to_path_buf(),
            closed: Arc::default(),
        })
    }
}

impl Drop for UnixListen {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Listener for UnixListen {
    fn accept_until(
        &self,
        deadline: Option<Instant>,
    ) -> std::io::Result<Option<(BoxConn, String)>> {
        self.listener.set_nonblocking(true)?;
        let r = accept_polling(deadline, || {
            if self.closed.load(Ordering::SeqCst) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "the listener was shut down",
                ));
            }
            self.listener.accept()
        });
        let _ = self.listener.set_nonblocking(false);
        match r? {
            None => Ok(None),
            Some((s, _)) => {
                s.set_nonblocking(false)?;
                // A client socket is rarely bound to a path: name the
                // connection by the listener's.
                Ok(Some((Box::new(s), format!("a peer on {}", self.local()))))
            }
        }
    }
    fn shutdown_handle(&self) -> std::io::Result<ShutdownHandle> {
        let closed = self.closed.clone();
        Ok(ShutdownHandle::new(move || {
            closed.store(true, Ordering::SeqCst)
        }))
    }
    fn local(&self) -> String {
        format!("unix:{}", self.path.display())
    }
}

/// Connects to the Unix socket at `path`, configured with the I/O
/// timeout.
///
/// # Errors
/// [`MigrateError::Io`].
pub fn connect_unix(path: &Path, net: &NetConfig) -> Result<UnixStream, MigrateError> {
    let what = format!("connecting to unix:{}", path.display());
    let s = UnixStream::connect(path).map_err(|e| MigrateError::io(what.clone(), &e))?;
    s.configure(net.io_timeout)
        .map_err(|e| MigrateError::io(what, &e))?;
    Ok(s)
}
