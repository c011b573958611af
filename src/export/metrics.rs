//! `/metrics`: a telemetry snapshot, the probes' allocator stats and hooked PyTorch jobs'
//! allocators (`torch_metrics`) in the Prometheus text exposition format 0.0.4. A figure
//! a device cannot report (`None`) is left out of the output, never written as 0. Must
//! not depend on ratatui or the app.
//!
//! Series are named `vramtop_*` in base units (bytes, watts, ratios); the README maps
//! each to its dcgm-exporter field. With `dcgm_names`, the DCGM_FI_DEV_* series are
//! written too, in dcgm-exporter's own units (MiB, %, W, MHz) and label names.

use prometheus::{Encoder, GaugeVec, IntCounterVec, Opts, Registry, TextEncoder};

use super::labels::command_label;
use super::torch_metrics;
use vramtop_alloc::Stats;
use vramtop_attach::AttachedJobs;
use vramtop_telemetry::{DeviceHealth, DeviceSnapshot, SystemSnapshot};

/// The Content-Type of the text format this module writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Labels of every per-device series.
const DEVICE_LABELS: [&str; 3] = ["gpu", "uuid", "hostname"];
/// dcgm-exporter's label names, for the compatible series.
const DCGM_LABELS: [&str; 5] = ["gpu", "UUID", "device", "modelName", "Hostname"];

type DeviceField = fn(&DeviceSnapshot) -> Option<f64>;

fn num(v: Option<impl Into<f64>>) -> Option<f64> {
    v.map(Into::into)
}

fn bytes(v: Option<u64>) -> Option<f64> {
    v.map(|b| b as f64)
}

fn mib(v: Option<u64>) -> Option<f64> {
    // dcgm-exporter reports whole MiB.
    v.map(|b| (b >> 20) as f64)
}

/// Per-device gauges: name, help, value.
const DEVICE_GAUGES: [(&str, &str, DeviceField); 11] = [
    (
        "vramtop_memory_total_bytes",
        "Total device memory in bytes (DCGM_FI_DEV_FB_TOTAL x 2^20).",
        |d| bytes(d.memory_total_bytes),
    ),
    (
        "vramtop_memory_used_bytes",
        "Device memory used in bytes (DCGM_FI_DEV_FB_USED x 2^20).",
        |d| bytes(d.memory_used_bytes),
    ),
    (
        "vramtop_memory_free_bytes",
        "Device memory free in bytes (DCGM_FI_DEV_FB_FREE x 2^20).",
        |d| bytes(d.memory_free_bytes),
    ),
    (
        "vramtop_memory_reserved_bytes",
        "Device memory the driver keeps for itself, in bytes (DCGM_FI_DEV_FB_RESERVED x 2^20).",
        |d| bytes(d.memory_reserved_bytes),
    ),
    (
        "vramtop_gpu_utilization_ratio",
        "GPU utilisation, 0 to 1 (DCGM_FI_DEV_GPU_UTIL / 100).",
        |d| d.gpu_util_pct.map(|p| f64::from(p) / 100.0),
    ),
    (
        "vramtop_memory_utilization_ratio",
        "Memory bandwidth utilisation, 0 to 1 (DCGM_FI_DEV_MEM_COPY_UTIL / 100).",
        |d| d.memory_util_pct.map(|p| f64::from(p) / 100.0),
    ),
    (
        "vramtop_temperature_celsius",
        "GPU temperature in degrees Celsius (DCGM_FI_DEV_GPU_TEMP).",
        |d| num(d.temperature_c),
    ),
    (
        "vramtop_power_watts",
        "Power draw in watts (DCGM_FI_DEV_POWER_USAGE).",
        |d| d.power_mw.map(|mw| f64::from(mw) / 1000.0),
    ),
    (
        "vramtop_power_limit_watts",
        "Power management limit in watts (DCGM_FI_DEV_POWER_MGMT_LIMIT).",
        |d| d.power_limit_mw.map(|mw| f64::from(mw) / 1000.0),
    ),
    (
        "vramtop_sm_clock_hertz",
        "SM clock in hertz (DCGM_FI_DEV_SM_CLOCK x 10^6).",
        |d| d.sm_clock_mhz.map(|m| f64::from(m) * 1e6),
    ),
    (
        "vramtop_memory_clock_hertz",
        "Memory clock in hertz (DCGM_FI_DEV_MEM_CLOCK x 10^6).",
        |d| d.memory_clock_mhz.map(|m| f64::from(m) * 1e6),
    ),
];

