//! `Etcd::server_version` against the real etcd binary: the version is the
//! one the binary reports, read without a request of its own, and a release
//! with known defects gets its one warning at connect.

mod common;

use fleetcoord::{etcd_defects, Etcd, EtcdOptions};
use std::process::Command;
use std::sync::Mutex;

/// Every warning logged in this test binary.
static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Warnings;

impl log::Log for Warnings {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            WARNINGS
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(record.args().to_string());
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
    let _ = log::set_logger(&Warnings).map(|()| log::set_max_level(log::LevelFilter::Warn));
    let expected = binary_version();
    let server = common::start_etcd();
    let before = server.grpc_counts().expect("etcd's metrics");

    let etcd = Etcd::with_options(&[server.endpoint()], EtcdOptions::default()).expect("connect");

    let version = etcd.server_version().expect("a version read at connect");
    assert_eq!(version.as_str(), expected);
    assert_eq!(version.major(), 3);
    // What connect asks of etcd: the probe's status and the shared
    // client's proving status, one each; the version adds none.
    let asked = server.grpc_counts().expect("etcd's metrics").since(&before);
    assert_eq!(
        asked.started("Status"),
        2,
        "{:?}",
        asked.started_by_method().collect::<Vec<_>>()
    );

    let defects = etcd_defects(&expected);
    let warnings: Vec<String> = WARNINGS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|w| w.contains("known defects"))
        .cloned()
        .collect();
    if defects.is_empty() {
        assert!(warnings.is_empty(), "{warnings:?}");
    } else {
        assert_eq!(warnings.len(), 1, "one warning per connect: {warnings:?}");
        let warning = &warnings[0];
        assert!(warning.contains(&expected), "{warning}");
        for defect in &defects {
            assert!(
                warning.contains(&defect.to_string()),
                "{warning} lacks {defect}"
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
