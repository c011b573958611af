//! The remedies at an OOM, on recorded states: the live path (a hook's `oom` message, as
//! the attached view explains it) and the file path (a snapshot kept at that OOM with no
//! history, as `vramtop replay` and `vramtop run` explain it) give the same verdicts for
//! the same state; traces made on an H100 (tests/fixtures) get the verdicts PyTorch's
//! A/B runs showed.

use std::path::PathBuf;
use std::process::Command;

#[path = "support/trace_support.rs"]
mod trace_support;
use trace_support::unzipped_as_kept;

use vramtop::alloc::remedy::{Missing, Remedy, RemedyVerdict, Verdict};
use vramtop::attach::job::{snapshot_segments, OomExplained};
use vramtop::attach::protocol::{AllocatorSettings, HookBlock, HookSegment, OomState};
use vramtop::trace::cause;
use vramtop::trace::ooms::trace_ooms;
use vramtop::trace::replay::remedies::{capacity_bounds, remedies, OomRemedies};
use vramtop::trace::{self, KeptOom, Trace, TraceEvent, TraceEventKind, TraceFormat};

const MIB: u64 = 1 << 20;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures")).join(name)
}

fn block(address: u64, size: u64, live: bool) -> HookBlock {
    HookBlock {
        address,
        size,
        requested_size: if live { size } else { 0 },
        state: if live { "active_allocated" } else { "inactive" }.into(),
        site: live.then(|| "train.py:12 step".into()),
    }
}

/// `count` segments of `pattern` (MiB, live?) each.
fn segments(count: u64, pattern: &[(u64, bool)], expandable: bool) -> Vec<HookSegment> {
    let total: u64 = pattern.iter().map(|(mib, _)| mib * MIB).sum();
    (0..count)
        .map(|i| {
            let base = 0x7f00_0000_0000 + i * 0x1000_0000;
            let mut at = base;
            let blocks = pattern
                .iter()
                .map(|&(mib, live)| {
                    let b = block(at, mib * MIB, live);
                    at += mib * MIB;
                    b
                })
                .collect();
            HookSegment {
                address: base,
                total_size: total,
                stream: 0,
                segment_type: "large".into(),
                is_expandable: expandable,
                blocks,
            }
        })
        .collect()
}

/// The same OOM as a file the hook kept at it, without history.
fn kept_file(oom: &OomState) -> Trace {
    let mut stats = trace::TraceStats {
        no_history: true,
        ..Default::default()
    };
    stats.kept_oom = Some(KeptOom {
        number: 1,
        pid: 4242,
        argv: vec!["python".into(), "train.py".into()],
        time_us: 0,
        device: 0,
        requested_bytes: oom.requested_bytes,
        device_free_bytes: oom.device_free_bytes.unwrap_or(0),
        device_total_bytes: oom.device_total_bytes.unwrap_or(0),
        summary: String::new(),
        history_left_out: true,
        ring_complete: false,
        checkpoint: None,
        steps_us: Vec::new(),
        ..Default::default()
    });
    Trace {
        source: TraceFormat::PytorchSnapshot,
        device: 0,
        initial: Vec::new(),
        initial_segments: Vec::new(),
        // PyTorch's `oom` entry: its `addr` field carries the device's free bytes.
        events: vec![TraceEvent {
            kind: TraceEventKind::Oom,
            addr: oom.device_free_bytes.unwrap_or(0),
            size: oom.requested_bytes,
            stream: 0,
            tag: None,
            time_us: None,
        }],
        segments_at_end: snapshot_segments(&oom.segments),
        settings: Default::default(),
        stats,
    }
}

fn oom(segments: Vec<HookSegment>, requested: u64, free: u64, allowed: u64) -> OomState {
    OomState {
        time_s: 1.0,
        device: 0,
        requested_bytes: requested,
        device_free_bytes: Some(free),
        device_total_bytes: Some(allowed),
        stats: None,
        segments,
        truncated: false,
        summary: None,
        settings: AllocatorSettings::default(),
        ring: None,
        kept_path: None,
        device_uuid: None,
        ..Default::default()
    }
}

/// States made like the GPU workloads: a capped checkerboard (holes), a fill whose OOM is
/// the 2 MiB tails of 20 MiB segments, a split cache with room, a device that is full,
/// and a job that already ran with expandable segments.
fn states() -> Vec<(&'static str, OomState)> {
    let cap = 8100 * MIB;
    vec![
        (
            "checkerboard at its cap, 1 GiB asked",
            oom(
                segments(404, &[(6, true), (6, false), (6, true), (2, false)], false),
                1 << 30,
                70 << 30,
                cap,
            ),
        ),
        (
            "tails of 20 MiB segments, 6 MiB asked",
            oom(
                segments(30, &[(6, true), (6, true), (6, true), (2, false)], false),
                6 * MIB,
                70 << 30,
                600 * MIB,
            ),
        ),
        (
            "a split cache with room to grow",
            oom(
                segments(
                    1,
                    &[(304, true), (304, false), (304, true), (304, false)],
                    false,
                ),
                2560 * MIB,
                70 << 30,
                7900 * MIB,
            ),
        ),
        (
            "the device full, no cap",
            oom(
                segments(10, &[(10, true), (10, false)], false),
                64 * MIB,
                4 * MIB,
                80 << 30,
            ),
        ),
        (
            "expandable already on",
            oom(
                segments(1, &[(60, true), (40, false)], true),
                64 * MIB,
                70 << 30,
                100 * MIB,
            ),
        ),
    ]
}

