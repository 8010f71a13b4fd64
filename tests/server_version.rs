//! `Etcd::server_version` against the real etcd binary: the version is the
//! one the binary reports, read without a request of its own, and a release
//! with known defects gets one short warning line per process (the detail at
//! debug level).

mod common;

use fleetcoord::{etcd_defects, Etcd, EtcdOptions};
use std::process::Command;
use std::sync::Mutex;

/// Every record logged in this test binary at debug level or above, with
/// its level.
static WARNINGS: Mutex<Vec<(log::Level, String)>> = Mutex::new(Vec::new());

struct Warnings;

impl log::Log for Warnings {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Debug
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            WARNINGS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((record.level(), record.args().to_string()));
        }
    }

    fn flush(&self) {}
}

/// The version `etcd --version` prints ("etcd Version: 3.4.23"), from the
/// binary `EtcdServer` starts (`$ETCD_BIN`, else `etcd` on PATH).
fn binary_version() -> String {
    let bin = std::env::var_os("ETCD_BIN").unwrap_or_else(|| "etcd".into());
    let out = Command::new(&bin)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {bin:?} --version ({e}); {}", common::INSTALL));
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("etcd Version:"))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no version in `etcd --version`: {text:?}"))
}

#[test]
fn connect_reads_the_version_without_a_request_and_warns_once_about_its_defects() {
    let _ = log::set_logger(&Warnings).map(|()| log::set_max_level(log::LevelFilter::Debug));
    let expected = binary_version();
    let server = common::start_etcd();
    let before = server.grpc_counts().expect("etcd's metrics");

    let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");

    let version = etcd.server_version().expect("a version read at connect");
    assert_eq!(version.as_str(), expected);
    assert_eq!(version.major(), 3);
    // What connect asks of etcd: the probe's status, and the shared
    // client's proving read (auth would refuse it), one each, sent at
    // once; the version adds none.
    let asked = server.grpc_counts().expect("etcd's metrics").since(&before);
    let by_method = asked.started_by_method().collect::<Vec<_>>();
    assert_eq!(asked.started("Status"), 1, "{by_method:?}");
    assert_eq!(asked.started("Range"), 1, "{by_method:?}");

    // A second handle in the same process: the warning is not repeated.
    let again = Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");
    again.close().expect("close");

    let defects = etcd_defects(&expected);
    let logged = WARNINGS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let about = |level: log::Level| -> Vec<String> {
        logged
            .iter()
            .filter(|(l, w)| *l == level && w.contains("known defects"))
            .map(|(_, w)| w.clone())
            .collect()
    };
    let (warnings, details) = (about(log::Level::Warn), about(log::Level::Debug));
    if defects.is_empty() {
        assert!(warnings.is_empty(), "{warnings:?}");
    } else {
        assert_eq!(warnings.len(), 1, "one warning per process: {warnings:?}");
        let warning = &warnings[0];
        assert!(warning.contains(&expected), "{warning}");
        assert!(
            warning.chars().count() <= 120 && !warning.contains('\n'),
            "one short line: {warning}"
        );
        // The detail, at debug level, at every connect.
        assert_eq!(details.len(), 2, "{details:?}");
        for defect in &defects {
            assert!(
                details[0].contains(&defect.to_string()),
                "{} lacks {defect}",
                details[0]
            );
        }
    }
    // etcd 3.4.23, the version these tests run on in CI (Debian 12), has
    // the early-revoke defect; say so if the binary changes under us.
    if expected.starts_with("3.4.") {
        assert!(!defects.is_empty(), "{expected} is older than 3.4.31");
    }
    etcd.close().expect("close");
}
