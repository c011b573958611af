//! The OOM's cause, on files the hook (1.4) kept at real OOMs on an H100 (PyTorch 2.11,
//! `scripts/gpu/causes.sh`; see tests/fixtures/README.md): another process (JAX's
//! preallocation, CuPy's pool), the job's own cap, a leak with and without `--history`, a
//! GPT-2 too big for the GPU. The same cause in the batch block (`vramtop snapshot --once`,
//! the binary itself), from the library, and in the live view's explanation of the OOM.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "support/trace_support.rs"]
mod trace_support;

#[path = "support/json_doc.rs"]
mod json_doc;
use trace_support::unzipped_as_kept;

use vramtop::alloc::{BlockState, Pool};
use vramtop::attach::job::OomExplained;
use vramtop::attach::protocol::{HookBlock, HookSegment, OomState, RingAtOom};
use vramtop::trace::cause::{self, Cause};
use vramtop::trace::ooms::trace_ooms;
use vramtop::trace::{self, SnapshotSegment, Trace};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures")).join(name)
}

/// The fixture `cause_NAME.pickle.gz` (or `NAME.pickle.gz` for a `ring_` one) as the hook
/// kept it: (its folder, the file).
fn unzipped(name: &str) -> (PathBuf, PathBuf) {
    let file = if name.starts_with("ring_") {
        format!("{name}.pickle.gz")
    } else {
        format!("cause_{name}.pickle.gz")
    };
    unzipped_as_kept(&fixture(&file), name)
}

/// The causes of the file's OOM as the library finds them.
fn causes_of(trace: &Trace) -> Vec<Cause> {
    let ooms = trace_ooms(trace);
    let last = ooms.last().expect("an OOM");
    let at = vramtop::trace::replay::remedies::remedies(trace, &ooms, None)
        .unwrap()
        .into_iter()
        .find(|r| r.event == last.event);
    cause::of_kept_file(trace, last, at.as_ref())
}

