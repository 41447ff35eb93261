//! Both ends of a new connection: TLS and the key exchange as
//! [`Security`] says, within one overall deadline, and a TLS stream as a
//! [`Connection`].

use super::config::{NetConfig, Security, TLS_SEND_BUFFER};
use super::conn::{connection_via, BoxConn, Connection, ShutdownHandle};
use super::psk::{psk_client, psk_server};
use super::records::{server_can_take_over, take_over};
use super::sockbuf::{plain, SockBuf};
use super::tls::{tls_client, tls_server};
use crate::stream_error::MigrateError;
use rustls::{ConnectionCommon, StreamOwned};
use std::io::{Read, Write};
use std::ops::DerefMut;
use std::time::{Duration, Instant};

impl<C: Send> Connection for StreamOwned<C, SockBuf>
where
    StreamOwned<C, SockBuf>: Read + Write,
{
    connection_via!(sock);
    /// rustls checks every record's AEAD tag before it yields a byte.
    fn authenticates(&self) -> bool {
        true
    }
}

/// The source's side of a new connection: TLS and the key exchange as
/// configured, all of it within one I/O timeout (an overall deadline, so
/// a destination that drips its handshake is cut off).
///
/// # Errors
/// [`MigrateError::Auth`] when the destination fails authentication,
/// [`MigrateError::Io`], [`MigrateError::Timeout`].
pub fn client<C: Connection + 'static>(s: C, net: &NetConfig) -> Result<BoxConn, MigrateError> {
    let s: BoxConn = Box::new(s);
    let deadline = Some(Instant::now() + net.io_timeout);
    match &net.security {
        Security::Plain => plain(s, net.io_timeout),
        Security::Tls {
            client,
            server_name,
            ..
        } => {
            let c = tls_client(s, client, server_name, deadline)?;
            established(c, client.enable_secret_extraction, net)
        }
        Security::Psk { client, key, .. } => {
            let mut c = tls_client(s, client, "s2mmu-psk", deadline)?;
            psk_client(&mut c, key)?;
            established(c, client.enable_secret_extraction, net)
        }
    }
}

/// The destination's side of an accepted connection: TLS and the key
/// exchange within one I/O timeout from now (an overall deadline: a peer
/// that sends its ClientHello a byte at a time is cut off).
///
/// # Errors
/// [`MigrateError::Auth`] when the source fails authentication (nothing
/// of the stream was read), [`MigrateError::Io`], [`MigrateError::Timeout`].
pub fn server<C: Connection + 'static>(s: C, net: &NetConfig) -> Result<BoxConn, MigrateError> {
    s.configure(net.io_timeout)
        .map_err(|e| MigrateError::io("configuring the connection", &e))?;
    let s: BoxConn = Box::new(s);
    let deadline = Some(Instant::now() + net.io_timeout);
    match &net.security {
        Security::Plain => plain(s, net.io_timeout),
        Security::Tls { server, .. } => {
            let c = tls_server(s, server, deadline)?;
            established(c, server_can_take_over(server), net)
        }
        Security::Psk { server, key, .. } => {
            let mut c = tls_server(s, server, deadline)?;
            psk_server(&mut c, key)?;
            established(c, server_can_take_over(server), net)
        }
    }
}

/// The connection after a handshake (and the key's exchange): the
/// session's records sealed and opened by [`RecordConn`](super::records::RecordConn)
/// when `take` (the configuration lets rustls give its secrets up), else
/// rustls's own stream with a 1 MiB send buffer.
fn established<C, D>(
    mut c: StreamOwned<C, SockBuf>,
    take: bool,
    net: &NetConfig,
) -> Result<BoxConn, MigrateError>
where
    C: Into<rustls::Connection> + DerefMut<Target = ConnectionCommon<D>> + Send + 'static,
    StreamOwned<C, SockBuf>: Read + Write,
{
    c.sock.end_handshake(net.io_timeout)?;
    if take {
        let r = take_over(c.conn, c.sock)
            .map_err(|e| MigrateError::io("moving the TLS session to its record layer", &e))?;
        return Ok(Box::new(r));
    }
    c.conn.set_buffer_limit(Some(TLS_SEND_BUFFER));
    Ok(Box::new(c))
}
