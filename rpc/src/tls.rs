//! TLS for clients (rustls on ring; no OpenSSL): which CA to trust, and the identity a
//! node presents when it dials another node. The configuration sits behind a lock so a
//! node can swap in new certificates (SIGHUP) without dropping its pool.

use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::RwLock;

use rustls::ClientConfig;
use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::PrivateKeyDer;
use rustls_pki_types::ServerName;
use rustls_pki_types::pem::PemObject;

/// The name (a DNS name in its certificate) that speaks for node `id` among nodes; the
/// Raft port serves only certificates naming a current member this way.
pub fn node_name(id: u64) -> String {
    format!("rota-node-{id}")
}

/// The environment variable clients read the CA bundle's path from.
pub const CA_ENV: &str = "ROTA_CA";

/// Why TLS material could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM.
    #[error("{what} {path}: {problem}")]
    File {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// rustls refused the material.
    #[error("{0}")]
    Config(String),
}

/// The certificates in the PEM file at `path`.
pub fn read_certs(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_error = |problem: String| TlsError::File {
        what,
        path: path.to_path_buf(),
        problem,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(e.to_string()))?;
    if certs.is_empty() {
        return Err(file_error("holds no PEM certificate".into()));
    }
    Ok(certs)
}

/// The private key in the PEM file at `path`.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::File {
        what: "private key",
        path: path.to_path_buf(),
        problem: e.to_string(),
    })
}

/// A trust store of the CA certificates at `path`.
pub fn read_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs("CA certificate", path)? {
        roots.add(cert).map_err(|e| TlsError::File {
            what: "CA certificate",
            path: path.to_path_buf(),
            problem: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// The provider every configuration here uses, so that none depends on a process-wide
/// default being installed.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Where a client's TLS material lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// PEM bundle of the CA(s) whose certificates the servers must have.
    pub ca: PathBuf,
    /// A certificate and key to present (a node dialing a node), if any.
    pub identity: Option<(PathBuf, PathBuf)>,
}

impl ClientTlsFiles {
    /// A client configuration from the files.
    pub fn load(&self) -> Result<ClientConfig, TlsError> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(read_roots(&self.ca)?);
        match &self.identity {
            None => Ok(builder.with_no_client_auth()),
            Some((cert, key)) => builder
                .with_client_auth_cert(read_certs("certificate", cert)?, read_key(key)?)
                .map_err(|e| TlsError::Config(format!("{}: {e}", cert.display()))),
        }
    }
}

/// A client's TLS configuration, replaceable while connections use the old one.
#[derive(Debug)]
pub struct ClientTls {
    files: ClientTlsFiles,
    config: RwLock<Arc<ClientConfig>>,
}

impl ClientTls {
    /// Loads the files.
    pub fn load(files: ClientTlsFiles) -> Result<Arc<Self>, TlsError> {
        let config = Arc::new(files.load()?);
        Ok(Arc::new(Self {
            files,
            config: RwLock::new(config),
        }))
    }

    /// Reads the files again; on an error the old configuration stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = Arc::new(self.files.load()?);
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = config;
        Ok(())
    }

    /// A connector with the current configuration.
    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        let config = self
            .config
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        tokio_rustls::TlsConnector::from(config)
    }
}

/// The name a server at `addr` (`host:port`, `[v6]:port`) must have in its certificate.
pub fn server_name(addr: &str) -> Result<ServerName<'static>, TlsError> {
    let host = match addr.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .map_err(|e| TlsError::Config(format!("{addr}: not a host name or address: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_come_from_the_host_part() {
        assert_eq!(
            server_name("rota-1.example.internal:7001").ok(),
            ServerName::try_from("rota-1.example.internal").ok()
        );
        assert!(matches!(
            server_name("127.0.0.1:7001"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(matches!(
            server_name("[::1]:7001"),
            Ok(ServerName::IpAddress(_))
        ));
        assert!(server_name("bad name:1").is_err());
    }
}
