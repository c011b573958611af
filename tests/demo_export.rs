//! Talk-mode exports: the story recorded as an asciicast v2 file (every line parsed as
//! JSON) and a screen saved as SVG (checked well formed by a small tag-balance reader,
//! with the screen's text in it), in talk mode and with the live view's P key.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;

use vramtop::demo::player::{PlayState, StoryPlayer};
use vramtop::demo::story::Story;
use vramtop::export::cast::CastRecorder;
use vramtop::export::svg::buffer_to_svg;
use vramtop::ui::presenter::{self, Chrome};

#[path = "support/pty.rs"]
mod pty;

fn player() -> StoryPlayer {
    let story = Story::load("oom-with-free-memory").unwrap_or_else(|e| panic!("{e}"));
    StoryPlayer::new(story, 0, None).unwrap_or_else(|e| panic!("{e}"))
}

fn screen(p: &StoryPlayer) -> Buffer {
    let mut buf = Buffer::empty(Rect::new(0, 0, 80, 24));
    presenter::render(buf.area, &mut buf, &p.view(), &Chrome::default());
    buf
}

#[test]
fn recording_is_valid_asciicast_v2() {
    let mut p = player();
    let mut rec =
        CastRecorder::new(Vec::new(), 80, 24, 1_700_000_000, "vramtop demo test").expect("header");
    let mut t = 0.0;
    let mut written = 0;
    rec.frame(t, &screen(&p)).expect("frame");
    while !p.is_finished() {
        if p.state() == PlayState::Running {
            p.advance(0.5);
        } else {
            p.next();
        }
        t += 0.5;
        written += usize::from(rec.frame(t, &screen(&p)).expect("frame"));
        // A frame drawn twice is written once.
        assert!(!rec.frame(t + 0.1, &screen(&p)).expect("frame"));
    }
    let bytes = rec.finish().expect("flush");
    let text = String::from_utf8(bytes).expect("utf-8");
    let mut lines = text.lines();
    let header: serde_json::Value =
        serde_json::from_str(lines.next().expect("header line")).expect("header is JSON");
    assert_eq!(header["version"], 2);
    assert_eq!(header["width"], 80);
    assert_eq!(header["height"], 24);
    assert!(header["timestamp"].is_u64());
    assert!(header["title"].is_string());
    let mut last = 0.0f64;
    let mut events = 0;
    let mut all = String::new();
    for line in lines {
        let event: serde_json::Value = serde_json::from_str(line).expect("event is JSON");
        let event = event.as_array().expect("event is an array");
        assert_eq!(event.len(), 3, "{line}");
        let time = event[0].as_f64().expect("time is a number");
        assert!(time >= last, "time went back: {time} after {last}");
        last = time;
        assert_eq!(event[1], "o");
        let data = event[2].as_str().expect("data is a string");
        assert!(data.starts_with("\x1b["), "{data:?}");
        all.push_str(data);
        events += 1;
    }
    assert_eq!(events, written + 1);
    assert!(all.contains("OUT OF MEMORY") && all.contains("FITS"));
}

/// A small XML reader: tags balance, attributes are quoted, entities are known, and no
/// stray '<' or '&' sits in text. Returns the text content with entities decoded.
fn check_xml(doc: &str) -> Result<String, String> {
    let mut stack: Vec<String> = Vec::new();
    let mut text = String::new();
    let mut rest = doc;
    let mut roots = 0;
    while let Some(open) = rest.find('<') {
        text.push_str(&decode(&rest[..open])?);
        let close = rest[open..].find('>').ok_or("a tag never closes")? + open;
        let tag = &rest[open + 1..close];
        rest = &rest[close + 1..];
        if tag.starts_with('?') {
            if !tag.ends_with('?') {
                return Err(format!("bad declaration <{tag}>"));
            }
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            match stack.pop() {
                Some(open) if open == name.trim() => {}
                other => return Err(format!("</{name}> closes {other:?}")),
            }
            continue;
        }
        let self_closing = tag.ends_with('/');
        let body = tag.trim_end_matches('/');
        let name = body.split_whitespace().next().ok_or("empty tag")?;
        if !name
            .chars()
            .all(|c| c.is_alphanumeric() || c == ':' || c == '-')
        {
            return Err(format!("bad tag name {name:?}"));
        }
        let attrs = &body[name.len()..];
        if attrs.matches('"').count() % 2 != 0 {
            return Err(format!("unbalanced quotes in <{tag}>"));
        }
        if stack.is_empty() {
            roots += 1;
        }
        if !self_closing {
            stack.push(name.to_string());
        }
    }
    text.push_str(&decode(rest)?);
    if !stack.is_empty() {
        return Err(format!("unclosed {stack:?}"));
    }
    if roots != 1 {
        return Err(format!("{roots} root elements"));
    }
    Ok(text)
}

