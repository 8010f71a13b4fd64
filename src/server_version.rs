//! Which etcd the handle talks to, and what that release is known to break.
//!
//! [`Etcd::connect`](crate::Etcd::connect) already asks every member for
//! its status when it probes them; the version comes from the first
//! answer, in endpoint order (no request of its own). The table of [`KnownDefect`]s is a pure
//! function of the version string ([`etcd_defects`]), so it is tested
//! against made-up versions.
//!
//! Sources: docs/etcd-notes.md, "Leases revoked early", and the etcd
//! issues each defect names.

use std::fmt;

/// An etcd release as its member reports it (`3.4.23`, `3.5.0-rc.1`):
/// `MAJOR.MINOR.PATCH`, optionally a `-pre-release` and a `+build`
/// suffix, as in semantic versioning.
///
/// Ordering with [`ServerVersion::is_older_than`] follows semantic
/// versioning: a pre-release comes before its release (`3.4.31-rc.1` is
/// older than `3.4.31`), build metadata is ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerVersion {
    major: u64,
    minor: u64,
    patch: u64,
    pre_release: Option<String>,
    raw: String,
}

impl ServerVersion {
    /// `raw` read as a version, or `None` when it is not one
    /// (`MAJOR.MINOR.PATCH` of decimal numbers, then an optional non-empty
    /// `-pre-release`, then an optional `+build`; a leading `v` and
    /// surrounding whitespace are ignored). Never panics.
    pub fn parse(raw: &str) -> Option<ServerVersion> {
        let text = raw.trim();
        let text = text.strip_prefix('v').unwrap_or(text);
        let text = match text.split_once('+') {
            Some((before, build)) if !build.is_empty() => before,
            Some(_) => return None,
            None => text,
        };
        let (core, pre_release) = match text.split_once('-') {
            Some((_, "")) => return None,
            Some((core, pre)) => (core, Some(pre.to_string())),
            None => (text, None),
        };
        let mut numbers = core.split('.').map(|n| {
            if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                n.parse::<u64>().ok()
            } else {
                None
            }
        });
        let (Some(Some(major)), Some(Some(minor)), Some(Some(patch)), None) = (
            numbers.next(),
            numbers.next(),
            numbers.next(),
            numbers.next(),
        ) else {
            return None;
        };
        Some(ServerVersion {
            major,
            minor,
            patch,
            pre_release,
            raw: raw.trim().to_string(),
        })
    }

    /// The major version (3 for `3.4.23`).
    pub fn major(&self) -> u64 {
        self.major
    }

    /// The minor version (4 for `3.4.23`).
    pub fn minor(&self) -> u64 {
        self.minor
    }

    /// The patch version (23 for `3.4.23`).
    pub fn patch(&self) -> u64 {
        self.patch
    }

    /// The pre-release part (`rc.1` for `3.4.23-rc.1`), if any.
    pub fn pre_release(&self) -> Option<&str> {
        self.pre_release.as_deref()
    }

    /// The version exactly as the member reported it (surrounding
    /// whitespace removed).
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// Whether this version comes before release `major.minor.patch` (a
    /// pre-release of that release does).
    pub fn is_older_than(&self, major: u64, minor: u64, patch: u64) -> bool {
        let mine = (self.major, self.minor, self.patch);
        mine < (major, minor, patch)
            || (mine == (major, minor, patch) && self.pre_release.is_some())
    }

    /// The known lease, watch and consistency defects of this release,
    /// most severe first; empty when none is known (3.4.31 and later 3.4,
    /// 3.5.13 and later 3.5, 3.6 and later). A release older than 3.4 gives
    /// only [`KnownDefect::Unsupported`].
    pub fn known_defects(&self) -> Vec<KnownDefect> {
        let mut defects = Vec::new();
        let fixed_in = match (self.major, self.minor) {
            (m, n) if (m, n) < (3, 4) => {
                defects.push(KnownDefect::Unsupported);
                return defects;
            }
            (3, 4) if self.is_older_than(3, 4, 31) => "3.4.31",
            (3, 5) if self.is_older_than(3, 5, 13) => "3.5.13",
            _ => return defects,
        };
        if self.major == 3 && self.minor == 5 && self.is_older_than(3, 5, 3) {
            defects.push(KnownDefect::InconsistencyAfterKill);
        }
        defects.push(KnownDefect::EarlyLeaseRevoke { fixed_in });
        defects.push(KnownDefect::LostWatchEvents { fixed_in });
        defects
    }
}

