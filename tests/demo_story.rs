//! Talk mode headless: the built-in story played to its end on a TestBackend, frame by
//! frame, twice under one seed; what each act comes to; the presenter layout at 80x24
//! and 120x40 as insta snapshots; themes and NO_COLOR; the command line.

use assert_cmd::Command;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::style::{Color, Modifier};
use ratatui::Terminal;

use vramtop::demo::player::{PlayState, RequestOutcome, StoryPlayer};
use vramtop::demo::story::{Story, StoryBacking};
use vramtop::ui::presenter::{self, Chrome};
use vramtop::ui::screen_theme::{Palette, ScreenTheme};

const STORY: &str = "oom-with-free-memory";

fn player(seed: u64, backing: Option<StoryBacking>) -> StoryPlayer {
    let story = Story::load(STORY).unwrap_or_else(|e| panic!("{e}"));
    StoryPlayer::new(story, seed, backing).unwrap_or_else(|e| panic!("{e}"))
}

fn render(p: &StoryPlayer, width: u16, height: u16, palette: Palette) -> Buffer {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
    let chrome = Chrome {
        palette,
        message: None,
    };
    let view = p.view();
    terminal
        .draw(|f| presenter::draw(f, &view, &chrome))
        .expect("draw");
    terminal.backend().buffer().clone()
}

fn text(buf: &Buffer) -> String {
    vramtop::ui::buffer_text(buf)
}

/// Every frame of a run through the story: half a second of story time per frame
/// while a step runs, the speaker's "next" whenever one waits.
fn all_frames(seed: u64) -> Vec<Buffer> {
    let mut p = player(seed, None);
    let mut frames = vec![render(&p, 80, 24, Palette::default())];
    let mut guard = 0;
    while !p.is_finished() {
        if p.state() == PlayState::Running {
            p.advance(0.5);
        } else {
            p.next();
        }
        frames.push(render(&p, 80, 24, Palette::default()));
        guard += 1;
        assert!(guard < 1000, "the story does not end");
    }
    frames
}

#[test]
fn same_seed_same_frames_to_the_end() {
    let first = all_frames(7);
    let second = all_frames(7);
    assert!(first.len() > 10, "only {} frames", first.len());
    assert_eq!(first.len(), second.len());
    for (i, (a, b)) in first.iter().zip(&second).enumerate() {
        assert_eq!(a, b, "frame {i} differs:\n{}\n{}", text(a), text(b));
    }
    let last = text(first.last().expect("frames"));
    assert!(last.contains("FITS"), "{last}");
}

fn check_outcomes(p: &StoryPlayer) {
    let outcomes = p.act_outcomes();
    match &outcomes[0] {
        Some(RequestOutcome::OutOfMemory(oom)) => {
            assert_eq!(oom.requested_bytes, 24 << 20);
            assert!(
                oom.total_free_bytes > oom.requested_bytes,
                "OOM with only {} free",
                oom.total_free_bytes
            );
            assert!(oom.largest_free_bytes < oom.requested_bytes);
        }
        other => panic!("act 1 should end out of memory, got {other:?}"),
    }
    assert_eq!(
        outcomes[1],
        Some(RequestOutcome::Placed { bytes: 24 << 20 }),
        "act 2 should fit the request"
    );
}

#[test]
fn caching_fails_with_memory_free_and_expandable_fits() {
    let mut p = player(0, None);
    p.run_to_end();
    check_outcomes(&p);
}

#[test]
fn the_story_runs_on_host_memory_too() {
    let mut p = player(3, Some(StoryBacking::Host));
    p.run_to_end();
    check_outcomes(&p);
}

/// The speaker's "next" until step `index` is on screen and finished.
fn play_to(p: &mut StoryPlayer, index: usize) {
    while p.current() < index || p.state() == PlayState::Running {
        p.next();
    }
}

/// Index of the step whose caption starts with `start`, in act `act`.
fn step_of(p: &StoryPlayer, act: usize, start: &str) -> usize {
    p.steps()
        .iter()
        .position(|s| s.act == act && s.caption.starts_with(start))
        .unwrap_or_else(|| panic!("no step '{start}' in act {act}"))
}

#[test]
fn presenter_at_80x24_and_120x40() {
    let mut p = player(0, None);
    let oom = step_of(&p, 0, "Ask for 24 MiB");
    play_to(&mut p, oom);
    let small = text(&render(&p, 80, 24, Palette::default()));
    assert!(small.contains("OUT OF MEMORY"), "{small}");
    assert!(small.contains("LARGEST FREE RUN"), "{small}");
    insta::assert_snapshot!("presenter_oom_80x24", small);
    let large = text(&render(&p, 120, 40, Palette::default()));
    insta::assert_snapshot!("presenter_oom_120x40", large);

    let fits = step_of(&p, 1, "Ask for 24 MiB");
    play_to(&mut p, fits);
    let screen = text(&render(&p, 80, 24, Palette::default()));
    assert!(screen.contains("FITS"), "{screen}");
    insta::assert_snapshot!("presenter_expandable_fits_80x24", screen);
}

#[test]
fn themes_and_no_color() {
    let mut p = player(0, None);
    let oom = step_of(&p, 0, "Ask for 24 MiB");
    play_to(&mut p, oom);
    let dark = render(&p, 80, 24, Palette::default());
    let plain = render(&p, 80, 24, Palette::new(ScreenTheme::Dark, true));
    assert_eq!(text(&dark), text(&plain), "NO_COLOR must keep every symbol");
    assert!(plain
        .content
        .iter()
        .all(|c| c.fg == Color::Reset && c.bg == Color::Reset));
    assert!(dark.content.iter().any(|c| c.fg != Color::Reset));

    let light = render(&p, 80, 24, Palette::new(ScreenTheme::Light, false));
    assert!(light.content.iter().all(|c| c.bg != Color::Reset));
    assert!(light.content.iter().all(|c| c.fg != Color::White));
    let contrast = render(&p, 80, 24, Palette::new(ScreenTheme::HighContrast, false));
    assert!(contrast
        .content
        .iter()
        .all(|c| !c.modifier.contains(Modifier::DIM) && c.fg != Color::DarkGray));
    // Small terminals get a request to enlarge, not a panic.
    for (w, h) in [(1, 1), (20, 5), (49, 30), (80, 15)] {
        let small = text(&render(&p, w, h, Palette::default()));
        assert!(w < 10 || small.contains("enlarge"), "{small}");
    }
}

fn vramtop() -> Command {
    Command::cargo_bin("vramtop").expect("binary built")
}

#[test]
fn demo_alone_lists_stories_and_an_unknown_name_exits_2() {
    let out = vramtop()
        .arg("demo")
        .assert()
        .success()
        .get_output()
        .clone();
    assert!(String::from_utf8_lossy(&out.stdout).contains(STORY));
    let out = vramtop()
        .args(["demo", "no-such-story"])
        .assert()
        .code(2)
        .get_output()
        .clone();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("known stories: oom-with-free-memory"), "{err}");
}
