//! Connections of a migration: a [`Connection`] (read and write with a
//! deadline on each, a [`ShutdownHandle`] that ends it from any thread, a
//! description of the peer) and a [`Listener`] (accept within a deadline,
//! shut down from any thread). Two transports implement them: TCP
//! ([`tcp`]: keepalive, `TCP_NODELAY`, a user timeout) and Unix sockets
//! ([`unix`]: same-host upgrades). TLS and the pre-shared key are layered
//! over any connection. The wire bench's references (plain TCP between
//! the same endpoints, iperf3, the memory floor) are the benchmark
//! crate's.
//!
//! Three ways to secure a connection:
//! - [`Security::Tls`]: mutual TLS 1.3 with certificates from files (or an
//!   ephemeral CA made in memory for the in-process migration): each side
//!   presents its certificate and checks the other's against the CA.
//! - [`Security::Psk`]: rustls has no external-PSK support, so TLS runs
//!   with an ephemeral self-signed certificate (encryption and integrity,
//!   not identity) and both sides then prove knowledge of the key:
//!   HMAC-SHA256 over the TLS exporter value of this session (RFC
//!   5705/8446 keying material), each side with its own label. A peer
//!   without the key cannot answer; a relay between two TLS sessions
//!   cannot forward the answers, because the exporter differs per
//!   session; and since both sides' random values and key shares go into
//!   the exporter, it is fresh in every session, so an answer cannot be
//!   replayed (no nonces needed: the source's proof leaves with its TLS
//!   Finished, one round trip less). The destination checks the source's
//!   answer before it answers itself or reads anything else, and the
//!   source checks the destination's before it sends anything else (the
//!   HEADER or a JOIN included).
//! - [`Security::Plain`]: bare TCP, for a trusted network only (said
//!   loudly by the command).

use crate::stream_error::MigrateError;

mod admit;
mod config;
mod conn;
#[allow(unsafe_code)] // ioctl(TIOCOUTQ): a socket's unsent bytes
mod outq;
mod psk;
mod records;
mod secure;
mod sockbuf;
pub mod tcp;
mod tls;
pub mod unix;

#[cfg(test)]
mod tests;

pub use admit::{
    Admission, Admitted, Opener, Refused, MAX_OPENING, MAX_PREAUTH, PREAUTH_PROTECTED,
};
pub use config::{NetConfig, Security, TLS_SEND_BUFFER};
pub(crate) use conn::record_plaintexts;
#[cfg(any(test, feature = "fuzzing"))]
pub use conn::SharedSink;
pub use conn::{sealed_len, sealed_offset, SEAL_AFTER, SEAL_BEFORE, SEAL_PLAIN, SEAL_SPAN};
pub use conn::{transient, BoxConn, Connection, Duplex, Listener, ShutdownHandle};
pub use psk::{psk, psk_from_file};
#[cfg(any(test, feature = "fuzzing"))]
pub use records::fixed_key_session;
pub use records::{MAX_CIPHER, MAX_PLAIN, MAX_RECORDS};
pub use secure::{client, server};
pub use sockbuf::{SockBuf, WritePace, MIN_WRITE_RATE, WRITE_WINDOW};
pub use tcp::{configure, connect_tcp};
pub use tls::{ephemeral_tls, make_pki, tls_from_files, Pki};
pub use unix::{connect_unix, UnixListen};

/// Connects to `addr`: `unix:PATH` is a Unix socket, anything else a TCP
/// address (`host:port`); within the I/O timeout, configured.
///
/// # Errors
/// [`MigrateError::Io`], [`MigrateError::Timeout`], [`MigrateError::Setup`]
/// for an address that names nothing.
pub fn connect(addr: &str, net: &NetConfig) -> Result<BoxConn, MigrateError> {
    match addr.strip_prefix("unix:") {
        Some(path) => Ok(Box::new(connect_unix(std::path::Path::new(path), net)?)),
        None => Ok(Box::new(connect_tcp(addr, net)?)),
    }
}

/// Listens at `addr`: `unix:PATH` is a Unix socket, anything else a TCP
/// address.
///
/// # Errors
/// [`MigrateError::Io`] naming the address.
pub fn bind(addr: &str) -> Result<Box<dyn Listener>, MigrateError> {
    let what = format!("listening on {addr}");
    let io = |e: std::io::Error| MigrateError::io(what.clone(), &e);
    match addr.strip_prefix("unix:") {
        Some(path) => Ok(Box::new(unix::UnixListen::bind(std::path::Path::new(
            path,
        ))?)),
        None => Ok(Box::new(std::net::TcpListener::bind(addr).map_err(io)?)),
    }
}
