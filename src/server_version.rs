//! Which etcd the handle talks to, and what that release is known to break.
//!
//! [`Etcd::connect`](crate::Etcd::connect) already asks every member for
//! its status when it probes them: each member's version comes from its
//! answer (no request of its own), and again from the health monitor's
//! probe when a member it had stopped using answers again
//! ([`MemberVersions`]). The table of [`KnownDefect`]s is a pure
//! function of the version string ([`etcd_defects`]), so it is tested
//! against made-up versions.
//!
//! Sources: docs/etcd-notes.md, "Leases revoked early", and the etcd
//! issues each defect names.

use crate::driver::ServerStatus;
use std::collections::BTreeMap;
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

    /// The known lease, watch and consistency defects of this release, in
    /// the order of [`KnownDefect`]'s table; empty when none is known (3.5.28
    /// and later 3.5, 3.6.9 and later 3.6, 3.7 and later). Every 3.4 has at
    /// least [`KnownDefect::EndOfLife`]. A release older than 3.4 gives only
    /// [`KnownDefect::Unsupported`].
    pub fn known_defects(&self) -> Vec<KnownDefect> {
        let mut defects = Vec::new();
        let line = (self.major, self.minor);
        if line < (3, 4) {
            defects.push(KnownDefect::Unsupported);
            return defects;
        }
        if line == (3, 5) && self.is_older_than(3, 5, 3) {
            defects.push(KnownDefect::InconsistencyAfterKill);
        }
        let compaction_fix = match line {
            (3, 4) if self.is_older_than(3, 4, 31) => Some("3.4.31"),
            (3, 5) if self.is_older_than(3, 5, 13) => Some("3.5.13"),
            _ => None,
        };
        if let Some(fixed_in) = compaction_fix {
            defects.push(KnownDefect::EarlyLeaseRevoke { fixed_in });
            defects.push(KnownDefect::LostWatchEvents { fixed_in });
        }
        // 3.4 never got these fixes: its fix is 3.5's.
        let (renewal_fix, stale_fix) = match line {
            (3, 4) => (Some("3.5.23"), Some("3.5.28")),
            (3, 5) => (
                self.is_older_than(3, 5, 23).then_some("3.5.23"),
                self.is_older_than(3, 5, 28).then_some("3.5.28"),
            ),
            (3, 6) => (
                self.is_older_than(3, 6, 5).then_some("3.6.5"),
                self.is_older_than(3, 6, 9).then_some("3.6.9"),
            ),
            _ => (None, None),
        };
        if let Some(fixed_in) = renewal_fix {
            defects.push(KnownDefect::RevokedLeaseRenewed { fixed_in });
        }
        if let Some(fixed_in) = stale_fix {
            defects.push(KnownDefect::StaleReadsAfterPause { fixed_in });
        }
        if line == (3, 4) {
            defects.push(KnownDefect::EndOfLife);
        }
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
    /// A renewal of a lease that was already revoked can be answered with a
    /// positive TTL (etcd-io/etcd#20590), so a client may go on believing
    /// in a lease, and a leadership or lock on it, that is gone. Fixed in
    /// `fixed_in` (3.5.23, 3.6.5); never in 3.4.
    RevokedLeaseRenewed {
        /// The first release with the fix (of the same line, or of 3.5 for
        /// 3.4).
        fixed_in: &'static str,
    },
    /// After a member is paused and resumes, it can serve stale reads
    /// (etcd-io/etcd#20418). Fixed in `fixed_in` (3.5.28, 3.6.9); never in
    /// 3.4.
    StaleReadsAfterPause {
        /// The first release with the fix (of the same line, or of 3.5 for
        /// 3.4).
        fixed_in: &'static str,
    },
    /// The 3.4 line reached its end of life with 3.4.45 on 2026-06-01: it
    /// gets no more fixes, the ones above included. Upgrade to 3.5.20 or
    /// later (the step before 3.6).
    EndOfLife,
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
            KnownDefect::RevokedLeaseRenewed { .. } => &["etcd-io/etcd#20590"],
            KnownDefect::StaleReadsAfterPause { .. } => &["etcd-io/etcd#20418"],
            KnownDefect::EndOfLife | KnownDefect::Unsupported => &[],
        }
    }

    /// The first release that fixes (or, for
    /// [`KnownDefect::EarlyLeaseRevoke`], mitigates) the defect: of the
    /// version's line, or of the next line where its own has none; `None`
    /// for [`KnownDefect::Unsupported`] and [`KnownDefect::EndOfLife`].
    pub fn fixed_in(&self) -> Option<&'static str> {
        match self {
            KnownDefect::EarlyLeaseRevoke { fixed_in }
            | KnownDefect::LostWatchEvents { fixed_in }
            | KnownDefect::RevokedLeaseRenewed { fixed_in }
            | KnownDefect::StaleReadsAfterPause { fixed_in } => Some(fixed_in),
            KnownDefect::InconsistencyAfterKill => Some("3.5.3"),
            KnownDefect::EndOfLife | KnownDefect::Unsupported => None,
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
            KnownDefect::RevokedLeaseRenewed { fixed_in } => write!(
                f,
                "renewals of a revoked lease answered with a positive TTL \
                 (etcd-io/etcd#20590; fixed in {fixed_in})"
            ),
            KnownDefect::StaleReadsAfterPause { fixed_in } => write!(
                f,
                "stale reads from a member after a pause (etcd-io/etcd#20418; fixed in {fixed_in})"
            ),
            KnownDefect::EndOfLife => f.write_str(
                "etcd 3.4 is end-of-life since 2026-06-01 and gets no more fixes \
                 (upgrade to 3.5.20 or later)",
            ),
            KnownDefect::Unsupported => {
                f.write_str("etcd older than 3.4 is unsupported and untested by fleetcoord")
            }
        }
    }
}