impl fmt::Display for ServerVersion {
    /// The version as the member reported it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

/// A known etcd defect that weakens what fleetcoord can promise, with the
/// release that fixes it. `Display` gives one line naming the defect, its
/// etcd issues and the fixing release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KnownDefect {
    /// A raft leader that stalls (paused, overloaded) and resumes can revoke
    /// leases that clients kept renewing with the new leader, deleting their
    /// keys before their TTL: a leadership or lock can pass to someone else
    /// before the holder's `lost()` (etcd-io/etcd#15247). Mitigated in
    /// `fixed_in` (3.4.31, 3.5.13) by etcd-io/etcd#16822; still seen on
    /// 3.5.30 with a paused raft leader (docs/etcd-notes.md, "Leases
    /// revoked early").
    EarlyLeaseRevoke {
        /// The first release of this line with the mitigation.
        fixed_in: &'static str,
    },
    /// A watch that starts at or resumes near a compacted revision can miss
    /// events (etcd-io/etcd#17610, etcd-io/etcd#17612). Fixed in `fixed_in`
    /// (3.4.31, 3.5.13).
    LostWatchEvents {
        /// The first release of this line with the fix.
        fixed_in: &'static str,
    },
    /// 3.5.0 to 3.5.2: members can diverge (data inconsistency) after a
    /// member is killed (etcd-io/etcd#13766). Fixed in 3.5.3.
    InconsistencyAfterKill,
    /// Older than 3.4: fleetcoord is neither supported nor tested there.
    Unsupported,
}

impl KnownDefect {
    /// The etcd issues that describe the defect, as `etcd-io/etcd#N`.
    pub fn issues(&self) -> &'static [&'static str] {
        match self {
            KnownDefect::EarlyLeaseRevoke { .. } => &["etcd-io/etcd#15247"],
            KnownDefect::LostWatchEvents { .. } => &["etcd-io/etcd#17610", "etcd-io/etcd#17612"],
            KnownDefect::InconsistencyAfterKill => &["etcd-io/etcd#13766"],
            KnownDefect::Unsupported => &[],
        }
    }

    /// The first release of the version's line that fixes (or, for
    /// [`KnownDefect::EarlyLeaseRevoke`], mitigates) the defect; `None` for
    /// [`KnownDefect::Unsupported`].
    pub fn fixed_in(&self) -> Option<&'static str> {
        match self {
            KnownDefect::EarlyLeaseRevoke { fixed_in }
            | KnownDefect::LostWatchEvents { fixed_in } => Some(fixed_in),
            KnownDefect::InconsistencyAfterKill => Some("3.5.3"),
            KnownDefect::Unsupported => None,
        }
    }
}

impl fmt::Display for KnownDefect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KnownDefect::EarlyLeaseRevoke { fixed_in } => write!(
                f,
                "leases revoked early by a stalled ex-leader (etcd-io/etcd#15247; \
                 mitigated in {fixed_in} by etcd-io/etcd#16822)"
            ),
            KnownDefect::LostWatchEvents { fixed_in } => write!(
                f,
                "watch events lost after a compaction (etcd-io/etcd#17610, \
                 etcd-io/etcd#17612; fixed in {fixed_in})"
            ),
            KnownDefect::InconsistencyAfterKill => f.write_str(
                "data inconsistency after a member is killed (etcd-io/etcd#13766; fixed in 3.5.3)",
            ),
            KnownDefect::Unsupported => {
                f.write_str("etcd older than 3.4 is unsupported and untested by fleetcoord")
            }
        }
    }
}

/// The known defects of the etcd release `version` (as a member reports
/// it, e.g. `"3.4.23"`), most severe first: see
/// [`ServerVersion::known_defects`]. Pure; empty when none is known and
/// when `version` is not a version ([`ServerVersion::parse`]).
///
/// ```
/// use fleetcoord::{etcd_defects, KnownDefect};
///
/// assert!(etcd_defects("3.4.23").contains(&KnownDefect::EarlyLeaseRevoke { fixed_in: "3.4.31" }));
/// assert!(etcd_defects("3.5.13").is_empty());
/// assert!(etcd_defects("garbage").is_empty());
/// ```
pub fn etcd_defects(version: &str) -> Vec<KnownDefect> {
    ServerVersion::parse(version)
        .map(|v| v.known_defects())
        .unwrap_or_default()
}

/// How long the one-line version warning may be: it reaches the stderr
/// of every CLI command, where a paragraph would bury the command's own
/// output.
pub(crate) const WARNING_MAX_CHARS: usize = 120;

