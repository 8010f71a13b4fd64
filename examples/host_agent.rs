//! A fleet agent: register this host, print the fleet as it changes, run a
//! "rebalancer" role on whichever agent leads, and leave promptly on
//! SIGINT or SIGTERM.
//!
//! ```text
//! cargo run --example host_agent -- 127.0.0.1:2379
//! ```

use crossbeam_channel::Receiver;
use fleetcoord::{Election, Etcd, EtcdOptions, HostEvent, HostLiveness, HostWatcher};
use std::thread;
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:2379".into());
    let etcd = Etcd::with_options(&[endpoint], EtcdOptions::default())?;

    let me = uuid::Uuid::new_v4();
    let metadata = format!(r#"{{"pid":{}}}"#, std::process::id());
    let liveness = HostLiveness::register(&etcd, me, metadata.as_bytes(), Duration::from_secs(5))?;
    println!("registered as {me}");

    // SIGINT or SIGTERM drops the sender: every wait on `stop`, in every
    // thread, returns at once from then on.
    let (stop_tx, stop) = crossbeam_channel::bounded::<()>(0);
    let mut stop_tx = Some(stop_tx);
    ctrlc::set_handler(move || drop(stop_tx.take()))?;

    let rebalancer = Election::new(&etcd, "rebalancer")?;
    let role = thread::spawn({
        let stop = stop.clone();
        move || rebalance(&rebalancer, &me.to_string(), &stop)
    });

    let watcher = HostWatcher::watch(&etcd)?;
    loop {
        crossbeam_channel::select! {
            recv(watcher.events()) -> event => match event? {
                HostEvent::Up(h) => println!("up      {} {}", h.id, String::from_utf8_lossy(&h.metadata)),
                HostEvent::Updated(h) => println!("updated {} {}", h.id, String::from_utf8_lossy(&h.metadata)),
                HostEvent::Down(h, why) => println!("down    {} ({why})", h.id),
                HostEvent::Synced => println!("-- the fleet above was already there; changes follow"),
            },
            recv(liveness.states()) -> state => println!("my state: {:?}", state?),
            recv(stop) -> _ => break,
        }
    }
    role.join()
        .map_err(|_| "the rebalancer thread panicked")??;
    // Revoking the lease makes every watcher see this host Down at once.
    liveness.close()?;
    Ok(())
}

/// Waits in the rebalancer's queue (its key and place kept however long),
/// acts while leading, and on `stop` leaves: a waiting key is withdrawn, a
/// leadership resigned, so the next agent takes over at once.
fn rebalance(election: &Election, me: &str, stop: &Receiver<()>) -> fleetcoord::Result<()> {
    while let Some(leadership) = election.campaign_until(me.as_bytes(), stop)? {
        println!("rebalancer: leading (token {})", leadership.fencing_token());
        crossbeam_channel::select! {
            recv(leadership.lost()) -> _ => println!("rebalancer: lost; queueing again"),
            recv(stop) -> _ => {
                leadership.resign()?;
                break;
            }
        }
    }
    election.close()
}
