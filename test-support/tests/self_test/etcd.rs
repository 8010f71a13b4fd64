//! The model etcd keeps etcd's rules: revisions, leases, transactions,
//! reads, compaction, pause and leader change.

use crate::fixtures::*;
use fleetcoord_sm::*;
use fleetcoord_test_support::*;
use std::time::{Duration, Instant};

#[test]
fn grant_applies_min_ttl_and_hands_out_distinct_nonzero_ids() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let (a, ttl_a) = grant(&mut etcd, t0, 1);
    let (b, ttl_b) = grant(&mut etcd, t0, 5);
    assert_eq!((ttl_a, ttl_b), (2, 5));
    assert!(a != 0 && b != 0 && a != b);
    assert_eq!(etcd.lease_deadline(a), Some(t0 + Duration::from_secs(2)));
    assert_eq!(etcd.revision(), 1, "grants do not write keys");
}

#[test]
fn lease_expiry_deletes_keys_in_one_revision_with_delete_events() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let (lease, ttl) = grant(&mut etcd, t0, 2);
    etcd.execute(t0, &put("/h/a", "1", lease)).unwrap();
    etcd.execute(t0, &put("/h/b", "2", lease)).unwrap();
    etcd.execute(t0, &put("/other", "x", 0)).unwrap();
    assert_eq!(etcd.revision(), 4);
    let renewed = t0 + ms(1500);
    assert_eq!(
        etcd.execute(renewed, &Request::KeepAlive { lease })
            .unwrap(),
        Response::KeptAlive { ttl_secs: ttl }
    );
    etcd.advance(t0 + Duration::from_secs(2));
    assert!(etcd.lease_exists(lease), "renewal moved the deadline");
    etcd.advance(renewed + Duration::from_secs(2));
    assert!(!etcd.lease_exists(lease));
    assert_eq!(etcd.revision(), 5, "one revision for both keys");
    assert!(etcd.range_prefix(b"/h/").is_empty());
    assert!(etcd.get(b"/other").is_some());
    let events = etcd
        .watch_history(&KeyRange::Prefix(b"/h/".to_vec()), 5)
        .unwrap();
    assert_eq!(events.len(), 2);
    for e in &events {
        assert_eq!(e.kind, EventKind::Delete);
        assert_eq!(e.kv.mod_revision, 5);
        assert_eq!(e.prev_kv.as_ref().unwrap().lease, lease);
    }
    assert_eq!(
        etcd.execute(renewed, &Request::KeepAlive { lease })
            .unwrap(),
        Response::KeptAlive { ttl_secs: 0 }
    );
}

#[test]
fn leases_expire_in_deadline_order() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let (late, _) = grant(&mut etcd, t0, 5);
    let (early, _) = grant(&mut etcd, t0, 3);
    etcd.execute(t0, &put("late", "", late)).unwrap();
    etcd.execute(t0, &put("early", "", early)).unwrap();
    etcd.advance(t0 + Duration::from_secs(10));
    let events = etcd
        .watch_history(&KeyRange::Prefix(Vec::new()), 4)
        .unwrap();
    assert_eq!(
        keys(&events.iter().map(|e| e.kv.clone()).collect::<Vec<_>>()),
        ["early", "late"]
    );
    assert_eq!(events[0].kv.mod_revision + 1, events[1].kv.mod_revision);
}

#[test]
fn revoke_and_put_reject_unknown_leases() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    assert_eq!(
        etcd.execute(t0, &Request::Revoke { lease: 42 }),
        Err(RpcError::LeaseNotFound)
    );
    assert_eq!(
        etcd.execute(t0, &put("k", "v", 42)),
        Err(RpcError::LeaseNotFound)
    );
    let (lease, _) = grant(&mut etcd, t0, 10);
    etcd.execute(t0, &put("k", "v", lease)).unwrap();
    assert_eq!(
        etcd.execute(t0, &Request::Revoke { lease }),
        Ok(Response::Revoked)
    );
    assert!(etcd.get(b"k").is_none());
    assert_eq!(etcd.revision(), 3);
}

#[test]
fn put_tracks_create_mod_version() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    assert_eq!(
        etcd.execute(t0, &put("k", "1", 0)),
        Ok(Response::Put { revision: 2 })
    );
    etcd.execute(t0, &put("k", "2", 0)).unwrap();
    let kv = etcd.get(b"k").unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 3, 2));
    let events = etcd
        .watch_history(&KeyRange::Key(b"k".to_vec()), 3)
        .unwrap();
    assert_eq!(events[0].prev_kv.as_ref().unwrap().value, b"1");
}

