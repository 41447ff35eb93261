//! How connections are secured ([`Security`]) and set up ([`NetConfig`]):
//! plain data the transports and the handshakes read, kept apart from them
//! so no child of `transport` imports from its parent.

use crate::stream_error::MigrateError;
use ring::hmac;
use rustls::{ClientConfig, ServerConfig};
use std::sync::Arc;
use std::time::Duration;

/// Bytes of encrypted records a TLS connection queues before it writes
/// them: rustls's default (64 KiB) makes a system call per 64 KiB, so a
/// 1 MiB batch of pages took 16; with 1 MiB it goes out in one `writev`
/// of 64 records (rustls writes at most 64 chunks at once). A bound per
/// connection, not a growth.
pub const TLS_SEND_BUFFER: usize = 1 << 20;

/// How connections are secured.
#[derive(Clone)]
pub enum Security {
    /// Bare TCP.
    Plain,
    /// Mutual TLS: `server` for the destination, `client` for the source,
    /// and the name the source expects in the destination's certificate.
    Tls {
        server: Arc<ServerConfig>,
        client: Arc<ClientConfig>,
        server_name: String,
    },
    /// TLS with ephemeral certificates, then HMAC-SHA256 challenge-response
    /// with the key, bound to the TLS session.
    Psk {
        server: Arc<ServerConfig>,
        client: Arc<ClientConfig>,
        key: Arc<hmac::Key>,
    },
}

impl Security {
    /// In words, for the report.
    pub fn describe(&self) -> &'static str {
        match self {
            Security::Plain => "plain TCP (no authentication, no encryption)",
            Security::Tls { .. } => "mutual TLS 1.3",
            Security::Psk { .. } => "TLS 1.3 + pre-shared key (HMAC-SHA256 challenge-response)",
        }
    }
}

/// Socket settings of every connection.
#[derive(Clone)]
pub struct NetConfig {
    /// Deadline of every read and write (and of the TLS handshake's each
    /// step); also the keepalive idle time.
    pub io_timeout: Duration,
    /// How connections are secured.
    pub security: Security,
}

impl NetConfig {
    /// Bare TCP with `io_timeout`.
    pub fn plain(io_timeout: Duration) -> Self {
        NetConfig {
            io_timeout,
            security: Security::Plain,
        }
    }
}

pub(super) fn setup(what: &str, e: impl std::fmt::Display) -> MigrateError {
    MigrateError::Setup(format!("{what}: {e}"))
}