/// The live view's one-state path (no whole history came with the OOM) leaves open the
/// "fits" inside a first step that accumulates gradients, as the replay's path does
/// (`open_inside_accumulating`): the split cache with room, whose one state says that
/// expandable segments fit, with a kept file beside it whose hook counted 4 forwards over
/// untouched gradients and marked no step (hook 1.14's `accumulating`), and with 0.
#[test]
fn the_live_view_leaves_open_the_fits_inside_an_accumulating_first_step() {
    use trace_support::{dict, event, pickle, snapshot, P};
    let (_, state) = states().swap_remove(2);
    let dir = std::env::temp_dir().join(format!("vramtop-accumulating-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let live = |accumulating: i64, passes: Vec<P>| {
        // PyTorch's `oom` entry alone: its `addr` is the device's free bytes.
        let oom_entry = event("oom", 70 << 30, state.requested_bytes as i64, vec![]);
        let mut file = snapshot(vec![], vec![vec![oom_entry]]);
        let kept = dict(vec![
            ("number", P::Int(1)),
            ("pid", P::Int(4242)),
            ("time_s", P::Float(state.time_s)),
            ("device", P::Int(0)),
            ("requested_bytes", P::Int(state.requested_bytes as i64)),
            ("accumulating", P::Int(accumulating)),
            ("passes", P::List(passes)),
        ]);
        if let P::Dict(pairs) = &mut file {
            pairs.push((P::Str("vramtop_oom".into()), kept));
        }
        let path = dir.join(format!(
            "vramtop-oom-accumulating-4242-{accumulating}.pickle"
        ));
        std::fs::write(&path, pickle(&file)).unwrap();
        let oom = OomState {
            ring: Some(vramtop::attach::protocol::RingAtOom {
                max_entries: 8192,
                entries: 8192,
                complete: false,
            }),
            kept_path: Some(path.to_string_lossy().into_owned()),
            ..state.clone()
        };
        OomExplained::from_oom(&oom).remedies
    };
    let of = |all: &[RemedyVerdict], remedy: Remedy| {
        all.iter().find(|r| r.remedy == remedy).unwrap().clone()
    };
    let decided = live(0, vec![]);
    let expandable = of(&decided, Remedy::ExpandableSegments);
    assert_eq!(expandable.verdict, Verdict::Fits, "{decided:?}");
    let open = live(4, vec![]);
    let expandable = of(&open, Remedy::ExpandableSegments);
    assert_eq!(expandable.verdict, Verdict::CannotTell, "{open:?}");
    assert!(expandable.reason.contains("accumulating"), "{open:?}");
    // What one state rules out stays ruled out: empty_cache() at the OOM.
    assert_eq!(
        of(&open, Remedy::EmptyCache).verdict,
        Verdict::Fails,
        "{open:?}"
    );
    // A pass marked: a step had ended, so the count no longer says the first step goes on.
    let stepped = live(4, vec![P::Float(state.time_s - 0.5)]);
    let expandable = of(&stepped, Remedy::ExpandableSegments);
    assert_eq!(expandable.verdict, Verdict::Fits, "{stepped:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_live_view_and_a_kept_file_give_the_same_verdicts() {
    for (name, state) in states() {
        let live = OomExplained::from_oom(&state);
        let file = kept_file(&state);
        let ooms = trace_ooms(&file);
        assert_eq!(ooms.len(), 1, "{name}");
        let from_file = remedies(&file, &ooms, None).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(from_file.len(), 1, "{name}");
        assert_eq!(live.remedies, from_file[0].remedies, "{name}");
        assert_eq!(
            Some(&live.what_would_fit),
            from_file[0].what_would_fit.as_ref(),
            "{name}"
        );
        assert_eq!(live.remedies.len(), 5, "{name}");
    }
}

#[test]
fn one_state_verdicts_follow_pytorchs_rules() {
    let verdicts: Vec<(&str, Vec<Verdict>)> = states()
        .into_iter()
        .map(|(name, s)| {
            let v = OomExplained::from_oom(&s).remedies;
            (name, v.iter().map(|r| r.verdict).collect())
        })
        .collect();
    use Verdict::*;
    // Checkerboard: 4.7 GiB live and 1 GiB asked fit the 7.9 GiB cap packed tight, so no
    // setting is ruled out by the floor; whether expandable pages would have stayed mapped
    // depends on the order of allocs and frees (the trace replay says: they would, and it
    // fails, as PyTorch did). One state cannot tell; under the cap neither can it for the GC threshold or for
    // empty_cache() between steps, which release segments earlier.
    assert_eq!(
        verdicts[0].1,
        [CannotTell, CannotTell, CannotTell, Fails, CannotTell],
        "{verdicts:?}"
    );
    // A split cache with room: every live tensor on pages of its own still fits.
    assert_eq!(verdicts[2].1[0], Fits, "{verdicts:?}");
    // Tails: 18 MiB live per segment; packed tight on 20 MiB pages the request fits in
    // the 600 MiB held, not with each tensor on pages of its own.
    assert_eq!(verdicts[1].1[0], CannotTell, "{verdicts:?}");
    // The device itself was full: a GC threshold needs a memory fraction.
    assert_eq!(verdicts[3].1[2], Fails, "{verdicts:?}");
    // Already on: PyTorch unmapped what it could and retried.
    assert_eq!(verdicts[4].1[0], Fails, "{verdicts:?}");
    // empty_cache() in the failing process never changes its OOM.
    assert!(verdicts.iter().all(|(_, v)| v[3] == Fails));
}

#[test]
fn h100_checkerboard_traces_every_remedy_fails_at_the_1_gib_request() {
    // PyTorch 2.11 on an H100, each remedy in a fresh process (README, the A/B table): the
    // 1 GiB request failed with none, with empty_cache(), with expandable segments, with
    // max_split_size_mb:20 and :200, and with garbage_collection_threshold:0.6.
    for name in ["oom_cap.pickle.gz", "oom_cap_expandable.pickle.gz"] {
        let t = trace::load(&fixture(name)).unwrap_or_else(|e| panic!("{e}"));
        let ooms = trace_ooms(&t);
        let all = remedies(&t, &ooms, None).unwrap_or_else(|e| panic!("{e}"));
        let big = all.last().expect("the 1 GiB OOM");
        assert_eq!(big.event, ooms[1].event);
        // Every remedy fails, or is left open (the GC threshold under a cap and
        // empty_cache() between steps depend on the order of events): none says "fits".
        for r in &big.remedies {
            assert_ne!(r.verdict, Verdict::Fits, "{name}: {}", r.line());
        }
        let empty_cache = big
            .remedies
            .iter()
            .find(|r| r.remedy.to_string() == "empty_cache()");
        assert_eq!(
            empty_cache.map(|r| r.verdict),
            Some(Verdict::Fails),
            "{name}"
        );
        let expandable = &big.remedies[0];
        assert_eq!(expandable.remedy.to_string(), "expandable_segments:True");
        if name.contains("expandable") {
            assert!(
                expandable.reason.starts_with("already on"),
                "{}",
                expandable.reason
            );
        }
    }
}

#[test]
fn a_capacity_the_trace_only_bounds_is_said_as_bounds() {
    let t = trace::load(&fixture("oom_cap.pickle.gz")).unwrap_or_else(|e| panic!("{e}"));
    let ooms = trace_ooms(&t);
    // Peak reserved 8,100 MiB; the fill's 6 MiB request needed a 20 MiB segment the cap
    // refused with 8,100 MiB held: the cap is under 8,120 MiB.
    let b = capacity_bounds(&t, &ooms, None).expect("bounds");
    assert_eq!(b.low, 8100 * MIB);
    assert_eq!(b.high, 8120 * MIB - 1);
    let given = capacity_bounds(&t, &ooms, Some(9000 * MIB)).expect("given");
    assert_eq!((given.low, given.high), (9000 * MIB, 9000 * MIB));
}

#[test]
fn replay_json_lists_remedies_at_each_trace_oom() {
    let out = Command::new(env!("CARGO_BIN_EXE_vramtop"))
        .args(["replay", "--report", "--json"])
        .arg(fixture("oom_cap.pickle.gz"))
        .output()
        .expect("vramtop runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let ooms = report["trace_ooms"].as_array().expect("trace_ooms");
    assert_eq!(ooms.len(), 2);
    let big = &ooms[1];
    assert_eq!(big["requested_bytes"], 1u64 << 30);
    let remedies = big["remedies"].as_array().expect("remedies");
    let names: Vec<&str> = remedies
        .iter()
        .filter_map(|r| r["remedy"].as_str())
        .collect();
    assert_eq!(names[0], "expandable_segments:True");
    assert!(names.contains(&"empty_cache()"));
    for r in remedies {
        assert_ne!(r["verdict"], "fits", "{r}");
        assert!(!r["reason"].as_str().unwrap_or("").is_empty(), "{r}");
    }
    assert_eq!(report["capacity"]["source"], "inferred");
}

/// What PyTorch 2.11 did on the H100 with each remedy, each in a fresh process
/// (`scripts/gpu/jobs/whatif_ab.py`), for the workloads whose OOM the hook kept with its
/// event ring: (remedy as vramtop names it, fits).
fn pytorch_outcomes(workload: &str) -> Vec<(&'static str, bool)> {
    let all_fail = vec![
        ("expandable_segments:True", false),
        ("max_split_size_mb", false),
        ("garbage_collection_threshold:0.6", false),
        ("empty_cache()", false),
    ];
    match workload {
        "splitcache" => vec![
            ("expandable_segments:True", true),
            ("max_split_size_mb", true),
            ("garbage_collection_threshold:0.6", false),
            ("empty_cache()", false),
        ],
        "tails" => vec![
            ("expandable_segments:True", true),
            ("max_split_size_mb", false),
            ("garbage_collection_threshold:0.6", false),
            ("empty_cache()", false),
        ],
        _ => all_fail,
    }
}

/// The state the hook sent at the OOM, as far as the history path reads it: the kept
/// file and its ring.
fn oom_message_for(path: &std::path::Path, kept: &KeptOom, complete: bool) -> OomState {
    OomState {
        time_s: kept.time_us as f64 / 1e6,
        device: kept.device,
        requested_bytes: kept.requested_bytes,
        device_free_bytes: Some(kept.device_free_bytes),
        device_total_bytes: Some(kept.device_total_bytes),
        stats: None,
        segments: Vec::new(),
        truncated: false,
        summary: None,
        settings: AllocatorSettings::default(),
        ring: Some(vramtop::attach::protocol::RingAtOom {
            max_entries: 8192,
            entries: 1,
            complete,
        }),
        kept_path: Some(path.to_string_lossy().into_owned()),
        device_uuid: None,
        ..Default::default()
    }
}

#[test]
fn gpu_kept_files_with_the_whole_history_give_pytorchs_outcomes_on_both_paths() {
    for workload in ["checker", "splitcache", "tails", "otherproc"] {
        let path = fixture(&format!("ring_{workload}.pickle.gz"));
        let file = trace::load(&path).unwrap_or_else(|e| panic!("{workload}: {e}"));
        let kept = file.stats.kept_oom.clone().expect("a file the hook kept");
        assert!(
            kept.ring_complete,
            "{workload}: the ring held the whole history"
        );
        // The replay of the file, as `vramtop replay` answers it...
        let at = at_last_oom(workload, &file);
        // ...and the live view, handed the same OOM by the hook, which names its files
        // `vramtop-oom-...` (the live view opens no other).
        let (dir, kept_path) = unzipped_as_kept(&path, workload);
        let misnamed = OomExplained::from_oom(&oom_message_for(&path, &kept, true));
        assert_eq!(
            misnamed.history_events, None,
            "{workload}: not a name the hook gives"
        );
        let path = kept_path;
        let live = OomExplained::from_oom(&oom_message_for(&path, &kept, true));
        assert_eq!(live.history_events, Some(file.events.len()), "{workload}");
        // checker caught its first OOM (6 MiB tensors until one fails) and went on: under
        // expandable segments that request is served, and the job goes on making tensors
        // (on an H200 PyTorch's run made 2,383 where the plain one made 2,145), so its
        // history cannot say (`runs::served_caught`); PyTorch failed it on the H100 and
        // fitted it on the H200.
        let went_another_way = workload == "checker";
        assert!(
            live.expandable_line().contains(if went_another_way {
                "and went on without (an OOM it caught"
            } else {
                "the job's own history replayed"
            }),
            "{workload}: {}",
            live.expandable_line()
        );
        assert_eq!(live.remedies, at.remedies, "{workload}");
        for (remedy, fits) in pytorch_outcomes(workload) {
            let ours = live
                .remedies
                .iter()
                .find(|r| r.remedy.to_string().starts_with(remedy))
                .unwrap_or_else(|| panic!("{workload}: no {remedy}"));
            let expected = match (fits, went_another_way && remedy.starts_with("expandable")) {
                (_, true) => Verdict::CannotTell,
                (true, false) => Verdict::Fits,
                (false, false) => Verdict::Fails,
            };
            assert_eq!(ours.verdict, expected, "{workload} {remedy}: {ours:?}");
        }
        // A ring the hook does not call complete is not replayed from the live view.
        let partial = OomExplained::from_oom(&oom_message_for(&path, &kept, false));
        assert_eq!(partial.history_events, None, "{workload}");
        // Nor is a file kept at another OOM (the hook rewrites its `last` file).
        let mut later = oom_message_for(&path, &kept, true);
        later.time_s += 1.0;
        assert_eq!(
            OomExplained::from_oom(&later).history_events,
            None,
            "{workload}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Files kept by hook 1.3 at the judged OOM of three stepped workloads of
/// `scripts/gpu/jobs/whatif_ab.py` under a plain `vramtop run` on the H100 (PyTorch 2.11):
/// kvcache with its whole history (27,683 events), gpt2var and gpt2mixed from the hook's
/// checkpoint (4,340 and 26,593 events since). PyTorch's outcome for each remedy is its
/// own, each in a fresh process (tests/fixtures/README.md).
/// The kvcache jobs' outcomes in PyTorch: every allocator setting failed; `empty_cache`
/// is the row that differs between them.
fn every_setting_fails_and(empty_cache: (&'static str, Verdict)) -> Vec<(&'static str, Verdict)> {
    every_setting_fails_and_split(Verdict::Fails, empty_cache)
}

/// The KV cache grows at every step: `max_split_size_mb:20` and `:64` serve the refused
/// request in the replay (and PyTorch, run with them, got past it too, dying a few hundred
/// events later in the same step: H200, 2026-11-26), so vramtop, whose history ends at the
/// OOM, says it cannot tell, and why: the job's live memory keeps rising.
const KV_SPLIT: Verdict = Verdict::CannotTell;

fn every_setting_fails_and_split(
    max_split: Verdict,
    empty_cache: (&'static str, Verdict),
) -> Vec<(&'static str, Verdict)> {
    vec![
        ("expandable_segments:True", Verdict::Fails),
        ("max_split_size_mb", max_split),
        ("roundup_power2_divisions", Verdict::Fails),
        ("garbage_collection_threshold:0.6", Verdict::Fails),
        (
            "expandable_segments:True,garbage_collection_threshold:0.6",
            Verdict::Fails,
        ),
        empty_cache,
    ]
}

/// PyTorch's outcome for each setting of a stepped job, as its A/B table gives them.
/// `expandable_segments:True,garbage_collection_threshold:0.6` is expandable's: PyTorch
/// unmaps every free page and retries before it raises, whatever the threshold.
struct Outcomes {
    expandable: Verdict,
    /// The row's name (`max_split_size_mb:N`, the largest N that fits, or the bare name)
    /// and its outcome.
    max_split: (&'static str, Verdict),
    roundup: Verdict,
    gc: Verdict,
    between_steps: Verdict,
}

fn stepped(o: Outcomes) -> Vec<(&'static str, Verdict)> {
    vec![
        ("expandable_segments:True", o.expandable),
        o.max_split,
        ("roundup_power2_divisions", o.roundup),
        ("garbage_collection_threshold:0.6", o.gc),
        (
            "expandable_segments:True,garbage_collection_threshold:0.6",
            o.expandable,
        ),
        ("empty_cache() between steps", o.between_steps),
    ]
}

#[test]
fn gpu_kept_files_of_stepped_jobs_give_pytorchs_outcomes_on_both_paths() {
    use Verdict::{Fails, Fits};
    let all_fail = &every_setting_fails_and(("empty_cache()", Fails))[..];
    let kvcache = &every_setting_fails_and_split(KV_SPLIT, ("empty_cache()", Fails))[..];
    // gpt2var's max_split_size_mb:512 fitted in one run of PyTorch and failed in another
    // (same job, same settings): no history decides it, and vramtop names it as a lone fit
    // (it said "fits" when it took the replay's lone fit at 512 for an answer). Since the
    // replay retries after releasing oversize segments that fell short of the request, as
    // PyTorch does, 20 fits too, under every start and address order; PyTorch fitted 20 in
    // the same job kept by hook 1.4 (below).
    let gpt2var: &[(&str, Verdict)] = &[
        ("max_split_size_mb:20", Verdict::Fits),
        ("expandable_segments:True", Fits),
        ("roundup_power2_divisions", Fails),
        ("garbage_collection_threshold:0.6", Fails),
        (
            "expandable_segments:True,garbage_collection_threshold:0.6",
            Fits,
        ),
        ("empty_cache()", Fails),
    ];
    // The same job kept by hook 1.4 (its optimizer steps marked), judged again on the
    // H100 on 2026-11-26: PyTorch fitted max_split_size_mb:20 and failed :200 and :1000,
    // and fitted empty_cache() between steps.
    let gpt2var_steps: &[(&str, Verdict)] = &[
        ("max_split_size_mb:20", Verdict::Fits),
        ("expandable_segments:True", Fits),
        ("roundup_power2_divisions", Fails),
        (
            "expandable_segments:True,garbage_collection_threshold:0.6",
            Fits,
        ),
        ("empty_cache() between steps", Fits),
    ];
    for (name, outcomes, from_checkpoint) in [
        ("ring_kvcache", kvcache, false),
        ("checkpoint_gpt2mixed", all_fail, true),
        ("checkpoint_gpt2var", gpt2var, true),
        ("checkpoint_gpt2var_steps", gpt2var_steps, true),
    ] {
        let path = fixture(&format!("{name}.pickle.gz"));
        let file = trace::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let kept = file.stats.kept_oom.clone().expect("a file the hook kept");
        assert!(kept.ring_complete, "{name}");
        match (&kept.checkpoint, from_checkpoint) {
            (Some(cp), true) => {
                // The ring's first entry is the checkpoint's own `snapshot`: nothing in the
                // history contradicts the segments it read.
                assert!(cp.reconciled >= 1, "{name}: {cp:?}");
                assert_eq!(cp.contradictions, 0, "{name}: {cp:?}");
                assert!(!file.initial_segments.is_empty(), "{name}");
            }
            (None, false) => assert!(file.initial.is_empty(), "{name}"),
            (cp, _) => panic!("{name}: checkpoint {cp:?}"),
        }
        let at = at_last_oom(name, &file);
        for &(remedy, expected) in outcomes {
            let ours = verdict_of(name, &at, remedy);
            if remedy == "roundup_power2_divisions" {
                roundup_agrees(name, ours, expected);
                continue;
            }
            assert_eq!(ours.verdict, expected, "{name} {remedy}: {ours:?}");
            if remedy.starts_with("max_split_size_mb") {
                // PyTorch's own: bertaccum 20 to 1024 fit, 2048 and 4096 fail; moemix 20 to
                // 256 fit, 512 to 4096 fail.
                let fitting = match name {
                    "history_bertaccum_hook18" => {
                        Some("fits with N = 20, 64, 128, 256, 512, 1024;")
                    }
                    "history_moemix_hook18" => Some("fits with N = 20, 64, 128, 256;"),
                    _ => None,
                };
                if let Some(fitting) = fitting {
                    assert!(ours.reason.contains(fitting), "{name}: {ours:?}");
                }
            }
            if name.contains("hftrainer")
                && (remedy.starts_with("roundup") || remedy.starts_with("empty_cache"))
            {
                // Failed at both ends of what the rest of the step would ask.
                assert!(
                    ours.reason.contains("the least it would ask"),
                    "{name}: {ours:?}"
                );
            }
            if name.contains("gpt2ckpt_cap12g5") && remedy.starts_with("garbage") {
                // Failed at both ends of what the rest of the step would ask.
                assert!(
                    ours.reason.contains("the least it would ask"),
                    "{name}: {ours:?}"
                );
            }
            if name.contains("_gpu") && remedy.starts_with("garbage_collection_threshold") {
                // No fraction: PyTorch never runs its collection, whatever the history.
                assert!(
                    ours.reason
                        .contains("only under set_per_process_memory_fraction"),
                    "{name}: {ours:?}"
                );
            }
            if name.contains("resnetvar") && remedy.starts_with("expandable_segments") {
                // Served in the replay, failed by the step's own size.
                assert!(ours.reason.contains("the step goes on"), "{name}: {ours:?}");
            }
            if name.contains("resnetinfer") && remedy.starts_with("expandable_segments") {
                assert!(
                    ours.reason.contains("grew alike whatever their size"),
                    "{name}: {ours:?}"
                );
            }
            if name == "ring_kvcache" && remedy == "max_split_size_mb" {
                assert!(ours.reason.contains("keeps rising"), "{name}: {ours:?}");
            }
        }
        // The live view, handed the same OOM, replays the same file to the same verdicts.
        let live = live_view_of(&path, name, &kept);
        assert_eq!(live.history_events, Some(file.events.len()), "{name}");
        assert_eq!(live.remedies, at.remedies, "{name}");
    }
}

/// The `roundup_power2_divisions` row of these tables is PyTorch's outcome with N = 4, the
/// value its A/B runs tried until 2026-11-29 (a row left open is open in vramtop too).
/// vramtop now tries 2, 4, 8 and 16 and lists those that fit: 4 must be listed where
/// PyTorch fitted it, and not where PyTorch failed it. Where PyTorch was run at every N,
/// `roundup_at_every_n_is_judged_as_pytorch_ran_it` holds the list whole.
fn roundup_agrees(name: &str, ours: &RemedyVerdict, pytorch_at_4: Verdict) {
    let listed: Vec<&str> = if ours.verdict == Verdict::Fits {
        ours.reason
            .split("fits with N = ")
            .nth(1)
            .and_then(|rest| rest.split(';').next())
            .map(|l| l.split(", ").collect())
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    match pytorch_at_4 {
        Verdict::Fits => assert!(listed.contains(&"4"), "{name}: PyTorch fitted 4: {ours:?}"),
        Verdict::Fails => {
            assert!(!listed.contains(&"4"), "{name}: PyTorch failed 4: {ours:?}");
            // Open only where these files leave it open, for the reason given.
            match ROUNDUP_OPEN.iter().find(|(n, _)| *n == name) {
                Some((_, why)) => {
                    assert_eq!(ours.verdict, Verdict::CannotTell, "{name}: {ours:?}");
                    assert!(ours.reason.contains(why), "{name}: {ours:?}");
                }
                None => assert_ne!(ours.verdict, Verdict::CannotTell, "{name}: {ours:?}"),
            }
        }
        Verdict::CannotTell => assert_eq!(ours.verdict, Verdict::CannotTell, "{name}: {ours:?}"),
    }
}

/// Files of the tables above whose roundup row PyTorch failed at N = 4 and vramtop, trying
/// 2 to 16, leaves open, with why.
const ROUNDUP_OPEN: &[(&str, &str)] = &[
    (
        "history_maskrcnnvar_cap17g03_hook118",
        "and went on without (an OOM it caught",
    ),
    // 2 and 4 fit or fail by where the checkpoint's blocks were.
    (
        "checkpoint_gpt2var_steps",
        "the blocks live at the hook's checkpoint",
    ),
    // 16 alone fits, with nothing to spare (the llamabf16 case).
    (
        "history_moemix_hook18",
        "N = 16 served it with less than a hundredth of the cap",
    ),
    // 4 and 16 fit alone, each between values that fail: PyTorch failed 4.
    ("history_gpt2stream_hook18", "N = 4, 16 alone"),
    // PyTorch failed every N (ROUNDUP_AT_EVERY_N).
    (
        "history_llamabf16_cap7_hook19",
        "N = 16 served it with less than a hundredth of the cap",
    ),
];

/// Kept files whose job PyTorch ran with `roundup_power2_divisions` 2, 4, 8 and 16 (H200,
/// 2026-11-29, each judged at the step the kept run died in, the control reproducing it):
/// the verdict, and the words that list the N (every N listed fitted in PyTorch).
const ROUNDUP_AT_EVERY_N: &[(&str, Verdict, &str)] = &[
    // 4 and 8 fitted, 2 and 16 failed (8 is not listed: open, not wrong).
    (
        "history_gan_hook18",
        Verdict::Fits,
        "fits with N = 4; tried 2 to 16",
    ),
    // 16 fitted alone, 2, 4 and 8 failed: one value that fits is one run, trusted.
    (
        "history_vitvar_cap10_hook114",
        Verdict::Fits,
        "fits with N = 16; tried 2 to 16",
    ),
    // 8 fitted, twice and under four placements of CUDA's address space; 2, 4 and 16
    // failed.
    (
        "history_gpt2ckpt_cap14_hook18",
        Verdict::Fits,
        "fits with N = 8; tried 2 to 16",
    ),
    // 8 and 16 fitted, 2 and 4 failed (whispervar under 10 GiB, 2026-11-29, later).
    (
        "history_whispervar_cap10_hook116",
        Verdict::Fits,
        "fits with N = 8, 16; tried 2 to 16",
    ),
    // 16 fitted, 2, 4 and 8 failed (gnnvar under 19 GiB, 2026-11-29).
    (
        "history_gnnvar_cap19_hook117",
        Verdict::Fits,
        "fits with N = 16; tried 2 to 16",
    ),
    // Every N failed (detrvar under 4.6 GiB, 2026-11-29).
    (
        "history_detrvar_cap4g6_hook117",
        Verdict::Fails,
        "at every N (tried 2 to 16)",
    ),
    // Every N failed, under four placements too for 16, which the replay serves with
    // nothing to spare: 64 MiB short in PyTorch's own run (`runs::roundup_room`).
    (
        "history_llamabf16_cap7_hook19",
        Verdict::CannotTell,
        "N = 16 served it with less than a hundredth of the cap to spare",
    ),
];

#[test]
fn roundup_at_every_n_is_judged_as_pytorch_ran_it() {
    for &(name, verdict, words) in ROUNDUP_AT_EVERY_N {
        let path = fixture(&format!("{name}.pickle.gz"));
        let file = trace::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let at = at_last_oom(name, &file);
        let ours = verdict_of(name, &at, "roundup_power2_divisions");
        assert_eq!(ours.verdict, verdict, "{name}: {ours:?}");
        assert!(ours.reason.contains(words), "{name}: {ours:?}");
        // The live view, handed the same OOM, gives the same.
        let kept = file.stats.kept_oom.clone().expect("a file the hook kept");
        let live = live_view_of(&path, name, &kept);
        assert_eq!(live.remedies, at.remedies, "{name}");
    }
}

/// The verdicts at a kept file's last OOM, from its history (not from one state).
fn at_last_oom(name: &str, file: &Trace) -> OomRemedies {
    let ooms = trace_ooms(file);
    let last = ooms.last().expect("an OOM").event;
    let replayed = remedies(file, &ooms, None).unwrap();
    let at = replayed.into_iter().find(|r| r.event == last).unwrap();
    assert!(at.what_would_fit.is_none(), "{name}: from history");
    at
}

/// The verdict whose remedy's name begins with `remedy`.
fn verdict_of<'a>(name: &str, at: &'a OomRemedies, remedy: &str) -> &'a RemedyVerdict {
    at.remedies
        .iter()
        .find(|r| r.remedy.to_string().starts_with(remedy))
        .unwrap_or_else(|| panic!("{name}: no {remedy}: {:?}", at.remedies))
}

/// What the live view says of the OOM a GPU-kept file holds, handed it as the hook does.
fn live_view_of(path: &std::path::Path, name: &str, kept: &KeptOom) -> OomExplained {
    let (dir, kept_path) = unzipped_as_kept(path, name);
    let live = OomExplained::from_oom(&oom_message_for(&kept_path, kept, true));
    let _ = std::fs::remove_dir_all(&dir);
    live
}

/// `value` pickled and zlib-compressed, as hook 1.5 keeps a history piece.
fn zlib_pickle(value: &trace_support::P) -> trace_support::P {
    use std::io::Write;
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(&trace_support::pickle(value)).unwrap();
    trace_support::P::Bytes(z.finish().unwrap())
}

/// A file as hook 1.5 keeps it at an OOM: the snapshot `file` with its `vramtop_oom`
/// entry (the request, the device's total with 70 GiB free, so a memory fraction refused
/// it; a whole ring; the checkpoint's segments; the history).
fn kept_by_hook(
    mut file: trace_support::P,
    requested: i64,
    total: i64,
    checkpoint: Vec<trace_support::P>,
    history: trace_support::P,
) -> Vec<u8> {
    use trace_support::{dict, pickle, P};
    let kept = dict(vec![
        ("number", P::Int(1)),
        ("pid", P::Int(4242)),
        ("time_s", P::Float(1_795_321_079.0)),
        ("device", P::Int(0)),
        ("requested_bytes", P::Int(requested)),
        ("device_free_bytes", P::Int(70 << 30)),
        ("device_total_bytes", P::Int(total)),
        ("ring", dict(vec![("complete", P::Bool(true))])),
        (
            "checkpoint",
            dict(vec![
                ("time_s", P::Float(1_795_321_078.5)),
                ("skip", P::Int(0)),
                ("segments", P::List(checkpoint)),
            ]),
        ),
        ("history", history),
    ]);
    if let P::Dict(pairs) = &mut file {
        pairs.push((P::Str("vramtop_oom".into()), kept));
    }
    pickle(&file)
}

/// Hook 1.5: a file kept at an OOM whose history before its checkpoint came in pieces
/// (the ring as read before the checkpoint cleared it, and the state just after), as the
/// hook writes them: each a snapshot pickle, zlib-compressed. The split-cache workload of
/// the A/B table: a 6 GiB block cached, split by 20 tensors of 304 MiB, the checkpoint,
/// every other tensor freed, then 2.5 GiB asked under a 7.9 GiB cap.
fn split_cache_kept(with_history: bool) -> Vec<u8> {
    use trace_support::{block, dict, event, pickle, segment, snapshot, P};
    let x: i64 = 0x7f00_0000_0000;
    let part: i64 = 304 << 20;
    let whole: i64 = 6 << 30;
    let seg = |live: &dyn Fn(i64) -> bool| {
        let mut blocks: Vec<P> = (0..20)
            .map(|i| {
                let state = if live(i) {
                    "active_allocated"
                } else {
                    "inactive"
                };
                block(x + i * part, part, state)
            })
            .collect();
        blocks.push(block(x + 20 * part, whole - 20 * part, "inactive"));
        segment(x, whole, blocks)
    };
    let mut ring = vec![
        event("segment_alloc", x, whole, vec![]),
        event("alloc", x, whole, vec![]),
        event("free_requested", x, whole, vec![]),
        event("free_completed", x, whole, vec![]),
    ];
    ring.extend((0..20).map(|i| event("alloc", x + i * part, part, vec![])));
    let at_checkpoint = vec![seg(&|_| true)];
    let events_piece = snapshot(vec![seg(&|_| true)], vec![ring]);
    let state_piece = snapshot(at_checkpoint.clone(), vec![vec![]]);
    // The file's own ring: the checkpoint's `snapshot` entry, the frees, the OOM (its
    // `addr` is the device's free bytes: 70 GiB, so a memory fraction refused it).
    let mut after = vec![event("snapshot", 0, 20 * part, vec![])];
    after.extend(
        (0..20)
            .step_by(2)
            .map(|i| event("free_completed", x + i * part, part, vec![])),
    );
    after.push(event("oom", 70 << 30, 2560 << 20, vec![]));
    let file = snapshot(vec![seg(&|i| i % 2 == 1)], vec![after]);
    let history = dict(vec![
        ("version", P::Int(1)),
        ("from_start", P::Bool(true)),
        (
            "pieces",
            P::List(vec![
                dict(vec![
                    ("kind", P::Str("events".into())),
                    ("zlib", zlib_pickle(&events_piece)),
                ]),
                // The last piece as read: an OOM came before the hook compressed it.
                dict(vec![
                    ("kind", P::Str("state".into())),
                    ("pickle", P::Bytes(pickle(&state_piece))),
                ]),
            ]),
        ),
    ]);
    let history = if with_history { history } else { P::None };
    kept_by_hook(file, 2560 << 20, 7900 << 20, at_checkpoint, history)
}

#[test]
fn a_history_kept_in_pieces_is_replayed_from_the_jobs_start() {
    let verdicts = |with_history: bool| {
        let bytes = split_cache_kept(with_history);
        let t = trace::from_bytes(&bytes, &Default::default()).unwrap();
        let kept = t.stats.kept_oom.clone().unwrap();
        let ooms = trace_ooms(&t);
        let all = remedies(&t, &ooms, None).unwrap();
        let v: Vec<(String, Verdict)> = all[0]
            .remedies
            .iter()
            .map(|r| (r.remedy.to_string(), r.verdict))
            .collect();
        (t, kept, v)
    };
    let (t, kept, with) = verdicts(true);
    // Stitched on: the job's own start, no checkpoint to begin from, no blocks before it.
    let history = kept.history.expect("the pieces were read");
    assert_eq!(
        (history.pieces, history.from_start, history.filled),
        (2, true, 0)
    );
    assert_eq!(kept.checkpoint, None);
    assert!(t.initial.is_empty() && t.initial_segments.is_empty());
    assert_eq!(
        t.events[0].kind,
        TraceEventKind::SegmentAlloc,
        "{:?}",
        &t.events[..3]
    );
    // PyTorch 2.11 on an H100: expandable segments and max_split_size_mb fit.
    assert_eq!(
        with[0],
        ("expandable_segments:True".into(), Verdict::Fits),
        "{with:?}"
    );
    assert_eq!(with[1].1, Verdict::Fits, "{with:?}");
    // ... and the GC threshold does not: no request before the last misses the cache.
    let gc = with
        .iter()
        .find(|(r, _)| r.starts_with("garbage_collection_threshold"));
    assert_eq!(gc.map(|g| g.1), Some(Verdict::Fails), "{with:?}");
    // The same file without its pieces begins at the checkpoint, as hook 1.4's did, where
    // the 20 tensors live then decide max_split_size_mb: replayed where PyTorch had them
    // and packed anew, they give different answers.
    let (t, kept, without) = verdicts(false);
    assert!(kept.history.is_none() && kept.checkpoint.is_some());
    assert_eq!(t.initial.len(), 20);
    assert_eq!(without[1].1, Verdict::CannotTell, "{without:?}");
}

#[test]
fn a_history_piece_that_cannot_be_read_leaves_the_checkpoint() {
    let mut bytes = split_cache_kept(true);
    // Spoil the first piece's zlib stream (its header follows the first `x\x01` pair).
    let at = bytes.windows(2).position(|w| w == [0x78, 0x01]).unwrap();
    bytes[at + 2] ^= 0xff;
    bytes[at + 3] ^= 0xff;
    let t = trace::from_bytes(&bytes, &Default::default()).unwrap();
    let kept = t.stats.kept_oom.unwrap();
    assert!(kept.history.is_none());
    assert!(kept.checkpoint.is_some());
    assert_eq!(t.initial.len(), 20);
}

/// A file hook 1.5 kept on the H100 (gpt2var with a quarter-size ring, so that the ring was
/// read whole at three checkpoints and once overflowed between the hook's looks): its
/// pieces, as PyTorch's C++ pickled them, stitch on from the checkpoint after the overflow.
#[test]
fn a_gpu_kept_file_with_history_pieces_stitches_from_its_older_checkpoint() {
    let t = trace::load(&fixture("history_gpt2var_pieces.pickle.gz")).unwrap();
    let kept = t.stats.kept_oom.clone().unwrap();
    let history = kept.history.expect("pieces read and stitched");
    assert_eq!((history.pieces, history.from_start), (3, false));
    assert_eq!((history.events, history.filled), (10_425, 228));
    assert!(kept.checkpoint.is_some());
    assert_eq!(t.initial.len(), 364);
    let ooms = trace_ooms(&t);
    let all = remedies(&t, &ooms, None).unwrap();
    let verdict = |name: &str| {
        all[0]
            .remedies
            .iter()
            .find(|r| r.remedy.to_string() == name)
            .map(|r| r.verdict)
    };
    // PyTorch fitted both in that call (the README's A/B, "One run was wrong").
    assert_eq!(verdict("expandable_segments:True"), Some(Verdict::Fits));
    assert_eq!(verdict("empty_cache() between steps"), Some(Verdict::Fits));
}

/// A kept file whose history has two checkpoints: the job's first events (a long churn,
/// about `churn` alloc/free triples of one 1 MiB tensor, then tensor A kept), the state
/// with A, tensor B's alloc, the state with A and B; then the file's own ring (the frees
/// of A and B, the OOM).
fn two_checkpoints_kept(churn: usize) -> Vec<u8> {
    use trace_support::{block, dict, event, segment, snapshot, P};
    let x: i64 = 0x7f00_0000_0000;
    let mib: i64 = 1 << 20;
    let whole: i64 = 64 * mib;
    let seg = |a: bool, b: bool| {
        let state = |live: bool| if live { "active_allocated" } else { "inactive" };
        segment(
            x,
            whole,
            vec![
                block(x, mib, state(a)),
                block(x + mib, 2 * mib, state(b)),
                block(x + 3 * mib, whole - 3 * mib, "inactive"),
            ],
        )
    };
    let mut first = vec![event("segment_alloc", x, whole, vec![])];
    for _ in 0..churn {
        first.push(event("alloc", x, mib, vec![]));
        first.push(event("free_requested", x, mib, vec![]));
        first.push(event("free_completed", x, mib, vec![]));
    }
    first.push(event("alloc", x, mib, vec![]));
    // Each events piece after a state begins at that state's own `snapshot` entry.
    let second = vec![
        event("snapshot", 0, mib, vec![]),
        event("alloc", x + mib, 2 * mib, vec![]),
    ];
    let piece = |kind: &str, value: &P| {
        dict(vec![
            ("kind", P::Str(kind.into())),
            ("zlib", zlib_pickle(value)),
        ])
    };
    let pieces = vec![
        piece("events", &snapshot(vec![seg(true, false)], vec![first])),
        piece("state", &snapshot(vec![seg(true, false)], vec![vec![]])),
        piece("events", &snapshot(vec![seg(true, true)], vec![second])),
        piece("state", &snapshot(vec![seg(true, true)], vec![vec![]])),
    ];
    let after = vec![
        event("snapshot", 0, 3 * mib, vec![]),
        event("free_completed", x, mib, vec![]),
        event("free_completed", x + mib, 2 * mib, vec![]),
        event("oom", 70 << 30, 128 * mib, vec![]),
    ];
    let file = snapshot(vec![seg(false, false)], vec![after]);
    let history = dict(vec![
        ("version", P::Int(1)),
        ("from_start", P::Bool(true)),
        ("pieces", P::List(pieces)),
    ]);
    kept_by_hook(file, 128 * mib, 80 * mib, vec![seg(true, true)], history)
}

/// A history whose oldest piece inflates past the reader's limit (a long job's first
/// events) still begins at the newest checkpoint before it, instead of being dropped.
#[test]
fn a_history_past_the_readers_limit_begins_at_its_newest_checkpoint() {
    let bytes = two_checkpoints_kept(20_000);
    let whole = trace::from_bytes(&bytes, &Default::default()).unwrap();
    let history = whole
        .stats
        .kept_oom
        .unwrap()
        .history
        .expect("every piece read");
    assert_eq!((history.pieces, history.from_start), (4, true));
    assert!(whole.initial.is_empty());
    // A limit the file fits in, which the first piece's 60,000 events inflate past.
    let limit = 1 << 20;
    assert!((bytes.len() as u64) < limit, "{} bytes", bytes.len());
    let opts = trace::LoadOptions {
        max_bytes: limit,
        ..Default::default()
    };
    let cut = trace::from_bytes(&bytes, &opts).unwrap();
    let kept = cut.stats.kept_oom.clone().unwrap();
    let history = kept.history.expect("the newest pieces read");
    assert_eq!((history.pieces, history.from_start), (3, false));
    // It begins at the first checkpoint: A live, then B's alloc, then the file's ring.
    assert_eq!(cut.initial.len(), 1, "{:?}", cut.initial);
    assert_eq!(history.events, 1);
    assert!(cut.events.len() < 10, "{:?}", cut.events);
    // And the OOM is judged from there.
    let ooms = trace_ooms(&cut);
    assert_eq!(ooms.len(), 1);
    let judged = remedies(&cut, &ooms, None).unwrap();
    assert!(!judged[0].remedies.is_empty());
}

/// Where the kept file carries the job's cap, no verdict asks for it: those left open turn
/// on the checkpoint or the addresses, which the cap would not settle (the advice to
/// give `--capacity` there promised what it could not).
#[test]
fn verdicts_of_files_that_carry_their_cap_ask_for_no_cap() {
    for name in [
        "cause_leak.pickle.gz",
        "cause_leak_history.pickle.gz",
        "checkpoint_gpt2var_steps.pickle.gz",
        "history_gpt2var_pieces.pickle.gz",
    ] {
        let t = trace::load(&fixture(name)).unwrap();
        let ooms = trace_ooms(&t);
        let judged = remedies(&t, &ooms, None).unwrap();
        let open: Vec<_> = judged
            .iter()
            .flat_map(|at| &at.remedies)
            .filter(|r| r.verdict == Verdict::CannotTell)
            .collect();
        assert!(!open.is_empty(), "{name}: nothing left open to check");
        for r in open {
            assert_eq!(r.missing, None, "{name}: {r:?}");
        }
    }
}

/// The advice a `cannot tell` gives settles what it promises: the capped checkerboard's
/// file does not carry its cap, the GC threshold's verdict asks for it, and given either
/// bound of it the verdict is decided (fails, as PyTorch did in the A/B on the H100).
#[test]
fn a_verdict_that_asks_for_the_cap_is_decided_once_given_it() {
    let t = trace::load(&fixture("oom_cap.pickle.gz")).unwrap();
    let ooms = trace_ooms(&t);
    let gc = |given: Option<u64>| {
        let judged = remedies(&t, &ooms, given).unwrap();
        judged
            .last()
            .unwrap()
            .remedies
            .iter()
            .find(|r| matches!(r.remedy, Remedy::GarbageCollectionThreshold(_)))
            .cloned()
            .expect("a GC threshold verdict")
    };
    let open = gc(None);
    assert_eq!(open.verdict, Verdict::CannotTell, "{open:?}");
    assert_eq!(open.missing, Some(Missing::MemoryCap), "{open:?}");
    let bounds = capacity_bounds(&t, &ooms, None).expect("bounds");
    assert!(bounds.low < bounds.high, "{bounds:?}");
    for cap in [bounds.low, bounds.high] {
        let given = gc(Some(cap));
        assert_eq!(given.verdict, Verdict::Fails, "{cap}: {given:?}");
        assert_eq!(given.missing, None, "{cap}: {given:?}");
    }
}

/// Files kept by hooks 1.5 to 1.7 under a plain `vramtop run` on the H100 (PyTorch 2.11,
/// `scripts/gpu/jobs/whatif_ab.py`, 2026-11-26), each judged against PyTorch's outcome for
/// every remedy in a fresh process, and the OOM reproduced by plain PyTorch (no vramtop)
/// at the same step asking the same bytes:
/// - gpt2mixed under a 15.5 GiB cap (the issue's job: batch and length vary each step),
///   its whole history from the job's first allocation, stitched from the hook's pieces;
/// - gpt2var dying at step 20 (756 MiB asked), its whole history in the ring alone;
/// - kvcache_steps, which marks its own steps with `vramtop.step()` (no optimizer), as the
///   reason of a `cannot tell` advises; its whole history in the ring alone.
///
/// Expandable + GC takes expandable's verdict by rule: those rows are not independent.
#[test]
fn gpu_kept_histories_of_training_loops_give_pytorchs_outcomes_on_both_paths() {
    use Verdict::{CannotTell, Fails, Fits};
    let gpt2mixed = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:20", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fits,
    })[..];
    let gpt2var = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:512", Fits),
        roundup: Fits,
        gc: Fits,
        between_steps: Fits,
    })[..];
    // llamamix, step 93 asking 1.1 GiB: PyTorch fitted expandable, GC 0.6, both, the cache
    // emptied after every step and max_split 20, 128, 256 and 512; it failed roundup 4 and
    // max_split 64 and 1024 to 4096.
    let llamamix = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:512", Fits),
        roundup: Fails,
        gc: Fits,
        between_steps: Fits,
    })[..];
    // PyTorch failed every remedy, `empty_cache() between steps` too (in 8 more runs under
    // 7 placements as well: README). Replayed now that the job marks its steps, it fails
    // under both address orders: top-down at an allocation before the OOM, as PyTorch
    // failed a step early; and the trace's, whose addresses stop being hinted
    // once the emptied cache has given back segments the job kept (they fitted it while
    // hinted, as did a bottom-up order, which CUDA followed for 1 to 4 % of segments).
    let kvcache_steps =
        &every_setting_fails_and_split(KV_SPLIT, ("empty_cache() between steps", Fails))[..];
    // Hook 1.6's kvcache_steps: a gap between a read of the ring and its clearing hid the
    // job's allocator taking and giving back segments (21 released, 45 taken), so each
    // verdict must also hold begun again after it. The emptied cache fails there too under
    // both address orders (open while random orders were asked as well), as PyTorch did.
    let kvcache_steps_16 =
        &every_setting_fails_and_split(KV_SPLIT, ("empty_cache() between steps", Fails))[..];
    // Hook 1.7's gpt2mixed: another run of the same seeded job, whose history differs in
    // the order of frees from the autograd thread. Under it `max_split_size_mb:20` fits
    // with the trace's address order and failed under plain top-down (open until
    // 2026-11-27); CUDA's ranges fit it, and 64, as in hook 1.8's file; 1024 fits alone
    // (PyTorch fitted with 20, 200 and 1000 on the H100, with 1024 in four runs under four
    // placements on an H200, and with 64 in three of four, failing it under a 2 MiB nudge).
    let gpt2mixed_18 = &[
        &gpt2mixed[..1],
        &[("max_split_size_mb:64", Fits)],
        &gpt2mixed[2..],
    ]
    .concat()[..];
    let gpt2mixed_17 = gpt2mixed_18;
    // A ResNet-50 (fp32, SGD) whose batch and resolution vary, under a 6.5 GiB cap, dying
    // at step 97 asking 62 MiB with 268 MiB free in the cache: expandable segments serve
    // that request in the replay, and PyTorch, run with them, died later in the same step.
    // No setting fits the step: its earlier steps grew at least 1.07 times past the same
    // point, more than the cap holds. PyTorch failed every remedy (H100, 2026-11-27).
    let resnetvar =
        &every_setting_fails_and_split(Fails, ("empty_cache() between steps", Fails))[..];
    // BERT (6 layers, bf16 autocast, AdamW) with four micro-batches of their own shape a
    // step, dying at step 46 asking 1.46 GiB. Under an 8 GiB cap PyTorch fitted expandable,
    // expandable + GC and max_split 20 to 1024, and failed roundup 4, GC 0.6, the cache
    // emptied after every step and max_split 2048 and 4096; under 7 GiB it failed every one
    // (H100 and H200, 2026-11-27). The replay serves the request under both caps. The
    // point is found a few allocations off the count in earlier steps (their micro-batches'
    // shapes take other kernels); under 8 GiB the steps of about this one's size say the
    // step ends under the cap, and carried on as the likest went on every fit holds, with
    // N = 20 to 1024 as PyTorch. Under 7 GiB the middle of them passes the cap: open.
    // Carried on, max_split runs out both in this step's sizes and at the least, but not
    // at the least with 1 % more room (`LEAST_ROOM`): open still.
    let bertaccum = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    let bertaccum_cap7 = &stepped(Outcomes {
        expandable: CannotTell,
        max_split: ("max_split_size_mb", CannotTell),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    // T5 (6 layers, bf16 autocast, AdamW), source and target lengths varying apart, under
    // a 5 GiB cap, dying at step 45 asking 182 MiB: PyTorch failed every remedy (H200).
    // Expandable serves the request in the replay; its 7 matching earlier steps grew 1.04 to
    // 1.60 times past the point, the least leaving the step 42 MiB under the cap and the
    // middle one 45 MiB over it: open. Carried on by the likest step (which grew 1.07
    // times), it runs out in this step's sizes and at that step's own: fails.
    let t5var_cap5 = &every_setting_fails_and(("empty_cache() between steps", Fails))[..];
    // accelaccum under 8.5 GiB, the same OOM as under 9.5 (step 48, 674 MiB; H100,
    // 2026-11-28): PyTorch failed every setting. Its 29 matching steps grew 1.17 to 1.34
    // times past the point, the middle 518 MiB over the cap, the least (in a step 2.8
    // times smaller) under it: every fit was open until open rows were carried on by the
    // likest step whatever it grew.
    let accelaccum_cap8g5 = &every_setting_fails_and(("empty_cache() between steps", Fails))[..];
    // A GPT-2 (8 layers, 1024 wide, AdamW, bf16 autocast) with activation checkpointing,
    // batch and length varying, under a 12.5 GiB cap, dying at step 46 asking 3.06 GiB
    // with 2.4 GiB free in the cache (H200, 2026-11-27). PyTorch fitted expandable,
    // expandable + GC, the cache emptied after every step and max_split 20 to 1024; it
    // failed roundup 4, and GC 0.6 and max_split 2048 served the 3.06 GiB and then failed
    // the next one, 14 allocations on in the same step. The replay serves the request under
    // GC 0.6 and 2048 too; carried on through the rest of the step as the likest earlier
    // step went on, it runs out under GC 0.6 and 2048 drops out of the values that fit.
    // GC 0.6 runs out too where the rest of the step asks only the earlier step's own
    // sizes, the least it would: "fails" (open before that bound, 2026-11-27). Roundup 4
    // fails under the trace's and CUDA's top-down address orders (open while two random
    // orders were asked too, one of which fitted it).
    let gpt2ckpt_cap12g5 = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:1024", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fits,
    })[..];
    // The same job under 14 GiB, dying at step 56 asking 3.16 GiB: PyTorch fitted every
    // remedy but roundup 4 and max_split 4096 (H200, the same day); carried on through the
    // step, every fit stands.
    let gpt2ckpt_cap14 = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:2048", Fits),
        roundup: Fails,
        gc: Fits,
        between_steps: Fits,
    })[..];
    // A Mixtral (6 layers, 8 experts, 2 a token, bf16 autocast, AdamW) whose batch and
    // length vary, under 10.94 GiB, dying at step 45 asking 934 MiB (its logits in fp32):
    // PyTorch fitted expandable, expandable + GC, the cache emptied after every step and
    // max_split 20 to 256, and failed roundup 4, GC 0.6 and max_split 512 to 4096 (H200,
    // 2026-11-27). Its steps made 1,261 to 1,309 allocations as the router sent tokens, and
    // the logits came 2 to 6 allocations off the count: by the count alone the point was
    // not identified, and every fit was open.
    let moemix = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:256", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fits,
    })[..];
    // A GPT-2 (6 layers, 1024 wide) stepped by transformers' Trainer (accelerate's
    // prepare: bf16 autocast, its wrapped optimizer; clipping to 1.0; a linear schedule),
    // batch and length varying, under 12.72 GiB, dying at step 58 asking 1.91 GiB (H200,
    // 2026-11-27, hook 1.8.1). PyTorch fitted expandable, expandable + GC and max_split 20,
    // and failed GC 0.6, max_split 64 to 4096, roundup 4 and the cache emptied after every
    // step. Roundup 4 and the emptied cache serve the request and run out in the rest of
    // the step carried on, both scaled and at the earlier step's own sizes: "fails".
    let hftrainer = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:20", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    // A ResNet-50 classifying batches under no_grad (no optimizer, no step marked: its
    // rounds stand in), refused 1.53 GiB at its 47th batch under 5.11 GiB (H200): PyTorch
    // failed every setting, expandable segments too. Its 37 matching rounds grew 2.19
    // times past the point whatever their size, so the rise is taken as following the
    // round's size (`StepRest::proportional`), and the least passes the cap.
    let resnetinfer = &every_setting_fails_and(("empty_cache() between steps", Fails))[..];
    // A DCGAN (64x64, 256 wide, Adam) with two optimizers, so two steps marked an
    // iteration, its batch growing, under 7.2 GiB: it ran out 48 times, 47 of them inside
    // cuDNN's workspace search (PyTorch caught those itself), and died of the 48th at
    // iteration 78 asking 512 MiB (H200, 2026-11-27). PyTorch fitted expandable,
    // expandable + GC, roundup 4, the cache emptied after every step and max_split 20 to
    // 512, and failed GC 0.6 and max_split 1024 to 4096, each of GC 0.6 and roundup 4 the
    // same under four placements of CUDA's (`whatif_ab.py nudge`, 0 to 512 MiB taken
    // first). Roundup 4 and GC 0.6 were open while two random address orders were asked
    // besides the trace's and top-down: one disagreed with each.
    // Since a remedy that would have served an OOM the job caught is left open (the job
    // run so goes another way: `runs::served_caught`), vramtop leaves expandable, GC 0.6,
    // max_split and the emptied cache open: each replay served a workspace cuDNN had been
    // refused. Roundup 4 served none, and is judged as before.
    let gan = &stepped(Outcomes {
        expandable: CannotTell,
        max_split: ("max_split_size_mb", CannotTell),
        roundup: Fits,
        gc: CannotTell,
        between_steps: CannotTell,
    })[..];
    // gpt2mixed's GPT-2 handing activations between two CUDA streams (record_stream),
    // under 7.44 GiB, dying at step 8 asking 954 MiB (H200, 2026-11-27). PyTorch fitted
    // every setting but roundup 4 and max_split 1024 to 4096; max_split 256 and 512 fitted
    // under four placements each. 256 fits under the trace's and top-down orders (two
    // random orders failed it, and it was left out of the list); 512 fits under the
    // trace's order and CUDA's ranges (plain top-down failed it, and it was left out).
    let gpt2stream = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:512", Fits),
        roundup: Fails,
        gc: Fits,
        between_steps: Fits,
    })[..];
    // gpt2mixed's GPT-2 trained by PyTorch Lightning's Trainer (bf16-mixed, AdamW,
    // clipping to 1.0, batches from a DataLoader), under 10.8 GiB, dying at step 79 asking
    // 1.48 GiB (H200, 2026-11-27). Lightning's closure drops the last step's gradients
    // after the forward, inside the step: carried on with them left live, every fit ran
    // out (10 wrong). PyTorch fitted expandable, expandable + GC, the cache emptied after
    // every step and max_split 20 to 512, and failed GC 0.6, roundup 4 and max_split 1024
    // to 4096.
    let lightning = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:512", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fits,
    })[..];
    // The same GPT-2 stepped in PyTorch's tutorial order (`zero_grad()` first), under
    // 10.3 GiB, dying at step 79 asking 1.48 GiB (H200, 2026-11-27): PyTorch failed every
    // setting. The earlier steps' middle growth put the step 91 MiB over the cap, the
    // least under it (open); carried on, every fit runs out both in this step's sizes and
    // at the least.
    let gpt2tutorial = &every_setting_fails_and(("empty_cache() between steps", Fails))[..];
    // The same under 10.55 GiB, the same OOM (H100, 2026-11-28): PyTorch fitted
    // expandable, expandable + GC, max_split 64 and 128 and the cache emptied after every
    // step, and failed GC 0.6, roundup 4 and max_split 20 and 256. Carried on, the emptied
    // cache ran out at both sizes and got through with 51 MiB more: too close to call
    // (`LEAST_ROOM`), where it said "fails" before.
    let gpt2tutorial_cap10g55 = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:128", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: CannotTell,
    })[..];
    // A Llama with eager attention trained through accelerate (bf16, two micro-batches an
    // optimizer step, its prepared DataLoader), under 9.5 GiB, dying at step 48 asking 674
    // MiB (H100, 2026-11-28): PyTorch fitted every setting but roundup 4 and max_split 1024
    // to 4096; roundup 4 serves the request and runs out in the step carried on.
    let accelaccum = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:512", Fits),
        roundup: Fails,
        gc: Fits,
        between_steps: Fits,
    })[..];
    // gpt2mixed's GPT-2 with its gradients kept and zeroed in place, fused AdamW, under
    // 11 GiB, dying at step 79 asking 1.48 GiB (H100, 2026-11-28): PyTorch fitted
    // expandable and expandable + GC only. max_split 128 and the emptied cache failed by
    // 38 and 20 MiB, later in the step; carried on, they run out at both sizes and get
    // through with 59 MiB more: too close to call.
    let gpt2fused = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb", CannotTell),
        roundup: Fails,
        gc: Fails,
        between_steps: CannotTell,
    })[..];
    // A U-Net (four levels, group norm) trained for segmentation under bf16 autocast,
    // batch and resolution varying, under 24 GiB, dying at step 85 asking 900 MiB after 32
    // OOMs caught inside the same step (cuDNN trying its algorithms' workspaces), kept by
    // hook 1.9 on an H200 with five other jobs on the host (2026-11-28). PyTorch fitted
    // expandable, expandable + GC, the emptied cache and max_split 20 to 128, and failed
    // GC 0.6, roundup 4 and max_split 256 to 4096. Kept by hook 1.8 under the same load,
    // the history began at a checkpoint 0.8 s before the OOM (a read the clear overtook),
    // and GC 0.6 was `cannot tell`.
    // vramtop leaves expandable, max_split and the emptied cache open: their replays
    // served workspaces cuDNN had been refused (`runs::served_caught`).
    let unetvar = &stepped(Outcomes {
        expandable: CannotTell,
        max_split: ("max_split_size_mb", CannotTell),
        roundup: Fails,
        gc: Fails,
        between_steps: CannotTell,
    })[..];
    // A Llama (8 layers) trained in pure bf16 (no autocast: weights, gradients and AdamW's
    // state all bf16), SDPA, activation checkpointing, under 7 GiB, dying at step 76 asking
    // 1.71 GiB (hook 1.9, H200, 2026-11-28): PyTorch fitted expandable, expandable + GC,
    // the emptied cache and max_split 20 to 1024, and failed GC 0.6, roundup 4 and
    // max_split 2048 and 4096.
    let llamabf16 = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:1024", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fits,
    })[..];
    // An MLP (6 blocks, 2048 wide) trained by CUDA graphs, PyTorch's whole-network
    // capture: each batch size's step captured once into a private pool of its own and
    // replayed after, under 16 GiB, dying at step 18 asking 64 MiB with 11.9 GiB free in
    // six graphs' pools and 54 MiB in the job's own (hook 1.9, H200, 2026-11-28). PyTorch
    // fitted expandable and expandable + GC, and failed GC 0.6, roundup 4, the emptied
    // cache and max_split 20, 200 and 1000. Replayed as one pool (and without the
    // `empty_cache()` torch.cuda.graph makes before each capture) the job's own replay
    // served the request: every row `cannot tell`.
    let graphsteps = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb", Fails),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    // The same under 12 GiB, dying at step 15 asking 64 MiB (same call): as under 16 GiB,
    // but max_split 20 aborted the capture (`cudaErrorStreamCaptureInvalidated`) and 64
    // ran out where the replay served both: `max_split_size_mb` is left open under graphs.
    let graphsteps_cap12 = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb", CannotTell),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    // graphsteps warmed up once, each new batch size captured straight away, under 25.2 GiB,
    // dying at step 43 asking 128 MiB during a capture, into the new graph's pool, with
    // 21.8 GiB free in 12 graphs' pools and 36.5 MiB in the job's own (hook 1.9, H200,
    // 2026-11-28). PyTorch fitted expandable and expandable + GC, and failed GC 0.6,
    // roundup 4, the emptied cache and max_split 200 and 1000 (20 aborted the capture).
    let graphsonce = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb", Fails),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    // gpt2mixed's GPT-2 under torch.compile(mode="reduce-overhead") (cudagraph trees:
    // each new shape run and recorded in the trees' one pool), under 13.1 GiB, dying at
    // step 36 asking 2.69 GiB in that pool (hook 1.9, H200, 2026-11-28). PyTorch fitted
    // expandable, expandable + GC, GC 0.6, the emptied cache (those two with 72 MiB to
    // spare) and max_split 1000, and failed roundup 4. GC and the emptied cache serve the
    // request and run out in the step carried on; max_split is open under graph pools.
    let gpt2graphs = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb", CannotTell),
        roundup: Fails,
        gc: CannotTell,
        between_steps: CannotTell,
    })[..];
    // A Llama (6 layers) under torch.compile(mode="reduce-overhead"), fused AdamW, batch
    // and length in buckets, under 7.65 GiB, dying at step 16 asking 750 MiB with 1.3 GiB
    // free in the trees' pool (hook 1.9, H200, 2026-11-28, the stitch's fix in the binary):
    // PyTorch fitted expandable and expandable + GC only (max_split 20: see the README).
    let llamagraphs = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb", Fails),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    // The runs of 2026-11-29 on an H200 (their rows below say what PyTorch did).
    let segformervar = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:256", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    let gpt2offload = &stepped(Outcomes {
        expandable: CannotTell,
        max_split: ("max_split_size_mb", CannotTell),
        roundup: Fails,
        gc: Fails,
        between_steps: CannotTell,
    })[..];
    let dlrmsparse = &stepped(Outcomes {
        expandable: CannotTell,
        max_split: ("max_split_size_mb", CannotTell),
        roundup: Fails,
        gc: CannotTell,
        between_steps: CannotTell,
    })[..];
    // The runs of 2026-11-29 on an H200, session 21. Knowledge distillation (a frozen bf16
    // GPT-2 teacher of 8 layers, a GPT-2 student of 4 trained on the cross-entropy and
    // the KL divergence from the teacher's logits) under 9.17 GiB, 1 % over its uncapped
    // allocated peak: step 8 asking 954 MiB, and PyTorch failed every setting (22 of 22,
    // every roundup N and max_split 20, 200, 1000).
    let distill_9g17 = &stepped(Outcomes {
        expandable: Fails,
        max_split: ("max_split_size_mb", Fails),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    // A ConvNeXt-Tiny trained at multiple scales with clipping, a cosine schedule and an
    // EMA of its weights, under 8.93 GiB: step 23 asking 22 MiB with 92.5 MiB free in 52
    // runs. PyTorch fitted expandable, expandable + GC, the emptied cache and max_split
    // 128, and failed GC 0.6 and roundup at every N (18 of 18).
    let convnextema = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:128", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fits,
    })[..];
    // A Whisper (6 + 6 layers, 512 wide) trained for speech recognition, 30 s of features
    // a sample, batch and transcript length varying, under 8.9 GiB: step 3 asking 166 MiB
    // with 110 MiB free in 135 runs. PyTorch failed every setting (22 of 22); vramtop
    // fails all but expandable and expandable + GC, which it leaves open: they serve the
    // request, and the 2 earlier steps (too few to identify the point) put the step's end
    // 49 MiB under and over the cap.
    let whispervar_8g9 = &stepped(Outcomes {
        expandable: CannotTell,
        max_split: ("max_split_size_mb", Fails),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    // The same under 10 GiB: step 16 asking 894 MiB with 720 MiB free in 137 runs. PyTorch
    // fitted expandable, GC 0.6, expandable + GC, the emptied cache, max_split 128 and
    // roundup 8 and 16, and failed roundup 2 and 4 (18 of 18).
    let whispervar_10 = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:128", Fits),
        roundup: Fails,
        gc: Fits,
        between_steps: Fits,
    })[..];
    // Graph learning on neighbour-sampled batches (gnnvar: 4 GraphSAGE layers, each batch
    // a graph of its own node and edge counts) under 19 GiB: step 28 asking 2.96 GiB with
    // 4.5 GiB free in 30 runs (H200, 2026-11-29). PyTorch fitted expandable, expandable +
    // GC, the emptied cache, max_split 2048 and roundup 16, and failed GC 0.6 and roundup
    // 2, 4 and 8 (18 of 18).
    let gnnvar_19 = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:2048", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fits,
    })[..];
    // A DETR (transformers' ResNet-50, 6 + 6 layers) trained on 2 to 8 images of their own
    // sizes padded to the batch's largest, 1 to 40 boxes each, under 4.6 GiB: step 7 asking
    // 618 MiB with 1.7 GiB free in 59 runs. PyTorch fitted all but roundup at every N (18 of
    // 18). Under 4.3 GiB it ran out in its first step (`ring_detrvar_cap4g3_hook117`).
    let detrvar_4g6 = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:512", Fits),
        roundup: Fails,
        gc: Fits,
        between_steps: Fits,
    })[..];
    // torchvision's Mask R-CNN (ResNet-50 FPN, SGD, fp16 autocast and a GradScaler) on 2
    // to 8 images of their own sizes under 17.03 GiB (1.01 times its allocated peak): 240
    // OOMs caught inside cuDNN (each convolution trying its algorithms' workspaces, 841 to
    // 883 MiB, from step 13), then step 20 asking 442 MiB with 1.1 GiB free in 42 runs
    // (H200, 2026-11-29). PyTorch fitted expandable, expandable + GC, the emptied cache and
    // roundup 16, and failed GC 0.6, max_split 128 (both at step 13, asking 442 MiB) and
    // roundup 2, 4 and 8. vramtop said GC 0.6 and max_split 128 fit (4 wrong rows): their
    // replays were given the workspaces cuDNN had been refused, and a job given them goes
    // another way. Every setting whose replay served one is now open.
    let maskrcnnvar = &stepped(Outcomes {
        expandable: CannotTell,
        max_split: ("max_split_size_mb", CannotTell),
        roundup: Fails,
        gc: CannotTell,
        between_steps: CannotTell,
    })[..];
    let detrvar_4g3 = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:512", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    // gpt2mixed's GPT-2 in DistributedDataParallel, one rank over NCCL (gradient buckets,
    // the all-reduce on NCCL's stream), under 7.84 GiB, dying at step 8 asking 954 MiB
    // (hook 1.10, H200, 2026-11-28): PyTorch fitted all but roundup, as vramtop said.
    let gpt2ddp = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:512", Fits),
        roundup: Fails,
        gc: Fits,
        between_steps: Fits,
    })[..];
    // The commonest OOM: a GPT-2 of one batch shape (12 x 1024, bf16 autocast, AdamW) that
    // ran out in its second step asking 2.3 GiB, AdamW's state made at the first step's end
    // (hook 1.12, H200, 2026-11-28), under caps between its allocated and reserved peaks.
    // Under 15.35 GiB PyTorch fitted expandable, expandable + GC, the cache emptied after
    // every step and max_split 20, 200 and 1000, and failed roundup 4 and GC 0.6; under
    // 15.22 GiB it fitted expandable, expandable + GC and max_split 20, and failed the rest.
    // Every "fits" was once `cannot tell`: the memory rising through the step's forward
    // pass read as a floor rising, and no earlier marked step said how the step goes on;
    // the first step, from the job's start, now does (`step_rest::first_step`).
    let gpt2fixed_15g35 = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:2048", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fits,
    })[..];
    let gpt2ddpaccumskip = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:512", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    let gpt2fixed_15g22 = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:128", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    // A Llama of one batch shape (8 x 1024) that ran out in its second step asking 1000 MiB
    // (hook 1.12, H200, 2026-11-28). Its first step made cuBLAS's workspace among the
    // allocations both steps began with, and is still taken to stand in. Under 8.66 GiB
    // PyTorch fitted every setting but roundup 4 (max_split 20, 200 and 1000); under 8.59
    // GiB the same but max_split 20, which failed, as 200 and 1000 fitted: the replay, the
    // step carried on, may run out with N = 20 and 64, and leaves max_split open.
    let llamafixed_8g66 = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:512", Fits),
        roundup: Fails,
        gc: Fits,
        between_steps: Fits,
    })[..];
    let llamafixed_8g59 = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb", CannotTell),
        roundup: Fails,
        gc: Fits,
        between_steps: Fits,
    })[..];
    // A ViT-Base of one batch shape (128 x 224 x 224) that ran out in its second step
    // asking 148 MiB under 10.44 GiB, 30 MiB over its allocated peak (hook 1.12, H200,
    // 2026-11-28): PyTorch fitted expandable and expandable + GC and failed the rest. The
    // first step stands in (AdamW's state, which the second step holds, no longer made
    // again), and carried on by it the step still runs out, and its least stays under the
    // cap: open, not wrong.
    // A Llama of 0.85 billion parameters fine-tuned on one batch shape (8 x 1024), whose
    // AdamW state (6.8 GB) outweighs a step's activations (hook 1.12, H200, 2026-11-28).
    // Under 24.3 GiB, between its first and second steps' allocated peaks, PyTorch failed
    // every setting: its first step, standing in, says the second reaches 27.5 GiB at
    // least (PyTorch's own peak there: 27.48 GiB). Under 28.9 GiB PyTorch fitted every
    // setting but roundup 4 and max_split 128 and above; roundup's replay, carried on,
    // runs out, and is left open.
    let llamatune_24g3 = &stepped(Outcomes {
        expandable: Fails,
        max_split: ("max_split_size_mb", Fails),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    let llamatune_28g9 = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:64", Fits),
        roundup: CannotTell,
        gc: Fits,
        between_steps: Fits,
    })[..];
    // A BERT-Base in the Hugging Face examples' loop, one batch shape, under 13.3 GiB: its
    // second step ran out asking 1.86 GiB; PyTorch fitted expandable, empty_cache() after
    // every step and max_split 20 to 1024, and failed GC 0.6, roundup 4 and 2048 and up.
    let bertfixed = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:1024", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fits,
    })[..];
    // The same BERT under 11.85 GiB, between its first and second steps' allocated peaks:
    // PyTorch failed every setting, and its first step says the second reaches 12.2 GiB
    // at least (PyTorch's own peak there: 12.28 GiB).
    let bertfixed_11g85 = &stepped(Outcomes {
        expandable: Fails,
        max_split: ("max_split_size_mb", Fails),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    // gpt2fixed compiled (torch.compile, default mode) under 9.21 GiB: its second step ran
    // out asking 1.15 GiB; PyTorch fitted expandable and max_split 1024 (the one N run)
    // and failed GC 0.6, roundup 4 and the cache emptied after every step.
    let gpt2compilefixed = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:1024", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    // The same under 8.13 GiB, kept by hook 1.13: it ran out in its first step (the
    // compiled first step, capped, runs out before the second), and PyTorch, emptying the
    // cache after every step, ran out there too: the hook saw the job still in its first
    // pass through its model, so no step had ended (`Roles::first_pass`).
    let gpt2compilefixed_8g13 = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:1024", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    // gpt2fixed in fp16 with a GradScaler starting at 2**40: the scaler skipped the
    // optimizer's step in steps 0 to 18, so no step was marked, and the job ran out in its
    // second step asking 2.3 GiB under 15.3 GiB (hook 1.14, H200, 2026-11-29). Hook 1.14
    // marked the second pass's start (`passes`), so the first step stands in. PyTorch
    // fitted expandable, expandable + GC, the cache emptied after every step and max_split
    // 2048, and failed GC 0.6 and roundup 4.
    let gpt2scalerfixed = &stepped(Outcomes {
        expandable: Fits,
        max_split: ("max_split_size_mb:2048", Fits),
        roundup: Fails,
        gc: Fails,
        between_steps: Fits,
    })[..];
    // gpt2fixed's GPT-2 accumulating 8 micro-batches of 2 to 9 sequences of 1024 tokens
    // before AdamW's step, under 8.15 GiB: it ran out in the fifth micro-batch of its first
    // step asking 1.15 GiB (hook 1.14, H200, 2026-11-29). PyTorch failed every setting, the
    // later micro-batches larger still; served, the request leaves the fits open (hook
    // 1.14's `accumulating`), where they were "fits" (6 wrong).
    let gpt2accumfirst = &stepped(Outcomes {
        expandable: CannotTell,
        max_split: ("max_split_size_mb", CannotTell),
        roundup: Fails,
        gc: Fails,
        between_steps: CannotTell,
    })[..];
    // gpt2scalerskip's GPT-2 with two micro-batches of varying shape accumulated a step, its
    // scaler skipping (none marked), under 6.62 GiB: it ran out in step 4 asking 954 MiB
    // (hook 1.14, H200, 2026-11-29), 4 passes marked, one a step (after zero_grad(), not
    // between micro-batches). PyTorch fitted expandable, expandable + GC, GC 0.6, the
    // emptied cache and max_split 20 and 200, and failed roundup 4 and max_split 1000; four
    // earlier steps of varying micro-batches are too few to tell the step's rest: open.
    let gpt2accumskip = &stepped(Outcomes {
        expandable: CannotTell,
        max_split: ("max_split_size_mb", CannotTell),
        roundup: CannotTell,
        gc: CannotTell,
        between_steps: CannotTell,
    })[..];
    // gpt2sgd zeroing its gradients in place (`p.grad.zero_()`), under 6.93 GiB: it ran out
    // in step 8 asking 954 MiB, its gradients held across steps (hook 1.14, H200,
    // 2026-11-29); the hook told its steps by the gradients changed in place (8 passes).
    // PyTorch failed every setting.
    let gpt2sgdzero = &stepped(Outcomes {
        expandable: Fails,
        max_split: ("max_split_size_mb", Fails),
        roundup: Fails,
        gc: Fails,
        between_steps: Fails,
    })[..];
    let vitfixed = &stepped(Outcomes {
        expandable: CannotTell,
        max_split: ("max_split_size_mb", CannotTell),
        roundup: Fails,
        gc: CannotTell,
        between_steps: CannotTell,
    })[..];
    // The `_hook16` files were kept by hook 1.6 (a 32,768-entry ring checkpointed from a
    // quarter full, each checkpoint's segments read off the GIL), so even these short jobs'
    // histories come stitched from pieces, gaps filled; PyTorch's outcomes were the same.
    // The `_hook17` files hold no `free_requested` (hook 1.7 skips it, skip_actions).
    let mut told_to_hold_less = Vec::new();
    for (name, outcomes, steps, stitched) in [
        ("history_gpt2mixed_cap15g", gpt2mixed, 93, true),
        ("ring_gpt2var_step20", gpt2var, 20, false),
        ("ring_kvcache_steps", kvcache_steps, 85, false),
        ("history_gpt2var_hook16", gpt2var, 20, true),
        ("history_kvcache_steps_hook16", kvcache_steps_16, 85, true),
        ("history_gpt2mixed_hook17", gpt2mixed_17, 93, true),
        ("history_kvcache_steps_hook17", kvcache_steps, 85, true),
        // Hook 1.8 clears the ring while PyTorch still pickles its read: 18 and 5 events
        // put in for the gaps (597 to 675 in gpt2mixed's earlier files).
        ("history_gpt2mixed_hook18", gpt2mixed_18, 93, true),
        ("history_kvcache_steps_hook18", kvcache_steps, 85, true),
        // A Llama (8 layers, grouped-query attention) whose batch and length vary, under a
        // 10 GiB cap, kept by hook 1.8 on an H200: a second architecture, judged in one A/B
        // call with every N of max_split run (its 13 rows all equal to PyTorch's).
        ("history_llamamix_hook18", llamamix, 93, true),
        // Two more architectures, kept by hook 1.8 on an H100 and judged in one A/B call.
        ("history_resnetvar_hook18", resnetvar, 97, true),
        ("history_bertaccum_hook18", bertaccum, 46, true),
        ("history_bertaccum_cap7_hook18", bertaccum_cap7, 46, true),
        ("history_t5var_cap5_hook18", t5var_cap5, 45, true),
        (
            "history_gpt2ckpt_cap12g5_hook18",
            gpt2ckpt_cap12g5,
            46,
            true,
        ),
        ("history_gpt2ckpt_cap14_hook18", gpt2ckpt_cap14, 56, true),
        ("history_moemix_hook18", moemix, 45, true),
        ("history_hftrainer_hook18", hftrainer, 58, true),
        ("history_resnetinfer_cap5g11_hook18", resnetinfer, 0, true),
        ("history_gan_hook18", gan, 156, true),
        ("history_gpt2stream_hook18", gpt2stream, 8, true),
        ("history_lightning_hook18", lightning, 79, true),
        ("history_gpt2tutorial_hook18", gpt2tutorial, 79, true),
        (
            "history_gpt2tutorial_cap10g55_hook18",
            gpt2tutorial_cap10g55,
            79,
            true,
        ),
        ("history_accelaccum_hook18", accelaccum, 48, true),
        (
            "history_accelaccum_cap8g5_hook18",
            accelaccum_cap8g5,
            48,
            true,
        ),
        ("history_gpt2fused_cap11g_hook18", gpt2fused, 79, true),
        // Hook 1.9 waits for the ring's read by the reader's own CPU time.
        ("history_unetvar_cap24_hook19", unetvar, 85, true),
        ("history_llamabf16_cap7_hook19", llamabf16, 76, true),
        // Its 6,993 events never filled a quarter of the ring: no checkpoint, no pieces.
        ("ring_graphsteps_cap16_hook19", graphsteps, 18, false),
        ("ring_graphsteps_cap12_hook19", graphsteps_cap12, 12, false),
        ("ring_graphsonce_cap25g2_hook19", graphsonce, 13, false),
        // Stitched from 4 pieces with nothing put in: the gaps changed no block or
        // segment, the pool's included (0 put in; 200 while a pool's stream was compared).
        ("history_gpt2graphs_cap13g1_hook19", gpt2graphs, 36, true),
        ("history_llamagraphs_cap7g65_hook19", llamagraphs, 16, true),
        ("history_gpt2ddp_cap7g84_hook110", gpt2ddp, 8, true),
        // The same GPT-2 as a torchrun job of two ranks over NCCL, one H200 each, 8.1 GiB a
        // rank; rank 0 ran out at step 8 (954 MiB). PyTorch's outcomes: as gpt2ddp's.
        ("history_gpt2ddp2_cap8g1_hook110", gpt2ddp, 8, true),
        // Its ranks' draws swapped (WHATIF_DDP_SWAP): the rank on cuda:1 ran out, at the
        // same step; its file's cuda:0 trace holds `snapshot` markers alone.
        ("history_gpt2ddp2_rank1_cap8g1_hook110", gpt2ddp, 8, true),
        // Both ranks on one H200 over gloo (CUDA_VISIBLE_DEVICES=0): no NCCL stream, the
        // all-reduce staged through the host; rank 0 ran out at step 8.
        ("history_gpt2ddp2_gloo_cap8g1_hook110", gpt2ddp, 8, true),
        // The same job sharded by FSDP2 (fully_shard on each block and the root), 7.53 GiB
        // a rank: rank 1 ran out at step 26 asking 1000 MiB. PyTorch's outcomes: as
        // gpt2ddp's (12 of 12 on the two H200s, 2026-11-28).
        ("history_gpt2fsdp2_cap7g53_hook111", gpt2ddp, 26, true),
        // Under FSDP's first form (FullyShardedDataParallel), 7.25 GiB a rank: rank 0 ran
        // out at step 8 asking 954 MiB. Its checkpoint holds a 2 MiB segment at
        // 0x41d400000, the rest at 0x7fd1...: the replay's placement once ran out of
        // address space below it. PyTorch's outcomes: as gpt2ddp's (12 of 12).
        ("history_gpt2fsdp1_cap7g25_hook111", gpt2ddp, 8, true),
        // gpt2mixed's GPT-2 fed by a DataLoader (4 forked workers, pinned memory,
        // non_blocking copies), 7.6 GiB: step 8, 954 MiB. PyTorch's outcomes: as
        // gpt2ddp's (12 of 12 on an H200, 2026-11-28).
        ("history_gpt2loader_cap7g6_hook112", gpt2ddp, 8, true),
        ("ring_gpt2fixed_cap15g35_hook112", gpt2fixed_15g35, 1, false),
        ("ring_gpt2fixed_cap15g22_hook112", gpt2fixed_15g22, 1, false),
        ("ring_llamafixed_cap8g66_hook112", llamafixed_8g66, 1, false),
        ("ring_llamafixed_cap8g59_hook112", llamafixed_8g59, 1, false),
        ("ring_vitfixed_cap10g44_hook112", vitfixed, 1, false),
        ("ring_llamatune_cap24g3_hook112", llamatune_24g3, 1, false),
        ("ring_llamatune_cap28g9_hook112", llamatune_28g9, 1, false),
        ("ring_bertfixed_cap13g3_hook112", bertfixed, 1, false),
        ("ring_bertfixed_cap11g85_hook112", bertfixed_11g85, 1, false),
        (
            "ring_gpt2compilefixed_cap9g21_hook112",
            gpt2compilefixed,
            1,
            false,
        ),
        (
            "ring_gpt2compilefixed_cap8g13_hook113",
            gpt2compilefixed_8g13,
            0,
            false,
        ),
        // No optimizer step marked in these three: their passes stand for their steps.
        (
            "ring_gpt2scalerfixed_cap15g3_hook114",
            gpt2scalerfixed,
            0,
            false,
        ),
        // gpt2scaler's GPT-2 (shapes varying) with its scale at 2**40: steps 0 to 7
        // skipped, none marked; it ran out in step 8 asking 954 MiB under 6.6 GiB. And
        // gpt2sgd (a hand-written update, never marked) under 6.93 GiB, the same step and
        // request. PyTorch's outcomes: as gpt2ddp's (12 of 12 each, H200, 2026-11-29).
        ("history_gpt2scalerskip_cap6g6_hook114", gpt2ddp, 0, true),
        ("history_gpt2sgd_cap6g93_hook114", gpt2ddp, 0, true),
        (
            "ring_gpt2accumfirst_cap8g15_hook114",
            gpt2accumfirst,
            0,
            false,
        ),
        (
            "history_gpt2accumskip_cap6g62_hook114",
            gpt2accumskip,
            0,
            true,
        ),
        ("history_gpt2sgdzero_cap6g93_hook114", gpt2sgdzero, 0, true),
        // gpt2sgd on a smaller GPU, with no memory fraction: all but 7,500 MiB of the H200
        // taken through the driver first (WHATIF_GPU_FREE_MIB), so CUDA itself refused the
        // segment. It ran out in step 8 asking 954 MiB; PyTorch fitted expandable,
        // expandable + GC, the emptied cache and max_split 512, and failed GC 0.6 (which
        // PyTorch applies under a fraction only) and roundup 4 (12 of 12, H200, 2026-11-29):
        // as lightning's.
        ("history_gpt2sgd_gpu7500mib_hook114", lightning, 0, true),
        // gpt2accumskip in DistributedDataParallel (one rank over NCCL), every micro-batch
        // all-reduced and copied back in place by DDP's own end-of-backward callback, under
        // 7 GiB: step 4 asking 694 MiB, 4 passes for 8 micro-batches. PyTorch fitted
        // expandable, expandable + GC and max_split 512 and failed the rest (12 of 12,
        // H200, 2026-11-29).
        (
            "history_gpt2ddpaccumskip_cap7_hook114",
            gpt2ddpaccumskip,
            0,
            true,
        ),
        // gpt2scaler's GPT-2 with GradScaler skipping steps 2 and 6 (inf gradients), in the
        // middle of the run, under 7.43 GiB: step 8 asking 954 MiB, with 8 steps marked, the
        // two skipped among them (hook 1.16; 6 without the wrapper of `GradScaler.step`).
        // PyTorch's outcomes: as gpt2ddp's (18 of 18 with every roundup N, H200,
        // 2026-11-29).
        ("history_gpt2scalermid_cap7g43_hook116", gpt2ddp, 8, true),
        // A SegFormer (MiT-b0) trained for segmentation, batch and side varying, under 16
        // GiB (uncapped it reserved 37.6 GiB for an allocated peak of 15.3 GiB): step 39
        // asking 3.66 GiB (H200, 2026-11-29, 18 of 18 with every roundup N).
        ("history_segformervar_cap16_hook116", segformervar, 39, true),
        // gpt2scaler's GPT-2 with its saved activations offloaded to pinned host memory,
        // under 4.6 GiB: step 8 asking 954 MiB. PyTorch fitted expandable, expandable + GC,
        // the emptied cache and max_split 20 and 200, and failed GC 0.6, max_split 1000
        // and roundup at every N (H200, 2026-11-29); vramtop leaves the fits open: the
        // earlier steps at that point grew past it 1.52 to 3.43 times the memory they
        // worked with (the backward copies the offloaded activations back), and the cap
        // lies between what the least and the middle of them make of this step.
        ("history_gpt2offload_cap4g6_hook116", gpt2offload, 8, true),
        // A recommendation model (8 embedding tables of 2M x 64 with sparse gradients and
        // SparseAdam, an MLP with Adam: two optimizer steps marked an iteration) under 14.4
        // GiB: iteration 23 asking 164 MiB. PyTorch failed every setting (H200,
        // 2026-11-29); vramtop fails roundup and leaves the rest open: carried on, the
        // step ends 97 MiB over the cap, under 1 % of it.
        ("ring_dlrmsparse_cap14g4_hook116", dlrmsparse, 46, false),
        ("history_distill_cap9g17_hook116", distill_9g17, 8, true),
        // The same distillation under 9.5 GiB: the same step 8 asking 954 MiB; PyTorch
        // fitted expandable, GC 0.6, expandable + GC, the emptied cache and max_split 512
        // and failed roundup at every N (18 of 18): as gpt2ddp's.
        ("history_distill_cap9g5_hook116", gpt2ddp, 8, true),
        ("history_convnextema_cap8g93_hook116", convnextema, 23, true),
        ("history_whispervar_cap8g9_hook116", whispervar_8g9, 3, true),
        ("history_whispervar_cap10_hook116", whispervar_10, 16, true),
        ("history_gnnvar_cap19_hook117", gnnvar_19, 28, true),
        ("history_detrvar_cap4g6_hook117", detrvar_4g6, 7, true),
        ("ring_detrvar_cap4g3_hook117", detrvar_4g3, 0, false),
        (
            "history_maskrcnnvar_cap17g03_hook118",
            maskrcnnvar,
            20,
            true,
        ),
    ] {
        let path = fixture(&format!("{name}.pickle.gz"));
        let file = trace::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let kept = file.stats.kept_oom.clone().expect("a file the hook kept");
        assert!(kept.ring_complete, "{name}");
        // gpt2mixed's history and the `_hook16` files' came in pieces read before the hook's
        // checkpoints, from the job's start; the others' fitted in the ring alone.
        let pieces = kept.history.as_ref().map(|h| (h.pieces > 1, h.from_start));
        assert_eq!(pieces, stitched.then_some((true, true)), "{name}");
        // From the job's first allocation: no blocks live before the history begins.
        assert!(
            file.initial.is_empty(),
            "{name}: {} live",
            file.initial.len()
        );
        assert_eq!(
            kept.steps_us.len(),
            steps,
            "{name}: the steps marked before the OOM"
        );
        let requests = file
            .events
            .iter()
            .filter(|e| e.kind == TraceEventKind::FreeRequested)
            .count();
        assert_eq!(
            requests == 0,
            name.ends_with("_hook17")
                || name.ends_with("_hook18")
                || name.ends_with("_hook19")
                || name.ends_with("_hook110")
                || name.ends_with("_hook111")
                || name.ends_with("_hook112")
                || name.ends_with("_hook113")
                || name.ends_with("_hook114")
                || name.ends_with("_hook116")
                || name.ends_with("_hook117")
                || name.ends_with("_hook118"),
            "{name}: {requests}"
        );
        if [
            "_hook18", "_hook19", "_hook110", "_hook111", "_hook112", "_hook113", "_hook114",
            "_hook116", "_hook117", "_hook118",
        ]
        .iter()
        .any(|hook| name.ends_with(hook))
        {
            // A ring file has no pieces and so no gaps; a history file must have its pieces.
            let none = if name.starts_with("ring_") {
                0
            } else {
                u64::MAX
            };
            let filled = kept.history.as_ref().map_or(none, |h| h.filled);
            // At most 0.2 % of the history (5 to 291 events in these files, 0.14 % at most;
            // 597 to 675 of about 131,000 before hook 1.8, 0.45 %).
            let events = file.events.len() as u64;
            assert!(
                filled * 500 < events,
                "{name}: {filled} of {events} events put in for the gaps"
            );
        }
        let at = at_last_oom(name, &file);
        for &(remedy, expected) in outcomes {
            let ours = verdict_of(name, &at, remedy);
            if remedy == "roundup_power2_divisions" {
                roundup_agrees(name, ours, expected);
                continue;
            }
            assert_eq!(ours.verdict, expected, "{name} {remedy}: {ours:?}");
            if name.contains("resnetvar") && remedy.starts_with("expandable_segments") {
                // Served in the replay, failed by the step's own size.
                assert!(ours.reason.contains("the step goes on"), "{name}: {ours:?}");
            }
            // Every N listed, as PyTorch fitted them (gpt2mixed's 64 in three placements
            // of four; gpt2stream's 256 and 512 in four of four).
            let fitting = match name {
                "history_gpt2mixed_cap15g" => Some("fits with N = 20; N = 1024 also"),
                "history_gpt2mixed_hook17" | "history_gpt2mixed_hook18" => {
                    Some("fits with N = 20, 64; N = 1024 also")
                }
                "history_gpt2stream_hook18"
                | "history_lightning_hook18"
                | "history_accelaccum_hook18" => Some("fits with N = 20, 64, 128, 256, 512;"),
                "history_llamabf16_cap7_hook19" => {
                    Some("fits with N = 20, 64, 128, 256, 512, 1024;")
                }
                "history_gpt2tutorial_cap10g55_hook18" => Some("fits with N = 64, 128;"),
                "ring_gpt2fixed_cap15g22_hook112" => Some("fits with N = 20, 64, 128;"),
                "ring_llamafixed_cap8g66_hook112" => Some("fits with N = 20, 64, 128, 256, 512;"),
                "ring_llamatune_cap28g9_hook112" => Some("fits with N = 20, 64;"),
                "ring_bertfixed_cap13g3_hook112" => {
                    Some("fits with N = 20, 64, 128, 256, 512, 1024;")
                }
                _ => None,
            };
            if let Some(fitting) = fitting.filter(|_| remedy.starts_with("max_split")) {
                assert!(ours.reason.contains(fitting), "{name}: {ours:?}");
            }
            if expected == CannotTell {
                let why = if name.contains("gan_hook18")
                    || name.contains("unetvar_cap24")
                    || name.contains("maskrcnnvar")
                {
                    "and went on without (an OOM it caught"
                } else if name.contains("bertaccum") || name.contains("accumskip") {
                    "the step goes on"
                } else if name.contains("graphsteps")
                    || (name.contains("gpt2graphs") && remedy == "max_split_size_mb")
                {
                    "CUDA graph pool(s)"
                } else if name.contains("gpt2graphs") {
                    "whether it gets through this step is not in its history"
                } else if name.contains("llamafixed") {
                    "may run out before the step's end"
                } else if name.contains("vitfixed") || name.contains("llamatune") {
                    "runs out of memory before the step's end"
                } else if name.contains("accumfirst") {
                    "accumulating gradients"
                } else if name.contains("gpt2tutorial_cap10g55") || name.contains("gpt2fused") {
                    "too close to call"
                } else if name.contains("gpt2tutorial") {
                    "whether it gets through this step is not in its history"
                } else if name.contains("gpt2offload")
                    || name.contains("dlrmsparse")
                    || name.contains("whispervar")
                {
                    "whether it ends under the cap is not in the job's history"
                } else if remedy == "max_split_size_mb" {
                    "keeps rising"
                } else if name.ends_with("_hook16") {
                    "gap"
                } else {
                    "address orders"
                };
                assert!(ours.reason.contains(why), "{name}: {ours:?}");
                assert!(
                    ours.missing.is_none(),
                    "{name}: nothing to ask for: {ours:?}"
                );
            }
        }
        let live = live_view_of(&path, name, &kept);
        assert_eq!(live.remedies, at.remedies, "{name}");
        // "No allocator setting gets the job through" only where PyTorch failed each
        // setting these files were run with.
        let ooms = trace_ooms(&file);
        let causes = cause::of_kept_file(&file, ooms.last().unwrap(), Some(&at));
        if causes.iter().any(|c| {
            c.line()
                .contains("no allocator setting gets the job through")
        }) {
            assert!(
                outcomes.iter().all(|&(_, pytorch)| pytorch == Fails),
                "{name}: {causes:?}"
            );
            told_to_hold_less.push(name);
        }
    }
    // t5var, gpt2tutorial, accelaccum, gpt2sgd zeroing in place and distill: PyTorch failed
    // every setting in each (H100 and H200).
    assert_eq!(
        told_to_hold_less,
        [
            "history_t5var_cap5_hook18",
            "history_gpt2tutorial_hook18",
            "history_accelaccum_cap8g5_hook18",
            "history_gpt2sgdzero_cap6g93_hook114",
            "history_distill_cap9g17_hook116",
        ]
    );
}

/// A batch-size finder (`whatif_ab.py gpt2finder`: a GPT-2 step tried at batch 64, halved
/// at each caught OOM, `empty_cache()` in its `except`) under 8 GiB on an H200 (hook
/// 1.18), refused at batch 64, 32 and 16 for want of room and at batch 8 for want of a
/// piece (1.5 GiB asked, 858.8 MiB free in 10 runs). Its `empty_cache()` calls came with a
/// segment that would not have fitted beside what it held, so the replay took them for
/// PyTorch's own releases, kept those segments, served the batch-8 request PyTorch refused
/// and judged nothing ("does not fail where PyTorch failed"). PyTorch's own release comes
/// right before its retry or its raise; these were followed by the job's frees.
#[test]
fn a_batch_size_finders_own_empty_cache_is_replayed_as_the_job_made_it() {
    let name = "ring_gpt2finder_cap8_hook118";
    let file = trace::load(&fixture(&format!("{name}.pickle.gz"))).unwrap();
    let releases: Vec<bool> = file
        .stats
        .cache_releases
        .iter()
        .map(|r| r.retried)
        .collect();
    // Three in the finder's `except` blocks, one before the last refusal.
    assert_eq!(releases, [false, false, false, true]);
    let at = at_last_oom(name, &file);
    for r in &at.remedies {
        assert!(
            !r.reason.contains("does not fail where PyTorch failed"),
            "{r:?}"
        );
    }
    // Under expandable segments the replay serves batch 64's first refused request: a
    // finder given it tries on, and may keep a larger batch.
    let expandable = verdict_of(name, &at, "expandable_segments:True");
    assert_eq!(expandable.verdict, Verdict::CannotTell, "{expandable:?}");
    assert!(
        expandable
            .reason
            .contains("128.0 MiB it was refused at event 201"),
        "{expandable:?}"
    );
}

/// An OOM in the job's first step: `empty_cache() between steps` fails only where the hook
/// saw the job still in its first pass through its model (hook 1.13); the same file
/// without that word leaves it open, as before.
#[test]
fn the_cache_emptied_between_steps_fails_where_no_step_had_ended() {
    let name = "ring_gpt2compilefixed_cap8g13_hook113";
    let mut file = trace::load(&fixture(&format!("{name}.pickle.gz"))).unwrap();
    let between = |file: &Trace| {
        let at = at_last_oom(name, file);
        verdict_of(name, &at, "empty_cache() between steps").clone()
    };
    let told = between(&file);
    assert_eq!(told.verdict, Verdict::Fails, "{told:?}");
    assert!(told.reason.contains("first pass"), "{told:?}");
    let kept = file.stats.kept_oom.as_mut().unwrap();
    kept.roles.as_mut().unwrap().first_pass = false;
    let untold = between(&file);
    assert_eq!(untold.verdict, Verdict::CannotTell, "{untold:?}");
}

/// A job that marked no step (a GradScaler skipping the optimizer's first steps): the passes
/// hook 1.14 marked stand for its steps, and decide what its history alone left open. The
/// same file without them is judged as before hook 1.14 (on the GPU: 4 equal, 12 open).
#[test]
fn the_passes_stand_for_the_steps_a_scaler_skipped() {
    use vramtop::trace::replay::{steps, StepsBy};
    let name = "ring_gpt2scalerfixed_cap15g3_hook114";
    let mut file = trace::load(&fixture(&format!("{name}.pickle.gz"))).unwrap();
    let kept = file.stats.kept_oom.as_ref().unwrap();
    assert!(kept.steps_us.is_empty(), "no optimizer step was marked");
    assert_eq!(kept.passes_us.len(), 1, "the second pass's start");
    assert_eq!(steps(&file).by, StepsBy::Passes);
    let at = at_last_oom(name, &file);
    let between = verdict_of(name, &at, "empty_cache() between steps");
    assert_eq!(between.verdict, Verdict::Fits, "{between:?}");
    assert!(
        between.reason.contains("model's next forward"),
        "{between:?}"
    );
    // Two micro-batches a step, the scaler skipping: one pass a step, after zero_grad(),
    // none between the micro-batches (it ran out in step 4).
    let accum = "history_gpt2accumskip_cap6g62_hook114";
    let accum_file = trace::load(&fixture(&format!("{accum}.pickle.gz"))).unwrap();
    let kept = accum_file.stats.kept_oom.as_ref().unwrap();
    assert_eq!((kept.steps_us.len(), kept.passes_us.len()), (0, 4));
    // The same in DistributedDataParallel, each micro-batch all-reduced: DDP copies the
    // reduced gradients back in place at each backward's end, after the hook's first
    // callback, and still no micro-batch reads as a step (on the GPU, hook 1.14).
    let ddp = "history_gpt2ddpaccumskip_cap7_hook114";
    let ddp_file = trace::load(&fixture(&format!("{ddp}.pickle.gz"))).unwrap();
    let kept = ddp_file.stats.kept_oom.as_ref().unwrap();
    assert_eq!(
        (kept.steps_us.len(), kept.passes_us.len(), kept.accumulating),
        (0, 4, 0)
    );
    // Gradients zeroed in place by a hand-written update: a pass a step all the same, told
    // by the gradient changed since the backward left it, and nothing accumulating.
    let zero = "history_gpt2sgdzero_cap6g93_hook114";
    let zero_file = trace::load(&fixture(&format!("{zero}.pickle.gz"))).unwrap();
    let kept = zero_file.stats.kept_oom.as_ref().unwrap();
    assert_eq!((kept.passes_us.len(), kept.accumulating), (8, 0));
    file.stats.kept_oom.as_mut().unwrap().passes_us.clear();
    let unmarked = at_last_oom(name, &file);
    for remedy in ["expandable_segments:True", "empty_cache() between steps"] {
        let open = verdict_of(name, &unmarked, remedy);
        assert_eq!(open.verdict, Verdict::CannotTell, "{remedy}: {open:?}");
    }
}

/// Hook 1.15 marks each step GradScaler skipped, where its `step()` returned: gpt2scalerskip
/// (the scale at 2**40, steps 0 to 7 skipped) under 6.6 GiB ran out at step 8 asking 954 MiB
/// with its 8 skipped steps marked and no pass needed (H200, 2026-11-29). PyTorch fitted
/// expandable, expandable + GC and the cache emptied after every step; so does vramtop,
/// live and kept, its steps now the marks.
#[test]
fn the_steps_a_scaler_skipped_are_marked() {
    use vramtop::trace::replay::{steps, StepsBy};
    let name = "history_gpt2scalerskip_cap6g6_hook115";
    let path = fixture(&format!("{name}.pickle.gz"));
    let file = trace::load(&path).unwrap();
    let kept = file.stats.kept_oom.clone().unwrap();
    assert_eq!((kept.steps_us.len(), kept.passes_us.len()), (8, 0));
    assert_eq!(steps(&file).by, StepsBy::Marks);
    let at = at_last_oom(name, &file);
    for remedy in [
        "expandable_segments:True",
        "expandable_segments:True,garbage_collection_threshold",
        "empty_cache() between steps",
    ] {
        let ours = verdict_of(name, &at, remedy);
        assert_eq!(ours.verdict, Verdict::Fits, "{remedy}: {ours:?}");
    }
    let between = verdict_of(name, &at, "empty_cache() between steps");
    assert!(
        between
            .reason
            .contains("each of its 8 steps marked in its history"),
        "{between:?}"
    );
    let live = live_view_of(&path, name, &kept);
    assert_eq!(live.remedies, at.remedies, "{name}");
}

/// An OOM inside a job's first step while it accumulated gradients: the fits are left open
/// (hook 1.14's `accumulating`), as the micro-batches still to come are not in the
/// history; so on the live view's one-state path too. Without that word the same file says "fits", which PyTorch, run with each
/// setting, did not bear out: a later, larger micro-batch ran out.
#[test]
fn the_fits_inside_an_accumulating_first_step_are_left_open() {
    let name = "ring_gpt2accumfirst_cap8g15_hook114";
    let mut file = trace::load(&fixture(&format!("{name}.pickle.gz"))).unwrap();
    let expandable = |file: &Trace| {
        let at = at_last_oom(name, file);
        verdict_of(name, &at, "expandable_segments:True").clone()
    };
    let open = expandable(&file);
    assert_eq!(open.verdict, Verdict::CannotTell, "{open:?}");
    assert!(open.reason.contains("accumulating"), "{open:?}");
    let kept = file.stats.kept_oom.as_mut().unwrap();
    assert_eq!(kept.accumulating, 4);
    kept.accumulating = 0;
    assert_eq!(expandable(&file).verdict, Verdict::Fits);
}

/// wav2vec (a Wav2Vec2, random weights, CTC on clips of varying batch and length) under
/// 12.15 GiB, kept by hook 1.8.1 on an H100 (2026-11-27): its 32 MiB history, past the
/// budget, begins at a checkpoint
/// 11.2 s before the OOM at step 66, in 41 pieces. The first events piece holds another
/// read's `snapshot` entry 3 ms ahead of the state's own, three allocations between; taken
/// for the state's mark, they contradicted it, and the whole history was dropped for the
/// last checkpoint's 0.3 s (GC 0.6 and roundup 4 were then `cannot tell`). PyTorch, each
/// in a fresh process: expandable, expandable + GC, the cache emptied after every step and
/// max_split 20 to 1024 fit; GC 0.6, roundup 4 and max_split 2048 and 4096 fail.
#[test]
fn a_history_begun_at_a_checkpoint_is_read_past_another_reads_snapshot_entry() {
    use Verdict::{Fails, Fits};
    let name = "history_wav2vec_hook18";
    let file = trace::load(&fixture(&format!("{name}.pickle.gz"))).unwrap();
    let kept = file.stats.kept_oom.clone().expect("a file the hook kept");
    let history = kept.history.as_ref().expect("its pieces stitched");
    assert_eq!((history.pieces, history.from_start), (41, false));
    assert!(history.events > 190_000, "{history:?}");
    let at = at_last_oom(name, &file);
    for (remedy, expected) in [
        ("roundup_power2_divisions", Fails),
        ("garbage_collection_threshold:0.6", Fails),
        ("empty_cache() between steps", Fits),
        ("max_split_size_mb:1024", Fits),
    ] {
        let ours = verdict_of(name, &at, remedy);
        assert_eq!(ours.verdict, expected, "{remedy}: {ours:?}");
        assert!(ours.reason.contains("11.2 s before the OOM"), "{ours:?}");
    }
    let split = verdict_of(name, &at, "max_split_size_mb");
    assert!(
        split
            .reason
            .contains("fits with N = 20, 64, 128, 256, 512, 1024;"),
        "{split:?}"
    );
    // Expandable segments: the blocks live at the checkpoint, where PyTorch had them and
    // padded to whole pages, give different answers; open, not wrong (PyTorch fitted).
    let expandable = verdict_of(name, &at, "expandable_segments:True");
    assert_ne!(expandable.verdict, Fails, "{expandable:?}");
}

/// A GPT-2 history (hook 1.7, gpt2mixed under 15.5 GiB) with one gap, 3.3 s before the OOM,
/// in which the job's allocator gave back 26 segments and took 3 between a read of the
/// ring and its clearing (the gap lasted 26 ms; it hid the pair of 1.5 GiB segments'
/// allocation). PyTorch, each remedy in a fresh process (H100, 2.11): expandable,
/// expandable+GC, max_split 20, 200 and 1000, empty_cache() after every step fit;
/// roundup 4 and GC 0.6 fail. Filled without the segments, what PyTorch held at the OOM
/// read 15.0 GiB (it held 13.7) and GC 0.6 "fits": wrong. Now the state at the OOM is
/// PyTorch's, and GC 0.6, which fits with the gap filled and is left open begun again after
/// it, is `cannot tell`.
#[test]
fn a_gap_that_hid_the_jobs_segment_decisions_leaves_open_what_it_decides() {
    use Verdict::*;
    let name = "history_gpt2mixed_gap";
    let file = trace::load(&fixture(&format!("{name}.pickle.gz"))).expect("loads");
    let kept = file.stats.kept_oom.clone().expect("a file the hook kept");
    let history = kept.history.as_ref().expect("a history in pieces");
    assert!(history.from_start, "{name}");
    assert!(history.restart.is_some(), "{name}: the gap is found");
    let ooms = trace_ooms(&file);
    let oom = ooms.last().expect("an OOM");
    // PyTorch's own message: 12.56 GiB allocated, 1.10 GiB reserved but unallocated; its
    // stats in the file, to the byte: reserved 14,673,772,544, allocated 13,491,482,112.
    assert_eq!(oom.reserved_bytes, 14_673_772_544, "{name}: {oom:?}");
    assert_eq!(oom.allocated_bytes, 13_491_482_112, "{name}: {oom:?}");
    let at = at_last_oom(name, &file);
    for (remedy, expected) in [
        ("expandable_segments:True", Fits),
        ("roundup_power2_divisions", Fails),
        ("garbage_collection_threshold", CannotTell),
        (
            "expandable_segments:True,garbage_collection_threshold",
            Fits,
        ),
        ("empty_cache() between steps", Fits),
        ("max_split_size_mb", CannotTell),
    ] {
        let ours = verdict_of(name, &at, remedy);
        assert_eq!(ours.verdict, expected, "{name} {remedy}: {ours:?}");
    }
    let gc = verdict_of(name, &at, "garbage_collection_threshold");
    assert!(gc.reason.contains("gap 3.3 s before the OOM"), "{gc:?}");
    assert!(gc.missing.is_none(), "nothing to ask for: {gc:?}");
    let live = live_view_of(&fixture(&format!("{name}.pickle.gz")), name, &kept);
    assert_eq!(live.remedies, at.remedies, "{name}");
}

/// Hook 1.7 keeps the ring without `free_requested` (PyTorch's `skip_actions`): the same
/// GPU-kept histories with those events taken out give the same verdicts, for the same
/// reasons, at their last OOM (a block is freed at its `free_completed`; a request was
/// only counted).
#[test]
fn gpu_kept_histories_without_free_requested_give_the_same_verdicts() {
    for name in [
        "history_gpt2mixed_cap15g",
        "history_gpt2var_hook16",
        "history_kvcache_steps_hook16",
    ] {
        let file = trace::load(&fixture(&format!("{name}.pickle.gz")))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut without = file.clone();
        // A gap's restart point is an index into the events: it moves with them.
        let kept_history = without
            .stats
            .kept_oom
            .as_mut()
            .and_then(|k| k.history.as_mut());
        if let Some(restart) = kept_history.and_then(|h| h.restart.as_mut()) {
            restart.event -= file.events[..restart.event]
                .iter()
                .filter(|e| e.kind == TraceEventKind::FreeRequested)
                .count();
        }
        without
            .events
            .retain(|e| e.kind != TraceEventKind::FreeRequested);
        assert!(without.events.len() < file.events.len(), "{name}");
        let (with_them, stripped) = (at_last_oom(name, &file), at_last_oom(name, &without));
        let verdicts = |at: &OomRemedies| {
            at.remedies
                .iter()
                .map(|r| (r.remedy.to_string(), r.verdict, r.reason.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(verdicts(&with_them), verdicts(&stripped), "{name}");
    }
}

/// A GPU-kept history with its step marks taken out, as a loop with no torch optimizer
/// would keep it.
fn unmarked(file: &Trace) -> Trace {
    let mut without = file.clone();
    if let Some(kept) = without.stats.kept_oom.as_mut() {
        kept.steps_us.clear();
    }
    without
}

/// A loop that marked no steps is judged by its rounds (`replay::steps`): where its memory
/// in use came back down. On training loops kept on the GPU they fall where the hook marked
/// their optimizer steps, every one, and the Trainer's history without its marks gets the
/// verdicts it got with them (PyTorch's outcomes: see the stepped jobs' test above).
#[test]
fn the_rounds_of_training_loops_fall_at_their_optimizer_steps() {
    use vramtop::trace::replay::{step_boundaries, steps};
    for name in [
        "history_hftrainer_hook18",
        "history_llamamix_hook18",
        "history_moemix_hook18",
        "history_t5var_cap5_hook18",
        "history_gpt2ckpt_cap14_hook18",
    ] {
        let file = trace::load(&fixture(&format!("{name}.pickle.gz")))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let marks = step_boundaries(&file);
        assert!(marks.len() > 40, "{name}: {} marks", marks.len());
        let rounds = steps(&unmarked(&file));
        assert!(!rounds.marked(), "{name}");
        assert_eq!(rounds.at, marks, "{name}");
    }
    let name = "history_hftrainer_hook18";
    let file = trace::load(&fixture(&format!("{name}.pickle.gz"))).expect("loads");
    let verdicts = |at: &OomRemedies| {
        at.remedies
            .iter()
            .map(|r| (r.remedy.to_string(), r.verdict))
            .collect::<Vec<_>>()
    };
    let (marked, by_rounds) = (
        at_last_oom(name, &file),
        at_last_oom(name, &unmarked(&file)),
    );
    assert_eq!(verdicts(&marked), verdicts(&by_rounds));
    let between = verdict_of(name, &by_rounds, "empty_cache() between steps");
    // Its reason says what the steps were taken for.
    assert!(
        between.reason.contains("no step is marked in"),
        "{}",
        between.reason
    );
}

/// The replay of each GPU-kept file's own settings, at the cap the job ran under, reaches
/// PyTorch's own reserved peak (its segments, from the trace's segment entries) to the
/// byte: a replay that does not follow the job says little of what a remedy would do. A
/// torch.compile history's stitch once put gpt2graphs' 626 MiB over at the OOM, its peak
/// 5.8 % over, and every verdict was "cannot tell" (`history::unchanged`). The one file
/// whose gap hid releases of PyTorch's own (`history_gpt2mixed_gap`, 26 segments) is
/// 2.6 % under, and is left out.
#[test]
fn each_kept_files_own_replay_reaches_pytorchs_reserved_peak() {
    use vramtop::alloc::PolicyKind;
    use vramtop::trace::replay::report::TraceFigures;
    use vramtop::trace::replay::{replay, ReplayOptions};
    let dir = fixture("");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            (n.starts_with("history_") || n.starts_with("ring_")) && n.ends_with(".pickle.gz")
        })
        .collect();
    names.sort();
    let mut checked = 0;
    for name in &names {
        let file = trace::load(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let Some(cap) = vramtop::trace::replay::remedies::kept_cap(&file) else {
            continue; // not under a cap the file names (another process's memory)
        };
        let Some(traced) = TraceFigures::of(&file).reserved_peak_bytes else {
            continue;
        };
        let opts = ReplayOptions {
            capacity: cap,
            ..ReplayOptions::default()
        };
        let run = replay(&file, PolicyKind::Caching, opts).unwrap();
        if name.starts_with("history_gpt2mixed_gap") {
            let ratio = run.peak_reserved_bytes as f64 / traced as f64;
            assert!((0.97..0.98).contains(&ratio), "{name}: {ratio}");
            continue;
        }
        assert_eq!(run.peak_reserved_bytes, traced, "{name}");
        checked += 1;
    }
    assert!(checked >= 35, "{checked} files checked");
}

/// A replay of a file the hook kept under a memory fraction runs at that cap, where the
/// remedies are judged, not at the capacity inferred from the trace: on the SegFormer's
/// file (16 GiB cap, 14.9 GiB held at the OOM) the report said "pytorch-expandable fails
/// too" at 15.3 GiB (its reserved peak) beside "expandable_segments:True: fits", which
/// PyTorch, run with it, bore out.
#[test]
fn a_kept_files_replay_runs_at_the_cap_its_remedies_are_judged_at() {
    use vramtop::alloc::PolicyKind;
    use vramtop::trace::replay::{plan_capacity, report, CapacitySource};
    let name = "history_segformervar_cap16_hook116";
    let file = trace::load(&fixture(&format!("{name}.pickle.gz"))).unwrap();
    let ooms = trace_ooms(&file);
    let opts = plan_capacity(&file, None, &ooms);
    let kept = file.stats.kept_oom.as_ref().unwrap();
    assert_eq!(
        (opts.source, opts.capacity),
        (CapacitySource::Kept, kept.device_total_bytes)
    );
    assert_eq!(opts.capacity, 16 << 30);
    let last = ooms.last().unwrap().event;
    let rows = report(
        &file,
        &[PolicyKind::Caching, PolicyKind::PytorchExpandable],
        opts,
    )
    .unwrap();
    let fails: Vec<bool> = rows
        .iter()
        .map(|row| {
            row.trace_ooms
                .iter()
                .find(|c| c.event == last)
                .unwrap()
                .fails
        })
        .collect();
    assert_eq!(fails, [true, false], "caching fails, expandable fits");
    let at = at_last_oom(name, &file);
    let expandable = verdict_of(name, &at, "expandable_segments:True");
    assert_eq!(expandable.verdict, Verdict::Fits, "{expandable:?}");
    // Given a capacity, it stands.
    assert_eq!(
        plan_capacity(&file, Some(15 << 30), &ooms).source,
        CapacitySource::Given
    );
}
