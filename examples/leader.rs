//! Do work only while leading, and stop promptly on SIGINT or SIGTERM:
//! campaign until leader or told to stop (the candidate keeps its key and
//! its place in the queue however long it waits), work until leadership is
//! lost or the signal comes, then resign; campaign again after a loss.
//!
//! ```text
//! cargo run --example leader -- 127.0.0.1:2379 my-job
//! ```

use fleetcoord::{Election, Etcd, EtcdOptions};
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let endpoint = args.next().unwrap_or_else(|| "127.0.0.1:2379".into());
    let name = args.next().unwrap_or_else(|| "example-job".into());
    let etcd = Etcd::with_options(&[endpoint], EtcdOptions::default())?;
    let election = Election::new(&etcd, &name)?;
    let me = format!("pid-{}", std::process::id());

    // SIGINT or SIGTERM (ctrlc's `termination` feature) drops the sender:
    // from then on every wait on `stop` returns at once, however many.
    let (stop_tx, stop) = crossbeam_channel::bounded::<()>(0);
    let mut stop_tx = Some(stop_tx);
    ctrlc::set_handler(move || drop(stop_tx.take()))?;

    // `None`: stopped while waiting; the key was withdrawn before the return.
    while let Some(leadership) = election.campaign_until(me.as_bytes(), &stop)? {
        println!(
            "leading {name} with fencing token {}",
            leadership.fencing_token()
        );
        let ticker = crossbeam_channel::tick(Duration::from_secs(1));
        let stopping = loop {
            crossbeam_channel::select! {
                recv(leadership.lost()) -> _ => break false,
                recv(stop) -> _ => break true,
                recv(ticker) -> _ => println!("working (token {})", leadership.fencing_token()),
            }
        };
        if stopping {
            // The next candidate leads as soon as etcd deleted the key.
            leadership.resign()?;
            break;
        }
        println!("leadership lost; stop acting as leader and campaign again");
    }
    election.close()?;
    Ok(())
}
