//! Connections of a migration: TCP with a deadline on every read and write
//! and TCP keepalive, optionally inside TLS (rustls), optionally with a
//! pre-shared key.
//!
//! Three ways to secure a connection:
//! - [`Security::Tls`]: mutual TLS 1.3 with certificates from files (or an
//!   ephemeral CA made in memory for the in-process migration): each side
//!   presents its certificate and checks the other's against the CA.
//! - [`Security::Psk`]: rustls has no external-PSK support, so TLS runs
//!   with an ephemeral self-signed certificate (encryption and integrity,
//!   not identity) and both sides then prove knowledge of the key:
//!   HMAC-SHA256 over fresh 32-byte nonces from both sides and the TLS
//!   exporter value of this session (RFC 5705/8446 keying material), each
//!   side with its own label. A peer without the key cannot answer; a
//!   relay between two TLS sessions cannot forward the answers, because
//!   the exporter differs per session; fresh nonces stop replays. The
//!   destination checks the source's answer before it answers itself or
//!   reads anything else, and the source checks the destination's before it
//!   sends anything of the guest.
//! - [`Security::Plain`]: bare TCP, for a trusted network only (said
//!   loudly by the command).

use super::error::MigrateError;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    ClientConfig, ClientConnection, DigitallySignedStruct, RootCertStore, ServerConfig,
    ServerConnection, SignatureScheme, StreamOwned,
};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A connection carrying a migration stream.
pub trait Conn: Read + Write + Send {
    /// The TCP socket underneath, to shut it down from another thread.
    fn tcp(&self) -> Option<&TcpStream> {
        None
    }
}

/// A boxed connection.
pub type BoxConn = Box<dyn Conn>;

impl Conn for BoxConn {
    fn tcp(&self) -> Option<&TcpStream> {
        (**self).tcp()
    }
}

impl Conn for TcpStream {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(self)
    }
}

/// A socket read in large chunks: rustls asks for 4 KiB at a time, which
/// would be a system call per 4 KiB of a bulk stream. Writes go straight
/// through.
pub struct SockBuf {
    sock: TcpStream,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl SockBuf {
    fn new(sock: TcpStream) -> Self {
        SockBuf {
            sock,
            buf: vec![0u8; 256 << 10].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }
}

impl Read for SockBuf {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.start == self.end {
            if out.len() >= self.buf.len() {
                return self.sock.read(out);
            }
            let n = self.sock.read(&mut self.buf)?;
            self.start = 0;
            self.end = n;
        }
        let n = out.len().min(self.end - self.start);
        out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        Ok(n)
    }
}

impl Write for SockBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.sock.write(b)
    }
    fn write_vectored(&mut self, b: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        self.sock.write_vectored(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.sock.flush()
    }
}

impl Conn for StreamOwned<ClientConnection, SockBuf> {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(&self.sock.sock)
    }
}

impl Conn for StreamOwned<ServerConnection, SockBuf> {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(&self.sock.sock)
    }
}

/// A reader and a writer as one connection (a recorded stream in, the
/// replies out).
pub struct Duplex<R, W> {
    /// Where the stream comes from.
    pub input: R,
    /// Where the replies go.
    pub output: W,
}

impl<R: Read, W> Read for Duplex<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(buf)
    }
}

impl<R, W: Write> Write for Duplex<R, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.output.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.output.flush()
    }
}

impl<R: Read + Send, W: Write + Send> Conn for Duplex<R, W> {}

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

/// ring's provider with AES-128-GCM first: the cheapest suite per byte
/// on CPUs with AES instructions, which is what a bulk stream wants.
fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::ring::cipher_suite as cs;
    Arc::new(CryptoProvider {
        cipher_suites: vec![
            cs::TLS13_AES_128_GCM_SHA256,
            cs::TLS13_AES_256_GCM_SHA384,
            cs::TLS13_CHACHA20_POLY1305_SHA256,
        ],
        ..rustls::crypto::ring::default_provider()
    })
}

fn setup(what: &str, e: impl std::fmt::Display) -> MigrateError {
    MigrateError::Setup(format!("{what}: {e}"))
}