/// The versions warned about in this process already: every connect
/// reads the version, but the warning is worth saying once per process
/// and version (a program that reconnects, or opens several handles,
/// would otherwise repeat it).
static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// The version `member` reported at connect, read; when it has known
/// defects, logs one short warning line the first time this process sees
/// the version ([`warning_line`], at most [`WARNING_MAX_CHARS`]), and
/// every time the full detail at debug level (`RUST_LOG=fleetcoord=debug`;
/// one debug line instead when the version cannot be read). Records it in
/// the metrics.
pub(crate) fn read_at_connect(raw: &str, member: u64) -> Option<ServerVersion> {
    let Some(version) = ServerVersion::parse(raw) else {
        log::debug!(
            "etcd member {member:x} reported version {raw:?}, which is not \
             MAJOR.MINOR.PATCH: its known defects are not checked"
        );
        return None;
    };
    crate::metrics::server_version(version.as_str());
    let defects = version.known_defects();
    if !defects.is_empty() {
        let list: Vec<String> = defects.iter().map(ToString::to_string).collect();
        log::debug!(
            "etcd {version} (member {member:x}) has known defects: {}; fenced writes \
             (txn_if_leader, txn_if_held, FLEETCOORD_FENCING_TOKEN) still exclude a \
             stale holder's effects (README, \"Guarantees\")",
            list.join("; ")
        );
        if first_sight(version.as_str()) {
            log::warn!("{}", warning_line(&version, &defects));
        }
    }
    Some(version)
}

/// Whether `version` is warned about for the first time in this process
/// (and from now on counts as warned about).
fn first_sight(version: &str) -> bool {
    // A panic elsewhere while holding the lock leaves a list still usable.
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if warned.iter().any(|v| v == version) {
        return false;
    }
    warned.push(version.to_string());
    true
}

/// The short name of a defect, for the one-line warning.
fn short_name(defect: &KnownDefect) -> &'static str {
    match defect {
        KnownDefect::EarlyLeaseRevoke { .. } => "early lease revokes",
        KnownDefect::LostWatchEvents { .. } => "lost watch events",
        KnownDefect::InconsistencyAfterKill => "member divergence",
        KnownDefect::Unsupported => "older than 3.4, untested",
    }
}