/// What `vramtop snapshot --once FILE` prints, as a user sees it.
fn batch_block(path: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_vramtop"))
        .args(["snapshot", "--once"])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The OOM as the hook sent it to a viewer, read back from what it kept.
fn live_explanation(trace: &Trace, path: &Path) -> OomExplained {
    let kept = trace.stats.kept_oom.clone().unwrap();
    OomExplained::from_oom(&OomState {
        time_s: kept.time_us as f64 / 1e6,
        device: kept.device,
        requested_bytes: kept.requested_bytes,
        device_free_bytes: Some(kept.device_free_bytes),
        device_total_bytes: Some(kept.device_total_bytes),
        segments: hook_segments(&trace.segments_at_end),
        ring: Some(RingAtOom {
            max_entries: 65536,
            entries: trace.events.len() as u64,
            complete: kept.ring_complete,
        }),
        kept_path: Some(path.to_string_lossy().into_owned()),
        physical_total_bytes: kept.physical_total_bytes,
        series: kept.series.clone(),
        step_series: kept.step_series.clone(),
        gpu_processes: kept.gpu_processes.clone(),
        ..Default::default()
    })
}

/// The file's segments as the hook's `oom` message carries them.
fn hook_segments(segments: &[SnapshotSegment]) -> Vec<HookSegment> {
    segments
        .iter()
        .map(|s| HookSegment {
            address: s.addr,
            total_size: s.total_size,
            stream: 0,
            segment_type: if s.pool == Pool::Small {
                "small"
            } else {
                "large"
            }
            .into(),
            is_expandable: s.is_expandable,
            blocks: s
                .blocks
                .iter()
                .map(|b| HookBlock {
                    address: b.addr,
                    size: b.size,
                    requested_size: b.requested_size,
                    state: match b.state {
                        BlockState::Allocated => "active_allocated",
                        BlockState::PendingFree => "active_pending_free",
                        _ => "inactive",
                    }
                    .into(),
                    site: b.tag.as_deref().map(str::to_string),
                })
                .collect(),
        })
        .collect()
}

/// Each file: the first cause's kind, and what its line must say.
fn expected() -> Vec<(&'static str, &'static str, Vec<&'static str>)> {
    vec![
        (
            "jax",
            "another process",
            vec![
                "another process held 59.9 GiB of this GPU",
                "cause_jobs.py jax_hold",
                "JAX/XLA",
                "XLA_PYTHON_CLIENT_PREALLOCATE=false",
            ],
        ),
        (
            "cupy",
            "another process",
            vec!["30.5 GiB", "CuPy", "free_all_blocks()"],
        ),
        // The same libraries inside the job's own process (H200, 2026-11-29): PyTorch then
        // fitted the same 40 GiB with JAX started with XLA_PYTHON_CLIENT_PREALLOCATE=false,
        // and after CuPy's free_all_blocks(). Before, each read "too big for this GPU".
        (
            "inproc_jax",
            "outside PyTorch in the job's process",
            vec![
                "the job's own process held 105.4 GiB of this GPU outside PyTorch's allocator",
                "JAX/XLA is loaded in it",
                "XLA_PYTHON_CLIENT_PREALLOCATE=false",
            ],
        ),
        (
            "inproc_cupy",
            "outside PyTorch in the job's process",
            vec!["110.5 GiB", "CuPy is loaded in it", "free_all_blocks()"],
        ),
        // A GPT-2 trained beside JAX at XLA_PYTHON_CLIENT_MEM_FRACTION=.9: the tensors and
        // the request (13.26 GiB) just fit the 13.28 GiB JAX left, packed tight, but the
        // device refused the request's segment with 25 MiB free in the cache; PyTorch
        // trained the same steps with JAX not preallocating. Read "fragmentation" before.
        (
            "inproc_jax_train",
            "outside PyTorch in the job's process",
            vec!["held 126.5 GiB", "JAX/XLA is loaded in it"],
        ),
        // 110 GiB taken through the CUDA driver, as a CUDA extension would: no framework.
        (
            "inproc_raw",
            "outside PyTorch in the job's process",
            vec![
                "110.5 GiB",
                "another library in the job allocates on the GPU itself",
            ],
        ),
        (
            "cap",
            "the job's own cap",
            vec![
                "set_per_process_memory_fraction allows 7.9 GiB of 79.2 GiB",
                "1.1 GiB more",
            ],
        ),
        (
            "toobig",
            "too big",
            vec!["too big for this GPU", "16.6 GiB more than the 78.5 GiB"],
        ),
        (
            "leak",
            "a leak",
            vec![
                "likely a leak: allocated after each step rose",
                "the job's allocation sites were not recorded, so no line is named",
            ],
        ),
        (
            "leak_history",
            "a leak",
            vec![
                "a leak: 963 blocks from",
                "cause_jobs.py:92 body still alive (7.5 GiB), one a step",
            ],
        ),
        (
            "leak_loop",
            "a leak",
            vec![
                "likely a leak: allocated rose from",
                "the job's allocation sites were not recorded, so no line is named",
            ],
        ),
        (
            "leak_loop_history",
            "a leak",
            vec![
                "a leak: 809 blocks from",
                "cause_jobs.py:94 body still alive (6.3 GiB)",
            ],
        ),
        // An MLP trained by captured CUDA graphs (hook 1.9, H200): 11.9 GiB of the 12.0 GiB
        // free sat in six graphs' pools, 54 MiB in the job's own cache.
        (
            "ring_graphsteps_cap16_hook19",
            "CUDA graphs' pools",
            vec![
                "CUDA graphs' private pools: 11.9 GiB free in 6 pool(s)",
                "expandable_segments:True fits",
            ],
        ),
    ]
}

#[test]
fn every_cause_is_named_first_in_the_batch_block_the_library_and_the_live_view() {
    for (name, kind, says) in expected() {
        let (dir, path) = unzipped(name);
        let trace = trace::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let found = causes_of(&trace);
        let first = found.first().unwrap_or_else(|| panic!("{name}: no cause"));
        assert_eq!(first.name(), kind, "{name}: {found:?}");
        let line = first.line();
        for text in &says {
            assert!(line.contains(text), "{name}: {line:?} lacks {text:?}");
        }
        // The batch block: right under the OOM's figures, before PyTorch's words.
        let block = batch_block(&path);
        let lines: Vec<&str> = block.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.trim_start().starts_with("OOM: needed"))
            .unwrap_or_else(|| panic!("{name}: {block}"));
        // The batch log says how to give what the cause lacked (the library does not).
        let advised = vramtop::advice::line_with(&line, first.missing());
        assert_eq!(lines[at + 1].trim(), format!("cause: {advised}"), "{name}");
        if name == "leak" || name == "leak_loop" {
            assert!(
                advised.ends_with("`vramtop run --history` to name the line"),
                "{advised}"
            );
        }
        // The live view says the same of the same OOM.
        let live = live_explanation(&trace, &path);
        assert_eq!(
            live.cause_lines().first().map(String::as_str),
            Some(format!("cause: {line}").as_str()),
            "{name}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The GPT-2 whose batch doubled each step (hook 1.4 with roles): it died at batch 128
/// after batch 64 had run, so half the batch was enough, as the knobs line says.
#[test]
fn the_knobs_of_a_job_too_big_say_half_the_batch_is_enough() {
    let (dir, path) = unzipped("toobig");
    let block = batch_block(&path);
    assert!(
        block
            .contains("  knobs: 16.6 GiB short; would give back: half the batch or sequence about"),
        "{block}"
    );
    assert!(block.contains("the request; enough)"), "{block}");
    assert!(
        block.contains("an optimizer without state (SGD) 624.9 MiB (measured; not enough)"),
        "{block}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The README's front-page job (GPT-2 trained on short sequences, then one full-length
/// batch), its addresses moved below 0x7f00_0000_0000 as the kernel placed them in one
/// batch run on the H100, where the replay from the hook's checkpoint failed with "address
/// space exhausted" and the block gave no remedy at all. Each remedy has its verdict.
#[test]
fn a_checkpoint_at_low_addresses_replays() {
    let (dir, path) = unzipped("front_page_low_addresses");
    let block = batch_block(&path);
    assert!(!block.contains("the replay failed"), "{block}");
    for remedy in [
        "  expandable_segments:True: fails: the job's own history replayed",
        "  max_split_size_mb:N: fails: no value fits",
        "  roundup_power2_divisions:N: fails: the job's history replayed",
    ] {
        assert!(block.contains(remedy), "{remedy} missing:\n{block}");
    }
    assert!(block.contains("  cause: too big for this GPU"), "{block}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `replay --json` of every kept file here (each cause, roles, a checkpoint): schema 2,
/// and each field it carries has its row in docs/json.md.
#[test]
fn replay_json_of_every_kept_file_is_documented() {
    let names = [
        "jax",
        "cupy",
        "inproc_jax",
        "cap",
        "toobig",
        "leak",
        "leak_history",
        "leak_loop",
        "leak_loop_history",
        "front_page_low_addresses",
        "ring_graphsteps_cap16_hook19",
        // An OOM asked of a graph's pool: `graph_pools.asked_pool`.
        "ring_graphsonce_cap25g2_hook19",
    ];
    for name in names {
        let (dir, path) = unzipped(name);
        let out = Command::new(env!("CARGO_BIN_EXE_vramtop"))
            .args(["replay", "--json"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["schema"], 2, "{name}");
        json_doc::assert_documented("replay --json", &v);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A leak is not blamed where allocated only rose at the job's start and at its OOM: the
/// cap and the GPT-2 files have series too.
#[test]
fn no_leak_is_called_where_the_floor_held() {
    for name in ["cap", "toobig", "jax", "cupy"] {
        let (dir, path) = unzipped(name);
        let trace = trace::load(&path).unwrap();
        let found = causes_of(&trace);
        assert!(
            !found.iter().any(|c| matches!(c, Cause::Leak { .. })),
            "{name}: {found:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The kept file names every process on the GPU, the job itself marked, with its
/// framework: what the cause line is built from.
#[test]
fn the_kept_file_lists_the_gpus_processes_with_their_frameworks() {
    let (dir, path) = unzipped("jax");
    let trace = trace::load(&path).unwrap();
    let kept = trace.stats.kept_oom.unwrap();
    let listed = kept.gpu_processes.expect("NVML's list");
    assert!(listed.own_pid_listed);
    let own = listed.processes.iter().find(|p| p.own).expect("the job");
    assert_eq!(
        own.frameworks.as_deref(),
        Some(&["PyTorch".to_string()][..])
    );
    let jax = listed
        .processes
        .iter()
        .find(|p| !p.own)
        .expect("the holder");
    assert_eq!(
        jax.frameworks.as_deref(),
        Some(&["JAX/XLA".to_string()][..])
    );
    assert!(jax.bytes.unwrap() > 59 << 30);
    assert_eq!(kept.physical_total_bytes, Some(85_017_493_504));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A GPT-2 (6 layers) trained with AdamW on the H100 printed its own sums just before it
/// asked for 200 GiB (tests/fixtures/README.md): the kept file's roles are those bytes,
/// to the byte, and the batch block says what the memory was for.
#[test]
fn the_roles_at_an_oom_are_the_jobs_own_sums() {
    let (dir, path) = unzipped_as_kept(&fixture("roles_gpt2_adamw.pickle.gz"), "roles");
    let trace = trace::load(&path).unwrap();
    let roles = trace.stats.kept_oom.as_ref().unwrap().roles.unwrap();
    // The job's own line: {"parameters": 326077440, "gradients": 326077440,
    // "optimizer_state": 652154880, "moment": "oom", ...}
    assert_eq!(
        (roles.parameters, roles.gradients, roles.optimizer_state),
        (326_077_440, 326_077_440, 652_154_880)
    );
    assert_eq!((roles.models, roles.optimizers), (1, 1));
    let block = batch_block(&path);
    assert!(
        block.contains(
            "  memory: parameters 311.0 MiB · gradients 311.0 MiB · optimizer state 621.9 MiB \
             (2.0x the parameters) · activations and other"
        ),
        "{block}"
    );
    // 200 GiB asked: no knob the roles measure comes near, and it says so.
    assert!(
        block.contains(
            "  knobs: 122.8 GiB short; would give back: half the batch or sequence about"
        ),
        "{block}"
    );
    assert!(!block.contains("; enough)"), "{block}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A distillation on an H200 (hook 1.17): its teacher's parameters, which no optimizer
/// holds, are said frozen, and AdamW's state is told against the student's. The same
/// models' own sums, each storage once, printed by PyTorch on the GPU machine: teacher
/// 308,664,320 bytes (bf16), student 274,093,056, no buffers. And a Llama fine-tuned with
/// low-rank adapters (loramix): its base weights, needing no gradient, frozen; AdamW's two
/// moments exactly twice the adapters.
#[test]
fn frozen_parameters_are_said_apart_from_those_an_optimizer_trains() {
    let (dir, path) = unzipped_as_kept(
        &fixture("history_distill_cap9g17_hook117.pickle.gz"),
        "roles",
    );
    let trace = trace::load(&path).unwrap();
    let roles = trace.stats.kept_oom.as_ref().unwrap().roles.unwrap();
    assert_eq!(
        (
            roles.parameters,
            roles.trained,
            roles.frozen,
            roles.optimizer_state
        ),
        (
            308_664_320 + 274_093_056,
            274_093_056,
            308_664_320,
            2 * 274_093_056
        )
    );
    let block = batch_block(&path);
    assert!(
        block.contains(
            "  memory: parameters 555.8 MiB (294.4 MiB frozen) · gradients 0 B · optimizer \
             state 522.8 MiB (2.0x the trained parameters) · activations and other"
        ),
        "{block}"
    );
    let _ = std::fs::remove_dir_all(&dir);

    let (dir, path) = unzipped_as_kept(
        &fixture("history_loramix_cap9g69_hook117.pickle.gz"),
        "roles",
    );
    let trace = trace::load(&path).unwrap();
    let roles = trace.stats.kept_oom.as_ref().unwrap().roles.unwrap();
    assert_eq!(roles.optimizer_state, 2 * roles.trained);
    // The rest of the parameters' bytes are the rotary embedding's buffer (256 bytes).
    assert_eq!(roles.parameters - roles.trained - roles.frozen, 256);
    let block = batch_block(&path);
    assert!(
        block.contains(
            "  memory: parameters 602.9 MiB (594.1 MiB frozen) · gradients 0 B · optimizer \
             state 17.8 MiB (2.0x the trained parameters)"
        ),
        "{block}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A GPT-2 trained with two EMAs of its weights, torch's AveragedModel and timm's
/// ModelEmaV3, updated after each step and never called (`roles_check.py ema`, H200, hook
/// 1.18). No forward finds them; the hook finds them in the training loop's names, and
/// their weights are parameters no optimizer trains. Before, they were "activations and
/// other", and half the batch seemed to give back half of them too. The job's own sums,
/// each storage once: 978,232,320 bytes of parameters and buffers, 652,154,880 of them the
/// two copies'.
#[test]
fn an_ema_of_the_weights_is_frozen_parameters_not_activations() {
    let (dir, path) = unzipped_as_kept(&fixture("ring_gpt2ema_roles_hook118.pickle.gz"), "ema");
    let trace = trace::load(&path).unwrap();
    let roles = trace.stats.kept_oom.as_ref().unwrap().roles.unwrap();
    assert_eq!(
        (
            roles.parameters,
            roles.frozen,
            roles.trained,
            roles.gradients,
            roles.optimizer_state
        ),
        (
            978_232_320,
            652_154_880,
            326_077_440,
            326_077_440,
            652_154_880
        )
    );
    let block = batch_block(&path);
    assert!(
        block.contains(
            "  memory: parameters 932.9 MiB (621.9 MiB frozen) · gradients 311.0 MiB · \
             optimizer state 621.9 MiB (2.0x the trained parameters) · activations and other \
             81.6 MiB"
        ),
        "{block}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// gpt2ddp2's GPT-2 sharded by FSDP2 on two H200s (hook 1.11): its parameters, their
/// gradients and AdamW's state are DTensors, counted by their local shards. The rank
/// printed its shards' bytes before training (tests/fixtures/README.md): 258,281,472,
/// padding and all; AdamW's two moments are made unpadded, 8 KiB less for both.
#[test]
fn an_fsdp2_ranks_roles_are_its_shards() {
    let (dir, path) = unzipped_as_kept(
        &fixture("history_gpt2fsdp2_cap7g53_hook111.pickle.gz"),
        "fsdp2",
    );
    let trace = trace::load(&path).unwrap();
    let roles = trace.stats.kept_oom.as_ref().unwrap().roles.unwrap();
    const SHARDS: u64 = 258_281_472;
    assert!(
        (2 * SHARDS - 8192..=2 * SHARDS).contains(&roles.optimizer_state),
        "{roles:?}"
    );
    // The shards, and the root's parameters FSDP2 had gathered for the step (its
    // embeddings and final norm, 204.3 MiB, kept unsharded through the backward).
    assert_eq!(roles.parameters - SHARDS, 214_253_568, "{roles:?}");
    assert_eq!(roles.gradients, 0, "in the forward, after set_to_none");
    let block = batch_block(&path);
    assert!(
        block
            .contains("  memory: parameters 450.6 MiB · gradients 0 B · optimizer state 492.6 MiB"),
        "{block}"
    );
    // The request as PyTorch said it ("Tried to allocate 1000.00 MiB", as the live view
    // reads it), not the trace entry's 998.5 MiB before PyTorch rounded it up.
    assert!(
        block.contains("  OOM: needed 1000.0 MiB contiguous; 1.0 GiB free in 75 runs"),
        "{block}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The ResNet-50 whose batch and resolution vary (hook 1.8, H100, a 6.5 GiB cap): it died
/// asking 62 MiB with 268 MiB free in the cache, so the request alone fitted the cap, but
/// its step did not (PyTorch failed it with every setting). The cause is the cap and the
/// step in progress, not fragmentation, in the library, the batch block and the live view.
#[test]
fn a_step_too_big_for_the_cap_is_named_though_its_request_fits() {
    let (dir, path) = unzipped_as_kept(&fixture("history_resnetvar_hook18.pickle.gz"), "resnetvar");
    let trace = trace::load(&path).unwrap();
    let found = causes_of(&trace);
    let first = found.first().expect("a cause");
    assert_eq!(first.name(), "the job's own cap", "{found:?}");
    let line = first.line();
    assert!(line.contains("the step in progress"), "{line}");
    assert!(line.contains("1.07 to 1.14 times"), "{line}");
    // The least is no advice to size a cap by: PyTorch died in the step under 6.5 GiB
    // plus 150 MiB and plus 307 MiB, and got through it under 7.07 GiB (H200).
    assert!(
        line.contains("would need 150.1 MiB to 609.7 MiB more")
            && line.contains("raise the fraction by the larger"),
        "{line}"
    );
    assert!(
        !found
            .iter()
            .any(|c| c.name() == "fragmentation and the cache"),
        "{found:?}"
    );
    let block = batch_block(&path);
    assert!(block.contains(&format!("cause: {line}")), "{block}");
    // Half the batch got it through all 400 steps under the same cap (H200).
    assert!(
        block.contains(
            "knobs: 150.1 MiB to 609.7 MiB short; would give back: half the batch or \
             sequence about 3.1 GiB (an estimate: half the activations and the request; enough)"
        ),
        "{block}"
    );
    let live = live_explanation(&trace, &path);
    assert_eq!(
        live.cause_lines().first().map(String::as_str),
        Some(format!("cause: {line}").as_str())
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The MLP trained by captured graphs (hook 1.9, H200): its OOM's first line counts the
/// job's own free runs, the ones the request could have used, and gives the pools' bytes
/// after; the batch block, the library and the live view say the same, and the walk over
/// the events finds what the segments kept at the OOM say.
#[test]
fn the_first_line_counts_the_jobs_own_runs_apart_from_the_graphs_pools() {
    let name = "ring_graphsteps_cap16_hook19";
    let (dir, path) = unzipped(name);
    let trace = trace::load(&path).unwrap();
    let oom = trace_ooms(&trace).pop().expect("an OOM");
    let walked = vramtop::trace::ooms::walked_ooms(&trace)
        .pop()
        .and_then(|o| o.graph_pools)
        .expect("the pools' segments are known");
    assert_eq!(
        Some(walked),
        cause::GraphPoolSplit::of(&trace.segments_at_end, oom_stream(&trace)),
        "the walk and the kept segments disagree"
    );
    assert_eq!(oom.graph_pools, Some(walked));
    assert_eq!(walked.pools, 6);
    assert_eq!(walked.asked_pool, None, "asked of the job's own cache");
    assert_eq!(
        walked.pool_free_bytes + walked.own_free_bytes,
        oom.free_bytes
    );
    assert!(walked.own_free_runs < oom.free_runs, "{walked:?} {oom:?}");
    let line = oom.explain();
    assert_eq!(
        line,
        "needed 64.0 MiB contiguous; 54.4 MiB free in 16 runs, largest 12.0 MiB, and 11.9 GiB \
         in 6 CUDA graphs' pools"
    );
    let block = batch_block(&path);
    assert!(
        block
            .lines()
            .any(|l| l.trim_start().starts_with(&format!("OOM: {line}"))),
        "{block}"
    );
    assert_eq!(live_explanation(&trace, &path).line(), line);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The stream id the trace's last `oom` entry was asked on (a pool's after the load).
fn oom_stream(trace: &trace::Trace) -> u32 {
    trace
        .events
        .iter()
        .rev()
        .find(|e| e.kind == trace::TraceEventKind::Oom)
        .map(|e| e.stream)
        .expect("an oom entry")
}

/// graphsonce (hook 1.9, H200) ran out during a capture: the request was asked of the new
/// graph's pool, so the line gives that pool's free memory first, which alone it could
/// have used, then the job's own cache and the other pools; the kept segments, the walk,
/// the batch block and the live view say the same.
#[test]
fn an_oom_asked_of_a_graphs_pool_counts_that_pools_runs_first() {
    let name = "ring_graphsonce_cap25g2_hook19";
    let (dir, path) = unzipped(name);
    let trace = trace::load(&path).unwrap();
    let oom = trace_ooms(&trace).pop().expect("an OOM");
    let split = oom.graph_pools.expect("the pools' segments are known");
    assert_eq!(
        Some(split),
        cause::GraphPoolSplit::of(&trace.segments_at_end, oom_stream(&trace))
    );
    let walked = vramtop::trace::ooms::walked_ooms(&trace)
        .pop()
        .and_then(|o| o.graph_pools)
        .expect("the walk knows the pools");
    assert_eq!(walked.asked_pool, split.asked_pool);
    let asked = split.asked_pool.expect("asked of a pool");
    // The asked pool's own segments, summed here apart from the split's code.
    let stream = oom_stream(&trace);
    let (bytes, runs, largest) = trace
        .segments_at_end
        .iter()
        .filter(|s| s.stream == stream)
        .flat_map(|s| s.free_runs())
        .fold((0, 0, 0), |(b, n, l), run| (b + run, n + 1, l.max(run)));
    assert_eq!(
        (asked.free_bytes, asked.free_runs, asked.largest_free_bytes),
        (bytes, runs, largest)
    );
    let line = oom.explain();
    // The new graph's pool was taken whole by the capture so far: nothing free in it.
    assert_eq!((asked.free_bytes, asked.free_runs), (0, 0));
    assert_eq!(
        line,
        "needed 128.0 MiB contiguous in a CUDA graph's pool, none of it free (36.5 MiB in the \
         job's own cache, 21.8 GiB in 11 other pools)"
    );
    let block = batch_block(&path);
    assert!(
        block
            .lines()
            .any(|l| l.trim_start().starts_with(&format!("OOM: {line}"))),
        "{block}"
    );
    assert_eq!(live_explanation(&trace, &path).line(), line);
    // The cause says where it was asked, and what that pool had.
    assert!(
        block.contains(
            "cause: CUDA graphs' private pools: the request was asked of a graph's pool, none \
             of it free (21.8 GiB more in 11 other pool(s); "
        ),
        "{block}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every kept file's first line is PyTorch's own state at its OOM. The walk over the
/// events alone (each request rounded as PyTorch rounds it, a large block's end of 1 MiB
/// or less its own) finds the segments' free runs on every kept file whose history is
/// whole, and their bytes where no large block's unsplit end has a free block after it;
/// the figures given are the segments' where the walk reached them, and the bytes PyTorch
/// counted as allocated (its own figure, read with the roles) are theirs. Before blocks
/// were sized so, kvcache's line said 83.0 MiB free in 49 runs where PyTorch held 80.0
/// MiB in one.
#[test]
fn the_walk_to_each_kept_oom_finds_the_segments_kept_there() {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures"));
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".pickle.gz"))
        .collect();
    names.sort();
    let (mut checked, mut exact, mut with_pytorchs_figure) = (0, 0, 0);
    for file in names {
        let name = file.trim_end_matches(".pickle.gz");
        let (tmp, path) = unzipped_as_kept(&dir.join(&file), name);
        let trace = trace::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let _ = std::fs::remove_dir_all(&tmp);
        let (Some(kept), Some(oom), Some(walked)) = (
            &trace.stats.kept_oom,
            trace_ooms(&trace).pop(),
            vramtop::trace::ooms::walked_ooms(&trace).pop(),
        ) else {
            continue;
        };
        // The segments' own figures: free blocks side by side are one run.
        let (mut free, mut runs, mut largest) = (0u64, 0u64, 0u64);
        for seg in &trace.segments_at_end {
            let mut run = 0u64;
            for block in seg.blocks.iter().map(Some).chain([None]) {
                match block {
                    Some(b) if b.state == BlockState::Free => run += b.size,
                    _ if run > 0 => {
                        (free, runs, largest) = (free + run, runs + 1, largest.max(run));
                        run = 0;
                    }
                    _ => {}
                }
            }
        }
        let segments = (free, runs, largest);
        assert_eq!(
            (oom.free_bytes, oom.free_runs, oom.largest_free_bytes),
            segments,
            "{name}: the figures given are not the segments'"
        );
        assert_eq!(
            (walked.free_runs, walked.largest_free_bytes),
            (runs, largest),
            "{name}: the walk's runs are not the segments'"
        );
        // Each run may follow a large block's unsplit end of 1 MiB or less.
        let over = walked.free_bytes.checked_sub(free);
        assert!(
            over.is_some_and(|o| o <= runs << 20),
            "{name}: the walk found {} free bytes, the segments {free}",
            walked.free_bytes
        );
        exact += usize::from(over == Some(0));
        if let Some(pytorch) = kept.roles.as_ref().and_then(|r| r.allocated) {
            // The hook reads PyTorch's figure with the roles, just after the OOM: what the
            // failing op had made before its refused request may be freed by then (128
            // KiB in the batch-size finder's file, read 1.2 ms later); in every other
            // file they are equal.
            let freed = oom.allocated_bytes.checked_sub(pytorch);
            if name.contains("gpt2finder") {
                assert_eq!(freed, Some(128 << 10), "{name}: PyTorch's allocated bytes");
            } else {
                assert_eq!(freed, Some(0), "{name}: PyTorch's allocated bytes");
            }
            with_pytorchs_figure += 1;
        }
        checked += 1;
    }
    assert!(checked >= 50, "{checked} kept files");
    assert!(
        exact >= 40,
        "the walk alone was exact on {exact} of {checked}"
    );
    assert!(with_pytorchs_figure >= 30, "{with_pytorchs_figure}");
}

/// Free memory in pieces that no allocator setting puts together: the cause says the job
/// must hold less, where PyTorch failed every setting, and only there. A distillation (a
/// frozen GPT-2 teacher, a GPT-2 student) under 9.17 GiB ran out asking 954 MiB with 796
/// MiB free in 36 runs, and PyTorch failed all 22 settings; under 9.5 GiB five of them got
/// it through (H200, 2026-11-29).
#[test]
fn a_cache_in_pieces_that_no_setting_mends_says_the_job_must_hold_less() {
    // Under a memory fraction: raising it is the other way out.
    const TAIL: &str = "no allocator setting gets the job through (each one replayed fails): \
                        raise the fraction, or it must hold less (a smaller batch or sequence";
    let (_dir, path) = unzipped_as_kept(
        &fixture("history_distill_cap9g17_hook116.pickle.gz"),
        "distill",
    );
    let trace = trace::load(&path).unwrap();
    let found = causes_of(&trace);
    let first = found.first().expect("a cause");
    assert_eq!(first.name(), "fragmentation and the cache", "{found:?}");
    assert!(first.line().contains(TAIL), "{}", first.line());
    let block = batch_block(&path);
    assert!(
        block.contains(&format!("cause: {}", first.line())),
        "{block}"
    );
    // The live view judges the same history and says the same.
    let live = live_explanation(&trace, &path);
    assert_eq!(
        live.causes.first().map(Cause::line),
        Some(first.line()),
        "{:?}",
        live.causes
    );

    // Verdicts judged at a capacity the user gave (`replay --capacity`) say nothing of the
    // job as it ran: every setting fails at 8 GiB too, and the cause does not go on.
    let out = Command::new(env!("CARGO_BIN_EXE_vramtop"))
        .args(["replay", "--json", "--capacity", "8GiB"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let last = json["trace_ooms"]
        .as_array()
        .and_then(|o| o.last())
        .unwrap()
        .clone();
    let verdicts: Vec<&str> = last["remedies"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["verdict"].as_str())
        .collect();
    assert!(verdicts.iter().all(|v| *v == "fails"), "{verdicts:?}");
    let said = last["cause"].as_str().unwrap_or_default();
    assert!(said.starts_with("fragmentation and the cache"), "{said}");
    assert!(!said.contains("no allocator setting"), "{said}");

    // A setting fits: the cause names it, and says nothing of holding less.
    let (_dir, path) = unzipped_as_kept(
        &fixture("history_distill_cap9g5_hook116.pickle.gz"),
        "distill",
    );
    let found = causes_of(&trace::load(&path).unwrap());
    let line = found.first().expect("a cause").line();
    assert!(line.ends_with("expandable_segments:True fits"), "{line}");
    assert!(!line.contains("must hold less"), "{line}");

    // Every setting fails beside JAX's memory in the job's process: giving that back is the
    // fix, not holding less.
    let (_dir, path) = unzipped("inproc_jax_train");
    let found = causes_of(&trace::load(&path).unwrap());
    assert!(
        found
            .iter()
            .any(|c| c.name() == "fragmentation and the cache"),
        "{found:?}"
    );
    assert!(
        found.iter().all(|c| !c.line().contains("must hold less")),
        "{found:?}"
    );
}
