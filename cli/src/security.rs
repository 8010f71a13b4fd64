//! `--cacert`, `--cert`, `--key`, `--user`, `--password-file`: how to reach
//! a secured etcd, spelled as etcdctl spells them, with etcdctl's
//! `ETCDCTL_*` variables as fallbacks. No password is ever printed: the
//! parsed `--user` hides it from `Debug`, clap never shows environment
//! values (they are read here, not by clap), and errors name files and
//! users only.

use crate::CliError;
use fleetcoord::{EtcdOptions, EtcdUser, Tls};
use std::path::PathBuf;

/// The flags; each falls back to the variable named in its help.
#[derive(clap::Args, Debug, Default)]
pub struct SecurityArgs {
    /// CA bundle that signs the etcd servers' certificates; turns on TLS
    /// [env: ETCDCTL_CACERT]
    // Ids of their own: global flags share one namespace with every
    // subcommand's arguments (`kv set <key>` has a `key`).
    #[arg(long = "cacert", id = "tls_cacert", global = true, value_name = "FILE")]
    cacert: Option<PathBuf>,

    /// Client certificate for etcd's --client-cert-auth (needs --key)
    /// [env: ETCDCTL_CERT]
    #[arg(long = "cert", id = "tls_cert", global = true, value_name = "FILE")]
    cert: Option<PathBuf>,

    /// Private key of --cert [env: ETCDCTL_KEY]
    #[arg(long = "key", id = "tls_key", global = true, value_name = "FILE")]
    key: Option<PathBuf>,

    /// etcd user, `name:password`, or `name` with --password-file
    /// [env: ETCDCTL_USER]
    #[arg(
        long = "user",
        id = "auth_user",
        global = true,
        value_name = "NAME[:PASSWORD]"
    )]
    user: Option<Hidden>,

    /// File whose first line is the password of --user (no prompt)
    /// [env: ETCDCTL_PASSWORD holds the password itself]
    #[arg(
        long = "password-file",
        id = "auth_password_file",
        global = true,
        value_name = "FILE"
    )]
    password_file: Option<PathBuf>,
}

/// Text that may hold a password: `Debug` never shows it.
#[derive(Clone)]
pub struct Hidden(String);

impl std::str::FromStr for Hidden {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Hidden(s.to_string()))
    }
}

