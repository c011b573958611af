//! Every file reader's limits against hostile input: decompression bombs (a small gzip
//! that expands past the limit), deep nesting, oversized files, and a small pickle whose
//! shared references make a huge logical snapshot. Each must end in one clear line and
//! a non-zero exit, through the library's entry points and through the CLI
//! (`vramtop replay`, `vramtop snapshot`, `vramtop probe`, `vramtop demo`, `--remote`).

#[path = "support/serve_support.rs"]
mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::Command;
use flate2::write::GzEncoder;
use flate2::Compression;
use vramtop::trace::{self, LoadOptions, TraceErrorKind};

use support::FakeServer;

fn vramtop() -> Command {
    Command::cargo_bin("vramtop").expect("binary built")
}

/// A scratch file named for this test and process, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str, bytes: &[u8]) -> Scratch {
        let path =
            std::env::temp_dir().join(format!("vramtop-limits-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).expect("write scratch file");
        Scratch(path)
    }

    fn arg(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::best());
    enc.write_all(bytes).expect("gzip in memory");
    enc.finish().expect("gzip in memory")
}

/// A gzip file that expands to `members` x `member_mib` MiB: one compressed member of
/// zeros (about 1 KiB per MiB), repeated. gunzip, and our reader, read every member.
fn gzip_bomb(prefix: &[u8], member_mib: usize, members: usize) -> Vec<u8> {
    let mut first = prefix.to_vec();
    first.resize(member_mib << 20, 0);
    let head = gzip(&first);
    let rest = gzip(&vec![0u8; member_mib << 20]);
    let mut out = head;
    for _ in 1..members {
        out.extend_from_slice(&rest);
    }
    out
}

/// The command failed with exactly one line on stderr containing every needle, and
/// printed nothing on stdout.
fn one_line_failure(cmd: &mut Command, needles: &[&str]) -> String {
    let out = cmd.output().expect("run vramtop");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{cmd:?} succeeded: {err}");
    assert!(out.stdout.is_empty(), "{cmd:?} printed on stdout");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{cmd:?}: not one line: {err}"
    );
    assert!(
        err.len() < 600,
        "{cmd:?}: a very long line: {} bytes",
        err.len()
    );
    for needle in needles {
        assert!(err.contains(needle), "{cmd:?}: no '{needle}' in: {err}");
    }
    err
}

/// A pickle whose first opcode is a 2 GiB string (BINUNICODE): the zeros behind it are
/// its text, so the streaming reader reads on until the size limit stops it.
const BOMB_PICKLE_HEAD: &[u8] = &[0x80, 2, b'X', 0xff, 0xff, 0xff, 0x7f];
const PICKLE_HEAD: &[u8] = &[0x80, 2];
const RMM_HEAD: &[u8] = b"Thread,Time,Action,Pointer,Size,Stream\n";
const RECORD_HEAD: &[u8] = b"{\"vramtop_trace\":1,\"device\":0}\n";

#[test]
fn a_gzip_bomb_of_every_format_stops_at_the_limit() {
    let opts = LoadOptions {
        max_bytes: 1 << 20,
        ..LoadOptions::default()
    };
    for (format, head) in [
        ("pickle", BOMB_PICKLE_HEAD),
        ("rmm", RMM_HEAD),
        ("record", RECORD_HEAD),
    ] {
        // 8 MiB behind 8 KiB of gzip: past the 1 MiB limit eight times over.
        let bomb = gzip_bomb(head, 1, 8);
        assert!(
            bomb.len() < 64 << 10,
            "{format}: bomb of {} bytes",
            bomb.len()
        );
        let err = trace::from_bytes(&bomb, &opts).expect_err("a bomb must be refused");
        assert!(
            matches!(err.kind, TraceErrorKind::TooLarge { limit } if limit == 1 << 20),
            "{format}: {err}"
        );
        let line = err.to_string();
        assert!(
            line.contains("larger than 1.0 MiB") && !line.contains('\n'),
            "{line}"
        );
    }
}

