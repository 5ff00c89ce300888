//! `rota cert ca | node`: a cluster CA and node certificates (rcgen), for `rota dev up
//! --secure` and for operators without a PKI of their own. A node's certificate names it
//! `rota-node-<id>` (its identity on the Raft port) and the host names and addresses
//! clients dial, for both server and client authentication.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::path::PathBuf;
use std::time::SystemTime;

use rcgen::BasicConstraints;
use rcgen::CertificateParams;
use rcgen::DnType;
use rcgen::ExtendedKeyUsagePurpose;
use rcgen::IsCa;
use rcgen::Issuer;
use rcgen::KeyPair;
use rcgen::KeyUsagePurpose;
use rpc::tls::node_name;

use crate::CliError;

/// The CA's certificate in a certificate directory.
pub const CA_CERT: &str = "ca.pem";
/// The CA's private key in a certificate directory.
pub const CA_KEY: &str = "ca.key";

/// Years a CA stays valid.
const CA_YEARS: i32 = 10;
/// Years a node certificate stays valid.
const NODE_YEARS: i32 = 2;

/// A certificate and its key, written.
#[derive(Clone, Debug)]
pub struct Written {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// The private key (PEM, mode 0600).
    pub key: PathBuf,
}

fn failed(what: &str) -> impl FnOnce(rcgen::Error) -> CliError + '_ {
    move |e| CliError::Failed(format!("{what}: {e}"))
}

/// Writes `text` to a new file (never over an old one), readable by its owner only when
/// `private`.
pub(crate) fn write_new(path: &Path, text: &str, private: bool) -> Result<(), CliError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(path)
        .map_err(|e| {
            CliError::Failed(format!(
                "creating {}: {e}; remove it first to replace it",
                path.display()
            ))
        })?;
    file.write_all(text.as_bytes())
        .map_err(|e| CliError::Failed(format!("writing {}: {e}", path.display())))
}

/// The current year, for validity periods (rcgen takes calendar dates).
fn this_year() -> i32 {
    let seconds = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    1970 + (seconds / 31_556_952) as i32
}

fn valid_for(params: &mut CertificateParams, years: i32) {
    let year = this_year();
    params.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
    params.not_after = rcgen::date_time_ymd(year + years, 1, 1);
}

/// Makes a CA in `dir` (`ca.pem`, `ca.key`); refuses to overwrite one.
pub fn make_ca(dir: &Path) -> Result<Written, CliError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError::Failed(format!("creating {}: {e}", dir.display())))?;
    let key = KeyPair::generate().map_err(failed("making the CA's key"))?;
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "Rota cluster CA");
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    valid_for(&mut params, CA_YEARS);
    let cert = params.self_signed(&key).map_err(failed("signing the CA"))?;
    let written = Written {
        cert: dir.join(CA_CERT),
        key: dir.join(CA_KEY),
    };
    write_new(&written.key, &key.serialize_pem(), true)?;
    write_new(&written.cert, &cert.pem(), false)?;
    Ok(written)
}

/// Makes node `id`'s certificate in `dir` (`node-<id>.pem`, `node-<id>.key`), signed by
/// the CA there, naming `rota-node-<id>` and `hosts`.
pub fn make_node(dir: &Path, id: u64, hosts: &[String]) -> Result<Written, CliError> {
    if id == 0 {
        return Err(CliError::Usage(
            "--id 0: node ids start at 1; give the id the node runs with".into(),
        ));
    }
    if hosts.iter().all(|h| h.trim().is_empty()) {
        return Err(CliError::Usage(
            "--host: give at least one name or address clients and nodes dial this node by (e.g. --host 10.0.0.1 --host rota-1.internal)".into(),
        ));
    }
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(|e| {
            CliError::Failed(format!(
                "reading {}: {e}; make the CA first with `rota cert ca --dir {}`",
                path.display(),
                dir.display()
            ))
        })
    };
    let ca_key = KeyPair::from_pem(&read(CA_KEY)?).map_err(failed("reading the CA's key"))?;
    let issuer =
        Issuer::from_ca_cert_pem(&read(CA_CERT)?, ca_key).map_err(failed("reading the CA"))?;
    let mut names = vec![node_name(id)];
    names.extend(
        hosts
            .iter()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty()),
    );
    let mut params = CertificateParams::new(names).map_err(failed("the host names"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, node_name(id));
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    valid_for(&mut params, NODE_YEARS);
    let key = KeyPair::generate().map_err(failed("making the node's key"))?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(failed("signing the node's certificate"))?;
    let written = Written {
        cert: dir.join(format!("node-{id}.pem")),
        key: dir.join(format!("node-{id}.key")),
    };
    write_new(&written.key, &key.serialize_pem(), true)?;
    write_new(&written.cert, &cert.pem(), false)?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_certificate_chains_to_the_ca_and_names_the_node() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let ca = make_ca(dir.path()).expect("a CA");
        assert!(make_ca(dir.path()).is_err(), "a CA is never overwritten");
        let node = make_node(
            dir.path(),
            3,
            &["127.0.0.1".into(), "rota-3.example".into()],
        )
        .expect("a node certificate");
        for (id, hosts) in [
            (0, vec!["127.0.0.1".to_string()]),
            (4, vec![" ".to_string()]),
        ] {
            assert!(
                matches!(make_node(dir.path(), id, &hosts), Err(CliError::Usage(_))),
                "id {id}, hosts {hosts:?}"
            );
        }
        let files = rpc::tls::ClientTlsFiles {
            ca: ca.cert.clone(),
            identity: Some((node.cert.clone(), node.key.clone())),
        };
        files
            .load()
            .expect("rustls takes the CA and the node's identity");
        let mode = std::fs::metadata(&node.key)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
            .expect("the key exists");
        assert_eq!(mode, 0o600);
    }
}
