//! TLS for the gateway's listener: rustls with the ring provider, ALPN `h2` and `http/1.1`.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::GatewayError;

/// The ALPN protocols the gateway offers, in its order of preference.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// A server certificate chain and its key, for [`GatewayBuilder::tls`](crate::GatewayBuilder::tls):
/// TLS 1.2 and 1.3 (rustls's safe defaults, ring provider), ALPN `h2` then `http/1.1`.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use rustls::pki_types::PrivateKeyDer;
/// use wirepool_gateway::TlsConfig;
///
/// // From PEM files: TlsConfig::from_pem_files("cert.pem".as_ref(), "key.pem".as_ref())?
/// let key = rcgen::KeyPair::generate()?; // a self-signed certificate, as a test would
/// let cert = rcgen::CertificateParams::new(vec!["localhost".into()])?.self_signed(&key)?;
/// let der_key = || PrivateKeyDer::try_from(key.serialize_der());
/// let tls = TlsConfig::from_der(vec![cert.der().clone()], der_key()?)?;
/// // Gateway::builder(pool).tls(tls).build()? serves HTTPS (h2 or http/1.1 by ALPN).
/// # drop(tls);
/// let other = rcgen::KeyPair::generate()?;
/// let wrong = PrivateKeyDer::try_from(other.serialize_der())?;
/// assert!(TlsConfig::from_der(vec![cert.der().clone()], wrong).is_err()); // not its key
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct TlsConfig {
    pub(crate) server: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("alpn", &["h2", "http/1.1"])
            .finish_non_exhaustive()
    }
}

/// Largest certificate or key file read (a chain of a few certificates is a few KiB).
const MAX_PEM_BYTES: u64 = 1 << 20;

fn read_pem(path: &Path, what: &str) -> Result<Vec<u8>, GatewayError> {
    let bad = |e: &dyn std::fmt::Display| {
        GatewayError::InvalidArgument(format!("TLS {what} {}: {e}", path.display()))
    };
    let len = std::fs::metadata(path).map_err(|e| bad(&e))?.len();
    if len > MAX_PEM_BYTES {
        return Err(bad(&format!(
            "{len} bytes, more than the {MAX_PEM_BYTES} a PEM file may have"
        )));
    }
    std::fs::read(path).map_err(|e| bad(&e))
}

impl TlsConfig {
    /// Reads a PEM certificate chain (the server's certificate first) and a PEM private key
    /// (PKCS#8, PKCS#1 or SEC1). A missing file, no certificate, no key or a key that does
    /// not match the certificate is `InvalidArgument` naming the file.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<TlsConfig, GatewayError> {
        let cert_pem = read_pem(cert, "certificate")?;
        let key_pem = read_pem(key, "key")?;
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                GatewayError::InvalidArgument(format!("TLS certificate {}: {e}", cert.display()))
            })?;
        if chain.is_empty() {
            return Err(GatewayError::InvalidArgument(format!(
                "TLS certificate {}: no CERTIFICATE in it",
                cert.display()
            )));
        }
        let key_der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            GatewayError::InvalidArgument(format!("TLS key {}: {e}", key.display()))
        })?;
        Self::from_der(chain, key_der)
    }

    /// A certificate chain and key already in DER form.
    pub fn from_der(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<TlsConfig, GatewayError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
            .map_err(|e| GatewayError::InvalidArgument(format!("TLS: {e}")))?;
        server.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
        Ok(TlsConfig {
            server: Arc::new(server),
        })
    }
}