/// dcgm-exporter's series, with its help texts and units.
const DCGM_GAUGES: [(&str, &str, DeviceField); 10] = [
    (
        "DCGM_FI_DEV_FB_TOTAL",
        "Total framebuffer memory (in MiB).",
        |d| mib(d.memory_total_bytes),
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB).",
        |d| mib(d.memory_used_bytes),
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        |d| mib(d.memory_free_bytes),
    ),
    (
        "DCGM_FI_DEV_FB_RESERVED",
        "Framebuffer memory reserved (in MiB).",
        |d| mib(d.memory_reserved_bytes),
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", |d| {
        num(d.gpu_util_pct)
    }),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "Memory utilization (in %).",
        |d| num(d.memory_util_pct),
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", |d| {
        num(d.temperature_c)
    }),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", |d| {
        d.power_mw.map(|mw| f64::from(mw) / 1000.0)
    }),
    (
        "DCGM_FI_DEV_SM_CLOCK",
        "SM clock frequency (in MHz).",
        |d| num(d.sm_clock_mhz),
    ),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        "Memory clock frequency (in MHz).",
        |d| num(d.memory_clock_mhz),
    ),
];

type AllocatorField = fn(&Stats) -> f64;

const ALLOCATOR_GAUGES: [(&str, &str, AllocatorField); 5] = [
    (
        "vramtop_allocator_capacity_bytes",
        "Most memory the probe's allocator may reserve, in bytes.",
        |s| s.capacity_bytes as f64,
    ),
    (
        "vramtop_allocator_reserved_bytes",
        "Bytes the probe's allocator holds from its backing (segments or mapped pages).",
        |s| s.reserved_bytes as f64,
    ),
    (
        "vramtop_allocator_allocated_bytes",
        "Bytes in live blocks of the probe's allocator, after rounding.",
        |s| s.allocated_bytes as f64,
    ),
    (
        "vramtop_allocator_largest_free_bytes",
        "Largest free run inside reserved memory, in bytes.",
        |s| s.largest_free_bytes as f64,
    ),
    (
        "vramtop_allocator_external_fragmentation_ratio",
        "1 - largest free run / total free bytes; 0 when nothing is free.",
        |s| s.external_fragmentation,
    ),
];

type AllocatorCounter = fn(&Stats) -> u64;

const ALLOCATOR_COUNTERS: [(&str, &str, AllocatorCounter); 2] = [
    (
        "vramtop_allocator_ooms_total",
        "Allocations the probe's allocator refused for want of memory.",
        |s| s.ooms,
    ),
    (
        "vramtop_allocator_backing_calls_total",
        "Calls to the backing: segment allocs and frees, page maps and unmaps.",
        Stats::backing_calls,
    ),
];

/// Everything `/metrics` shows, in the text format. Fails only on a bug (a bad metric
/// name or a label count mismatch), never on the figures themselves.
pub fn encode(
    snapshot: &SystemSnapshot,
    allocator: &[Stats],
    torch: &AttachedJobs,
    dcgm_names: bool,
) -> Result<String, prometheus::Error> {
    let registry = Registry::new();
    let host = snapshot.hostname.as_str();

    devices(&registry, snapshot)?;
    if dcgm_names {
        dcgm(&registry, snapshot)?;
    }
    processes(&registry, snapshot)?;

    let labels = ["policy", "hostname"];
    for (name, help, field) in ALLOCATOR_GAUGES {
        let gauge = register(&registry, GaugeVec::new(Opts::new(name, help), &labels)?)?;
        for s in allocator {
            gauge.with_label_values(&[policy(s), host]).set(field(s));
        }
    }
    for (name, help, field) in ALLOCATOR_COUNTERS {
        let counter = register(
            &registry,
            IntCounterVec::new(Opts::new(name, help), &labels)?,
        )?;
        for s in allocator {
            // A fresh registry per scrape: the counter starts at 0 and takes the total.
            counter
                .with_label_values(&[policy(s), host])
                .inc_by(field(s));
        }
    }

    torch_metrics::register(&registry, host, torch)?;

    let mut out = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut out)?;
    String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
}