#[test]
fn delete_prefix_is_one_revision_and_deleting_nothing_is_none() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    for k in ["/p/a", "/p/b", "/q"] {
        etcd.execute(t0, &put(k, "", 0)).unwrap();
    }
    let r = etcd
        .execute(t0, &Request::Delete(KeyRange::Prefix(b"/p/".to_vec())))
        .unwrap();
    assert_eq!(
        r,
        Response::Deleted {
            revision: 5,
            deleted: 2
        }
    );
    let r = etcd
        .execute(t0, &Request::Delete(KeyRange::Key(b"/nope".to_vec())))
        .unwrap();
    assert_eq!(
        r,
        Response::Deleted {
            revision: 5,
            deleted: 0
        }
    );
    assert_eq!(keys(&etcd.range_prefix(b"")), ["/q"]);
}

#[test]
fn txn_compares_and_shares_one_revision() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let absent = Compare::CreateRevisionEquals {
        key: b"a".to_vec(),
        revision: 0,
    };
    let create = Txn {
        compare: vec![absent.clone()],
        success: vec![
            TxnOp::Put {
                key: b"a".to_vec(),
                value: b"1".to_vec(),
                lease: 0,
            },
            TxnOp::Put {
                key: b"b".to_vec(),
                value: b"2".to_vec(),
                lease: 0,
            },
            TxnOp::Range(RangeRequest::all(KeyRange::Key(b"a".to_vec()))),
        ],
        failure: vec![TxnOp::Range(RangeRequest::all(KeyRange::Key(
            b"a".to_vec(),
        )))],
    };
    let Response::Txn {
        revision,
        succeeded,
        responses,
    } = etcd.execute(t0, &Request::Txn(create.clone())).unwrap()
    else {
        panic!()
    };
    assert!(succeeded);
    assert_eq!(revision, 2);
    assert_eq!(etcd.get(b"b").unwrap().mod_revision, 2);
    assert!(matches!(&responses[2], TxnOpResponse::Range { kvs } if kvs[0].value == b"1"));
    // Same txn again: the key exists now, so the failure branch reads it.
    let Response::Txn {
        revision,
        succeeded,
        responses,
    } = etcd.execute(t0, &Request::Txn(create)).unwrap()
    else {
        panic!()
    };
    assert!(!succeeded);
    assert_eq!(revision, 2, "a read-only branch does not bump the revision");
    assert!(matches!(&responses[0], TxnOpResponse::Range { kvs } if kvs[0].create_revision == 2));
    let guarded = |rev| Txn {
        compare: vec![Compare::ModRevisionEquals {
            key: b"a".to_vec(),
            revision: rev,
        }],
        success: vec![TxnOp::Delete(KeyRange::Key(b"a".to_vec()))],
        failure: vec![],
    };
    let r = etcd.execute(t0, &Request::Txn(guarded(7))).unwrap();
    assert!(matches!(
        r,
        Response::Txn {
            succeeded: false,
            revision: 2,
            ..
        }
    ));
    let r = etcd.execute(t0, &Request::Txn(guarded(2))).unwrap();
    assert!(matches!(
        r,
        Response::Txn {
            succeeded: true,
            revision: 3,
            ..
        }
    ));
    assert!(etcd.get(b"a").is_none());
}

#[test]
fn txn_rejects_duplicates_and_unknown_leases_without_writing() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let p = |k: &str, lease| TxnOp::Put {
        key: k.into(),
        value: Vec::new(),
        lease,
    };
    let dup = Txn {
        compare: vec![],
        success: vec![p("x", 0), p("x", 0)],
        failure: vec![],
    };
    assert!(matches!(
        etcd.execute(t0, &Request::Txn(dup)),
        Err(RpcError::Rejected(_))
    ));
    let overlap = Txn {
        compare: vec![],
        success: vec![p("x/1", 0), TxnOp::Delete(KeyRange::Prefix(b"x/".to_vec()))],
        failure: vec![],
    };
    assert!(matches!(
        etcd.execute(t0, &Request::Txn(overlap)),
        Err(RpcError::Rejected(_))
    ));
    let bad_lease = Txn {
        compare: vec![],
        success: vec![p("y", 0), p("z", 99)],
        failure: vec![],
    };
    assert_eq!(
        etcd.execute(t0, &Request::Txn(bad_lease)),
        Err(RpcError::LeaseNotFound)
    );
    assert_eq!(etcd.revision(), 1);
    assert!(etcd.range_prefix(b"").is_empty());
}

