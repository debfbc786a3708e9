//! The expiry limit (`Core::limit_expiry`): an HA leader lets leases expire only up to the
//! point its clock check against etcd's has proven.

/// An HA leader lets leases expire only up to what its clock check against etcd proved: a
/// lease due by the calls' clock but beyond the limit stays held (its holder may still renew
/// it), waiters are not served with it, and it expires once the limit allows.
#[test]
fn expiry_waits_for_the_limit_while_new_deadlines_follow_the_clock() {
    use lockd_core::{AcquireOutcome, Effect, Limits};
    let mut rig = crate::harness::Rig::new(Limits::default());
    let mut fx = Vec::new();
    let Ok(AcquireOutcome::Granted(a)) = rig.acquire("r", "a", (None, None), (1000, 0, 0), &mut fx)
    else {
        panic!("a free resource is granted");
    };
    let queued = rig.acquire("r", "b", (None, None), (1000, 60_000, 0), &mut fx);
    assert!(
        matches!(queued, Ok(AcquireOutcome::Queued { .. })),
        "{queued:?}"
    );
    let expired = |fx: &[Effect]| fx.iter().any(|e| matches!(e, Effect::Expired { .. }));

    // The clock says 5 s, but etcd's clock is proven only up to 500 ms: nothing expires.
    rig.core.limit_expiry(Some(500));
    fx.clear();
    rig.core.tick(5_000, &mut fx);
    assert!(!expired(&fx), "expired beyond the limit: {fx:?}");
    let r = fencing::ResourceName::new("r").unwrap();
    // Its holder renews it late: the lease is still its own, and its new deadline is counted
    // from the clock's time, not the limit's.
    let renewed = rig.core.renew(5_000, &r, a.lease_id, &mut fx).unwrap();
    assert_eq!(renewed.expires_at, 6_000);

    // The limit moves past the new deadline: the lease expires and the waiter gets the lock.
    rig.core.limit_expiry(Some(6_000));
    fx.clear();
    rig.core.tick(6_500, &mut fx);
    assert!(expired(&fx), "{fx:?}");
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Granted { .. })),
        "{fx:?}"
    );
}
