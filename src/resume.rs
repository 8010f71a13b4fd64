//! [`Resume`]: a host registration handed from one process to the next.

use crate::error::{Error, Result};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;
use uuid::Uuid;

/// The first line of [`Resume`]'s text form, with its format version.
const HEADER: &str = "fleetcoord-resume 1";

/// What [`HostLiveness::detach`](crate::HostLiveness::detach) leaves behind
/// so that the next process can
/// [`resume`](crate::HostLiveness::resume) the registration instead of
/// making a new one: the lease, the host key and the incarnation of that
/// key (its create revision) as the detached registration last wrote it.
///
/// It holds no secret (a lease id lets its holder renew or revoke the
/// lease, which anyone with access to the key space can do anyway), but
/// store it where only the agent's next incarnation reads it.
///
/// Its text form ([`fmt::Display`] / [`FromStr`]) is a few `name value`
/// lines under a versioned header, for a state file:
///
/// ```
/// use fleetcoord::Resume;
///
/// let text = "fleetcoord-resume 1\n\
///             host_id 7d444840-9dc0-11d1-b245-5ffdce74fad2\n\
///             key /coord/hosts/7d444840-9dc0-11d1-b245-5ffdce74fad2\n\
///             lease 7587862119431374600\n\
///             create_revision 42\n\
///             mod_revision 45\n\
///             incarnation 3\n\
///             ttl_secs 5\n";
/// let resume: Resume = text.parse()?;
/// assert_eq!(resume.create_revision, 42);
/// assert_eq!(resume.to_string().parse::<Resume>()?, resume);
/// # Ok::<(), fleetcoord::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Resume {
    /// The host id registered.
    pub host_id: Uuid,
    /// The host key (`<prefix><host id>`).
    pub key: String,
    /// The lease the key is bound to.
    pub lease: i64,
    /// The key's create revision: which incarnation of the key this is.
    pub create_revision: i64,
    /// The key's mod revision as the detached registration last wrote it.
    /// A resume is refused if the key was written since.
    pub mod_revision: i64,
    /// How many processes held this registration before the next one: the
    /// resumed registration counts `incarnation + 1`
    /// ([`HostLiveness::incarnation`](crate::HostLiveness::incarnation)).
    pub incarnation: u64,
    /// The lease's requested TTL.
    pub ttl: Duration,
}

impl fmt::Display for Resume {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{HEADER}")?;
        writeln!(f, "host_id {}", self.host_id.hyphenated())?;
        writeln!(f, "key {}", escape(&self.key))?;
        writeln!(f, "lease {}", self.lease)?;
        writeln!(f, "create_revision {}", self.create_revision)?;
        writeln!(f, "mod_revision {}", self.mod_revision)?;
        writeln!(f, "incarnation {}", self.incarnation)?;
        writeln!(f, "ttl_secs {}", self.ttl.as_secs())
    }
}

impl FromStr for Resume {
    type Err = Error;

    /// Reads the text form; every field must be present exactly once.
    fn from_str(text: &str) -> Result<Resume> {
        let bad = |why: String| Error::invalid("resume", why);
        let mut lines = text.lines();
        if lines.next().map(str::trim_end) != Some(HEADER) {
            return Err(bad(format!("does not start with {HEADER:?}")));
        }
        let mut fields: [Option<&str>; 7] = [None; 7];
        const NAMES: [&str; 7] = [
            "host_id",
            "key",
            "lease",
            "create_revision",
            "mod_revision",
            "incarnation",
            "ttl_secs",
        ];
        for line in lines.map(str::trim_end).filter(|l| !l.is_empty()) {
            let (name, value) = line.split_once(' ').unwrap_or((line, ""));
            let Some(i) = NAMES.iter().position(|n| *n == name) else {
                return Err(bad(format!("unknown field {name:?}")));
            };
            if fields[i].replace(value).is_some() {
                return Err(bad(format!("field {name:?} given twice")));
            }
        }
        let field = |i: usize| fields[i].ok_or_else(|| bad(format!("no {:?} field", NAMES[i])));
        fn num<T: FromStr>(name: &str, value: &str) -> Result<T> {
            value
                .parse()
                .map_err(|_| Error::invalid("resume", format!("{name} {value:?} is not a number")))
        }
        let host_id =
            Uuid::parse_str(field(0)?).map_err(|e| bad(format!("host_id is not a UUID: {e}")))?;
        let key = unescape(field(1)?).ok_or_else(|| bad("key is badly escaped".into()))?;
        if !key.ends_with(&host_id.hyphenated().to_string()) {
            return Err(bad(format!("key {key:?} is not host {host_id}'s")));
        }
        let lease: i64 = num("lease", field(2)?)?;
        let create_revision: i64 = num("create_revision", field(3)?)?;
        let mod_revision: i64 = num("mod_revision", field(4)?)?;
        if lease == 0 || create_revision <= 0 || mod_revision < create_revision {
            return Err(bad(format!(
                "lease {lease}, create_revision {create_revision}, mod_revision \
                 {mod_revision} do not describe a written key"
            )));
        }
        Ok(Resume {
            host_id,
            key,
            lease,
            create_revision,
            mod_revision,
            incarnation: num("incarnation", field(5)?)?,
            ttl: Duration::from_secs(num("ttl_secs", field(6)?)?),
        })
    }
}