fn register<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    collector: C,
) -> Result<C, prometheus::Error> {
    registry.register(Box::new(collector.clone()))?;
    Ok(collector)
}

fn policy(s: &Stats) -> &'static str {
    s.policy.map_or("unknown", |p| p.name())
}

fn devices(registry: &Registry, snapshot: &SystemSnapshot) -> Result<(), prometheus::Error> {
    let host = snapshot.hostname.as_str();
    let info = register(
        registry,
        GaugeVec::new(
            Opts::new(
                "vramtop_device_info",
                "Always 1: the device's name, and whether it is vramtop's simulated device.",
            ),
            &["gpu", "uuid", "hostname", "name", "simulated"],
        )?,
    )?;
    let up = register(
        registry,
        GaugeVec::new(
            Opts::new(
                "vramtop_device_up",
                "1 when the device's figures are current, 0 when stale or lost.",
            ),
            &DEVICE_LABELS,
        )?,
    )?;
    for d in &snapshot.devices {
        let gpu = d.index.to_string();
        let uuid = d.uuid.as_deref().unwrap_or("");
        let simulated = if d.simulated { "true" } else { "false" };
        info.with_label_values(&[gpu.as_str(), uuid, host, d.name.as_str(), simulated])
            .set(1.0);
        let healthy = matches!(d.health, DeviceHealth::Ok);
        up.with_label_values(&[gpu.as_str(), uuid, host])
            .set(if healthy { 1.0 } else { 0.0 });
    }
    for (name, help, field) in DEVICE_GAUGES {
        let gauge = register(
            registry,
            GaugeVec::new(Opts::new(name, help), &DEVICE_LABELS)?,
        )?;
        for d in &snapshot.devices {
            if let Some(v) = field(d) {
                let gpu = d.index.to_string();
                let uuid = d.uuid.as_deref().unwrap_or("");
                gauge.with_label_values(&[gpu.as_str(), uuid, host]).set(v);
            }
        }
    }
    Ok(())
}

fn dcgm(registry: &Registry, snapshot: &SystemSnapshot) -> Result<(), prometheus::Error> {
    for (name, help, field) in DCGM_GAUGES {
        let gauge = register(
            registry,
            GaugeVec::new(Opts::new(name, help), &DCGM_LABELS)?,
        )?;
        for d in &snapshot.devices {
            if let Some(v) = field(d) {
                let gpu = d.index.to_string();
                let device = format!("nvidia{}", d.index);
                let uuid = d.uuid.as_deref().unwrap_or("");
                gauge
                    .with_label_values(&[
                        gpu.as_str(),
                        uuid,
                        device.as_str(),
                        d.name.as_str(),
                        snapshot.hostname.as_str(),
                    ])
                    .set(v);
            }
        }
    }
    Ok(())
}

