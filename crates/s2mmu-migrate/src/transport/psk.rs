//! The pre-shared key: each side proves it knows the key with an HMAC over
//! its role and the TLS session's exporter value, the source first (in
//! the flight of its TLS Finished), the destination once it checked it.

use super::config::{setup, Security};
use super::records::allow_take_over;
use super::sockbuf::SockBuf;
use super::tls::{provider, AnyCert};
use crate::stream_error::MigrateError;
use ring::hmac;
use rustls::pki_types::PrivateKeyDer;
use rustls::{
    ClientConfig, ClientConnection, ConnectionCommon, ServerConfig, ServerConnection, StreamOwned,
};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

const EXPORTER_LABEL: &[u8] = b"EXPORTER-s2mmu-migrate-psk-v2";

/// Bytes of each side's proof (an HMAC-SHA256 tag).
const PROOF_LEN: usize = 32;

/// One side's proof that it holds `key`: an HMAC over its `role` and the
/// TLS session's exporter value. The exporter comes from the session's
/// secrets, which both sides' random values and key shares went into, so
/// it is fresh in every session and differs on each side of a relay
/// between two sessions: a proof cannot be replayed or forwarded, and no
/// nonce of either side's is needed.
fn psk_mac(key: &hmac::Key, role: &[u8], exporter: &[u8; 32]) -> hmac::Tag {
    let mut ctx = hmac::Context::with_key(key);
    ctx.update(b"s2mmu migrate psk v2 ");
    ctx.update(role);
    ctx.update(exporter);
    ctx.sign()
}

/// Compares two MACs in time independent of where they differ.
fn hmac_equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
    theirs: &[u8; PROOF_LEN],
) -> Result<(), MigrateError> {
    let expect = psk_mac(key, role, exporter);
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

/// The source's side: its proof goes out right behind its TLS Finished
/// (no round trip of its own), then the destination's is read and
/// checked before anything else is sent.
pub(super) fn psk_client(
    c: &mut StreamOwned<ClientConnection, SockBuf>,
    key: &hmac::Key,
) -> Result<(), MigrateError> {
    let exporter = exporter_of(&c.conn)?;
    let mac = psk_mac(key, b"source", &exporter);
    c.write_all(mac.as_ref())
        .and_then(|_| c.flush())
        .map_err(|e| MigrateError::io("sending the key's proof", &e))?;
    let mut theirs = [0u8; PROOF_LEN];
    c.read_exact(&mut theirs)
        .map_err(|e| exchange_io("reading the destination's proof of the key", &e))?;
    check_proof(key, b"destination", &exporter, &theirs)
}

/// The destination's side: the source's proof is read and checked before
/// the destination answers with its own (a peer without the key learns
/// nothing from it).
pub(super) fn psk_server(
    c: &mut StreamOwned<ServerConnection, SockBuf>,
    key: &hmac::Key,
) -> Result<(), MigrateError> {
    let exporter = exporter_of(&c.conn)?;
    let mut theirs = [0u8; PROOF_LEN];
    c.read_exact(&mut theirs)
        .map_err(|e| exchange_io("reading the source's proof of the key", &e))?;
    check_proof(key, b"source", &exporter, &theirs)?;
    let mac = psk_mac(key, b"destination", &exporter);
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

#[cfg(test)]
mod tests {
    use super::super::tls::tls_server;
    use super::*;
    use crate::transport::{client, BoxConn, Connection};
    use std::os::unix::net::UnixStream;
    use std::time::{Duration, Instant};

    /// The destination's side done by hand: the TLS handshake, then the
    /// source's proof read before anything is written (a source that waited
    /// for a nonce of the destination's would send nothing: the read times
    /// out), checked, and `answer` written back.
    fn by_hand(
        b: UnixStream,
        sec: &Security,
        answer: impl FnOnce(&hmac::Key, &[u8; 32]) -> Vec<u8>,
    ) -> Result<(), MigrateError> {
        let Security::Psk { server, key, .. } = sec else {
            unreachable!("a pre-shared key's security")
        };
        let t = Duration::from_secs(10);
        let b: BoxConn = Box::new(b);
        b.set_io_timeout(Some(t)).unwrap();
        let mut c = tls_server(b, server, Some(Instant::now() + t))?;
        c.sock.end_handshake(t)?;
        let exporter = exporter_of(&c.conn)?;
        let mut theirs = [0u8; PROOF_LEN];
        c.read_exact(&mut theirs)
            .map_err(|e| MigrateError::io("the source's proof, unasked", &e))?;
        check_proof(key, b"source", &exporter, &theirs)?;
        c.write_all(&answer(key, &exporter))
            .and_then(|_| c.flush())
            .map_err(|e| MigrateError::io("answering", &e))
    }

    fn net(sec: &Security) -> crate::transport::NetConfig {
        crate::transport::NetConfig {
            io_timeout: Duration::from_secs(10),
            security: sec.clone(),
        }
    }

    #[test]
    fn the_source_proves_the_key_unasked_and_checks_the_answer() {
        let sec = psk(b"a key of sixteen bytes or more").unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        let s = sec.clone();
        let d = std::thread::spawn(move || {
            by_hand(b, &s, |k, e| {
                psk_mac(k, b"destination", e).as_ref().to_vec()
            })
        });
        let c = client(a, &net(&sec));
        d.join().unwrap().expect("the destination's side");
        c.expect("the source's side");
    }

    #[test]
    fn the_source_refuses_an_answer_made_for_the_wrong_role_or_key() {
        let sec = psk(b"a key of sixteen bytes or more").unwrap();
        let other = hmac::Key::new(hmac::HMAC_SHA256, b"another key, sixteen bytes+");
        type Answer = fn(&hmac::Key, &[u8; 32], &hmac::Key) -> Vec<u8>;
        let answers: [Answer; 3] = [
            // The source's own proof sent back (a reflection).
            |k, e, _| psk_mac(k, b"source", e).as_ref().to_vec(),
            // The right role with another key.
            |_, e, o| psk_mac(o, b"destination", e).as_ref().to_vec(),
            // Another session's exporter.
            |k, _, _| psk_mac(k, b"destination", &[7u8; 32]).as_ref().to_vec(),
        ];
        for answer in answers {
            let (a, b) = UnixStream::pair().unwrap();
            let (s, o) = (sec.clone(), other.clone());
            let d = std::thread::spawn(move || by_hand(b, &s, |k, e| answer(k, e, &o)));
            let c = client(a, &net(&sec));
            d.join().unwrap().expect("the destination's side");
            assert!(matches!(c, Err(MigrateError::Auth { .. })), "{:?}", c.err());
        }
    }
}
