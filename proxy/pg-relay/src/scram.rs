//! SCRAM-SHA-256 (RFC 5802, RFC 7677) as PostgreSQL speaks it, both ends: the pool
//! authenticates its clients as the server would ([`ServerExchange`]), and logs in to
//! PostgreSQL as a client ([`ClientExchange`]) with a password or with the ClientKey a client
//! just proved it has (PgBouncer's pass-through: the proxy never needs the password when its
//! secret is PostgreSQL's own). No channel binding is offered (the mechanism named is
//! `SCRAM-SHA-256`, never `-PLUS`): the client's TLS ends at the proxy.
//!
//! Only bytes in and out; the I/O is the pool's.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

/// The mechanism, as PostgreSQL names it in AuthenticationSASL.
pub(crate) const MECHANISM: &str = "SCRAM-SHA-256";
/// Iterations of a secret the proxy derives from a password (PostgreSQL's default).
const ITERATIONS: u32 = 4096;

/// A user's SCRAM secret: what `pg_authid.rolpassword` holds,
/// `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret {
    pub(crate) iterations: u32,
    pub(crate) salt: Vec<u8>,
    pub(crate) stored_key: [u8; 32],
    pub(crate) server_key: [u8; 32],
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("any key length");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// PBKDF2-HMAC-SHA-256 of one block (`Hi` of RFC 5802).
fn salted_password(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut u = hmac(password, &[salt, &1u32.to_be_bytes()]);
    let mut out = u;
    for _ in 1..iterations {
        u = hmac(password, &[&u]);
        for (o, b) in out.iter_mut().zip(u) {
            *o ^= b;
        }
    }
    out
}

/// A password as SCRAM hashes it: SASLprep'd when it can be, else its bytes (as PostgreSQL).
fn normalize(password: &str) -> Vec<u8> {
    match stringprep::saslprep(password) {
        Ok(p) => p.into_owned().into_bytes(),
        Err(_) => password.as_bytes().to_vec(),
    }
}

fn keys(salted: &[u8; 32]) -> ([u8; 32], [u8; 32]) {
    (
        hmac(salted, &[b"Client Key"]),
        hmac(salted, &[b"Server Key"]),
    )
}

impl Secret {
    /// Parses PostgreSQL's text form; `None` if it is not one.
    pub(crate) fn parse(text: &str) -> Option<Secret> {
        let rest = text.strip_prefix("SCRAM-SHA-256$")?;
        let (params, keys) = rest.split_once('$')?;
        let (iterations, salt) = params.split_once(':')?;
        let (stored, server) = keys.split_once(':')?;
        let key = |s: &str| -> Option<[u8; 32]> { B64.decode(s).ok()?.try_into().ok() };
        Some(Secret {
            iterations: iterations.parse().ok().filter(|i| *i > 0)?,
            salt: B64.decode(salt).ok().filter(|s| !s.is_empty())?,
            stored_key: key(stored)?,
            server_key: key(server)?,
        })
    }

    /// A secret for `password` with a fresh random salt.
    pub(crate) fn from_password(password: &str) -> Secret {
        let mut salt = vec![0u8; 16];
        getrandom::fill(&mut salt).expect("the operating system's random number generator");
        Secret::with_salt(password, salt, ITERATIONS)
    }

    fn with_salt(password: &str, salt: Vec<u8>, iterations: u32) -> Secret {
        let (client_key, server_key) =
            keys(&salted_password(&normalize(password), &salt, iterations));
        Secret {
            iterations,
            salt,
            stored_key: sha256(&client_key),
            server_key,
        }
    }
}

fn nonce() -> String {
    let mut bytes = [0u8; 18];
    getrandom::fill(&mut bytes).expect("the operating system's random number generator");
    B64.encode(bytes)
}

/// The value of `key=` among SCRAM's comma-separated attributes.
fn attribute(message: &str, key: char) -> Option<&str> {
    message
        .split(',')
        .find_map(|a| a.strip_prefix(key)?.strip_prefix('='))
}