#[test]
fn a_single_member_gzip_bomb_stops_at_the_limit() {
    let mut plain = RMM_HEAD.to_vec();
    plain.resize(4 << 20, b'\n');
    let bomb = gzip(&plain);
    let opts = LoadOptions {
        max_bytes: 1 << 20,
        ..LoadOptions::default()
    };
    let err = trace::from_bytes(&bomb, &opts).expect_err("a bomb must be refused");
    assert!(matches!(err.kind, TraceErrorKind::TooLarge { .. }), "{err}");
}

/// The CLI's own limit (512 MiB after gunzip) against a 600 KiB file that expands to
/// 600 MiB: replay and snapshot both refuse it in one line naming the file.
#[test]
fn replay_and_snapshot_refuse_a_gzip_bomb() {
    let bomb = Scratch::new("bomb.pickle.gz", &gzip_bomb(BOMB_PICKLE_HEAD, 4, 150));
    for args in [
        vec!["replay", bomb.arg().as_str(), "--report"],
        vec!["snapshot", bomb.arg().as_str(), "--once"],
    ] {
        one_line_failure(
            vramtop().args(&args),
            &["larger than 512.0 MiB", "bomb.pickle.gz"],
        );
    }
}

/// A plain file past the limit, without writing 512 MiB to disk: a sparse file.
#[test]
fn replay_refuses_a_file_past_the_limit() {
    let big = Scratch::new("big.csv", b"");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&big.0)
        .expect("open scratch");
    file.set_len((512 << 20) + 4096).expect("sparse file");
    one_line_failure(
        vramtop().args(["replay", &big.arg(), "--report"]),
        &["larger than 512.0 MiB"],
    );
}

/// `n` empty lists, then `n - 1` APPENDs: each list inside the one below it.
fn nested_lists_pickle(n: usize) -> Vec<u8> {
    let mut out = PICKLE_HEAD.to_vec();
    out.extend(std::iter::repeat_n(b']', n));
    out.extend(std::iter::repeat_n(b'a', n - 1));
    out.push(b'.');
    out
}

#[test]
fn deeply_nested_pickle_is_refused_in_one_line() {
    let deep = nested_lists_pickle(100_000);
    let err = trace::from_bytes(&deep, &LoadOptions::default()).expect_err("too deep");
    assert!(matches!(err.kind, TraceErrorKind::Pickle(_)), "{err}");
    assert!(err.to_string().contains("limit on"), "{err}");
    let file = Scratch::new("deep.pickle.gz", &gzip(&deep));
    for args in [
        vec!["replay", file.arg().as_str(), "--report"],
        vec!["snapshot", file.arg().as_str(), "--once"],
    ] {
        one_line_failure(vramtop().args(&args), &["limit on", "deep.pickle.gz"]);
    }
}

#[test]
fn deeply_nested_json_in_a_recording_is_harmless_or_one_line() {
    let nest = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let header = String::from_utf8(RECORD_HEAD.to_vec()).expect("ascii");
    // In a field the reader ignores, serde_json skips the nesting without recursing.
    let ignored = format!(
        "{header}{{\"kind\":\"alloc\",\"addr\":1,\"size\":2,\"extra\":{}}}\n",
        nest(100_000)
    );
    let t = trace::from_bytes(ignored.as_bytes(), &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.events.len(), 1);
    // Where a string is expected, the nesting is refused at its first bracket.
    let typed = format!(
        "{header}{{\"kind\":\"alloc\",\"addr\":1,\"size\":2,\"tag\":{}}}\n",
        nest(100_000)
    );
    let err = trace::from_bytes(typed.as_bytes(), &LoadOptions::default()).expect_err("a list");
    assert!(
        matches!(err.kind, TraceErrorKind::Record { line: 2, .. }),
        "{err}"
    );
    let file = Scratch::new("deep.jsonl", typed.as_bytes());
    one_line_failure(
        vramtop().args(["replay", &file.arg(), "--report"]),
        &["recording line 2", "not a trace event"],
    );
    // And in the header.
    let head = format!("{{\"vramtop_trace\":{}}}\n", nest(100_000));
    let err = trace::from_bytes(head.as_bytes(), &LoadOptions::default()).expect_err("header");
    assert!(
        matches!(err.kind, TraceErrorKind::Record { line: 1, .. }),
        "{err}"
    );
}

