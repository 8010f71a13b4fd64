//! A minimal fleet agent: register this host, print the fleet as it
//! changes, leave gracefully on Ctrl-C.
//!
//! ```text
//! cargo run --example host_agent -- 127.0.0.1:2379
//! ```

use fleetcoord::{Etcd, EtcdOptions, HostEvent, HostLiveness, HostWatcher};
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

    let (stop_tx, stop) = crossbeam_channel::bounded::<()>(1);
    ctrlc::set_handler(move || {
        let _ = stop_tx.try_send(());
    })?;

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
    // Revoking the lease makes every watcher see this host Down at once.
    liveness.close()?;
    Ok(())
}