/// Why an exchange failed: `Refused` is the client's wrong proof (28P01 to it), anything else
/// a malformed message (08P01).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ScramError {
    Refused,
    Malformed(&'static str),
}

/// The server's side, for one client.
pub(crate) struct ServerExchange<'a> {
    secret: &'a Secret,
    /// `c=` of the final message: the GS2 header, in base64.
    binding: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

impl<'a> ServerExchange<'a> {
    /// Takes the client's first message (the SASLInitialResponse's data); returns the
    /// exchange and the server's first message.
    pub(crate) fn start(
        secret: &'a Secret,
        client_first: &[u8],
    ) -> Result<(ServerExchange<'a>, String), ScramError> {
        let text = std::str::from_utf8(client_first)
            .map_err(|_| ScramError::Malformed("a SCRAM message that is not UTF-8"))?;
        // The GS2 header: no channel binding (`n`), or a client that could bind but was not
        // offered it (`y`). `p=` asks for the -PLUS mechanism, which is not offered.
        let (flag, rest) = text
            .split_once(',')
            .ok_or(ScramError::Malformed("a SCRAM client-first message"))?;
        if flag != "n" && flag != "y" {
            return Err(ScramError::Malformed(
                "SCRAM channel binding is not offered through fence-proxy's pool",
            ));
        }
        let (authzid, bare) = rest
            .split_once(',')
            .ok_or(ScramError::Malformed("a SCRAM client-first message"))?;
        if !authzid.is_empty() {
            return Err(ScramError::Malformed(
                "a SCRAM authorization identity is not supported",
            ));
        }
        let gs2_header = &text[..flag.len() + 1 + authzid.len() + 1];
        // n=user,r=nonce[,extensions]: as PostgreSQL reads it, a mandatory extension (m=) is
        // refused, and every attribute is a letter and `=`.
        let mut attrs = bare.split(',');
        let well_formed = attrs.next().is_some_and(|a| a.starts_with("n="))
            && attrs.clone().all(|a| {
                let b = a.as_bytes();
                b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b'=' && b[0] != b'm'
            });
        let client_nonce = attrs
            .next()
            .and_then(|a| a.strip_prefix("r="))
            .filter(|n| !n.is_empty() && well_formed)
            .ok_or(ScramError::Malformed("a SCRAM client-first message"))?;
        let nonce = format!("{client_nonce}{}", nonce());
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&secret.salt),
            secret.iterations
        );
        Ok((
            ServerExchange {
                secret,
                binding: B64.encode(gs2_header),
                client_first_bare: bare.to_string(),
                server_first: server_first.clone(),
                nonce,
            },
            server_first,
        ))
    }

    /// Takes the client's final message; on a valid proof returns the server's final message
    /// and the client's ClientKey.
    pub(crate) fn finish(self, client_final: &[u8]) -> Result<(String, [u8; 32]), ScramError> {
        let text = std::str::from_utf8(client_final)
            .map_err(|_| ScramError::Malformed("a SCRAM message that is not UTF-8"))?;
        let (without_proof, proof) = text
            .rsplit_once(",p=")
            .ok_or(ScramError::Malformed("a SCRAM client-final message"))?;
        let mut attrs = without_proof.split(',');
        if attrs.next().and_then(|c| c.strip_prefix("c=")) != Some(self.binding.as_str()) {
            return Err(ScramError::Malformed(
                "a SCRAM channel binding that is not the first message's",
            ));
        }
        if attrs.next().and_then(|r| r.strip_prefix("r=")) != Some(self.nonce.as_str()) {
            return Err(ScramError::Malformed(
                "a SCRAM nonce that is not this exchange's",
            ));
        }
        let proof: [u8; 32] = B64
            .decode(proof)
            .ok()
            .and_then(|p| p.try_into().ok())
            .ok_or(ScramError::Malformed("a SCRAM proof"))?;
        let auth = format!(
            "{},{},{}",
            self.client_first_bare, self.server_first, without_proof
        );
        let signature = hmac(&self.secret.stored_key, &[auth.as_bytes()]);
        let mut client_key = [0u8; 32];
        for (i, k) in client_key.iter_mut().enumerate() {
            *k = proof[i] ^ signature[i];
        }
        let stored = sha256(&client_key);
        let same = stored
            .iter()
            .zip(&self.secret.stored_key)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
        if !same {
            return Err(ScramError::Refused);
        }
        let server_signature = hmac(&self.secret.server_key, &[auth.as_bytes()]);
        Ok((format!("v={}", B64.encode(server_signature)), client_key))
    }
}

