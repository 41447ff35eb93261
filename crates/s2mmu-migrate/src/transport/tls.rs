//! TLS: mutual TLS from certificate files, the ephemeral CA of an
//! in-process migration, the handshakes, and the verifier that accepts any
//! certificate (the pre-shared key's TLS, where the key proves identity).

use super::config::{setup, Security};
use super::conn::BoxConn;
use super::records::allow_take_over;
use super::sockbuf::SockBuf;
use crate::stream_error::MigrateError;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    ClientConfig, ClientConnection, DigitallySignedStruct, RootCertStore, ServerConfig,
    ServerConnection, SignatureScheme, StreamOwned,
};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// ring's provider with AES-128-GCM first: the cheapest suite per byte
/// on CPUs with AES instructions, which is what a bulk stream wants.
pub(super) fn provider() -> Arc<CryptoProvider> {
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

fn handshake_error(e: std::io::Error) -> MigrateError {
    match e.kind() {
        std::io::ErrorKind::InvalidData => MigrateError::Auth {
            why: format!("TLS handshake: {e}"),
        },
        _ => MigrateError::io("TLS handshake", &e),
    }
}

pub(super) fn tls_client(
    s: BoxConn,
    cfg: &Arc<ClientConfig>,
    name: &str,
    deadline: Option<Instant>,
) -> Result<StreamOwned<ClientConnection, SockBuf>, MigrateError> {
    let mut s = SockBuf::framed(s, deadline);
    let name = ServerName::try_from(name.to_string())
        .map_err(|e| setup(&format!("TLS server name '{name}'"), e))?;
    let mut c = ClientConnection::new(cfg.clone(), name).map_err(|e| setup("TLS client", e))?;
    while c.is_handshaking() {
        c.complete_io(&mut s).map_err(handshake_error)?;
    }
    Ok(StreamOwned::new(c, s))
}

pub(super) fn tls_server(
    s: BoxConn,
    cfg: &Arc<ServerConfig>,
    deadline: Option<Instant>,
) -> Result<StreamOwned<ServerConnection, SockBuf>, MigrateError> {
    let mut s = SockBuf::framed(s, deadline);
    let mut c = ServerConnection::new(cfg.clone()).map_err(|e| setup("TLS server", e))?;
    while c.is_handshaking() {
        c.complete_io(&mut s).map_err(handshake_error)?;
    }
    Ok(StreamOwned::new(c, s))
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
        .map_err(|e| setup(&format!("certificate chain {}", cert.display()), e))?
        .collect::<Result<_, _>>()
        .map_err(|e| setup(&format!("certificate chain {}", cert.display()), e))?;
    if chain.is_empty() {
        return Err(MigrateError::Setup(format!(
            "certificate chain {}: no certificate in it",
            cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| setup(&format!("private key {}", key.display()), e))?;
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca)
        .map_err(|e| setup(&format!("CA file {}", ca.display()), e))?
    {
        let c = c.map_err(|e| setup(&format!("CA file {}", ca.display()), e))?;
        roots
            .add(c)
            .map_err(|e| setup(&format!("CA file {}", ca.display()), e))?;
    }
    if roots.is_empty() {
        return Err(MigrateError::Setup(format!(
            "CA file {}: no certificate in it",
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
    let mut server = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| setup("TLS", e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(|e| setup("TLS certificate and key", e))?;
    let mut client = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| setup("TLS", e))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| setup("TLS certificate and key", e))?;
    allow_take_over(&mut server, &mut client);
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

/// Accepts any certificate (the PSK mode authenticates the peer by the
/// key, bound to this session) but still checks the handshake's
/// signatures with it.
#[derive(Debug)]
pub(super) struct AnyCert(pub(super) Arc<CryptoProvider>);

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