fn deep_toml(depth: usize) -> String {
    format!(
        "name = \"deep\"\nsummary = \"s\"\ndeep = {}{}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    )
}

#[test]
fn deeply_nested_scenario_and_story_toml_are_one_short_line() {
    let file = Scratch::new("deep.toml", deep_toml(100_000).as_bytes());
    let err = one_line_failure(
        vramtop().args(["probe", &file.arg(), "--backing", "bookkeeping"]),
        &["deep.toml", "line 3"],
    );
    assert!(err.contains("recursion") || err.contains("depth"), "{err}");
    one_line_failure(
        vramtop().args(["demo", &file.arg()]),
        &["deep.toml", "line 3"],
    );
}

#[test]
fn scenario_and_story_files_past_the_limit_are_refused() {
    // A valid TOML file padded with a comment past 1 MiB.
    let mut text = deep_toml(1);
    text.push('#');
    text.push_str(&"x".repeat(2 << 20));
    let file = Scratch::new("huge.toml", text.as_bytes());
    one_line_failure(
        vramtop().args(["probe", &file.arg(), "--backing", "bookkeeping"]),
        &["larger than 1024 KiB", "huge.toml"],
    );
    one_line_failure(
        vramtop().args(["demo", &file.arg()]),
        &["larger than 1024 KiB"],
    );
    // A device that never ends: once it read forever, holding all it read.
    if Path::new("/dev/zero").exists() {
        one_line_failure(
            vramtop().args(["probe", "/dev/zero", "--backing", "bookkeeping"]),
            &["/dev/zero", "larger than"],
        );
    }
}

/// `vramtop --remote ADDR --once` against a host whose answer is hostile: the host is
/// reported down with the reason, the run ends with exit 1, nothing hangs or grows.
fn remote_once_against(body: &'static str) -> String {
    let server = FakeServer::start(Some(body));
    let out = vramtop()
        .args(["--remote", &server.addr, "--once"])
        .timeout(Duration::from_secs(60))
        .output()
        .expect("run vramtop --remote");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains(&server.addr), "{all}");
    all
}

#[test]
fn remote_answers_too_deep_or_too_large_mark_the_host_down() {
    // Typed fields refuse nesting at its first bracket, ignored ones skip it: either
    // way the decoder never recurses deeply.
    let deep: &'static str = Box::leak(
        format!(
            "{{\"hostname\":\"h\",\"devices\":{}{}}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        )
        .into_boxed_str(),
    );
    let all = remote_once_against(deep);
    assert!(all.contains("down: not a vramtop snapshot"), "{all}");
    // 17 MiB of JSON string: past the 16 MiB body limit, so never decoded.
    let huge: &'static str = Box::leak(format!("\"{}\"", "x".repeat(17 << 20)).into_boxed_str());
    let all = remote_once_against(huge);
    assert!(all.contains("down: reading the answer"), "{all}");
}

