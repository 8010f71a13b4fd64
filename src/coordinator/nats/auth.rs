//! Logging in and TLS for the NATS backend: [`NatsCredentials`] resolved
//! into what async-nats is given (a `.creds` file read and checked, an
//! NKey seed parsed), and connect failures explained in one line.
//!
//! Secrets (passwords, tokens, seeds) never reach an error or a log line:
//! parse errors of a seed are replaced by a fixed text, and the public key
//! of an NKey (not secret: the server's configuration lists it) is what
//! messages name.

use super::NatsCredentials;
use crate::error::{Error, Result};
use crate::tls::refusal::{self, ClientSide};
use crate::tls::Tls;
use nkeys::{KeyPair, KeyPairType};
use std::path::Path;
use std::sync::Arc;

/// Credentials ready for async-nats; built before the driver starts, so
/// every problem with a file is an error of the constructor.
#[derive(Clone)]
pub(super) enum Login {
    None,
    UserPassword(String, String),
    Token(String),
    NKey(Arc<KeyPair>),
    Jwt { jwt: String, key: Arc<KeyPair> },
}

impl Login {
    /// Reads and checks what `credentials` name.
    pub(super) fn resolve(credentials: &NatsCredentials) -> Result<Login> {
        Ok(match credentials {
            NatsCredentials::None => Login::None,
            NatsCredentials::UserPassword { user, password } => {
                Login::UserPassword(user.clone(), password.clone())
            }
            NatsCredentials::Token(token) => Login::Token(token.clone()),
            NatsCredentials::NKey(seed) => {
                Login::NKey(Arc::new(user_seed("nkey", "the seed", seed)?))
            }
            NatsCredentials::CredentialsFile(path) => {
                let (jwt, key) = read_creds(path)?;
                Login::Jwt {
                    jwt,
                    key: Arc::new(key),
                }
            }
        })
    }

    /// `options` logging in with these credentials.
    pub(super) fn apply(self, options: async_nats::ConnectOptions) -> async_nats::ConnectOptions {
        match self {
            Login::None => options,
            Login::UserPassword(user, password) => options.user_and_password(user, password),
            Login::Token(token) => options.token(token),
            // async-nats takes the seed as text and signs with its own copy.
            Login::NKey(key) => match key.seed() {
                Ok(seed) => options.nkey(seed),
                Err(_) => options,
            },
            Login::Jwt { jwt, key } => options.jwt(jwt, move |nonce| {
                let key = key.clone();
                async move { key.sign(&nonce).map_err(async_nats::AuthError::new) }
            }),
        }
    }

    /// Who logs in, for messages: the user, the NKey's public key, or
    /// "the token" (never the token itself).
    pub(super) fn who(&self) -> Option<String> {
        match self {
            Login::None => None,
            Login::Token(_) => Some("the token".to_owned()),
            Login::UserPassword(user, _) => Some(format!("user {user:?}")),
            Login::NKey(key) => Some(format!("NKey user {}", key.public_key())),
            Login::Jwt { key, .. } => Some(format!("JWT user {}", key.public_key())),
        }
    }
}

/// The user key pair of `seed` (`SU...`); the message never quotes it.
fn user_seed(what: &'static str, name: &str, seed: &str) -> Result<KeyPair> {
    let key = KeyPair::from_seed(seed.trim()).map_err(|_| {
        Error::invalid(
            what,
            format!("{name} is not an NKey seed (one line starting with SU)"),
        )
    })?;
    if !matches!(key.key_pair_type(), KeyPairType::User) {
        return Err(Error::invalid(
            what,
            format!(
                "{name} is a seed of an {:?} key; logging in needs a user seed (SU...)",
                key.key_pair_type()
            ),
        ));
    }
    Ok(key)
}

const JWT_BLOCK: &str = "NATS USER JWT";
const SEED_BLOCK: &str = "USER NKEY SEED";

/// The user JWT and key of the `.creds` file at `path`; errors name the
/// file and what is wrong, never its seed.
pub(super) fn read_creds(path: &Path) -> Result<(String, KeyPair)> {
    const WHAT: &str = "credentials_file";
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::invalid(
            WHAT,
            format!("cannot read the credentials file {shown}: {e}"),
        )
    })?;
    let jwt = block(&text, JWT_BLOCK).ok_or_else(|| {
        Error::invalid(
            WHAT,
            format!("{shown} holds no user JWT (-----BEGIN {JWT_BLOCK}-----)"),
        )
    })?;
    let parts: Vec<&str> = jwt.split('.').collect();
    let base64url = |p: &&str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if parts.len() != 3 || !parts.iter().all(base64url) {
        return Err(Error::invalid(
            WHAT,
            format!("the user JWT in {shown} is not a JWT (three base64url parts)"),
        ));
    }
    let seed = block(&text, SEED_BLOCK).ok_or_else(|| {
        Error::invalid(
            WHAT,
            format!("{shown} holds no NKey seed (-----BEGIN {SEED_BLOCK}-----)"),
        )
    })?;
    let key = user_seed(WHAT, &format!("the seed in {shown}"), seed)?;
    Ok((jwt.to_owned(), key))
}