/// What the proxy proves itself with when PostgreSQL asks for SCRAM.
pub(crate) enum Credential<'a> {
    Password(&'a str),
    /// A client's ClientKey, with the secret it belongs to (whose salt and iterations must
    /// be PostgreSQL's).
    ClientKey(&'a [u8; 32], &'a Secret),
}

/// The client's side, logging in to PostgreSQL.
pub(crate) struct ClientExchange<'a> {
    credential: Credential<'a>,
    client_first_bare: String,
    nonce: String,
}

/// The server's signature, checked when its final message comes.
pub(crate) struct Expected([u8; 32]);

impl<'a> ClientExchange<'a> {
    /// The exchange and the client's first message.
    pub(crate) fn start(credential: Credential<'a>) -> (ClientExchange<'a>, String) {
        let nonce = nonce();
        let bare = format!("n=,r={nonce}");
        let first = format!("n,,{bare}");
        (
            ClientExchange {
                credential,
                client_first_bare: bare,
                nonce,
            },
            first,
        )
    }

    /// Takes the server's first message; returns the client's final one.
    pub(crate) fn respond(self, server_first: &[u8]) -> Result<(String, Expected), String> {
        let text = std::str::from_utf8(server_first)
            .map_err(|_| "PostgreSQL sent a SCRAM message that is not UTF-8".to_string())?;
        let nonce = attribute(text, 'r')
            .filter(|n| n.starts_with(&self.nonce) && n.len() > self.nonce.len())
            .ok_or("PostgreSQL's SCRAM nonce does not extend ours")?;
        let salt = attribute(text, 's')
            .and_then(|s| B64.decode(s).ok())
            .ok_or("PostgreSQL sent no SCRAM salt")?;
        let iterations: u32 = attribute(text, 'i')
            .and_then(|i| i.parse().ok())
            .filter(|i| *i > 0)
            .ok_or("PostgreSQL sent no SCRAM iteration count")?;
        let (client_key, server_key) = match self.credential {
            Credential::Password(p) => keys(&salted_password(&normalize(p), &salt, iterations)),
            Credential::ClientKey(key, secret) => {
                if secret.salt != salt || secret.iterations != iterations {
                    return Err("the SCRAM secret in auth_file is not PostgreSQL's for this user (its salt or iterations differ): copy pg_authid.rolpassword, or give the password".into());
                }
                (*key, secret.server_key)
            }
        };
        let without_proof = format!("c=biws,r={nonce}");
        let auth = format!("{},{},{}", self.client_first_bare, text, without_proof);
        let signature = hmac(&sha256(&client_key), &[auth.as_bytes()]);
        let mut proof = client_key;
        for (p, s) in proof.iter_mut().zip(signature) {
            *p ^= s;
        }
        Ok((
            format!("{without_proof},p={}", B64.encode(proof)),
            Expected(hmac(&server_key, &[auth.as_bytes()])),
        ))
    }
}

