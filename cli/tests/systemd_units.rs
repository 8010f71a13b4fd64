//! The example unit files under `contrib/systemd/` are what an operator
//! copies: `systemd-analyze verify` must accept each (installed by `make
//! test`'s set-up, as Debian's `systemd` package), and the `fleetcoord`
//! command line of each `ExecStart=` must parse — it fails on reaching
//! etcd (exit 1), never on its own flags (exit 2).

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_fleetcoord");
/// Where the unit files expect the binary; the test points them at this
/// build instead.
const INSTALLED: &str = "/usr/local/bin/fleetcoord";

fn units() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/systemd");
    let mut units: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "service"))
        .collect();
    units.sort();
    assert!(
        units.len() >= 2,
        "expected the agent and elect units: {units:?}"
    );
    units
}

/// The name systemd loads `unit` as: a template gets an instance.
fn loaded_name(unit: &Path) -> String {
    let name = unit
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a UTF-8 file name");
    name.replace("@.service", "@report.service")
}

#[test]
fn systemd_analyze_accepts_every_unit() {
    let dir = std::env::temp_dir().join(format!("fleetcoord-units-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    for unit in units() {
        let text = std::fs::read_to_string(&unit).expect("the unit file");
        assert!(
            text.contains(INSTALLED),
            "{}: ExecStart of {INSTALLED}",
            unit.display()
        );
        let name = unit.file_name().expect("a file name");
        std::fs::write(dir.join(name), text.replace(INSTALLED, BIN)).expect("a copy");
        let loaded = dir.join(loaded_name(&unit));
        // --man=no: the man page is installed by the operator, not here.
        let out = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&loaded)
            .output()
            .expect("run systemd-analyze (make test installs Debian's systemd)");
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Only what it says about our unit counts: a container may have
        // complaints about units of its own.
        let ours: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("fleetcoord"))
            .collect();
        assert!(
            out.status.success() && ours.is_empty(),
            "{}: systemd-analyze verify: {:?}\n{stderr}",
            unit.display(),
            out.status
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_exec_start_parses_and_fails_only_on_reaching_etcd() {
    for unit in units() {
        let text = std::fs::read_to_string(&unit).expect("the unit file");
        let exec = text
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap_or_else(|| panic!("{}: no ExecStart=", unit.display()));
        // systemd's specifiers and the environment the unit documents.
        let exec = exec
            .replace("%m", "0123456789abcdef0123456789abcdef")
            .replace("%i", "report")
            .replace("$FLEETCOORD_COMMAND", "true");
        let mut words = exec.split_whitespace();
        assert_eq!(words.next(), Some(INSTALLED), "{}", unit.display());
        let words: Vec<&str> = words.collect();
        let subcommand = words.first().copied().expect("a subcommand");
        // An etcd nobody listens on, and no waiting for it.
        let out = Command::new(BIN)
            .arg(subcommand)
            .args(["--endpoints", "127.0.0.1:1", "--connect-timeout", "200ms"])
            .args(&words[1..])
            .output()
            .expect("run fleetcoord");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}: `{exec}` should fail on etcd, not on its flags: {stderr}",
            unit.display()
        );
        assert!(
            stderr.contains("127.0.0.1:1"),
            "{}: {stderr}",
            unit.display()
        );
    }
}