/// The first non-blank line after the line opening block `name` (nsc
/// writes `-----BEGIN <name>-----`, the closing line `------END <name>------`).
fn block<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let open = format!("BEGIN {name}");
    let mut lines = text.lines();
    lines.find(|l| l.trim().starts_with("---") && l.contains(&open))?;
    let line = lines.map(str::trim).find(|l| !l.is_empty())?;
    (!line.starts_with("---")).then_some(line)
}

/// What a failed connect says, as one line naming the cause: a TLS check
/// that failed, a refused login, or async-nats's own words.
pub(super) fn explain(
    kind: async_nats::ConnectErrorKind,
    text: &str,
    tls: Option<&Tls>,
    who: Option<&str>,
) -> String {
    use async_nats::ConnectErrorKind as K;
    if kind == K::AuthorizationViolation {
        // async-nats's text says "authorization violation" twice.
        return match who {
            Some(who) => format!("the server refused {who} (authorization violation)"),
            None => "the server requires credentials and none were given (authorization \
                     violation)"
                .to_owned(),
        };
    }
    if refusal::untrusted_server(text) {
        return format!("TLS: the server's certificate is not signed by the given CA ({text})");
    }
    if refusal::wrong_name(text) {
        return format!(
            "TLS: the server's certificate is not valid for the name dialled; dial a name \
             it was issued for or set the TLS server name ({text})"
        );
    }
    // async-nats reads the platform's roots even when given a complete
    // ClientConfig (docs/backend-notes.md, "TLS"), so a broken
    // SSL_CERT_FILE fails a connection that would not have used them.
    if text.contains("could not load platform certs") {
        return format!(
            "TLS: the client could not read the platform's CA certificates, which it \
             loads even when a CA bundle is given; check SSL_CERT_FILE and SSL_CERT_DIR ({text})"
        );
    }
    let Some(tls) = tls else {
        return text.to_owned();
    };
    // A plain-text server answers the ClientHello with its INFO line.
    if text.contains("InvalidContentType") || text.contains("corrupt message") {
        return format!(
            "TLS: the server did not answer with TLS; it most likely has no `tls` block \
             configured ({text})"
        );
    }
    let alert = refusal::refused_by_alert(text);
    // TLS 1.3: the client's handshake is done before the server looked at
    // its certificate, so a refusal without an alert shows as the server
    // hanging up on the first read.
    let closed = [
        "connection reset",
        "broken pipe",
        "unexpected end of file",
        "early eof",
        "connection closed",
        "UnexpectedEof",
    ]
    .iter()
    .any(|w| text.contains(w));
    if !(alert || closed) {
        return text.to_owned();
    }
    let invalid_now = || tls.client_cert_invalid_at(refusal::unix_now());
    match refusal::client_side(tls.has_client_identity(), invalid_now) {
        ClientSide::Missing => format!(
            "TLS: the server closed the connection after the handshake; it most likely \
             requires a client certificate (nats-server `verify: true`), and none was given ({text})"
        ),
        ClientSide::Invalid(why) => {
            format!("TLS: the server refused the client certificate: {why} ({text})")
        }
        ClientSide::Refused => format!(
            "TLS: the server closed the connection after the handshake; it most likely \
             refused the client certificate (is it signed by a CA the server trusts?) ({text})"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_read_as_nsc_writes_them() {
        let text = "-----BEGIN NATS USER JWT-----\na.b.c\n------END NATS USER JWT------\n\n\
                    junk\n-----BEGIN USER NKEY SEED-----\n\n  SUxyz \n------END USER NKEY SEED------\n";
        assert_eq!(block(text, JWT_BLOCK), Some("a.b.c"));
        assert_eq!(block(text, SEED_BLOCK), Some("SUxyz"));
        let empty = "-----BEGIN NATS USER JWT-----\n------END NATS USER JWT------\n";
        assert_eq!(block(empty, JWT_BLOCK), None);
        assert_eq!(block("nothing", JWT_BLOCK), None);
    }

    #[test]
    fn a_bad_seed_is_never_quoted() {
        let secret = "SUAMNOTAVALIDSEEDATALLBUTSECRET";
        let err = user_seed("nkey", "the NKey seed", secret)
            .unwrap_err()
            .to_string();
        assert!(!err.contains(secret) && !err.contains("NOTAVALID"), "{err}");
        let account = KeyPair::new_account().seed().unwrap();
        let err = user_seed("nkey", "the NKey seed", &account)
            .unwrap_err()
            .to_string();
        assert!(err.contains("Account") && !err.contains(&account), "{err}");
        let user = KeyPair::new_user();
        let seed = user.seed().unwrap();
        let parsed = user_seed("nkey", "x", &format!(" {seed}\n")).unwrap();
        assert_eq!(parsed.public_key(), user.public_key());
    }
}