impl Expected {
    /// Checks the server's final message: a server that cannot prove it knows the secret is
    /// not PostgreSQL.
    pub(crate) fn check(&self, server_final: &[u8]) -> Result<(), String> {
        let text = std::str::from_utf8(server_final).unwrap_or("");
        let v = attribute(text, 'v').and_then(|v| B64.decode(v).ok());
        if v.as_deref() == Some(&self.0[..]) {
            Ok(())
        } else {
            Err("PostgreSQL's SCRAM server signature is wrong".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's example, run through both ends.
    #[test]
    fn rfc_7677_example() {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let secret = Secret::with_salt("pencil", salt, 4096);
        let client_first_bare = "n=user,r=rOprNGfwEbeRWgbNEkqO";
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let exchange = ServerExchange {
            secret: &secret,
            binding: "biws".into(),
            client_first_bare: client_first_bare.into(),
            server_first: server_first.into(),
            nonce: "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into(),
        };
        let (server_final, _) = exchange
            .finish(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
            .unwrap();
        assert_eq!(
            server_final,
            "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
    }

    #[test]
    fn a_client_and_the_server_agree_and_a_wrong_password_is_refused() {
        let secret = Secret::from_password("s3cret");
        let text = format!(
            "SCRAM-SHA-256${}:{}${}:{}",
            secret.iterations,
            B64.encode(&secret.salt),
            B64.encode(secret.stored_key),
            B64.encode(secret.server_key)
        );
        assert_eq!(Secret::parse(&text), Some(secret.clone()));
        for (password, ok) in [("s3cret", true), ("wrong", false)] {
            let (client, first) = ClientExchange::start(Credential::Password(password));
            let (server, server_first) = ServerExchange::start(&secret, first.as_bytes()).unwrap();
            let (client_final, expected) = client.respond(server_first.as_bytes()).unwrap();
            match server.finish(client_final.as_bytes()) {
                Ok((server_final, key)) => {
                    assert!(ok);
                    expected.check(server_final.as_bytes()).unwrap();
                    // The key it recovered logs in again, as the client would.
                    let (client, first) =
                        ClientExchange::start(Credential::ClientKey(&key, &secret));
                    let (server, sf) = ServerExchange::start(&secret, first.as_bytes()).unwrap();
                    let (cf, expected) = client.respond(sf.as_bytes()).unwrap();
                    let (fin, _) = server.finish(cf.as_bytes()).unwrap();
                    expected.check(fin.as_bytes()).unwrap();
                }
                Err(e) => {
                    assert!(!ok);
                    assert_eq!(e, ScramError::Refused);
                }
            }
        }
    }

    #[test]
    fn channel_binding_and_bad_messages_are_refused() {
        let secret = Secret::from_password("x");
        for bad in [
            &b"p=tls-server-end-point,,n=,r=abc"[..],
            b"n,,n=",
            b"garbage",
            b"\xff\xfe",
            b"n,a=app,n=,r=abc",
            b"n,,n=,r=abc,m=ext",
            b"n,,n=,r=ab,cd",
            b"n,,r=abc",
        ] {
            assert!(ServerExchange::start(&secret, bad).is_err(), "{bad:?}");
        }
        for bad in [
            "",
            "SCRAM-SHA-256$0:AAAA$AA==:AA==",
            "md5abc",
            "SCRAM-SHA-256$4096:$x:y",
        ] {
            assert_eq!(Secret::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_final_binding_must_be_the_first_messages() {
        let secret = Secret::from_password("pw");
        for (first, bind, ok) in [
            ("n,,n=,r=abc", "biws", true),
            ("y,,n=,r=abc", "eSws", true),
            ("n,,n=,r=abc", "eSws", false),
            ("y,,n=,r=abc", "biws", false),
        ] {
            let (server, server_first) = ServerExchange::start(&secret, first.as_bytes()).unwrap();
            let nonce = attribute(&server_first, 'r').unwrap();
            let fin = format!("c={bind},r={nonce},p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=");
            let got = server.finish(fin.as_bytes());
            // A well-bound message gets as far as the proof (wrong here).
            assert_eq!(
                got.err(),
                Some(if ok {
                    ScramError::Refused
                } else {
                    ScramError::Malformed("a SCRAM channel binding that is not the first message's")
                }),
                "{first} {bind}"
            );
        }
    }
}