/// One line naming the version, its defects in a few words each and the
/// release that fixes them all, with where the detail is: the README
/// section that explains what they mean for fenced writes.
fn warning_line(version: &ServerVersion, defects: &[KnownDefect]) -> String {
    let names: Vec<&str> = defects.iter().map(short_name).collect();
    let latest_fix = defects
        .iter()
        .filter_map(KnownDefect::fixed_in)
        .filter_map(ServerVersion::parse)
        .max_by_key(|v| (v.major(), v.minor(), v.patch()));
    let fix = match latest_fix {
        Some(v) => format!("; fixed in {v}"),
        None => String::new(),
    };
    let line = format!(
        "etcd {version} has known defects: {}{fix} (README, \"Known etcd defects\")",
        names.join(", ")
    );
    if line.chars().count() <= WARNING_MAX_CHARS {
        return line;
    }
    // 3.5.0 to 3.5.2 have three, and a version may carry a long build
    // suffix: the count, then, and the names at debug level.
    let (major, minor, patch) = (version.major(), version.minor(), version.patch());
    format!(
        "etcd {major}.{minor}.{patch} has {} known defects{fix} (README, \"Known etcd defects\")",
        defects.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const REVOKE_34: KnownDefect = KnownDefect::EarlyLeaseRevoke { fixed_in: "3.4.31" };
    const WATCH_34: KnownDefect = KnownDefect::LostWatchEvents { fixed_in: "3.4.31" };
    const REVOKE_35: KnownDefect = KnownDefect::EarlyLeaseRevoke { fixed_in: "3.5.13" };
    const WATCH_35: KnownDefect = KnownDefect::LostWatchEvents { fixed_in: "3.5.13" };

    #[test]
    fn parses_releases_pre_releases_and_build_metadata() {
        let v = ServerVersion::parse("3.4.23").expect("a version");
        assert_eq!((v.major(), v.minor(), v.patch()), (3, 4, 23));
        assert_eq!((v.pre_release(), v.as_str()), (None, "3.4.23"));
        let v = ServerVersion::parse(" v3.4.23-rc.1+git ").expect("a version");
        assert_eq!((v.major(), v.minor(), v.patch()), (3, 4, 23));
        assert_eq!(v.pre_release(), Some("rc.1"));
        assert_eq!(v.to_string(), "v3.4.23-rc.1+git");
    }

    #[test]
    fn anything_else_is_no_version() {
        for raw in [
            "",
            "garbage",
            "3",
            "3.4",
            "3.4.",
            "3.4.23.1",
            "3.4.x",
            "3.4.-1",
            "3.4.23-",
            "3.4.23+",
            "-3.4.23",
            "3..23",
            "3.4.99999999999999999999999",
            "३.४.२३",
        ] {
            assert_eq!(ServerVersion::parse(raw), None, "{raw:?}");
            assert_eq!(etcd_defects(raw), Vec::new(), "{raw:?}");
        }
    }

    #[test]
    fn the_34_line_is_fixed_in_3_4_31() {
        assert_eq!(etcd_defects("3.4.0"), vec![REVOKE_34, WATCH_34]);
        assert_eq!(etcd_defects("3.4.23"), vec![REVOKE_34, WATCH_34]);
        assert_eq!(etcd_defects("3.4.30"), vec![REVOKE_34, WATCH_34]);
        assert_eq!(etcd_defects("3.4.23-rc.1"), vec![REVOKE_34, WATCH_34]);
        assert_eq!(etcd_defects("3.4.31-rc.0"), vec![REVOKE_34, WATCH_34]);
        assert_eq!(etcd_defects("3.4.31"), vec![]);
        assert_eq!(etcd_defects("3.4.31+build"), vec![]);
        assert_eq!(etcd_defects("3.4.37"), vec![]);
    }

    #[test]
    fn the_35_line_is_fixed_in_3_5_13_and_3_5_3() {
        let divergent = KnownDefect::InconsistencyAfterKill;
        assert_eq!(etcd_defects("3.5.0"), vec![divergent, REVOKE_35, WATCH_35]);
        assert_eq!(etcd_defects("3.5.1"), vec![divergent, REVOKE_35, WATCH_35]);
        assert_eq!(etcd_defects("3.5.2"), vec![divergent, REVOKE_35, WATCH_35]);
        assert_eq!(
            etcd_defects("3.5.3-rc.1"),
            vec![divergent, REVOKE_35, WATCH_35]
        );
        assert_eq!(etcd_defects("3.5.3"), vec![REVOKE_35, WATCH_35]);
        assert_eq!(etcd_defects("3.5.12"), vec![REVOKE_35, WATCH_35]);
        assert_eq!(etcd_defects("3.5.13"), vec![]);
        assert_eq!(etcd_defects("3.5.30"), vec![]);
    }

    #[test]
    fn later_lines_have_none_and_earlier_ones_are_unsupported() {
        assert_eq!(etcd_defects("3.6.0"), vec![]);
        assert_eq!(etcd_defects("3.6.0-alpha.0"), vec![]);
        assert_eq!(etcd_defects("4.0.0"), vec![]);
        assert_eq!(etcd_defects("3.3.27"), vec![KnownDefect::Unsupported]);
        assert_eq!(etcd_defects("2.3.8"), vec![KnownDefect::Unsupported]);
        assert_eq!(etcd_defects("3.4.0-rc.0"), vec![REVOKE_34, WATCH_34]);
    }

    #[test]
    fn each_defect_names_its_issue_and_fix() {
        assert_eq!(REVOKE_34.issues(), ["etcd-io/etcd#15247"]);
        assert_eq!(REVOKE_35.fixed_in(), Some("3.5.13"));
        assert_eq!(
            KnownDefect::InconsistencyAfterKill.fixed_in(),
            Some("3.5.3")
        );
        assert_eq!(KnownDefect::Unsupported.fixed_in(), None);
        let line = REVOKE_34.to_string();
        assert!(line.contains("#15247") && line.contains("3.4.31"), "{line}");
        let line = WATCH_35.to_string();
        assert!(
            line.contains("#17610") && line.contains("#17612") && line.contains("3.5.13"),
            "{line}"
        );
    }

    #[test]
    fn the_warning_is_one_short_line_naming_the_fix() {
        for raw in [
            "3.4.23",
            "3.5.0",
            "3.5.2-rc.1+build.7",
            "3.3.27",
            "2.3.8",
            "3.5.1-rc.1+a-very-long-build-suffix-0123456789",
        ] {
            let version = ServerVersion::parse(raw).expect("a version");
            let line = warning_line(&version, &version.known_defects());
            assert!(line.chars().count() <= WARNING_MAX_CHARS, "{line}");
            assert!(!line.contains('\n') && line.contains(&raw[..5]), "{line}");
        }
        let v = ServerVersion::parse("3.5.0").expect("a version");
        let line = warning_line(&v, &v.known_defects());
        // 3.5.3 fixes one of them, 3.5.13 all.
        assert!(line.contains("fixed in 3.5.13"), "{line}");
    }

    #[test]
    fn each_version_is_warned_about_once_per_process() {
        assert!(first_sight("9.9.9-test"));
        assert!(!first_sight("9.9.9-test"));
        assert!(first_sight("9.9.8-test"));
    }

    #[test]
    fn an_unreadable_version_is_no_version_and_no_panic() {
        assert_eq!(read_at_connect("garbage", 1), None);
        assert_eq!(read_at_connect("", 1), None);
        let v = read_at_connect("3.5.16", 1).expect("a version");
        assert_eq!(v.as_str(), "3.5.16");
    }
}