/// The known defects of the etcd release `version` (as a member reports
/// it, e.g. `"3.4.23"`): see
/// [`ServerVersion::known_defects`]. Pure; empty when none is known and
/// when `version` is not a version ([`ServerVersion::parse`]).
///
/// ```
/// use fleetcoord::{etcd_defects, KnownDefect};
///
/// assert!(etcd_defects("3.4.23").contains(&KnownDefect::EarlyLeaseRevoke { fixed_in: "3.4.31" }));
/// assert!(etcd_defects("3.5.28").is_empty());
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

/// The defects warned about in this process already: every connect, and
/// every member that answers again, reads a version, but each defect is
/// worth saying once per process (a program that reconnects, opens
/// several handles or talks to several members would otherwise repeat
/// it).
static WARNED: std::sync::Mutex<Vec<KnownDefect>> = std::sync::Mutex::new(Vec::new());

/// The etcd versions the members of one [`crate::Etcd`] reported, by
/// member id: each member that answered at connect, again whenever the
/// health monitor takes a member back into use (it may have been upgraded
/// or downgraded meanwhile).
#[derive(Debug, Default)]
pub(crate) struct MemberVersions(parking_lot::Mutex<BTreeMap<u64, ServerVersion>>);

impl MemberVersions {
    /// Reads what a member said of itself ([`read`]) and keeps it as that
    /// member's version.
    pub(crate) fn record(&self, status: &ServerStatus) {
        if let Some(version) = read(&status.version, status.member_id) {
            self.0.lock().insert(status.member_id, version);
        }
    }

    /// The oldest version any member reported.
    pub(crate) fn oldest(&self) -> Option<ServerVersion> {
        self.all().into_iter().next().map(|(_, v)| v)
    }

    /// Every member's version, oldest first (then by member id).
    pub(crate) fn all(&self) -> Vec<(u64, ServerVersion)> {
        let mut all: Vec<(u64, ServerVersion)> =
            self.0.lock().iter().map(|(m, v)| (*m, v.clone())).collect();
        all.sort_by(|(ma, a), (mb, b)| age(a).cmp(&age(b)).then(ma.cmp(mb)));
        all
    }
}

