use fleetcoord_sm::mirror::{Mirror, MirrorNotice, Order, Step};

fn put(key: &str, value: u8) -> MirrorNotice<u8> {
    MirrorNotice::Put {
        key: key.into(),
        value,
    }
}

fn deleted(key: &str) -> MirrorNotice<u8> {
    MirrorNotice::Deleted { key: key.into() }
}

fn drain(mirror: &mut Mirror<u8>) -> Vec<MirrorNotice<u8>> {
    std::iter::from_fn(|| mirror.poll()).collect()
}

fn content(pairs: &[(&str, u8)]) -> Vec<(String, u8)> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn nothing_before_the_first_snapshot_then_its_puts_in_key_order_and_synced() {
    let mut m = Mirror::new(Order::Contiguous, 8);
    assert!(m.needs_snapshot() && m.wants_snapshot());
    assert_eq!(m.resume_at(), None);
    assert_eq!(m.change(1, "a".into(), Some(1)), Step::Resync);
    assert_eq!(m.queued(), 0);
    m.snapshot(4, content(&[("b", 2), ("a", 1)]));
    assert_eq!(m.at(), Some(4));
    assert!(!m.needs_snapshot());
    assert_eq!(m.resume_at(), Some(5));
    assert_eq!(
        drain(&mut m),
        [put("a", 1), put("b", 2), MirrorNotice::Synced]
    );
}

#[test]
fn an_empty_source_is_synced_at_version_zero() {
    let mut m = Mirror::<u8>::new(Order::Increasing, 8);
    m.snapshot_end(0);
    assert_eq!(m.at(), Some(0));
    assert_eq!(drain(&mut m), [MirrorNotice::Synced]);
}

#[test]
fn live_changes_pass_as_they_are_and_deletes_only_for_told_keys() {
    let mut m = Mirror::new(Order::Contiguous, 8);
    m.snapshot(1, content(&[("a", 1)]));
    drain(&mut m);
    assert_eq!(m.change(2, "a".into(), Some(1)), Step::Applied);
    // Another key: no notice, but the version moves on.
    assert_eq!(m.passed(3), Step::Applied);
    // Never told: a delete says nothing.
    assert_eq!(m.change(4, "b".into(), None), Step::Applied);
    assert_eq!(m.change(5, "a".into(), None), Step::Applied);
    assert_eq!(m.at(), Some(5));
    assert_eq!(drain(&mut m), [put("a", 1), deleted("a")]);
    // Redelivered: already reflected.
    assert_eq!(m.change(5, "a".into(), Some(3)), Step::Stale);
    assert_eq!(m.queued(), 0);
}

#[test]
fn a_contiguous_gap_asks_for_a_snapshot_whose_diff_is_all_that_is_told() {
    let mut m = Mirror::new(Order::Contiguous, 8);
    m.snapshot(1, content(&[("a", 1), ("b", 2), ("c", 3)]));
    drain(&mut m);
    assert_eq!(m.change(3, "a".into(), Some(7)), Step::Resync);
    // Stays stale until a snapshot, whatever comes in order after it.
    assert_eq!(m.change(4, "b".into(), None), Step::Resync);
    assert!(m.wants_snapshot());
    assert_eq!(m.queued(), 0);
    m.snapshot(4, content(&[("a", 7), ("c", 3), ("d", 4)]));
    // Deletes first, then new or changed keys; no second Synced.
    assert_eq!(drain(&mut m), [deleted("b"), put("a", 7), put("d", 4)]);
    assert_eq!(m.change(5, "d".into(), Some(5)), Step::Applied);
    assert_eq!(drain(&mut m), [put("d", 5)]);
}

#[test]
fn increasing_versions_have_holes_that_mean_nothing_until_missed_is_said() {
    let mut m = Mirror::new(Order::Increasing, 8);
    m.snapshot(10, content(&[]));
    drain(&mut m);
    assert_eq!(m.change(14, "a".into(), Some(1)), Step::Applied);
    assert_eq!(m.change(20, "a".into(), Some(2)), Step::Applied);
    m.missed();
    assert_eq!(m.change(21, "a".into(), Some(3)), Step::Resync);
    assert_eq!(drain(&mut m), [put("a", 1), put("a", 2)]);
    m.snapshot(21, content(&[("a", 3)]));
    assert_eq!(drain(&mut m), [put("a", 3)]);
}

#[test]
fn a_slow_consumer_holds_at_most_limit_live_changes_then_ends_with_the_latest() {
    let mut m = Mirror::new(Order::Contiguous, 2);
    m.snapshot(0, content(&[]));
    assert_eq!(drain(&mut m), [MirrorNotice::Synced]);
    assert_eq!(m.change(1, "a".into(), Some(1)), Step::Applied);
    assert_eq!(m.change(2, "a".into(), Some(2)), Step::Applied);
    assert_eq!(m.change(3, "a".into(), Some(3)), Step::Resync);
    assert_eq!(m.change(4, "b".into(), Some(4)), Step::Resync);
    // The consumer reads one, has no room for the next: it goes back.
    assert_eq!(m.poll(), Some(put("a", 1)));
    let held = m.poll().unwrap();
    m.unpoll(held);
    assert!(m.needs_snapshot() && !m.wants_snapshot(), "queue first");
    assert_eq!(m.poll(), Some(put("a", 2)));
    assert!(m.wants_snapshot());
    m.snapshot(4, content(&[("a", 3), ("b", 4)]));
    assert_eq!(drain(&mut m), [put("a", 3), put("b", 4)]);
    // Room again: live changes queue as before.
    assert_eq!(m.change(5, "a".into(), Some(5)), Step::Applied);
    assert_eq!(m.change(6, "a".into(), Some(6)), Step::Applied);
    assert_eq!(drain(&mut m), [put("a", 5), put("a", 6)]);
}

#[test]
fn a_snapshot_in_entries_keeps_the_newest_entry_per_key_and_its_markers() {
    let mut m = Mirror::new(Order::Increasing, 8);
    m.snapshot_entry(3, "a".into(), Some(1));
    m.snapshot_entry(5, "b".into(), Some(2));
    assert!(m.is_building());
    assert_eq!(m.resume_at(), Some(6), "entries count as seen");
    m.snapshot_entry(7, "a".into(), None);
    m.snapshot_seen(9);
    m.snapshot_end(8);
    assert!(!m.is_building());
    assert_eq!(m.at(), Some(9));
    assert_eq!(drain(&mut m), [put("b", 2), MirrorNotice::Synced]);
}

#[test]
fn a_snapshot_is_the_truth_even_at_a_lower_version() {
    // A server that restarted without its data starts counting again.
    let mut m = Mirror::new(Order::Contiguous, 8);
    m.snapshot(5, content(&[("a", 1), ("b", 2)]));
    drain(&mut m);
    m.missed();
    m.snapshot(1, content(&[("b", 2)]));
    assert!(!m.needs_snapshot());
    assert_eq!(m.at(), Some(1));
    assert_eq!(drain(&mut m), [deleted("a")]);
    // An empty snapshot in entries (no entry at all) empties the view.
    m.missed();
    m.snapshot_end(2);
    assert_eq!(m.at(), Some(2));
    assert_eq!(drain(&mut m), [deleted("b")]);
    assert_eq!(m.change(3, "a".into(), Some(3)), Step::Applied);
    assert_eq!(drain(&mut m), [put("a", 3)]);
}
