//! NATS decentralized auth for test servers, made without `nsc`: an
//! operator, an account with JetStream and a user, each an NKey, and the
//! JWTs that chain them (operator self-signed, account signed by the
//! operator, user signed by the account).
//!
//! A NATS JWT is `base64url(header).base64url(claims).base64url(sig)`
//! (no padding), the signature an ed25519 one by the issuer's NKey over
//! the first two parts, the header `{"typ":"JWT","alg":"ed25519-nkey"}`.
//! The claims are the standard ones (`jti`, `iat`, `iss`, `sub`, `name`)
//! and a `nats` object with the type and version 2; `jti` is the
//! unpadded base32 of the SHA-512/256 of the standard claims without it,
//! which makes it repeatable for identical claims.

use crate::{Error, Result};
use data_encoding::{BASE32_NOPAD, BASE64URL_NOPAD};
use nkeys::KeyPair;
use sha2::{Digest, Sha512_256};

/// What a server and its clients need: the operator and account JWTs for
/// the server's configuration, and the user's credentials.
pub(crate) struct Decentralized {
    pub(crate) operator_jwt: String,
    /// The system account: JetStream sets up its internal subscriptions
    /// there, and refuses to start in operator mode without one.
    pub(crate) system_public: String,
    pub(crate) system_jwt: String,
    pub(crate) account_public: String,
    pub(crate) account_jwt: String,
    pub(crate) user_public: String,
    /// The `.creds` file's text: the user JWT and seed.
    pub(crate) creds: String,
}

/// Unlimited limits of an account with JetStream on (`-1`: no limit; a
/// JetStream storage limit of 0, or none, would leave JetStream off).
const ACCOUNT_LIMITS: &str = r#"{"subs":-1,"data":-1,"payload":-1,"imports":-1,"exports":-1,"wildcards":true,"conn":-1,"leaf":-1,"mem_storage":-1,"disk_storage":-1,"streams":-1,"consumer":-1}"#;

impl Decentralized {
    /// A fresh operator, account and user (user name `user`, account name
    /// `account`).
    pub(crate) fn generate() -> Result<Decentralized> {
        let operator = KeyPair::new_operator();
        let system = KeyPair::new_account();
        let account = KeyPair::new_account();
        let user = KeyPair::new_user();
        let operator_jwt = jwt(
            &operator,
            &operator.public_key(),
            "operator",
            r#"{"type":"operator","version":2}"#,
        )?;
        let system_jwt = jwt(
            &operator,
            &system.public_key(),
            "SYS",
            r#"{"limits":{"subs":-1,"data":-1,"payload":-1,"imports":-1,"exports":-1,"wildcards":true,"conn":-1,"leaf":-1},"type":"account","version":2}"#,
        )?;
        let account_jwt = jwt(
            &operator,
            &account.public_key(),
            "account",
            &format!(
                r#"{{"limits":{ACCOUNT_LIMITS},"default_permissions":{{"pub":{{}},"sub":{{}}}},"type":"account","version":2}}"#
            ),
        )?;
        let user_jwt = jwt(
            &account,
            &user.public_key(),
            "user",
            r#"{"pub":{},"sub":{},"subs":-1,"data":-1,"payload":-1,"type":"user","version":2}"#,
        )?;
        let seed = user.seed().map_err(nkey_error)?;
        Ok(Decentralized {
            operator_jwt,
            system_public: system.public_key(),
            system_jwt,
            account_public: account.public_key(),
            account_jwt,
            user_public: user.public_key(),
            creds: creds_file(&user_jwt, &seed),
        })
    }
}

/// The text of a `.creds` file for `jwt` and `seed`, laid out as `nsc`
/// writes it.
pub(crate) fn creds_file(jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n"
    )
}

/// A JWT for `subject` named `name`, issued and signed by `issuer`, with
/// `nats` (a JSON object) as its `nats` claim.
fn jwt(issuer: &KeyPair, subject: &str, name: &str, nats: &str) -> Result<String> {
    let iat = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let iss = issuer.public_key();
    // Field order of the standard claims as the reference implementation
    // marshals them (aud, exp, jti, iat, iss, name, nbf, sub), jti empty
    // and so left out.
    let standard = format!(r#""iat":{iat},"iss":"{iss}","name":"{name}","sub":"{subject}""#);
    let jti = BASE32_NOPAD.encode(&Sha512_256::digest(format!("{{{standard}}}")));
    let claims = format!(r#"{{"jti":"{jti}",{standard},"nats":{nats}}}"#);
    let header = BASE64URL_NOPAD.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let signed = format!("{header}.{}", BASE64URL_NOPAD.encode(claims.as_bytes()));
    let signature = issuer.sign(signed.as_bytes()).map_err(nkey_error)?;
    Ok(format!("{signed}.{}", BASE64URL_NOPAD.encode(&signature)))
}

fn nkey_error(e: nkeys::error::Error) -> Error {
    Error::Io(std::io::Error::other(format!(
        "cannot make test NKeys: {e}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwts_are_signed_by_their_issuer() {
        let auth = Decentralized::generate().unwrap();
        for (jwt, prefix) in [
            (&auth.operator_jwt, 'O'),
            (&auth.system_jwt, 'O'),
            (&auth.account_jwt, 'O'),
        ] {
            let parts: Vec<&str> = jwt.split('.').collect();
            assert_eq!(parts.len(), 3);
            let claims =
                String::from_utf8(BASE64URL_NOPAD.decode(parts[1].as_bytes()).unwrap()).unwrap();
            let iss = claims.split(r#""iss":""#).nth(1).unwrap();
            assert!(iss.starts_with(prefix), "{claims}");
            let issuer = KeyPair::from_public_key(&iss[..56]).unwrap();
            let sig = BASE64URL_NOPAD.decode(parts[2].as_bytes()).unwrap();
            issuer
                .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &sig)
                .unwrap();
        }
        assert!(auth.account_public.starts_with('A'));
        assert!(auth.user_public.starts_with('U'));
        assert!(auth.creds.contains("BEGIN USER NKEY SEED-----\nSU"));
    }
}
