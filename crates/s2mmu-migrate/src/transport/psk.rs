//! The pre-shared key: each side proves it knows the key with an HMAC over
//! both sides' nonces and the TLS session's exporter value.

use super::config::{setup, Security};
use super::records::allow_take_over;
use super::sockbuf::SockBuf;
use super::tls::{provider, AnyCert};
use crate::stream_error::MigrateError;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use rustls::pki_types::PrivateKeyDer;
use rustls::{
    ClientConfig, ClientConnection, ConnectionCommon, ServerConfig, ServerConnection, StreamOwned,
};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

const EXPORTER_LABEL: &[u8] = b"EXPORTER-s2mmu-migrate-psk-v1";

fn psk_mac(
    key: &hmac::Key,
    role: &[u8],
    exporter: &[u8; 32],
    nd: &[u8; 32],
    ns: &[u8; 32],
) -> hmac::Tag {
    let mut ctx = hmac::Context::with_key(key);
    ctx.update(b"s2mmu migrate psk v1 ");
    ctx.update(role);
    ctx.update(exporter);
    ctx.update(nd);
    ctx.update(ns);
    ctx.sign()
}

/// Compares two MACs in time independent of where they differ.
fn hmac_equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn nonce() -> Result<[u8; 32], MigrateError> {
    let mut n = [0u8; 32];
    SystemRandom::new()
        .fill(&mut n)
        .map_err(|_| MigrateError::Setup("no random numbers for a nonce".into()))?;
    Ok(n)
}

/// The TLS session's exporter value that both proofs cover.
fn exporter_of<D>(conn: &ConnectionCommon<D>) -> Result<[u8; 32], MigrateError> {
    let mut exporter = [0u8; 32];
    conn.export_keying_material(&mut exporter, EXPORTER_LABEL, None)
        .map_err(|e| setup("TLS exporter", e))?;
    Ok(exporter)
}

/// Checks the peer's proof `theirs` that it holds the key, made in `role`
/// (`source` or `destination`, the peer's own role).
fn check_proof(
    key: &hmac::Key,
    role: &'static [u8],
    exporter: &[u8; 32],
    nd: &[u8; 32],
    ns: &[u8; 32],
    theirs: &[u8; 32],
) -> Result<(), MigrateError> {
    let expect = psk_mac(key, role, exporter, nd, ns);
    if hmac_equal(expect.as_ref(), theirs) {
        return Ok(());
    }
    let who = String::from_utf8_lossy(role);
    Err(MigrateError::Auth {
        why: format!("the {who} does not hold the pre-shared key"),
    })
}

fn exchange_io(what: &str, e: &std::io::Error) -> MigrateError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        MigrateError::Auth {
            why: format!("{what}: the peer closed the connection (a different key?)"),
        }
    } else {
        MigrateError::io(what, e)
    }
}

pub(super) fn psk_client(
    c: &mut StreamOwned<ClientConnection, SockBuf>,
    key: &hmac::Key,
) -> Result<(), MigrateError> {
    let exporter = exporter_of(&c.conn)?;
    let mut nd = [0u8; 32];
    c.read_exact(&mut nd)
        .map_err(|e| exchange_io("reading the destination's nonce", &e))?;
    let ns = nonce()?;
    let mac = psk_mac(key, b"source", &exporter, &nd, &ns);
    c.write_all(&ns)
        .and_then(|_| c.write_all(mac.as_ref()))
        .and_then(|_| c.flush())
        .map_err(|e| MigrateError::io("sending the key's proof", &e))?;
    let mut theirs = [0u8; 32];
    c.read_exact(&mut theirs)
        .map_err(|e| exchange_io("reading the destination's proof of the key", &e))?;
    check_proof(key, b"destination", &exporter, &nd, &ns, &theirs)
}

pub(super) fn psk_server(
    c: &mut StreamOwned<ServerConnection, SockBuf>,
    key: &hmac::Key,
) -> Result<(), MigrateError> {
    let exporter = exporter_of(&c.conn)?;
    let nd = nonce()?;
    c.write_all(&nd)
        .and_then(|_| c.flush())
        .map_err(|e| MigrateError::io("sending a nonce", &e))?;
    let mut ns = [0u8; 32];
    let mut theirs = [0u8; 32];
    c.read_exact(&mut ns)
        .and_then(|_| c.read_exact(&mut theirs))
        .map_err(|e| exchange_io("reading the source's proof of the key", &e))?;
    check_proof(key, b"source", &exporter, &nd, &ns, &theirs)?;
    let mac = psk_mac(key, b"destination", &exporter, &nd, &ns);
    c.write_all(mac.as_ref())
        .and_then(|_| c.flush())
        .map_err(|e| MigrateError::io("sending the key's proof", &e))?;
    Ok(())
}

/// The pre-shared-key mode with the key in `file` (at least 16 bytes;
/// its bytes as they are, a trailing newline dropped).
///
/// # Errors
/// [`MigrateError::Setup`].
pub fn psk_from_file(file: &Path) -> Result<Security, MigrateError> {
    let meta = std::fs::metadata(file)
        .map_err(|e| setup(&format!("pre-shared key file {}", file.display()), e))?;
    if meta.len() > 4096 {
        return Err(MigrateError::Setup(format!(
            "pre-shared key file {}: {} bytes, a key file has at most 4096",
            file.display(),
            meta.len()
        )));
    }
    let mut key = std::fs::read(file)
        .map_err(|e| setup(&format!("pre-shared key file {}", file.display()), e))?;
    while key.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        key.pop();
    }
    if key.len() < 16 {
        return Err(MigrateError::Setup(format!(
            "pre-shared key file {}: {} bytes, use a key of at least 16 (e.g. head -c 32 /dev/urandom | base64)",
            file.display(),
            key.len()
        )));
    }
    psk(&key)
}

/// The pre-shared-key mode with `key`.
///
/// # Errors
/// [`MigrateError::Setup`].
pub fn psk(key: &[u8]) -> Result<Security, MigrateError> {
    let g = |e: rcgen::Error| setup("making an ephemeral certificate", e);
    let ck = rcgen::generate_simple_self_signed(vec!["s2mmu-psk".to_string()]).map_err(g)?;
    let chain = vec![ck.cert.der().clone()];
    let pkey = PrivateKeyDer::try_from(ck.key_pair.serialize_der())
        .map_err(|e| setup("ephemeral key", e))?;
    let mut server = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| setup("TLS", e))?
        .with_no_client_auth()
        .with_single_cert(chain, pkey)
        .map_err(|e| setup("TLS certificate and key", e))?;
    let mut client = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| setup("TLS", e))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider())))
        .with_no_client_auth();
    allow_take_over(&mut server, &mut client);
    Ok(Security::Psk {
        server: Arc::new(server),
        client: Arc::new(client),
        key: Arc::new(hmac::Key::new(hmac::HMAC_SHA256, key)),
    })
}