fn decode(raw: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = raw;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let semi = rest[amp..].find(';').ok_or("bare '&'")? + amp;
        out.push(match &rest[amp + 1..semi] {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            other => return Err(format!("unknown entity &{other};")),
        });
        rest = &rest[semi + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[test]
fn svg_is_well_formed_with_the_screen_text() {
    let mut p = player();
    while !p
        .view()
        .outcome
        .as_ref()
        .is_some_and(|o| matches!(o, vramtop::demo::player::RequestOutcome::OutOfMemory(_)))
    {
        p.next();
    }
    let buf = screen(&p);
    let svg = buffer_to_svg(&buf, "#e5e5e5", "#1e1e1e", "a <title> & \"quotes\"");
    let text = check_xml(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
    for words in [
        "OUT OF MEMORY",
        "LARGEST FREE RUN",
        "Ask for 24 MiB",
        "1 cell =",
    ] {
        assert!(text.contains(words), "'{words}' missing from the SVG text");
    }
    assert!(text.contains("a <title> & \"quotes\""));
    assert!(svg.contains("<tspan") && svg.contains("<rect"));
    assert!(check_xml("<a><b></a></b>").is_err());
    assert!(check_xml("<a>&</a>").is_err());
}

/// P in the real live view, in a pseudo-terminal: the screen as drawn lands in --svg-dir
/// as a well-formed SVG with the screen's text, a second P never overwrites the first,
/// and the status row says where each went.
#[test]
fn p_in_the_live_view_saves_the_screen() {
    let dir = std::env::temp_dir().join(format!("vramtop-live-svg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let args = format!(
        "--device sim --no-tour --interval 0.5 --svg-dir {}",
        dir.display()
    );
    let Some(mut live) = pty::Pty::spawn(&args, 40, 120, &[]) else {
        return;
    };
    let drawn = live.shows("simulated");
    live.send(b"P");
    let said = live.shows("picture saved to");
    let first = pty::appears(&dir.join("vramtop.svg"));
    live.send(b"P");
    let second = pty::appears(&dir.join("vramtop-2.svg"));
    let exited = live.quit();
    let svg = std::fs::read_to_string(dir.join("vramtop.svg")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(drawn, "the live view never drew");
    assert!(said, "no 'picture saved' notice after P");
    assert!(first, "no picture after P");
    assert!(second, "the second picture overwrote the first");
    assert!(exited.is_some(), "q did not end the live view");
    let text = check_xml(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
    assert!(
        text.contains("simulated"),
        "the screen's text is not in the picture"
    );
    assert!(
        svg.contains("width=\"1008\" height=\"680\""),
        "not 120x40 cells"
    );
}

/// A folder that is not there is one line before the screen is taken over, and the
/// job is never started; in batch (stdout not a terminal) pictures are not asked for and
/// the job runs.
#[test]
fn a_missing_svg_dir_is_one_line_before_the_screen() {
    let marker = std::env::temp_dir().join(format!("vramtop-svg-job-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let args = format!(
        "--svg-dir /nonexistent/pictures run -- touch {}",
        marker.display()
    );
    let Some(live) = pty::Pty::spawn(&args, 40, 120, &[]) else {
        return;
    };
    let said =
        live.shows("--svg-dir /nonexistent/pictures: not a folder; create it or name another");
    assert!(said, "no line naming the folder");
    assert_eq!(live.quit(), Some(2));
    assert!(!marker.exists(), "the job was started");
    assert_cmd::Command::cargo_bin("vramtop")
        .unwrap_or_else(|e| panic!("{e}"))
        .args(["--svg-dir", "/nonexistent/pictures", "run", "--", "true"])
        .assert()
        .success();
}