impl std::fmt::Debug for Hidden {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Every error of these flags is one of their values or combinations:
/// a usage error, whoever found it.
fn invalid(e: fleetcoord::Error) -> CliError {
    CliError::Usage(e.to_string())
}

impl SecurityArgs {
    /// `options` with TLS and the user these flags (or variables) ask for.
    pub fn apply(
        &self,
        options: EtcdOptions,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<EtcdOptions, CliError> {
        let path = |flag: &Option<PathBuf>, name: &str| {
            flag.clone()
                .or_else(|| var(name).filter(|v| !v.is_empty()).map(PathBuf::from))
        };
        let cacert = path(&self.cacert, "ETCDCTL_CACERT");
        let cert = path(&self.cert, "ETCDCTL_CERT");
        let key = path(&self.key, "ETCDCTL_KEY");
        let mut options = options;
        match (cacert, cert, key) {
            (None, None, None) => {}
            (None, _, _) => {
                return Err(CliError::Usage(
                    "--cert/--key need --cacert, the CA that signs the etcd servers' certificates"
                        .into(),
                ))
            }
            (Some(ca), None, None) => {
                options = options.with_tls(Tls::from_ca_file(ca).map_err(invalid)?);
            }
            (Some(ca), Some(cert), Some(key)) => {
                let tls = Tls::from_ca_file(ca)
                    .and_then(|t| t.with_client_files(cert, key))
                    .map_err(invalid)?;
                options = options.with_tls(tls);
            }
            (Some(_), _, _) => {
                return Err(CliError::Usage(
                    "--cert and --key go together: give both or neither".into(),
                ))
            }
        }
        let user = self
            .user
            .clone()
            .or_else(|| var("ETCDCTL_USER").filter(|v| !v.is_empty()).map(Hidden));
        if let Some(Hidden(user)) = user {
            let user = match user.split_once(':') {
                Some(_) => EtcdUser::parse(&user),
                None => EtcdUser::new(user.clone(), self.password(&user, &var)?),
            }
            .map_err(invalid)?;
            options = options.with_user(user);
        } else if self.password_file.is_some() {
            return Err(CliError::Usage(
                "--password-file needs --user (or ETCDCTL_USER)".into(),
            ));
        }
        Ok(options)
    }

    /// The password of `name`: the first line of --password-file, else
    /// $ETCDCTL_PASSWORD. Never prompted for: scripts must not hang.
    fn password(
        &self,
        name: &str,
        var: &impl Fn(&str) -> Option<String>,
    ) -> Result<String, CliError> {
        if let Some(file) = &self.password_file {
            let text = std::fs::read_to_string(file).map_err(|e| {
                CliError::Usage(format!(
                    "cannot read the password file {}: {e}",
                    file.display()
                ))
            })?;
            return Ok(text.lines().next().unwrap_or_default().to_string());
        }
        var("ETCDCTL_PASSWORD").ok_or_else(|| {
            CliError::Usage(format!(
                "no password for user {name:?}: give --user name:password, \
                 --password-file FILE or ETCDCTL_PASSWORD"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        security: SecurityArgs,
    }

    fn options(args: &[&str], vars: &[(&str, &str)]) -> Result<EtcdOptions, String> {
        let cli = Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        cli.security
            .apply(EtcdOptions::default(), |name| {
                vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
            })
            .map_err(|e| match e {
                CliError::Usage(m) => m,
                other => format!("{other:?}"),
            })
    }

    #[test]
    fn users_come_from_the_flag_the_file_or_the_environment() {
        let o = options(&["--user", "agent:pw:1"], &[]).unwrap();
        assert_eq!(o.user.as_ref().map(EtcdUser::name), Some("agent"));
        let o = options(&[], &[("ETCDCTL_USER", "env-user:pw")]).unwrap();
        assert_eq!(o.user.as_ref().map(EtcdUser::name), Some("env-user"));
        let o = options(&["--user", "a"], &[("ETCDCTL_PASSWORD", "pw")]).unwrap();
        assert_eq!(o.user.as_ref().map(EtcdUser::name), Some("a"));

        let dir = tempfile_dir();
        let file = dir.join("pw");
        std::fs::write(&file, "from-file\nignored\n").unwrap();
        let f = file.to_str().unwrap();
        let o = options(&["--user", "a", "--password-file", f], &[]).unwrap();
        assert!(o.user.is_some());

        let e = options(&["--user", "a"], &[]).unwrap_err();
        assert!(e.contains("no password"), "{e}");
        let e = options(&["--password-file", f], &[]).unwrap_err();
        assert!(e.contains("needs --user"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn no_password_in_debug_output() {
        let cli = Cli::try_parse_from(["t", "--user", "agent:hunter2"]).unwrap();
        let shown = format!("{cli:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        let o = options(&["--user", "agent:hunter2"], &[]).unwrap();
        let shown = format!("{o:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn tls_flags_need_a_ca_and_go_in_pairs() {
        assert!(options(&[], &[]).unwrap().tls.is_none());
        let e = options(&["--cert", "c.pem", "--key", "k.pem"], &[]).unwrap_err();
        assert!(e.contains("need --cacert"), "{e}");
        let e = options(&["--cacert", "/nonexistent/ca.pem"], &[]).unwrap_err();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
        let e = options(&["--cacert", "ca.pem", "--cert", "c.pem"], &[]).unwrap_err();
        assert!(e.contains("go together"), "{e}");
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("fleetcoord-cli-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
