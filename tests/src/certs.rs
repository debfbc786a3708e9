//! Certificates made at test time (rcgen): a CA, and certificates it signs, as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A certificate authority whose certificate is in `pem`.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub pem: PathBuf,
}

/// A certificate and its key, as files.
#[derive(Clone, Debug)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pair {
    /// Writes this pair's files over `to`'s (a certificate rotated in place, for a reload).
    pub fn copy_over(&self, to: &Pair) {
        std::fs::copy(&self.cert, &to.cert).expect("copying a certificate");
        std::fs::copy(&self.key, &to.key).expect("copying a key");
    }
}

impl Ca {
    /// A new CA, written to `dir/{name}-ca.pem`.
    pub fn new(dir: &Path, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("a key"))
            .expect("a self-signed CA");
        let pem = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&pem, issuer.pem()).expect("writing the CA");
        Ca { issuer, pem }
    }

    /// A certificate for `names` (DNS names or IP addresses), common name `name`, written to
    /// `dir/{name}.pem` and `dir/{name}-key.pem`; `expired`: valid only in 2000.
    pub fn issue(&self, dir: &Path, name: &str, names: &[&str], expired: bool) -> Pair {
        let key = KeyPair::generate().expect("a key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("certificate parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        if expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2000, 12, 31);
        }
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("a signed certificate");
        let pair = Pair {
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}-key.pem")),
        };
        std::fs::write(&pair.cert, cert.pem()).expect("writing a certificate");
        std::fs::write(&pair.key, key.serialize_pem()).expect("writing a key");
        // Readable by its owner only, as libpq demands of a client key.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&pair.key, std::fs::Permissions::from_mode(0o600))
            .expect("the key's mode");
        pair
    }
}