/// A 30 KiB pickle of 1,000 references to one segment, whose 1,000 blocks share one
/// list of 10,000 frames, all inside torch: 10^10 frame visits to find that no block has
/// a user frame. Found while probing the readers for amplification (crates/vramtop-trace/src/pytorch.rs,
/// `TagCache::tag`): `vramtop snapshot` on it ran past 120 s. Bounded here at 60 s so a
/// regression fails instead of hanging.
#[test]
fn a_snapshot_of_shared_references_does_not_hang() {
    let pickle = shared_frames_pickle(1_000, 1_000, 10_000, "torch/nn/modules/module.py");
    let file = Scratch::new("laughs.pickle", &pickle);
    let mut child = StdCommand::new(assert_cmd::cargo::cargo_bin("vramtop"))
        .args(["snapshot", &file.arg(), "--once"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start vramtop");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // Either answer is fine (a summary, or one line saying the snapshot is too large):
    // only running for a minute on a 30 KiB file is not.
    assert!(
        status.is_some(),
        "vramtop snapshot ran past 60 s on a 30 KiB file"
    );
}

/// A 20 KiB pickle of 5,000 references to one segment of 5,000 references to one block:
/// 25 million blocks once the importer copies them out, several GiB. Found while probing
/// the readers for amplification: `vramtop snapshot` on it aborts ("memory allocation of
/// 805306368 bytes failed") under a 3 GB address-space limit, and without one takes
/// several GiB. The pickle reader's own limits count the 10,000 items it built, not the
/// 25 million the importer expands them to. Run here under a 2 GiB limit: the importer
/// takes a repeated segment or block once (so this one reads as one segment), and refuses
/// more than 10 million blocks in one line.
#[test]
fn a_snapshot_of_shared_blocks_is_refused_in_one_line() {
    let pickle = shared_frames_pickle(5_000, 5_000, 1, "train.py");
    assert!(pickle.len() < 32 << 10, "{} bytes", pickle.len());
    let file = Scratch::new("blocks.pickle", &pickle);
    let bin = assert_cmd::cargo::cargo_bin("vramtop");
    let script = format!(
        "ulimit -v 2097152; exec '{}' snapshot '{}' --once",
        bin.display(),
        file.arg()
    );
    let out = StdCommand::new("sh")
        .args(["-c", &script])
        .output()
        .expect("run vramtop under a memory limit");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(0 | 2)),
        "killed or aborted: {err}"
    );
    assert!(err.trim_end().lines().count() <= 1, "{err}");
    if out.status.success() {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("segments       1 "),
            "read as one segment: {text}"
        );
    }
}

/// Raw pickle opcodes for the snapshots above: each container is built once, BINPUT into
/// the memo, and referenced by BINGET wherever Python would share it.
fn shared_frames_pickle(segments: usize, blocks: usize, frames: usize, file: &str) -> Vec<u8> {
    let mut p = PickleOps(PICKLE_HEAD.to_vec());
    // memo 0: a frame in `file`.
    p.op(b'}').put(0).op(b'(');
    p.str("filename").str(file);
    p.str("line")
        .int(1)
        .str("name")
        .str("forward")
        .op(b'u')
        .op(b'0');
    // memo 1: the frame list, `frames` references to memo 0.
    p.op(b']').put(1).op(b'(');
    (0..frames).for_each(|_| {
        p.get(0);
    });
    p.op(b'e').op(b'0');
    // memo 2: a block with those frames; memo 3: `blocks` references to it.
    p.op(b'}').put(2).op(b'(');
    p.str("address")
        .int(0)
        .str("size")
        .int(512)
        .str("requested_size")
        .int(512);
    p.str("state")
        .str("active_allocated")
        .str("frames")
        .get(1)
        .op(b'u')
        .op(b'0');
    p.op(b']').put(3).op(b'(');
    (0..blocks).for_each(|_| {
        p.get(2);
    });
    p.op(b'e').op(b'0');
    // memo 4: a segment holding that block list.
    p.op(b'}').put(4).op(b'(');
    p.str("device")
        .int(0)
        .str("address")
        .int(0)
        .str("total_size")
        .int(1 << 20);
    p.str("stream").int(0).str("segment_type").str("large");
    p.str("blocks").get(3).op(b'u').op(b'0');
    // The snapshot: `segments` references to memo 4, and no history.
    p.op(b'}').op(b'(').str("segments").op(b']').op(b'(');
    (0..segments).for_each(|_| {
        p.get(4);
    });
    p.op(b'e').str("device_traces").op(b']').op(b'u').op(b'.');
    p.0
}

struct PickleOps(Vec<u8>);

impl PickleOps {
    fn op(&mut self, op: u8) -> &mut Self {
        self.0.push(op);
        self
    }

    fn put(&mut self, index: u8) -> &mut Self {
        self.0.extend_from_slice(&[b'q', index]);
        self
    }

    fn get(&mut self, index: u8) -> &mut Self {
        self.0.extend_from_slice(&[b'h', index]);
        self
    }

    fn str(&mut self, text: &str) -> &mut Self {
        self.0.push(b'X');
        self.0.extend_from_slice(&(text.len() as u32).to_le_bytes());
        self.0.extend_from_slice(text.as_bytes());
        self
    }

    fn int(&mut self, value: i32) -> &mut Self {
        self.0.push(b'J');
        self.0.extend_from_slice(&value.to_le_bytes());
        self
    }
}
