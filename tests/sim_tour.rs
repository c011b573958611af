//! The simulated device's tour: with no GPU and no `--probe`, the live view plays the
//! built-in scenarios one after another on bookkeeping memory, labelled simulated.
//! Here the real runner task is driven on a tokio runtime and the screen drawn from what
//! it publishes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratatui::backend::TestBackend;
use ratatui::Terminal;

use vramtop::alloc::PolicyKind;
use vramtop::app::App;
use vramtop::probe::live::{LiveProbe, ProbeView, MAX_OPS_PER_S};
use vramtop::probe::tour::{Tour, ORDER};
use vramtop::telemetry::sim::{SimSource, WorkloadGauge};
use vramtop::telemetry::TelemetrySource;

/// Wait (on the runtime) until the tour publishes a view `done` accepts, or give up.
async fn wait_for(probe: &mut LiveProbe, done: impl Fn(&ProbeView) -> bool) -> Arc<ProbeView> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let view = probe.views.borrow_and_update().clone();
        if done(&view) {
            return view;
        }
        assert!(
            Instant::now() < deadline,
            "the tour never got there: {:?}",
            view.tour
        );
        let _ = tokio::time::timeout(Duration::from_millis(200), probe.views.changed()).await;
    }
}

fn scenario(view: &ProbeView) -> &str {
    view.policies
        .first()
        .map_or("", |p| p.report.scenario.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tour_opens_on_checkerboard_holds_it_then_plays_the_next_story() {
    let tour = Tour::new(PolicyKind::Caching, 0)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_hold(Duration::from_millis(1500));
    let gauge = WorkloadGauge::default();
    let mut probe = LiveProbe::spawn_tour(tour, Some(gauge.clone()), MAX_OPS_PER_S);

    // The first story ends in the OOM with memory free, and stays up with a countdown.
    let held = wait_for(&mut probe, |v| {
        v.done && v.tour.is_some_and(|t| t.next_in_s.is_some())
    })
    .await;
    assert_eq!(scenario(&held), "checkerboard");
    let step = held.tour.expect("a tour step");
    assert_eq!((step.number, step.count), (1, ORDER.len()));
    let first = &held.policies[0];
    assert!(
        first.report.backing.contains("simulated"),
        "{}",
        first.report.backing
    );
    assert!(
        first.report.last_oom.is_some(),
        "checkerboard ends in its OOM"
    );
    assert_eq!(
        gauge.get(),
        first.stats.reserved_bytes,
        "the simulated device shows the tour's memory"
    );

    // Then the second story, on a fresh allocator.
    let next = wait_for(&mut probe, |v| v.tour.is_some_and(|t| t.number == 2)).await;
    assert_eq!(scenario(&next), ORDER[1]);
    assert!(
        next.policies[0].report.last_oom.is_none(),
        "a fresh allocator: {:?}",
        next.policies[0].report.last_oom
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_tour_stays_on_its_story() {
    let tour = Tour::new(PolicyKind::Caching, 0)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_hold(Duration::from_millis(100));
    let mut probe = LiveProbe::spawn_tour(tour, None, MAX_OPS_PER_S);
    wait_for(&mut probe, |v| v.done).await;
    probe.toggle_pause();
    wait_for(&mut probe, |v| v.paused).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let view = probe.views.borrow().clone();
    assert_eq!(scenario(&view), "checkerboard");
    assert_eq!(view.tour.map(|t| t.number), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_screen_names_the_tour_and_says_it_is_simulated() {
    let tour = Tour::new(PolicyKind::Caching, 0).unwrap_or_else(|e| panic!("{e}"));
    let mut probe = LiveProbe::spawn_tour(tour, None, MAX_OPS_PER_S);
    let view = wait_for(&mut probe, |v| v.done).await;

    let mut source = SimSource::new(7, WorkloadGauge::default()).with_fixed_clock();
    let mut app = App::new(1.0);
    app.apply_snapshot(source.poll());
    app.apply_probe(view);
    let mut terminal = Terminal::new(TestBackend::new(160, 45)).expect("test terminal");
    terminal.draw(|f| vramtop::ui::draw(f, &app)).expect("draw");
    let screen = vramtop::ui::buffer_text(terminal.backend().buffer());
    assert!(screen.contains("probe checkerboard"), "{screen}");
    assert!(screen.contains("simulated 512.0 MiB backing"), "{screen}");
    assert!(screen.contains("tour 1/6"), "{screen}");
    assert!(screen.contains("(--no-tour)"), "{screen}");
    assert!(
        screen.contains("OOM: needed 24.0 MiB contiguous"),
        "{screen}"
    );
}
