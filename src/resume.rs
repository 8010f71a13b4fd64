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
