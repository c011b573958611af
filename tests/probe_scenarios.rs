//! Every built-in scenario, headless, on real host memory under every policy: blocks
//! are filled and verified, so an overlap or a corruption shows up as a mismatch.

use std::sync::Arc;

use vramtop::alloc::{AllocConfig, Allocator, Event, PolicyKind};
use vramtop::backing::BackingChoice;
use vramtop::backing::BookkeepingBacking;
use vramtop::probe::scenario::names;
use vramtop::probe::{setup, Probe, Scenario};

#[test]
fn every_scenario_under_every_policy_verifies_clean() {
    for name in names() {
        let scenario = Scenario::load(name).expect("built-in scenario");
        for policy in PolicyKind::ALL {
            let mut set = setup::build(
                &scenario,
                &[policy],
                BackingChoice::Host,
                Some(256 << 20),
                1,
            )
            .expect("host backing");
            let probe = &mut set.probes[0];
            probe.run(None);
            let r = probe.report();
            assert!(r.complete, "{name}/{policy}: did not finish");
            assert_eq!(
                r.verify_mismatches, 0,
                "{name}/{policy}: memory did not read back"
            );
            assert!(
                r.verified_blocks > 0,
                "{name}/{policy}: nothing was verified"
            );
            assert!(
                r.backing_errors.is_empty(),
                "{name}/{policy}: {:?}",
                r.backing_errors
            );
        }
    }
}

#[test]
fn checkerboard_ends_in_oom_with_more_free_than_asked() {
    let scenario = Scenario::load("checkerboard").expect("built-in");
    for policy in [PolicyKind::Caching, PolicyKind::BestFit, PolicyKind::Tlsf] {
        let mut set = setup::build(
            &scenario,
            &[policy],
            BackingChoice::Bookkeeping,
            Some(256 << 20),
            1,
        )
        .expect("backing");
        let probe = &mut set.probes[0];
        probe.run(None);
        let r = probe.report();
        let oom = r
            .last_oom
            .as_ref()
            .unwrap_or_else(|| panic!("{policy}: no OOM"));
        assert_eq!(r.ooms, 1, "{policy}");
        assert!(
            oom.total_free_bytes > oom.requested_bytes,
            "{policy}: {oom}: the paradox needs more free than requested"
        );
        assert!(
            oom.largest_free_bytes < oom.requested_bytes,
            "{policy}: {oom}"
        );
    }
}

fn events_of(seed: u64) -> Vec<(String, u64, u64, u32)> {
    let scenario = Scenario::load("streams").expect("built-in");
    let allocator = Arc::new(Allocator::new(
        PolicyKind::Caching,
        Box::new(BookkeepingBacking::new(256 << 20)),
        AllocConfig::default(),
    ));
    let mut rx = allocator.subscribe();
    let mut probe = Probe::new(&scenario, allocator, "bookkeeping", seed);
    let mut events: Vec<Event> = Vec::new();
    while probe.step() {
        let missed = rx.drain(&mut events);
        assert_eq!(missed, 0, "event ring overflowed");
    }
    rx.drain(&mut events);
    events
        .into_iter()
        .map(|e| (format!("{:?}", e.kind), e.addr, e.size, e.stream))
        .collect()
}

#[test]
fn same_seed_gives_the_same_event_sequence() {
    let a = events_of(42);
    assert!(a.len() > 1000);
    assert_eq!(a, events_of(42));
    assert_ne!(a, events_of(43));
}