/// A sort key that orders versions as [`ServerVersion::is_older_than`]
/// does: a pre-release before its release.
fn age(v: &ServerVersion) -> (u64, u64, u64, bool) {
    (v.major(), v.minor(), v.patch(), v.pre_release().is_none())
}

/// The version `member` reported, read; when it has known defects, logs
/// one short warning line naming those this process has not warned about
/// yet ([`warning_line`], at most [`WARNING_MAX_CHARS`]), and every time
/// the full detail at debug level (`RUST_LOG=fleetcoord=debug`; one debug
/// line instead when the version cannot be read). Records it in the
/// metrics.
pub(crate) fn read(raw: &str, member: u64) -> Option<ServerVersion> {
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
        let fresh = first_sight(&defects);
        if !fresh.is_empty() {
            log::warn!("{}", warning_line(&version, &fresh));
        }
    }
    Some(version)
}

/// The defects of `defects` warned about for the first time in this
/// process (from now on they count as warned about).
fn first_sight(defects: &[KnownDefect]) -> Vec<KnownDefect> {
    // A panic elsewhere while holding the lock leaves a list still usable.
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    let fresh: Vec<KnownDefect> = defects
        .iter()
        .filter(|d| !warned.contains(d))
        .copied()
        .collect();
    warned.extend(fresh.iter().copied());
    fresh
}