/// Sets the deadlines, keepalive and TCP_NODELAY of a connection.
///
/// # Errors
/// [`MigrateError::Io`].
pub fn configure(s: &TcpStream, io_timeout: Duration) -> Result<(), MigrateError> {
    let io = |e: std::io::Error| MigrateError::io("configuring the connection", &e);
    s.set_nodelay(true).map_err(io)?;
    s.set_read_timeout(Some(io_timeout)).map_err(io)?;
    s.set_write_timeout(Some(io_timeout)).map_err(io)?;
    let sock = socket2::SockRef::from(s);
    let ka = socket2::TcpKeepalive::new()
        .with_time(io_timeout.max(Duration::from_secs(1)))
        .with_interval(Duration::from_secs(1))
        .with_retries(3);
    sock.set_tcp_keepalive(&ka).map_err(io)?;
    // Unacknowledged data older than this ends the connection: a peer
    // that vanished mid-write is noticed as surely as a silent one.
    sock.set_tcp_user_timeout(Some(io_timeout)).map_err(io)?;
    Ok(())
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

/// The source's side of a new connection: TLS and the key exchange as
/// configured.
///
/// # Errors
/// [`MigrateError::Auth`] when the destination fails authentication,
/// [`MigrateError::Io`], [`MigrateError::Timeout`].
pub fn client(s: TcpStream, net: &NetConfig) -> Result<BoxConn, MigrateError> {
    match &net.security {
        Security::Plain => Ok(Box::new(s)),
        Security::Tls {
            client,
            server_name,
            ..
        } => Ok(Box::new(tls_client(s, client, server_name)?)),
        Security::Psk { client, key, .. } => {
            let mut c = tls_client(s, client, "s2mmu-psk")?;
            psk_client(&mut c, key)?;
            Ok(Box::new(c))
        }
    }
}

/// The destination's side of an accepted connection.
///
/// # Errors
/// [`MigrateError::Auth`] when the source fails authentication (nothing
/// of the stream was read), [`MigrateError::Io`], [`MigrateError::Timeout`].
pub fn server(s: TcpStream, net: &NetConfig) -> Result<BoxConn, MigrateError> {
    configure(&s, net.io_timeout)?;
    match &net.security {
        Security::Plain => Ok(Box::new(s)),
        Security::Tls { server, .. } => Ok(Box::new(tls_server(s, server)?)),
        Security::Psk { server, key, .. } => {
            let mut c = tls_server(s, server)?;
            psk_server(&mut c, key)?;
            Ok(Box::new(c))
        }
    }
}

fn handshake_error(e: std::io::Error) -> MigrateError {
    match e.kind() {
        std::io::ErrorKind::InvalidData => MigrateError::Auth {
            why: format!("TLS handshake: {e}"),
        },
        _ => MigrateError::io("TLS handshake", &e),
    }
}

fn tls_client(
    s: TcpStream,
    cfg: &Arc<ClientConfig>,
    name: &str,
) -> Result<StreamOwned<ClientConnection, SockBuf>, MigrateError> {
    let mut s = SockBuf::new(s);
    let name = ServerName::try_from(name.to_string())
        .map_err(|e| setup(&format!("TLS server name '{name}'"), e))?;
    let mut c = ClientConnection::new(cfg.clone(), name).map_err(|e| setup("TLS client", e))?;
    while c.is_handshaking() {
        c.complete_io(&mut s).map_err(handshake_error)?;
    }
    Ok(StreamOwned::new(c, s))
}

fn tls_server(
    s: TcpStream,
    cfg: &Arc<ServerConfig>,
) -> Result<StreamOwned<ServerConnection, SockBuf>, MigrateError> {
    let mut s = SockBuf::new(s);
    let mut c = ServerConnection::new(cfg.clone()).map_err(|e| setup("TLS server", e))?;
    while c.is_handshaking() {
        c.complete_io(&mut s).map_err(handshake_error)?;
    }
    Ok(StreamOwned::new(c, s))
}

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

fn exchange_io(what: &str, e: &std::io::Error) -> MigrateError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        MigrateError::Auth {
            why: format!("{what}: the peer closed the connection (a different key?)"),
        }
    } else {
        MigrateError::io(what, e)
    }
}

