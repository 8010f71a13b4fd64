use fleetcoord_sm::{Command, Outbox, Request, RpcId};

#[test]
fn commands_come_out_in_order_with_increasing_ids_from_the_first() {
    let mut outbox: Outbox<&str> = Outbox::new(10);
    assert!(outbox.is_empty());
    assert!(!outbox.owns(RpcId(10)), "nothing issued yet");
    let a = outbox.rpc(Request::Revoke { lease: 1 });
    outbox.notify("told");
    outbox.cancel(a);
    let b = outbox.rpc(Request::Revoke { lease: 2 });
    outbox.push(Command::Cancel { id: RpcId(99) });
    assert_eq!((a, b), (RpcId(10), RpcId(11)));
    assert_eq!(
        outbox.pop(),
        Some(Command::Rpc {
            id: a,
            request: Request::Revoke { lease: 1 }
        })
    );
    assert_eq!(outbox.pop(), Some(Command::Notify("told")));
    assert_eq!(outbox.pop(), Some(Command::Cancel { id: a }));
    assert_eq!(
        outbox.pop(),
        Some(Command::Rpc {
            id: b,
            request: Request::Revoke { lease: 2 }
        })
    );
    assert_eq!(outbox.pop(), Some(Command::Cancel { id: RpcId(99) }));
    assert_eq!(outbox.pop(), None);
    assert!(outbox.is_empty());
}

#[test]
fn owns_exactly_the_ids_it_issued_so_composed_outboxes_are_disjoint() {
    let mut low: Outbox<()> = Outbox::default();
    let mut high: Outbox<()> = Outbox::new(1 << 40);
    let l = low.rpc(Request::Revoke { lease: 1 });
    let h = high.rpc(Request::Revoke { lease: 1 });
    assert_eq!((l, h), (RpcId(0), RpcId(1 << 40)));
    assert!(low.owns(l) && !low.owns(h) && !low.owns(RpcId(1)));
    assert!(high.owns(h) && !high.owns(l) && !high.owns(RpcId((1 << 40) - 1)));
    assert!(!high.owns(RpcId((1 << 40) + 1)));
}