fn processes(registry: &Registry, snapshot: &SystemSnapshot) -> Result<(), prometheus::Error> {
    let host = snapshot.hostname.as_str();
    let gauge = register(
        registry,
        GaugeVec::new(
            Opts::new(
                "vramtop_process_memory_used_bytes",
                "Device memory a process uses, in bytes, as the driver accounts it.",
            ),
            &["gpu", "uuid", "hostname", "pid", "command"],
        )?,
    )?;
    for d in &snapshot.devices {
        let gpu = d.index.to_string();
        let uuid = d.uuid.as_deref().unwrap_or("");
        for p in &d.processes {
            let Some(used) = p.used_memory_bytes else {
                continue;
            };
            let pid = p.pid.to_string();
            let command = command_label(p.command.as_deref().unwrap_or(""));
            gauge
                .with_label_values(&[gpu.as_str(), uuid, host, pid.as_str(), command])
                .set(used as f64);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramtop_alloc::PolicyKind;
    use vramtop_telemetry::{HostView, ProcessKind, ProcessSnapshot};

    fn snapshot() -> SystemSnapshot {
        let mut d = DeviceSnapshot::unknown(0, "Test GPU", false);
        d.uuid = Some("GPU-1".into());
        d.memory_total_bytes = Some(80 << 30);
        d.memory_used_bytes = Some(1 << 30);
        d.temperature_c = Some(40);
        d.processes.push(ProcessSnapshot {
            pid: 42,
            kind: ProcessKind::Compute,
            used_memory_bytes: Some(512 << 20),
            sm_util_pct: None,
            user: None,
            command: Some("python \"train.py\" C:\\data\nnext".into()),
            cpu_pct: None,
            rss_bytes: None,
            host_view: HostView::Visible,
            cgroup: None,
            frameworks: None,
        });
        SystemSnapshot {
            hostname: "box\"1".into(),
            source: "test".into(),
            driver_version: None,
            cuda_version: None,
            devices: vec![d],
            taken_at_ms: 0,
            warnings: Vec::new(),
        }
    }

    #[test]
    fn label_values_are_escaped() {
        let text = encode(&snapshot(), &[], &AttachedJobs::default(), false).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("vramtop_process_memory_used_bytes{"))
            .unwrap();
        assert!(
            line.contains(r#"command="python \"train.py\" C:\\data\nnext""#),
            "{line}"
        );
        assert!(line.contains(r#"hostname="box\"1""#), "{line}");
        assert!(line.ends_with(" 536870912"), "{line}");
    }

    #[test]
    fn unsupported_figures_are_left_out_not_zero() {
        let text = encode(&snapshot(), &[], &AttachedJobs::default(), false).unwrap();
        assert!(text.contains("vramtop_temperature_celsius{"));
        for absent in [
            "vramtop_power_watts",
            "vramtop_memory_free_bytes",
            "vramtop_gpu_utilization_ratio",
            "vramtop_allocator_",
            "vramtop_torch_",
            "DCGM_FI_DEV_",
        ] {
            let present = text
                .lines()
                .any(|l| !l.starts_with('#') && l.starts_with(absent));
            assert!(!present, "{absent} should be absent:\n{text}");
        }
    }

    #[test]
    fn dcgm_series_use_dcgm_units_and_labels() {
        let text = encode(&snapshot(), &[], &AttachedJobs::default(), true).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("DCGM_FI_DEV_FB_USED{"))
            .unwrap();
        assert!(line.contains(r#"UUID="GPU-1""#), "{line}");
        assert!(line.contains(r#"modelName="Test GPU""#), "{line}");
        assert!(line.ends_with(" 1024"), "{line}");
    }

    #[test]
    fn allocator_counters_carry_the_policy() {
        let stats = Stats {
            policy: Some(PolicyKind::BestFit),
            reserved_bytes: 4096,
            ooms: 3,
            segment_allocs: 5,
            page_maps: 2,
            ..Stats::default()
        };
        let text = encode(&snapshot(), &[stats], &AttachedJobs::default(), false).unwrap();
        assert!(text.contains("# TYPE vramtop_allocator_ooms_total counter"));
        assert!(
            text.contains(r#"vramtop_allocator_ooms_total{hostname="box\"1",policy="best-fit"} 3"#)
        );
        assert!(text.contains(
            r#"vramtop_allocator_backing_calls_total{hostname="box\"1",policy="best-fit"} 7"#
        ));
        assert!(text.contains(
            r#"vramtop_allocator_reserved_bytes{hostname="box\"1",policy="best-fit"} 4096"#
        ));
    }
}
