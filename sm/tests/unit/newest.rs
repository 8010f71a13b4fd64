use fleetcoord_sm::newest::Newest;

#[test]
fn only_the_newest_is_held_and_each_replaced_one_is_counted_once() {
    let mut n = Newest::new();
    assert!(!n.is_holding());
    assert_eq!(n.take(), None);
    n.hold(1);
    assert!(n.is_holding());
    n.hold(2);
    n.hold(3);
    assert_eq!(n.take_replaced(), 2);
    assert_eq!(n.take_replaced(), 0, "counted once");
    assert_eq!(n.take(), Some(3));
    assert!(!n.is_holding());
    assert_eq!(n.take(), None);
}

#[test]
fn taking_ends_a_run_without_counting_the_delivered_item() {
    let mut n = Newest::new();
    n.hold("a");
    assert_eq!(n.take(), Some("a"));
    // A new run after delivery: the first item replaces nothing.
    n.hold("b");
    assert_eq!(n.take_replaced(), 0);
    n.hold("c");
    assert_eq!(n.take_replaced(), 1);
    assert_eq!(n.take(), Some("c"));
}
