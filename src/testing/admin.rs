//! etcd administration for the harness (users, roles, auth) through
//! etcd-client on a throwaway runtime: no etcdctl needed.

use std::future::Future;
use std::time::Duration;

use etcd_client as ec;

use crate::tls::{EtcdUser, Tls};
use crate::{Error, Result};

/// Where and how the harness reaches its etcd as an administrator.
pub(crate) struct Admin {
    /// `host:port` client endpoints.
    pub(crate) endpoints: Vec<String>,
    pub(crate) tls: Option<Tls>,
    /// `None` before auth is enabled.
    pub(crate) root: Option<EtcdUser>,
}

/// How long one administrative step may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(20);

fn admin_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Io(std::io::Error::other(format!("test etcd: {what}: {e}")))
}

impl Admin {
    fn block_on<T>(
        &self,
        what: &str,
        work: impl FnOnce(
            ec::Client,
        )
            -> Box<dyn Future<Output = std::result::Result<T, ec::Error>> + Unpin>,
    ) -> Result<T> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let urls: Vec<String> = self
            .endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect();
        let mut options = ec::ConnectOptions::new();
        if let Some(tls) = &self.tls {
            options = options.with_tls(crate::driver::connect::tls_options(tls));
        }
        if let Some(root) = &self.root {
            options = options.with_user(root.name(), root.password());
        }
        runtime.block_on(async move {
            let attempt = async {
                let client = ec::Client::connect(&urls, Some(options)).await?;
                work(client).await
            };
            match tokio::time::timeout(ADMIN_TIMEOUT, attempt).await {
                Ok(result) => result.map_err(|e| admin_error(what, e)),
                Err(_) => Err(admin_error(what, "no answer")),
            }
        })
    }

    /// Create `root` with the root role and enable authentication.
    pub(crate) fn enable_auth(&self, root_password: &str) -> Result<()> {
        let password = root_password.to_string();
        self.block_on("enabling auth", move |mut c| {
            Box::new(Box::pin(async move {
                c.user_add("root", password, None).await?;
                c.user_grant_role("root", "root").await?;
                c.auth_enable().await?;
                Ok(())
            }))
        })
    }

    /// A user with its own role; with `prefix`, the role may read and write
    /// every key under it and nothing else.
    pub(crate) fn create_user(
        &self,
        name: &str,
        password: &str,
        prefix: Option<&str>,
    ) -> Result<()> {
        let (name, password) = (name.to_string(), password.to_string());
        let prefix = prefix.map(str::to_string);
        self.block_on("creating a user", move |mut c| {
            Box::new(Box::pin(async move {
                c.user_add(name.clone(), password, None).await?;
                if let Some(prefix) = prefix {
                    let role = format!("{name}-role");
                    c.role_add(role.clone()).await?;
                    c.role_grant_permission(
                        role.clone(),
                        ec::Permission::read_write(prefix).with_prefix(),
                    )
                    .await?;
                    c.user_grant_role(name, role).await?;
                }
                Ok(())
            }))
        })
    }

    /// This member's current revision (its status).
    pub(crate) fn revision(&self) -> Result<i64> {
        self.block_on("reading the revision", move |mut c| {
            Box::new(Box::pin(async move {
                let status = c.status().await?;
                Ok(status.header().map_or(0, |h| h.revision()))
            }))
        })
    }

    /// This member's hash of its keys up to `revision` (etcd's HashKV).
    pub(crate) fn hash_kv(&self, revision: i64) -> Result<u32> {
        self.block_on("hashing the keys", move |mut c| {
            Box::new(Box::pin(
                async move { Ok(c.hash_kv(revision).await?.hash()) },
            ))
        })
    }
}