fn psk_client(
    c: &mut StreamOwned<ClientConnection, SockBuf>,
    key: &hmac::Key,
) -> Result<(), MigrateError> {
    let mut exporter = [0u8; 32];
    c.conn
        .export_keying_material(&mut exporter, EXPORTER_LABEL, None)
        .map_err(|e| setup("TLS exporter", e))?;
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
    let mine = psk_mac(key, b"destination", &exporter, &nd, &ns);
    if !hmac_equal(mine.as_ref(), &theirs) {
        return Err(MigrateError::Auth {
            why: "the destination does not hold the pre-shared key".into(),
        });
    }
    Ok(())
}

fn psk_server(
    c: &mut StreamOwned<ServerConnection, SockBuf>,
    key: &hmac::Key,
) -> Result<(), MigrateError> {
    let mut exporter = [0u8; 32];
    c.conn
        .export_keying_material(&mut exporter, EXPORTER_LABEL, None)
        .map_err(|e| setup("TLS exporter", e))?;
    let nd = nonce()?;
    c.write_all(&nd)
        .and_then(|_| c.flush())
        .map_err(|e| MigrateError::io("sending a nonce", &e))?;
    let mut ns = [0u8; 32];
    let mut theirs = [0u8; 32];
    c.read_exact(&mut ns)
        .and_then(|_| c.read_exact(&mut theirs))
        .map_err(|e| exchange_io("reading the source's proof of the key", &e))?;
    let expect = psk_mac(key, b"source", &exporter, &nd, &ns);
    if !hmac_equal(expect.as_ref(), &theirs) {
        return Err(MigrateError::Auth {
            why: "the source does not hold the pre-shared key".into(),
        });
    }
    let mac = psk_mac(key, b"destination", &exporter, &nd, &ns);
    c.write_all(mac.as_ref())
        .and_then(|_| c.flush())
        .map_err(|e| MigrateError::io("sending the key's proof", &e))?;
    Ok(())
}

/// Accepts a connection within `deadline` (None: wait for ever).
///
/// # Errors
/// [`MigrateError::Timeout`] once the deadline passed, [`MigrateError::Io`].
pub fn accept_until(
    l: &TcpListener,
    deadline: Option<Instant>,
) -> Result<(TcpStream, std::net::SocketAddr), MigrateError> {
    let Some(deadline) = deadline else {
        return l
            .accept()
            .map_err(|e| MigrateError::io("accepting a source", &e));
    };
    l.set_nonblocking(true)
        .map_err(|e| MigrateError::io("accepting a channel", &e))?;
    let r = loop {
        match l.accept() {
            Ok((s, a)) => break s.set_nonblocking(false).map(|_| (s, a)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    break Err(e);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => break Err(e),
        }
    };
    let _ = l.set_nonblocking(false);
    r.map_err(|e| MigrateError::io("waiting for the source's further channels", &e))
}

/// Shuts a connection's socket down (to end a thread blocked on it).
pub fn shutdown(s: &TcpStream) {
    let _ = s.shutdown(Shutdown::Both);
}

/// Reads a certificate chain, a key and a CA from PEM files: mutual TLS.
/// The source expects `server_name` in the destination's certificate.
///
/// # Errors
/// [`MigrateError::Setup`] naming the file and what was wrong.
pub fn tls_from_files(
    cert: &Path,
    key: &Path,
    ca: &Path,
    server_name: &str,
) -> Result<Security, MigrateError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| setup(&format!("--tls-cert {}", cert.display()), e))?
        .collect::<Result<_, _>>()
        .map_err(|e| setup(&format!("--tls-cert {}", cert.display()), e))?;
    if chain.is_empty() {
        return Err(MigrateError::Setup(format!(
            "--tls-cert {}: no certificate in it",
            cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| setup(&format!("--tls-key {}", key.display()), e))?;
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca)
        .map_err(|e| setup(&format!("--tls-ca {}", ca.display()), e))?
    {
        let c = c.map_err(|e| setup(&format!("--tls-ca {}", ca.display()), e))?;
        roots
            .add(c)
            .map_err(|e| setup(&format!("--tls-ca {}", ca.display()), e))?;
    }
    if roots.is_empty() {
        return Err(MigrateError::Setup(format!(
            "--tls-ca {}: no certificate in it",
            ca.display()
        )));
    }
    mutual_tls(chain, key, roots, server_name)
}

fn mutual_tls(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    roots: RootCertStore,
    server_name: &str,
) -> Result<Security, MigrateError> {
    let roots = Arc::new(roots);
    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
        .build()
        .map_err(|e| setup("TLS client verifier", e))?;
    let server = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| setup("TLS", e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(|e| setup("TLS certificate and key", e))?;
    let client = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| setup("TLS", e))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| setup("TLS certificate and key", e))?;
    Ok(Security::Tls {
        server: Arc::new(server),
        client: Arc::new(client),
        server_name: server_name.to_string(),
    })
}