/// The short name of a defect, for the one-line warning.
fn short_name(defect: &KnownDefect) -> &'static str {
    match defect {
        KnownDefect::EarlyLeaseRevoke { .. } => "early lease revokes",
        KnownDefect::LostWatchEvents { .. } => "lost watch events",
        KnownDefect::InconsistencyAfterKill => "member divergence",
        KnownDefect::RevokedLeaseRenewed { .. } => "revoked leases renewed",
        KnownDefect::StaleReadsAfterPause { .. } => "stale reads after a pause",
        KnownDefect::EndOfLife => "end of life",
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
    const RENEWED_35: KnownDefect = KnownDefect::RevokedLeaseRenewed { fixed_in: "3.5.23" };
    const STALE_35: KnownDefect = KnownDefect::StaleReadsAfterPause { fixed_in: "3.5.28" };
    const EOL: KnownDefect = KnownDefect::EndOfLife;

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
    fn the_34_line_is_end_of_life_and_fixed_in_3_4_31_only_for_compaction() {
        let all = vec![REVOKE_34, WATCH_34, RENEWED_35, STALE_35, EOL];
        let late = vec![RENEWED_35, STALE_35, EOL];
        assert_eq!(etcd_defects("3.4.0"), all);
        assert_eq!(etcd_defects("3.4.23"), all);
        assert_eq!(etcd_defects("3.4.30"), all);
        assert_eq!(etcd_defects("3.4.23-rc.1"), all);
        assert_eq!(etcd_defects("3.4.31-rc.0"), all);
        assert_eq!(etcd_defects("3.4.31"), late);
        assert_eq!(etcd_defects("3.4.31+build"), late);
        assert_eq!(etcd_defects("3.4.45"), late);
    }

    #[test]
    fn the_35_line_is_fixed_in_3_5_3_3_5_13_3_5_23_and_3_5_28() {
        let divergent = KnownDefect::InconsistencyAfterKill;
        let early = vec![divergent, REVOKE_35, WATCH_35, RENEWED_35, STALE_35];
        assert_eq!(etcd_defects("3.5.0"), early);
        assert_eq!(etcd_defects("3.5.1"), early);
        assert_eq!(etcd_defects("3.5.2"), early);
        assert_eq!(etcd_defects("3.5.3-rc.1"), early);
        let no_divergence = vec![REVOKE_35, WATCH_35, RENEWED_35, STALE_35];
        assert_eq!(etcd_defects("3.5.3"), no_divergence);
        assert_eq!(etcd_defects("3.5.12"), no_divergence);
        assert_eq!(etcd_defects("3.5.13"), vec![RENEWED_35, STALE_35]);
        assert_eq!(etcd_defects("3.5.22"), vec![RENEWED_35, STALE_35]);
        assert_eq!(etcd_defects("3.5.23"), vec![STALE_35]);
        assert_eq!(etcd_defects("3.5.27"), vec![STALE_35]);
        assert_eq!(etcd_defects("3.5.28"), vec![]);
        assert_eq!(etcd_defects("3.5.30"), vec![]);
    }

    #[test]
    fn the_36_line_is_fixed_in_3_6_9_later_lines_have_none_earlier_are_unsupported() {
        let renewed = KnownDefect::RevokedLeaseRenewed { fixed_in: "3.6.5" };
        let stale = KnownDefect::StaleReadsAfterPause { fixed_in: "3.6.9" };
        assert_eq!(etcd_defects("3.6.0"), vec![renewed, stale]);
        assert_eq!(etcd_defects("3.6.0-alpha.0"), vec![renewed, stale]);
        assert_eq!(etcd_defects("3.6.5"), vec![stale]);
        assert_eq!(etcd_defects("3.6.9"), vec![]);
        assert_eq!(etcd_defects("3.7.0"), vec![]);
        assert_eq!(etcd_defects("4.0.0"), vec![]);
        assert_eq!(etcd_defects("3.3.27"), vec![KnownDefect::Unsupported]);
        assert_eq!(etcd_defects("2.3.8"), vec![KnownDefect::Unsupported]);
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
        assert_eq!(EOL.fixed_in(), None);
        assert_eq!(RENEWED_35.issues(), ["etcd-io/etcd#20590"]);
        assert_eq!(STALE_35.issues(), ["etcd-io/etcd#20418"]);
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
        // 3.5.3 fixes one of them, 3.5.28 all.
        assert!(line.contains("fixed in 3.5.28"), "{line}");
    }

    #[test]
    fn each_defect_is_warned_about_once_per_process() {
        // Values no real version produces, so that other tests of this
        // process cannot have warned about them.
        let a = KnownDefect::EarlyLeaseRevoke { fixed_in: "9.9.9" };
        let b = KnownDefect::LostWatchEvents { fixed_in: "9.9.9" };
        assert_eq!(first_sight(&[a]), vec![a]);
        assert_eq!(first_sight(&[a]), vec![]);
        assert_eq!(first_sight(&[a, b]), vec![b]);
        assert_eq!(first_sight(&[b, a]), vec![]);
    }

    #[test]
    fn the_oldest_member_is_the_handles_version() {
        let versions = MemberVersions::default();
        for (member, raw) in [
            (3, "3.5.30"),
            (1, "3.4.23"),
            (2, "3.5.0-rc.1"),
            (4, "garbage"),
        ] {
            versions.record(&ServerStatus {
                version: raw.to_string(),
                member_id: member,
            });
        }
        let all: Vec<(u64, String)> = versions
            .all()
            .into_iter()
            .map(|(m, v)| (m, v.to_string()))
            .collect();
        let expected = [(1, "3.4.23"), (2, "3.5.0-rc.1"), (3, "3.5.30")];
        let expected: Vec<(u64, String)> =
            expected.iter().map(|(m, v)| (*m, v.to_string())).collect();
        assert_eq!(all, expected);
        assert_eq!(
            versions.oldest().map(|v| v.to_string()),
            Some("3.4.23".into())
        );
        // A member that comes back upgraded replaces its old version.
        versions.record(&ServerStatus {
            version: "3.5.30".into(),
            member_id: 1,
        });
        assert_eq!(
            versions.oldest().map(|v| v.to_string()),
            Some("3.5.0-rc.1".into())
        );
    }

    #[test]
    fn an_unreadable_version_is_no_version_and_no_panic() {
        assert_eq!(read("garbage", 1), None);
        assert_eq!(read("", 1), None);
        let v = read("3.5.16", 1).expect("a version");
        assert_eq!(v.as_str(), "3.5.16");
    }
}