/// The first line of [`SessionResume`]'s text form, with its format
/// version.
const SESSION_HEADER: &str = "fleetcoord-session-resume 1";

/// What [`Session::detach`](crate::Session::detach) leaves behind so that
/// the next process can [`Session::resume`](crate::Session::resume) the
/// session's lease, with the host registrations on it, instead of
/// granting a new one: watchers then see no `Down` and no `Up` for a
/// restart within the TTL.
///
/// It carries the lease and the host keys only. Leaderships, locks and
/// shard ownerships were ended, and their keys deleted, before `detach`
/// returned: the next process campaigns, locks and joins again.
///
/// Its text form ([`fmt::Display`] / [`FromStr`]) is a few `name value`
/// lines under a versioned header, for a state file; a host line is
/// `host <host id> <mod revision> <incarnation> <key>`:
///
/// ```
/// use fleetcoord::SessionResume;
///
/// let text = "fleetcoord-session-resume 1\n\
///             lease 7587862119431374600\n\
///             ttl_secs 5\n\
///             host 7d444840-9dc0-11d1-b245-5ffdce74fad2 45 3 \
///                  /coord/hosts/7d444840-9dc0-11d1-b245-5ffdce74fad2\n";
/// let resume: SessionResume = text.parse()?;
/// assert_eq!(resume.hosts[0].incarnation, 3);
/// assert_eq!(resume.to_string().parse::<SessionResume>()?, resume);
/// # Ok::<(), fleetcoord::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionResume {
    /// The session's lease, left alive.
    pub lease: i64,
    /// The lease's requested TTL: a resume later than this after the
    /// detach finds the lease expired and starts afresh.
    pub ttl: Duration,
    /// The host registrations on the lease, for
    /// [`HostLiveness::with_session`](crate::HostLiveness::with_session)
    /// on the resumed session to take over.
    pub hosts: Vec<HostResume>,
}

/// A host registration on a detached session: see [`SessionResume`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostResume {
    /// The host id registered.
    pub host_id: Uuid,
    /// The host key (`<prefix><host id>`).
    pub key: String,
    /// The key's mod revision as the detached registration last knew it:
    /// the next registration's first write applies only if the key is
    /// still as it was left.
    pub mod_revision: i64,
    /// How many processes held this registration before the next one (see
    /// [`HostLiveness::incarnation`](crate::HostLiveness::incarnation)).
    pub incarnation: u64,
}

impl fmt::Display for SessionResume {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{SESSION_HEADER}")?;
        writeln!(f, "lease {}", self.lease)?;
        writeln!(f, "ttl_secs {}", self.ttl.as_secs())?;
        for h in &self.hosts {
            writeln!(
                f,
                "host {} {} {} {}",
                h.host_id.hyphenated(),
                h.mod_revision,
                h.incarnation,
                escape(&h.key)
            )?;
        }
        Ok(())
    }
}

impl FromStr for SessionResume {
    type Err = Error;