/// PEM files of a CA and of one certificate it signed (for `names`).
pub struct Pki {
    /// The CA's certificate.
    pub ca_pem: String,
    /// The certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

/// Makes a CA and a certificate for `names` signed by it, in memory.
///
/// # Errors
/// [`MigrateError::Setup`].
pub fn make_pki(names: &[&str]) -> Result<(Pki, rcgen::Certificate, rcgen::KeyPair), MigrateError> {
    let g = |e: rcgen::Error| setup("making certificates", e);
    let ca_key = rcgen::KeyPair::generate().map_err(g)?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(g)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "s2mmu migrate CA");
    let ca = ca_params.self_signed(&ca_key).map_err(g)?;
    let key = rcgen::KeyPair::generate().map_err(g)?;
    let params =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .map_err(g)?;
    let cert = params.signed_by(&key, &ca, &ca_key).map_err(g)?;
    Ok((
        Pki {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        },
        ca,
        ca_key,
    ))
}

/// An ephemeral identity for a migration inside one process: a CA made
/// in memory and one certificate (for `localhost`) both sides present.
///
/// # Errors
/// [`MigrateError::Setup`].
pub fn ephemeral_tls() -> Result<Security, MigrateError> {
    let (pki, _, _) = make_pki(&["localhost"])?;
    let chain = vec![CertificateDer::from_pem_slice(pki.cert_pem.as_bytes())
        .map_err(|e| setup("ephemeral certificate", e))?];
    let key = PrivateKeyDer::from_pem_slice(pki.key_pem.as_bytes())
        .map_err(|e| setup("ephemeral key", e))?;
    let mut roots = RootCertStore::empty();
    roots
        .add(
            CertificateDer::from_pem_slice(pki.ca_pem.as_bytes())
                .map_err(|e| setup("ephemeral CA", e))?,
        )
        .map_err(|e| setup("ephemeral CA", e))?;
    mutual_tls(chain, key, roots, "localhost")
}

/// The pre-shared-key mode with the key in `file` (at least 16 bytes;
/// its bytes as they are, a trailing newline dropped).
///
/// # Errors
/// [`MigrateError::Setup`].
pub fn psk_from_file(file: &Path) -> Result<Security, MigrateError> {
    let meta =
        std::fs::metadata(file).map_err(|e| setup(&format!("--psk {}", file.display()), e))?;
    if meta.len() > 4096 {
        return Err(MigrateError::Setup(format!(
            "--psk {}: {} bytes, a key file has at most 4096",
            file.display(),
            meta.len()
        )));
    }
    let mut key =
        std::fs::read(file).map_err(|e| setup(&format!("--psk {}", file.display()), e))?;
    while key.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        key.pop();
    }
    if key.len() < 16 {
        return Err(MigrateError::Setup(format!(
            "--psk {}: {} bytes, use a key of at least 16 (e.g. head -c 32 /dev/urandom | base64)",
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
    let server = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| setup("TLS", e))?
        .with_no_client_auth()
        .with_single_cert(chain, pkey)
        .map_err(|e| setup("TLS certificate and key", e))?;
    let client = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| setup("TLS", e))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider())))
        .with_no_client_auth();
    Ok(Security::Psk {
        server: Arc::new(server),
        client: Arc::new(client),
        key: Arc::new(hmac::Key::new(hmac::HMAC_SHA256, key)),
    })
}

/// Accepts any certificate (the PSK mode authenticates the peer by the
/// key, bound to this session) but still checks the handshake's
/// signatures with it.
#[derive(Debug)]
struct AnyCert(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
