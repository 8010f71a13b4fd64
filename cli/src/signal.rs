//! Ctrl-C and SIGTERM for long-running commands: the first signal asks the
//! command to stop cleanly (revoke, resign); a second one exits at once for
//! a user who does not want to wait.

use crossbeam_channel::Receiver;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Exit status after a second, impatient signal (128 + SIGINT, as shells do).
const FORCED_EXIT: i32 = 130;

/// Installs the handler; the returned receiver gets one `()` on the first
/// SIGINT, SIGTERM or SIGHUP.
pub fn install() -> Result<Receiver<()>, String> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let count = AtomicUsize::new(0);
    ctrlc::set_handler(move || {
        if count.fetch_add(1, Ordering::SeqCst) == 0 {
            let _ = tx.try_send(());
        } else {
            eprintln!("fleetcoord: second signal, exiting without cleanup");
            std::process::exit(FORCED_EXIT);
        }
    })
    .map_err(|e| format!("cannot install the signal handler: {e}"))?;
    Ok(rx)
}
