//! `trace::load` on each format and on each way a file can be wrong: the format is
//! detected, and every failure is one line that names the file and says what to do.

#[path = "../../../tests/support/trace_support.rs"]
mod support;
#[path = "../../../tests/support/temp_dir.rs"]
mod temp_dir;

use std::io::Write;

use support::{
    block, dict, event, frame, pickle, pickle_unmemoized_containers, s, segment, small_snapshot,
    snapshot, P,
};
use vramtop_alloc::BlockState;
use vramtop_trace::record::{self, RecordWriter};
use vramtop_trace::{
    self as trace, LiveAtStart, LoadOptions, TraceEvent, TraceEventKind, TraceFormat,
};

/// Writes `bytes` to a fresh file in a scratch folder, both removed when dropped.
fn temp_file(name: &str, bytes: &[u8]) -> temp_dir::TempFile {
    temp_dir::TempFile::new("trace-tests", name, bytes)
}

fn load_error(name: &str, bytes: &[u8]) -> String {
    let path = temp_file(name, bytes);
    match trace::load(&path) {
        Ok(t) => panic!("{name} loaded: {:?}", t.stats),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with(&path.display().to_string()), "{msg}");
            assert!(!msg.contains('\n'), "one line: {msg}");
            msg
        }
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap_or_default();
    enc.finish().unwrap_or_default()
}

#[test]
fn bad_files_give_one_clear_line() {
    assert!(load_error("empty.pickle", b"").contains("the file is empty"));
    assert!(load_error("text.pickle", b"hello\n").contains("not a trace vramtop knows"));
    let list = pickle(&P::List(vec![P::Int(1), P::Int(2), P::Int(3)]));
    assert!(load_error("list.pickle", &list).contains("holds a list of 3 items"));
    let other = pickle(&dict(vec![("model", s("resnet"))]));
    let msg = load_error("other.pickle", &other);
    assert!(
        msg.contains("keys [model]") && msg.contains("_dump_snapshot"),
        "{msg}"
    );
    let msg = load_error("class.pickle", b"\x80\x02c__main__\nFoo\n.");
    assert!(msg.contains("GLOBAL"), "{msg}");
    let missing = std::env::temp_dir().join("vramtop-no-such-trace.pickle");
    assert!(trace::load(&missing).is_err());
}

#[test]
fn gzip_cut_short_or_corrupt_is_reported() {
    let gz = gzip(&pickle(&small_snapshot()));
    for cut in [gz.len() / 2, gz.len() - 4, 12] {
        let msg = load_error("cut.pickle.gz", &gz[..cut]);
        assert!(msg.contains("cut short"), "cut at {cut}: {msg}");
    }
    let mut bad = gz.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    bad[mid + 1] ^= 0x55;
    load_error("corrupt.pickle.gz", &bad);
    let opts = LoadOptions {
        max_bytes: 100,
        ..LoadOptions::default()
    };
    let err = trace::from_bytes(&gz, &opts).err().map(|e| e.to_string());
    assert!(err.is_some_and(|m| m.contains("larger than")));
}

#[test]
fn small_snapshot_imports_with_initial_state_tags_and_counts() {
    let path = temp_file("small.pickle.gz", &gzip(&pickle(&small_snapshot())));
    let t = trace::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.source, TraceFormat::PytorchSnapshot);
    let kinds: Vec<TraceEventKind> = t.events.iter().map(|e| e.kind).collect();
    use TraceEventKind::*;
    assert_eq!(
        kinds,
        [
            SegmentAlloc,
            Alloc,
            Alloc,
            FreeRequested,
            FreeCompleted,
            FreeCompleted
        ]
    );
    assert_eq!(t.stats.actions.get("mystery_action"), Some(&1));
    assert_eq!(t.stats.actions.get("free_completed"), Some(&2));
    assert_eq!(t.stats.unknown_actions.get("mystery_action"), Some(&1));
    // 0x1234 is freed but never allocated: live before the trace began, not unknown.
    assert_eq!(t.stats.unknown_frees, 0);
    assert_eq!(t.events[1].tag.as_deref(), Some("train.py:68 step"));
    assert_eq!(t.events[3].tag, None);
    assert_eq!(t.events[1].time_us, Some(1_795_321_078_558_603));
    let base = 0x7f00_0000_0000;
    assert_eq!(
        t.initial,
        [
            LiveAtStart {
                addr: 0x1234,
                size: 512,
                stream: 0,
                tag: None
            },
            LiveAtStart {
                addr: base,
                size: 1 << 20,
                stream: 0,
                tag: None
            }
        ]
    );
    assert_eq!(t.segments_at_end.len(), 1);
    let states: Vec<BlockState> = t.segments_at_end[0]
        .blocks
        .iter()
        .map(|b| b.state)
        .collect();
    assert_eq!(
        states,
        [
            BlockState::Allocated,
            BlockState::Allocated,
            BlockState::Free
        ]
    );
    assert_eq!(t.live_bytes_peak(512), 4096 + 1024);
    assert_eq!(
        t.live_bytes_peak_with_initial(512),
        512 + (1 << 20) + 4096 + 1024
    );
    let notices = t.notices().join("\n");
    assert!(notices.contains("unknown actions") && notices.contains("mystery_action"));
    assert!(!notices.contains("not live"), "{notices}");
}