#[test]
fn keys_only_ranges_answer_empty_values_with_their_revisions() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    etcd.execute(t0, &put("/e/a", "value", 0)).unwrap();
    let read = |keys_only| {
        Request::Range(RangeRequest {
            keys_only,
            ..RangeRequest::all(KeyRange::Prefix(b"/e/".to_vec()))
        })
    };
    let full = kvs(etcd.execute(t0, &read(false)).unwrap());
    let bare = kvs(etcd.execute(t0, &read(true)).unwrap());
    assert_eq!(full[0].value, b"value".to_vec());
    assert!(bare[0].value.is_empty());
    assert_eq!(bare[0].key, full[0].key);
    assert_eq!(bare[0].create_revision, full[0].create_revision);
}

#[test]
fn range_sorts_limits_and_bounds_create_revision() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    for k in ["/e/c", "/e/a", "/e/b", "/f"] {
        etcd.execute(t0, &put(k, "", 0)).unwrap();
    }
    let range = |sort, limit, max_create_revision| {
        Request::Range(RangeRequest {
            range: KeyRange::Prefix(b"/e/".to_vec()),
            sort,
            limit,
            max_create_revision,
            revision: 0,
            keys_only: false,
        })
    };
    let r = |etcd: &mut ModelEtcd, req| keys(&kvs(etcd.execute(t0, &req).unwrap()));
    assert_eq!(
        r(&mut etcd, range(SortOrder::Key, 0, 0)),
        ["/e/a", "/e/b", "/e/c"]
    );
    assert_eq!(
        r(&mut etcd, range(SortOrder::CreateAscending, 0, 0)),
        ["/e/c", "/e/a", "/e/b"]
    );
    assert_eq!(
        r(&mut etcd, range(SortOrder::CreateDescending, 1, 0)),
        ["/e/b"]
    );
    assert_eq!(
        r(&mut etcd, range(SortOrder::CreateDescending, 1, 3)),
        ["/e/a"]
    );
    assert_eq!(r(&mut etcd, range(SortOrder::Key, 2, 0)), ["/e/a", "/e/b"]);
    let resp = etcd.execute(t0, &range(SortOrder::Key, 0, 0)).unwrap();
    assert!(matches!(resp, Response::Range { revision: 5, .. }));
}

#[test]
fn compaction_drops_history_and_refuses_old_starts() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    for v in ["1", "2", "3"] {
        etcd.execute(t0, &put("k", v, 0)).unwrap();
    }
    etcd.compact(3);
    let all = KeyRange::Prefix(Vec::new());
    assert_eq!(etcd.watch_history(&all, 3), Err(3));
    assert_eq!(etcd.watch_history(&all, 4).unwrap().len(), 1);
    etcd.compact(100);
    assert_eq!(
        etcd.compacted_revision(),
        4,
        "clamped to the current revision"
    );
}

#[test]
fn pause_blocks_work_and_resume_expires_overdue_leases_first() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let faults = Faults::none();
    let mut rng = rng(1);
    let (lease, _) = grant(&mut etcd, t0, 2);
    etcd.execute(t0, &put("/h/x", "", lease)).unwrap();
    let mut h = Harness::new(Probe::default());
    etcd.pause();
    let t1 = t0 + Duration::from_secs(1);
    let id = h.machine.send(Request::KeepAlive { lease });
    h.pump(&mut etcd, t1, &mut rng, &faults);
    assert_eq!(h.queued(), 1);
    let t5 = t0 + Duration::from_secs(5);
    etcd.advance(t5);
    assert!(etcd.lease_exists(lease), "a paused etcd expires nothing");
    etcd.resume(t5);
    assert!(!etcd.lease_exists(lease));
    assert!(etcd.get(b"/h/x").is_none());
    h.pump(&mut etcd, t5, &mut rng, &faults);
    h.deliver_due(&mut etcd, t5 + ms(1), &mut rng, &faults);
    assert_eq!(
        h.machine.replies_for(id),
        [(t5 + ms(1), Ok(Response::KeptAlive { ttl_secs: 0 }))]
    );
}

#[test]
fn extend_all_leases_gives_a_full_ttl_from_now() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let (lease, _) = grant(&mut etcd, t0, 3);
    let t2 = t0 + Duration::from_secs(2);
    etcd.extend_all_leases(t2);
    assert_eq!(
        etcd.lease_deadline(lease),
        Some(t2 + Duration::from_secs(3))
    );
    assert_eq!(etcd.next_deadline(), Some(t2 + Duration::from_secs(3)));
}

