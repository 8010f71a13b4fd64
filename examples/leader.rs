//! Do work only while leading: campaign, work until leadership is lost or
//! Ctrl-C, then resign; campaign again after a loss.
//!
//! ```text
//! cargo run --example leader -- 127.0.0.1:2379 my-job
//! ```

use fleetcoord::{Election, Error, Etcd, EtcdOptions};
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let endpoint = args.next().unwrap_or_else(|| "127.0.0.1:2379".into());
    let name = args.next().unwrap_or_else(|| "example-job".into());
    let etcd = Etcd::with_options(&[endpoint], EtcdOptions::default())?;
    let election = Election::new(&etcd, &name)?;
    let me = format!("pid-{}", std::process::id());

    let (stop_tx, stop) = crossbeam_channel::bounded::<()>(1);
    ctrlc::set_handler(move || {
        let _ = stop_tx.try_send(());
    })?;

    loop {
        let leadership = match election.campaign_timeout(me.as_bytes(), Duration::from_secs(1)) {
            Ok(l) => l,
            Err(Error::Timeout(_)) => {
                // Someone else leads; check for Ctrl-C now and then.
                if stop.try_recv().is_ok() {
                    break;
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        println!(
            "leading {name} with fencing token {}",
            leadership.fencing_token()
        );
        let ticker = crossbeam_channel::tick(Duration::from_secs(1));
        loop {
            crossbeam_channel::select! {
                recv(leadership.lost()) -> _ => {
                    println!("leadership lost; stop acting as leader and campaign again");
                    break;
                }
                recv(stop) -> _ => {
                    leadership.resign()?;
                    election.close()?;
                    return Ok(());
                }
                recv(ticker) -> _ => println!("working (token {})", leadership.fencing_token()),
            }
        }
    }
    election.close()?;
    Ok(())
}