#[test]
fn each_entry_keeps_its_own_site_when_frames_are_not_memoized() {
    // Without memo entries a frame dict is dropped once its list is read, and the next
    // one may be allocated at its address: the reader must not take it for the old one.
    let entries: Vec<P> = (0..200)
        .map(|i| {
            let site = frame("train.py", 100 + i, "step");
            event("alloc", 0x1000 * (i + 1), 512, vec![site])
        })
        .collect();
    for (name, bytes) in [
        (
            "unmemoized.pickle",
            pickle_unmemoized_containers(&snapshot(vec![], vec![entries.clone()])),
        ),
        ("memoized.pickle", pickle(&snapshot(vec![], vec![entries]))),
    ] {
        let t = trace::load(&temp_file(name, &bytes)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let tags: Vec<Option<&str>> = t.events.iter().map(|e| e.tag.as_deref()).collect();
        let want: Vec<String> = (0..200)
            .map(|i| format!("train.py:{} step", 100 + i))
            .collect();
        assert_eq!(
            tags,
            want.iter().map(|w| Some(w.as_str())).collect::<Vec<_>>(),
            "{name}"
        );
    }
}

#[test]
fn snapshot_without_history_loads_segments_and_says_so() {
    let snap = snapshot(
        vec![segment(
            4096,
            8192,
            vec![block(4096, 8192, "active_allocated")],
        )],
        vec![vec![]],
    );
    let t = trace::from_bytes(&pickle(&snap), &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(t.stats.no_history);
    assert!(t.events.is_empty());
    assert_eq!(t.segments_at_end.len(), 1);
    assert_eq!(t.initial.len(), 1);
    assert!(t.notices()[0].starts_with("no allocation history in this snapshot"));
}

#[test]
fn device_with_traces_is_picked_or_chosen() {
    let snap = snapshot(
        vec![],
        vec![
            vec![],
            vec![event("alloc", 512, 512, vec![])],
            vec![
                event("alloc", 1024, 512, vec![]),
                event("oom", 0, 1 << 30, vec![]),
            ],
        ],
    );
    let bytes = pickle(&snap);
    let t = trace::from_bytes(&bytes, &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((t.device, t.events.len()), (1, 1));
    assert_eq!(t.stats.devices_with_traces, [1, 2]);
    assert!(t.notices()[0].contains("devices 1, 2; showing device 1"));
    let opts = LoadOptions {
        device: Some(2),
        ..LoadOptions::default()
    };
    let t = trace::from_bytes(&bytes, &opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((t.device, t.events.len()), (2, 2));
    assert_eq!(t.events[1].kind, TraceEventKind::Oom);
    let opts = LoadOptions {
        device: Some(7),
        ..LoadOptions::default()
    };
    assert!(trace::from_bytes(&bytes, &opts).is_err());
}

#[test]
fn a_trace_of_snapshot_markers_alone_is_not_a_device_with_history() {
    // A DDP rank on cuda:1: PyTorch wrote a `snapshot` marker into cuda:0's ring too.
    let snap = snapshot(
        vec![],
        vec![
            vec![
                event("snapshot", 0, 0, vec![]),
                event("snapshot", 0, 0, vec![]),
            ],
            vec![
                event("snapshot", 0, 0, vec![]),
                event("alloc", 1024, 512, vec![]),
            ],
        ],
    );
    let t = trace::from_bytes(&pickle(&snap), &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.device, 1);
    assert_eq!(t.stats.devices_with_traces, [1]);
    assert!(t.notices().is_empty(), "{:?}", t.notices());
}

const RMM_LOG: &str = "Thread,Time,Action,Pointer,Size,Stream
140573312345856,23:59:59.900000,allocate,0x7f8a40000000,1024,0x0
140573312345856,23:59:59.950000,allocate,0x7f8a40000400,2048,0x7f8a38001020
140573312345856,00:00:00.100000,free,0x7f8a40000000,1024,0x0
140573312345856,00:00:00.200000,allocate failure,(nil),1099511627776,0x0
140573312345856,00:00:00.300000,free,0x7f8a99990000,4096,0x0
";

#[test]
fn rmm_log_imports() {
    let path = temp_file("rmm.csv", RMM_LOG.as_bytes());
    let t = trace::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.source, TraceFormat::RmmCsv);
    let kinds: Vec<TraceEventKind> = t.events.iter().map(|e| e.kind).collect();
    use TraceEventKind::*;
    assert_eq!(kinds, [Alloc, Alloc, FreeCompleted, Oom, FreeCompleted]);
    assert_eq!(t.events[1].addr, 0x7f8a_4000_0400);
    assert_eq!((t.events[0].stream, t.events[1].stream), (0, 1));
    assert_eq!(t.events[3].size, 1 << 40);
    // Midnight passed between rows 3 and 4: time keeps rising.
    assert_eq!(t.events[2].time_us, Some(86_400_100_000));
    assert_eq!(t.stats.actions.get("allocate"), Some(&2));
    assert_eq!(t.stats.unknown_frees, 1);
    assert_eq!(t.live_bytes_peak(512), 3072);
    // Gzipped logs load too.
    let gz = trace::from_bytes(&gzip(RMM_LOG.as_bytes()), &LoadOptions::default());
    assert_eq!(gz.map(|g| g.events.len()).ok(), Some(5));
}

#[test]
fn rmm_bad_row_is_named() {
    let bad = RMM_LOG.replace(",2048,", ",lots,");
    let msg = load_error("bad.csv", bad.as_bytes());
    assert!(msg.contains("row 3: bad size 'lots'"), "{msg}");
    let short = format!("{RMM_LOG}1,00:00:01.0,free\n");
    assert!(load_error("short.csv", short.as_bytes()).contains("row 7: 3 fields"));
}

fn sample_events() -> Vec<TraceEvent> {
    vec![
        TraceEvent {
            kind: TraceEventKind::Alloc,
            addr: 1 << 40,
            size: 4096,
            stream: 2,
            tag: Some("train.py:68 step \"quoted\"".into()),
            time_us: Some(-5),
        },
        TraceEvent {
            kind: TraceEventKind::FreeCompleted,
            addr: 1 << 40,
            size: 4096,
            stream: 2,
            tag: None,
            time_us: None,
        },
    ]
}

#[test]
fn recording_round_trips() {
    let mut writer = RecordWriter::new(Vec::new(), 3, None).unwrap_or_else(|e| panic!("{e}"));
    let param = LiveAtStart {
        addr: 7 << 30,
        size: 1 << 20,
        stream: 0,
        tag: Some("model.py:1 init".into()),
    };
    writer.live_at_start(&param).unwrap_or_default();
    for e in sample_events() {
        writer.event(&e).unwrap_or_default();
    }
    let text = writer.into_inner();
    assert!(text.starts_with(b"{\"vramtop_trace\":1,"));
    let t = trace::from_bytes(&text, &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.source, TraceFormat::VramtopRecord);
    assert_eq!(t.device, 3);
    assert_eq!(t.initial, [param]);
    assert_eq!(t.events, sample_events());

    let snap = trace::from_bytes(&pickle(&small_snapshot()), &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let text = record::write_trace(Vec::new(), &snap).unwrap_or_default();
    let back = trace::from_bytes(&text, &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((back.initial, back.events), (snap.initial, snap.events));
    assert_eq!(back.stats.unknown_frees, snap.stats.unknown_frees);
}

#[test]
fn recording_errors_name_the_line() {
    let header = "{\"vramtop_trace\":1,\"device\":0}\n";
    let bad =
        format!("{header}{{\"kind\":\"alloc\",\"addr\":1,\"size\":2}}\n{{\"kind\":\"alloc\"}}\n");
    assert!(load_error("bad.jsonl", bad.as_bytes()).contains("line 3: not a trace event"));
    let newer = "{\"vramtop_trace\":9}\n";
    assert!(load_error("newer.jsonl", newer.as_bytes()).contains("update vramtop"));
    let unknown = format!("{header}{{\"kind\":\"teleport\",\"addr\":1,\"size\":2}}\n");
    let t = trace::from_bytes(unknown.as_bytes(), &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.events.len(), 0);
    assert_eq!(t.stats.unknown_actions.get("teleport"), Some(&1));
}

/// A file hook 1.3 kept at an OOM: `snapshot` as `_snapshot()` returns it, with the hook's
/// `vramtop_oom` (its ring, its checkpoint's segments and how many entries they held).
fn kept_with_checkpoint(checkpoint_segments: Vec<P>) -> P {
    let base: i64 = 0x7f00_0000_0000;
    let mib: i64 = 1 << 20;
    let at_oom = segment(
        base,
        20 * mib,
        vec![
            block(base, 4 * mib, "active_allocated"),
            block(base + 4 * mib, 16 * mib, "active_allocated"),
        ],
    );
    let ring = vec![
        event("free_completed", base + 8 * mib, 2 * mib, vec![]), // before the mark: in it
        event("snapshot", 0, 4 * mib, vec![]),
        event("alloc", base + 4 * mib, 16 * mib, vec![]),
        dict(vec![
            ("action", s("oom")),
            ("device_free", P::Int(70 << 30)),
            ("size", P::Int(64 * mib)),
            ("stream", P::Int(0)),
            ("time_us", P::Int(1_795_321_078_558_700)),
        ]),
    ];
    let P::Dict(mut pairs) = snapshot(vec![at_oom], vec![ring]) else {
        unreachable!()
    };
    pairs.push((
        s("vramtop_oom"),
        dict(vec![
            ("number", P::Int(1)),
            ("pid", P::Int(4242)),
            ("argv", P::List(vec![s("train.py")])),
            ("time_s", P::Float(1_795_321_078.6)),
            ("device", P::Int(0)),
            ("requested_bytes", P::Int(64 * mib)),
            ("device_free_bytes", P::Int(70 << 30)),
            ("device_total_bytes", P::Int(24 * mib)),
            (
                "ring",
                dict(vec![
                    ("max_entries", P::Int(65536)),
                    ("entries", P::Int(4)),
                    ("complete", P::Bool(true)),
                    ("checkpoint", P::Bool(true)),
                ]),
            ),
            (
                "checkpoint",
                dict(vec![
                    ("time_s", P::Float(1_795_321_078.5)),
                    ("skip", P::Int(0)),
                    ("segments", P::List(checkpoint_segments)),
                ]),
            ),
            ("steps", P::List(vec![])),
        ]),
    ));
    P::Dict(pairs)
}

#[test]
fn a_kept_file_replays_from_its_checkpoint_and_a_broken_one_still_opens() {
    let base: i64 = 0x7f00_0000_0000;
    let mib: i64 = 1 << 20;
    let checkpoint = vec![segment(
        base,
        20 * mib,
        vec![
            block(base, 4 * mib, "active_allocated"),
            block(base + 4 * mib, 16 * mib, "inactive"),
        ],
    )];
    let t = trace::from_bytes(
        &pickle(&kept_with_checkpoint(checkpoint)),
        &LoadOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let kept = t.stats.kept_oom.as_ref().expect("kept");
    let cp = kept.checkpoint.as_ref().expect("a checkpoint");
    // Everything up to the checkpoint's own `snapshot` entry is in its segments.
    assert_eq!((cp.reconciled, cp.contradictions), (2, 0), "{cp:?}");
    assert!(kept.ring_complete);
    assert_eq!(t.initial.len(), 1, "the block live at the checkpoint");
    assert_eq!(t.initial_segments.len(), 1);
    assert_eq!(t.events[0].kind, TraceEventKind::Alloc);
    // A checkpoint whose segments cannot be read: the state at the OOM still opens, and
    // its history is not called complete (no verdict is replayed from it).
    let broken = vec![dict(vec![("address", s("not a number"))])];
    let t = trace::from_bytes(
        &pickle(&kept_with_checkpoint(broken)),
        &LoadOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let kept = t.stats.kept_oom.as_ref().expect("kept");
    assert!(!kept.ring_complete);
    assert!(kept.checkpoint.is_none());
    assert_eq!(t.segments_at_end.len(), 1);
}