    /// Reads the text form: `lease` and `ttl_secs` exactly once, any
    /// number of `host` lines.
    fn from_str(text: &str) -> Result<SessionResume> {
        let bad = |why: String| Error::invalid("resume", why);
        let mut lines = text.lines();
        if lines.next().map(str::trim_end) != Some(SESSION_HEADER) {
            return Err(bad(format!("does not start with {SESSION_HEADER:?}")));
        }
        fn num<T: FromStr>(name: &str, value: &str) -> Result<T> {
            value
                .parse()
                .map_err(|_| Error::invalid("resume", format!("{name} {value:?} is not a number")))
        }
        let (mut lease, mut ttl, mut hosts) = (None, None, Vec::new());
        for line in lines.map(str::trim_end).filter(|l| !l.is_empty()) {
            let (name, value) = line.split_once(' ').unwrap_or((line, ""));
            match name {
                "lease" if lease.is_none() => lease = Some(num::<i64>("lease", value)?),
                "ttl_secs" if ttl.is_none() => ttl = Some(num::<u64>("ttl_secs", value)?),
                "host" => {
                    let mut parts = value.splitn(4, ' ');
                    let mut part = |what: &str| {
                        parts
                            .next()
                            .ok_or_else(|| bad(format!("host line {value:?} has no {what}")))
                    };
                    let host_id = Uuid::parse_str(part("host id")?)
                        .map_err(|e| bad(format!("host id is not a UUID: {e}")))?;
                    let mod_revision: i64 = num("mod revision", part("mod revision")?)?;
                    let incarnation: u64 = num("incarnation", part("incarnation")?)?;
                    let key =
                        unescape(part("key")?).ok_or_else(|| bad("key is badly escaped".into()))?;
                    if !key.ends_with(&host_id.hyphenated().to_string()) {
                        return Err(bad(format!("key {key:?} is not host {host_id}'s")));
                    }
                    if mod_revision <= 0 {
                        return Err(bad(format!("mod revision {mod_revision} names no write")));
                    }
                    hosts.push(HostResume {
                        host_id,
                        key,
                        mod_revision,
                        incarnation,
                    });
                }
                _ => return Err(bad(format!("unexpected field {name:?}"))),
            }
        }
        let lease = lease.ok_or_else(|| bad("no \"lease\" field".into()))?;
        if lease == 0 {
            return Err(bad("lease 0 names no lease".into()));
        }
        let ttl = ttl.ok_or_else(|| bad("no \"ttl_secs\" field".into()))?;
        Ok(SessionResume {
            lease,
            ttl: Duration::from_secs(ttl),
            hosts,
        })
    }
}

/// Keeps the key on one line: `%`, line feed and carriage return as
/// `%25`, `%0A`, `%0D`.
fn escape(key: &str) -> String {
    key.replace('%', "%25")
        .replace('\n', "%0A")
        .replace('\r', "%0D")
}

fn unescape(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 3)?;
        out.push(match code {
            "25" => '%',
            "0A" => '\n',
            "0D" => '\r',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Resume {
        Resume {
            host_id: Uuid::from_u128(7),
            key: format!("/a%b\nc/{}", Uuid::from_u128(7)),
            lease: -5,
            create_revision: 3,
            mod_revision: 9,
            incarnation: 2,
            ttl: Duration::from_secs(4),
        }
    }

    fn session_sample() -> SessionResume {
        SessionResume {
            lease: 0x1234,
            ttl: Duration::from_secs(3),
            hosts: vec![HostResume {
                host_id: Uuid::from_u128(7),
                key: format!("/a b%\n/{}", Uuid::from_u128(7)),
                mod_revision: 11,
                incarnation: 4,
            }],
        }
    }

    #[test]
    fn session_text_form_round_trips_and_refuses_what_is_not_one() {
        let r = session_sample();
        let good = r.to_string();
        assert_eq!(good.parse::<SessionResume>().ok(), Some(r));
        let none = SessionResume {
            hosts: vec![],
            ..session_sample()
        };
        assert_eq!(none.to_string().parse::<SessionResume>().ok(), Some(none));
        for bad in [
            String::new(),
            good.replace("fleetcoord-session-resume 1", "fleetcoord-resume 1"),
            good.replace("lease 4660", "lease 0"),
            good.replace("lease 4660\n", ""),
            good.replace("ttl_secs 3\n", ""),
            format!("{good}lease 4\n"),
            good.replace(" 11 ", " 0 "),
            good.replace(" 4 ", " x "),
            good.replace("%0A", "%0"),
            good.replace(&format!("/{}", Uuid::from_u128(7)), "/x"),
            format!("{good}host {}\n", Uuid::from_u128(7)),
        ] {
            assert!(bad.parse::<SessionResume>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn text_form_round_trips() {
        let r = sample();
        assert_eq!(r.to_string().parse::<Resume>().ok(), Some(r));
    }

    #[test]
    fn text_form_refuses_what_is_not_a_resume() {
        let good = sample().to_string();
        for bad in [
            String::new(),
            good.replace("fleetcoord-resume 1", "fleetcoord-resume 2"),
            good.replace("lease -5", "lease x"),
            good.replace("create_revision 3", "create_revision 0"),
            good.replace("mod_revision 9", "mod_revision 2"),
            good.replace("incarnation 2\n", ""),
            format!("{good}lease 4\n"),
            good.replace("%0A", "%0"),
            good.replace(&Uuid::from_u128(7).to_string(), "x"),
        ] {
            assert!(bad.parse::<Resume>().is_err(), "{bad:?}");
        }
    }
}
