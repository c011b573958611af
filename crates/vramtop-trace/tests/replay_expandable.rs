//! Fidelity of `pytorch-expandable` to PyTorch 2.11 on the H100 traces
//! (scripts/gpu/traces/NOTE-expandable.md): replayed peak reserved within 1 % of
//! `torch.cuda.max_memory_reserved()` for runs recorded with expandable segments on,
//! and, for the same programs recorded without them, of what the expandable run reserved.
//! The traces are not in the repository: run with
//! `VRAMTOP_GPU_TRACES=/work/gpu-traces cargo test -p vramtop-trace --test replay_expandable -- --ignored`
//! (default directory: ../gpu-traces beside the repository).

use std::path::PathBuf;

use vramtop_alloc::PolicyKind;
use vramtop_trace as trace;
use vramtop_trace::replay::{self, ReplayOptions};

fn dir() -> PathBuf {
    std::env::var_os("VRAMTOP_GPU_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../gpu-traces"))
        })
}

/// PyTorch's own peak reserved for trace `name`, from traces.jsonl.
fn pytorch_peak(name: &str) -> u64 {
    let path = dir().join("traces.jsonl");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (see the module docs)", path.display()));
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|v| v["name"] == name)
        .and_then(|v| v["peak_reserved_bytes"].as_u64())
        .unwrap_or_else(|| panic!("no peak_reserved_bytes for {name} in {}", path.display()))
}

/// (pytorch-expandable, expandable) peak reserved of trace `name`.
fn replayed(name: &str) -> (u64, u64) {
    let path = dir().join(format!("{name}.pickle.gz"));
    let t = trace::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let rows = replay::report(
        &t,
        &[PolicyKind::PytorchExpandable, PolicyKind::Expandable],
        ReplayOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    for row in &rows {
        assert_eq!(row.ooms, 0, "{row:?}");
    }
    (rows[0].peak_reserved_bytes, rows[1].peak_reserved_bytes)
}

fn assert_within_1_percent(what: &str, replayed: u64, pytorch: u64) {
    let off = replayed as f64 / pytorch as f64 - 1.0;
    println!(
        "{what}: pytorch-expandable {:.1} MiB, PyTorch {:.1} MiB, {:+.2} %",
        replayed as f64 / 1048576.0,
        pytorch as f64 / 1048576.0,
        off * 100.0
    );
    assert!(off.abs() <= 0.01, "{what}: {:+.2} % off", off * 100.0);
}

#[test]
#[ignore = "needs the H100 traces; see the module docs"]
fn expandable_runs_replay_to_pytorchs_peak() {
    for program in ["gpt2_train", "resnet_train"] {
        let name = format!("{program}_expandable");
        let (faithful, ideal) = replayed(&name);
        assert_within_1_percent(&name, faithful, pytorch_peak(&name));
        assert!(
            ideal <= faithful,
            "{name}: the ideal bound is above the faithful policy"
        );
    }
}

#[test]
#[ignore = "needs the H100 traces; see the module docs"]
fn runs_without_expandable_predict_the_expandable_run() {
    for program in ["gpt2_train", "resnet_train"] {
        let (faithful, _) = replayed(program);
        let expandable_run = pytorch_peak(&format!("{program}_expandable"));
        assert_within_1_percent(program, faithful, expandable_run);
        // And it predicts a saving: PyTorch reserved more without expandable segments.
        assert!(faithful < pytorch_peak(program));
    }
}
