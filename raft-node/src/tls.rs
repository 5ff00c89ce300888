//! TLS on both listeners and on every connection a node makes (rustls on ring), and the
//! identity of a node: its certificate, signed by the cluster's CA, names it
//! `rota-node-<id>`. The Raft listener requires such a certificate and serves a request
//! only while the id it names is a member (a node in no cluster yet takes any the CA
//! signed, since it knows no members). SIGHUP reloads the files; connections already
//! open keep the certificates they started with.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::RwLock;

use axum::extract::State;
use axum::response::IntoResponse;
use axum::response::Response;
use rpc::tls::ClientTls;
use rpc::tls::ClientTlsFiles;
use rpc::tls::TlsError;
use rpc::tls::node_name;
use rpc::tls::provider;
use rpc::tls::read_certs;
use rpc::tls::read_key;
use rpc::tls::read_roots;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::ServerName;

use crate::http::ApiError;
use crate::node::SharedNode;

/// Where a node's TLS material lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// This node's certificate chain (PEM): its own first.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The cluster's CA bundle (PEM): peers' and clients' certificates chain to it.
    pub ca: PathBuf,
}

impl TlsFiles {
    fn server(&self, require_client_cert: bool) -> Result<ServerConfig, TlsError> {
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = if require_client_cert {
            let roots = Arc::new(read_roots(&self.ca)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| TlsError::Config(format!("{}: {e}", self.ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder
            .with_single_cert(read_certs("certificate", &self.cert)?, read_key(&self.key)?)
            .map_err(|e| TlsError::Config(format!("{}: {e}", self.cert.display())))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    fn client(&self) -> ClientTlsFiles {
        ClientTlsFiles {
            ca: self.ca.clone(),
            identity: Some((self.cert.clone(), self.key.clone())),
        }
    }
}

/// A node's TLS configurations: the API listener's, the Raft listener's (which asks
/// for a client certificate) and the one it dials other nodes with.
#[derive(Debug)]
pub struct NodeTls {
    files: TlsFiles,
    api: RwLock<Arc<ServerConfig>>,
    raft: RwLock<Arc<ServerConfig>>,
    client: Arc<ClientTls>,
}

/// Which listener a connection came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// Workers and operators.
    Api,
    /// Other nodes.
    Raft,
}

impl NodeTls {
    /// Reads the files; refuses material rustls cannot use.
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, TlsError> {
        let api = Arc::new(files.server(false)?);
        let raft = Arc::new(files.server(true)?);
        let client = ClientTls::load(files.client())?;
        Ok(Arc::new(Self {
            files,
            api: RwLock::new(api),
            raft: RwLock::new(raft),
            client,
        }))
    }

    /// Reads the files again; on any error every old configuration stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let api = Arc::new(self.files.server(false)?);
        let raft = Arc::new(self.files.server(true)?);
        self.client.reload()?;
        *self.api.write().unwrap_or_else(|p| p.into_inner()) = api;
        *self.raft.write().unwrap_or_else(|p| p.into_inner()) = raft;
        Ok(())
    }

    /// An acceptor with the current configuration of `listener`.
    pub fn acceptor(&self, listener: Listener) -> tokio_rustls::TlsAcceptor {
        let config = match listener {
            Listener::Api => &self.api,
            Listener::Raft => &self.raft,
        };
        tokio_rustls::TlsAcceptor::from(config.read().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// The configuration this node dials other nodes with.
    pub fn client(&self) -> Arc<ClientTls> {
        Arc::clone(&self.client)
    }
}

/// The certificate the peer of a connection presented, if any: put in every request of
/// that connection.
#[derive(Clone, Debug, Default)]
pub struct PeerCertificate(pub Option<Arc<CertificateDer<'static>>>);

/// Whether `cert` names one of `ids` (as `rota-node-<id>`).
fn names_one_of(cert: &CertificateDer<'_>, ids: impl IntoIterator<Item = u64>) -> bool {
    let Ok(cert) = webpki::EndEntityCert::try_from(cert) else {
        return false;
    };
    ids.into_iter().any(|id| {
        ServerName::try_from(node_name(id))
            .is_ok_and(|name| cert.verify_is_valid_for_subject_name(&name).is_ok())
    })
}

/// The Raft listener's check: on a node with TLS, a request is served only when its
/// connection's certificate names a current member (any the CA signed while this node
/// is in no cluster).
pub async fn require_member(
    State(node): State<SharedNode>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if node.config.tls.is_none() {
        return next.run(request).await;
    }
    let peer = request
        .extensions()
        .get::<PeerCertificate>()
        .and_then(|p| p.0.clone());
    let Some(cert) = peer else {
        return ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "the Raft port takes requests from nodes with a certificate of the cluster's CA only",
        )
        .into_response();
    };
    let members = node.member_ids();
    if members.is_empty() || names_one_of(&cert, members.iter().copied()) {
        return next.run(request).await;
    }
    tracing::warn!(
        ?members,
        "refused Raft traffic from a certificate that names no member"
    );
    ApiError::new(
        axum::http::StatusCode::FORBIDDEN,
        format!(
            "this connection's certificate names no member of the cluster ({}); a node's certificate carries the DNS name rota-node-<ID>",
            members
                .iter()
                .map(|id| node_name(*id))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
    .into_response()
}
