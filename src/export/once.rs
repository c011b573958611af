//! `vramtop --once [--json]`: one snapshot, printed as a table or as JSON.

use std::fmt::Write as _;

use crate::units::{bytes, celsius, device_title, pct, power, NA};
use vramtop_attach::{JobReport, JobView};
use vramtop_telemetry::{HostView, SystemSnapshot, SNAPSHOT_SCHEMA};

/// The snapshot as `--once --json` prints it, with its `schema` and an `attached` list:
/// the hooked PyTorch jobs and their allocators.
pub fn json_with_attached(snapshot: &SystemSnapshot, attached: &[JobView]) -> String {
    let reports = JobReport::of_all(attached);
    // Serialising plain data with string keys cannot fail; fall back to an error object
    // rather than a panic all the same.
    let value = serde_json::to_value(snapshot).map(|mut v| {
        if let Some(object) = v.as_object_mut() {
            object.insert("schema".to_string(), SNAPSHOT_SCHEMA.into());
            object.insert(
                "attached".to_string(),
                serde_json::to_value(&reports).unwrap_or_default(),
            );
        }
        v
    });
    value
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|e| format!("{{\"error\": \"could not serialise snapshot: {e}\"}}"))
}

/// Hooked jobs under the table, one line each; empty when there are none.
pub fn attached_table(attached: &[JobView]) -> String {
    if attached.is_empty() {
        return String::new();
    }
    let mut out = String::from("\nHOOKED JOBS\n");
    for job in attached {
        let _ = writeln!(
            out,
            "{}",
            vramtop_attach::summary::job_line(job, attached, crate::advice::line_with)
        );
    }
    out
}

pub fn table(snapshot: &SystemSnapshot) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "vramtop {}  host {}  driver {}  CUDA {}  source: {}",
        env!("CARGO_PKG_VERSION"),
        snapshot.hostname,
        snapshot.driver_version.as_deref().unwrap_or(NA),
        snapshot.cuda_version.as_deref().unwrap_or(NA),
        snapshot.source
    );
    for w in &snapshot.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    let _ = writeln!(
        out,
        "\n{:<52} {:>10} {:>10} {:>10} {:>10} {:>5} {:>5} {:>11}",
        "DEVICE", "USED", "DRIVER", "FREE", "TOTAL", "UTIL", "TEMP", "POWER"
    );
    for d in &snapshot.devices {
        let _ = writeln!(
            out,
            "{:<52} {:>10} {:>10} {:>10} {:>10} {:>5} {:>5} {:>11}",
            device_title(d),
            bytes(d.memory_used_bytes),
            bytes(d.memory_reserved_bytes),
            bytes(d.memory_free_bytes),
            bytes(d.memory_total_bytes),
            pct(d.gpu_util_pct),
            celsius(d.temperature_c),
            power(d.power_mw, d.power_limit_mw),
        );
    }
    let _ = writeln!(
        out,
        "\n{:<4} {:>8} {:<10} {:<4} {:>10} {:>10}  COMMAND",
        "GPU", "PID", "USER", "TYPE", "GPU MEM", "RSS"
    );
    let mut any = false;
    for d in &snapshot.devices {
        for p in &d.processes {
            any = true;
            let command = match p.host_view {
                HostView::Visible => p.command.clone().unwrap_or_else(|| NA.to_string()),
                HostView::OtherNamespace => "(not in our PID namespace)".to_string(),
                HostView::Exited => "(exited)".to_string(),
            };
            let _ = writeln!(
                out,
                "{:<4} {:>8} {:<10} {:<4} {:>10} {:>10}  {}",
                d.index,
                p.pid,
                p.user.as_deref().unwrap_or(NA),
                p.kind.label(),
                bytes(p.used_memory_bytes),
                bytes(p.rss_bytes),
                command
            );
        }
    }
    if !any {
        let _ = writeln!(out, "(no GPU processes)");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramtop_alloc::framework::Framework;
    use vramtop_telemetry::{DeviceSnapshot, ProcessKind, ProcessSnapshot};

    fn process(pid: u32, frameworks: Option<Vec<Framework>>) -> ProcessSnapshot {
        ProcessSnapshot {
            pid,
            kind: ProcessKind::Compute,
            used_memory_bytes: Some(1 << 30),
            sm_util_pct: None,
            user: None,
            command: Some("python train.py".into()),
            cpu_pct: None,
            rss_bytes: None,
            host_view: HostView::Visible,
            cgroup: None,
            frameworks,
        }
    }

    #[test]
    fn each_process_entry_names_its_frameworks_or_null() {
        let mut d = DeviceSnapshot::unknown(0, "Test GPU", false);
        d.processes = vec![
            process(1, Some(vec![Framework::Jax])),
            process(2, Some(vec![Framework::PyTorch, Framework::CuPy])),
            process(3, Some(vec![])),
            process(4, None),
        ];
        let snapshot = SystemSnapshot {
            hostname: "box".into(),
            source: "test".into(),
            driver_version: None,
            cuda_version: None,
            devices: vec![d],
            taken_at_ms: 0,
            warnings: Vec::new(),
        };
        let text = json_with_attached(&snapshot, &[]);
        {
            let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
            assert_eq!(v["schema"], SNAPSHOT_SCHEMA);
            let entries = v["devices"][0]["processes"].as_array().expect("processes");
            let frameworks: Vec<_> = entries.iter().map(|p| &p["frameworks"]).collect();
            assert_eq!(frameworks[0], &serde_json::json!(["JAX/XLA"]));
            assert_eq!(frameworks[1], &serde_json::json!(["PyTorch", "CuPy"]));
            assert_eq!(frameworks[2], &serde_json::json!([]), "none: an empty list");
            assert!(frameworks[3].is_null(), "not known: null");
        }
    }
}
