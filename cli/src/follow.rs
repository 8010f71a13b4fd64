//! The loop of every streaming command: print items until Ctrl-C, until
//! `--count` items were printed, or until the feed ends.

use crate::CliError;
use crossbeam_channel::{select, Receiver};

/// `--count` for streaming commands.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct CountArgs {
    /// Exit after printing this many records (default: run until Ctrl-C).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
}

/// Calls `each` for every item of `rx` until `shutdown` fires (a clean
/// stop), `count` items were handled, or `rx` disconnects — the last is an
/// error described by `ended`, since a feed only ends when its backend gave
/// up.
pub fn follow<T>(
    rx: &Receiver<T>,
    shutdown: &Receiver<()>,
    count: CountArgs,
    ended: &str,
    mut each: impl FnMut(T) -> Result<(), CliError>,
) -> Result<(), CliError> {
    let mut handled: u64 = 0;
    loop {
        if count.count.is_some_and(|c| handled >= c) {
            return Ok(());
        }
        select! {
            recv(rx) -> item => match item {
                Ok(item) => {
                    each(item)?;
                    handled += 1;
                }
                Err(_) => return Err(CliError::Message(ended.to_string())),
            },
            recv(shutdown) -> _ => return Ok(()),
        }
    }
}