#[test]
fn retime_lease_keeps_the_model_true_to_a_reported_ttl() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let (lease, _) = grant(&mut etcd, t0, 5);
    etcd.execute(t0, &put("k", "", lease)).unwrap();
    let t1 = t0 + Duration::from_secs(1);
    assert!(etcd.retime_lease(t1, lease, 9));
    assert_eq!(etcd.lease_ttl(lease), Some(9));
    assert_eq!(
        etcd.lease_deadline(lease),
        Some(t1 + Duration::from_secs(9))
    );
    assert_eq!(
        etcd.execute(t1, &Request::KeepAlive { lease }).unwrap(),
        Response::KeptAlive { ttl_secs: 9 },
        "renewals keep the new TTL"
    );
    assert!(etcd.retime_lease(t1, lease, 0), "TTL 0 ends the lease now");
    assert!(!etcd.lease_exists(lease));
    assert!(etcd.get(b"k").is_none(), "with its keys");
    assert!(!etcd.retime_lease(t1, lease, 3), "a gone lease stays gone");
}

#[test]
fn time_to_live_reports_whole_seconds_left_and_the_granted_ttl() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    let (lease, _) = grant(&mut etcd, t0, 5);
    assert_eq!(
        etcd.execute(t0 + ms(2500), &Request::LeaseTimeToLive { lease }),
        Ok(Response::LeaseTimeToLive {
            ttl_secs: 2,
            granted_secs: 5
        })
    );
    etcd.expire_lease(lease);
    assert_eq!(
        etcd.execute(t0, &Request::LeaseTimeToLive { lease }),
        Ok(Response::LeaseTimeToLive {
            ttl_secs: -1,
            granted_secs: 0
        })
    );
}

#[test]
fn range_at_an_old_revision_rebuilds_it_from_history_until_compacted() {
    let t0 = Instant::now();
    let mut etcd = ModelEtcd::new();
    etcd.execute(t0, &put("/e/a", "1", 0)).unwrap(); // rev 2
    etcd.execute(t0, &put("/e/b", "1", 0)).unwrap(); // rev 3
    etcd.execute(t0, &put("/e/a", "2", 0)).unwrap(); // rev 4
    etcd.execute(t0, &Request::Delete(KeyRange::Key(b"/e/b".to_vec())))
        .unwrap(); // rev 5
    etcd.execute(t0, &put("/e/c", "1", 0)).unwrap(); // rev 6
    let at = |revision| {
        Request::Range(RangeRequest {
            revision,
            ..RangeRequest::all(KeyRange::Prefix(b"/e/".to_vec()))
        })
    };
    let read = |etcd: &mut ModelEtcd, revision| match etcd.execute(t0, &at(revision)).unwrap() {
        Response::Range { revision, kvs } => (revision, kvs),
        other => panic!("unexpected {other:?}"),
    };
    let now = read(&mut etcd, 0).1;
    assert_eq!(read(&mut etcd, 6).1, now);
    let (header, then) = read(&mut etcd, 3);
    // The header is the current revision, as etcd's is.
    assert_eq!(header, 6);
    assert_eq!(keys(&then), ["/e/a", "/e/b"]);
    assert_eq!(
        (
            then[0].value.as_slice(),
            then[0].mod_revision,
            then[0].version
        ),
        (&b"1"[..], 2, 1)
    );
    assert_eq!(keys(&read(&mut etcd, 4).1), ["/e/a", "/e/b"]);
    assert_eq!(read(&mut etcd, 4).1[0].value, b"2");
    assert_eq!(keys(&read(&mut etcd, 5).1), ["/e/a"]);
    assert!(read(&mut etcd, 1).1.is_empty());
    assert!(matches!(
        etcd.execute(t0, &at(7)),
        Err(RpcError::Rejected(_))
    ));
    etcd.compact(4);
    assert_eq!(keys(&read(&mut etcd, 4).1), ["/e/a", "/e/b"]);
    assert_eq!(
        etcd.execute(t0, &at(3)),
        Err(RpcError::Compacted {
            compact_revision: 4
        })
    );
    // Paging: a limit and a start key at an old revision.
    let page = Request::Range(RangeRequest {
        revision: 4,
        limit: 1,
        ..RangeRequest::all(KeyRange::PrefixFrom {
            prefix: b"/e/".to_vec(),
            from: rpc::key_after(b"/e/a"),
        })
    });
    assert_eq!(keys(&kvs(etcd.execute(t0, &page).unwrap())), ["/e/b"]);
}
