//! vramtop-telemetry: what the driver says about the machine's GPUs, as owned snapshots.
//! Sources: NVML on machines with an NVIDIA driver, a labelled simulated device elsewhere,
//! other hosts' `vramtop serve`; /proc and cgroups for processes; the `Poller` that both
//! the live view and `serve` read from; per-process growth trends (`trend`).
//! A metric a device cannot report is `None`, never 0, and never aborts a poll.
//!
//! Depends on `vramtop-alloc` (its seeded random generator, its framework names) only: no ratatui, no clap,
//! nothing of the application.

pub mod auth;
pub mod cgroup;
pub mod error;
pub mod nvml;
pub mod open;
pub mod poller;
pub mod procfs;
pub mod remote;
pub mod sim;
pub mod timing;
pub mod trend;

pub use error::{FetchError, TelemetryError};

pub use open::DeviceChoice;
pub use vramtop_alloc::framework::Framework;

use serde::{Deserialize, Serialize};

/// How a process uses the GPU, merged from NVML's compute and graphics lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProcessKind {
    #[serde(rename = "C")]
    Compute,
    #[serde(rename = "G")]
    Graphics,
    #[serde(rename = "C+G")]
    Both,
}

impl ProcessKind {
    pub fn label(self) -> &'static str {
        match self {
            ProcessKind::Compute => "C",
            ProcessKind::Graphics => "G",
            ProcessKind::Both => "C+G",
        }
    }
}

/// What we could learn of a GPU process from the host side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostView {
    /// Found in /proc: user, command, CPU and RSS are filled in where readable.
    Visible,
    /// The driver lists it but /proc has no such pid in our namespace (a container
    /// boundary, or a process of another PID namespace).
    OtherNamespace,
    /// It was seen before and has since exited.
    Exited,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessSnapshot {
    pub pid: u32,
    pub kind: ProcessKind,
    pub used_memory_bytes: Option<u64>,
    /// Streaming-multiprocessor utilisation of this process, percent.
    pub sm_util_pct: Option<u32>,
    pub user: Option<String>,
    pub command: Option<String>,
    /// Host CPU use, percent of one core, over the last poll interval.
    pub cpu_pct: Option<f32>,
    pub rss_bytes: Option<u64>,
    pub host_view: HostView,
    /// Container, pod or systemd unit from /proc/PID/cgroup; None when not visible or in
    /// the root cgroup. Absent in snapshots from older `vramtop serve` hosts.
    #[serde(default)]
    pub cgroup: Option<cgroup::CgroupOrigin>,
    /// Frameworks told from the libraries it has mapped (/proc/PID/maps), by name
    /// ("JAX/XLA", "PyTorch"); empty for none, None when its maps could not be read (another
    /// user's process, another PID namespace). Absent from older `vramtop serve` hosts.
    #[serde(default, with = "framework_names")]
    pub frameworks: Option<Vec<Framework>>,
}

/// Frameworks travel by name (`Framework::name`), so the JSON reads as the table does; a
/// name this build does not know (a newer host's) is left out.
mod framework_names {
    use serde::{Deserialize, Deserializer, Serializer};
    use vramtop_alloc::framework::Framework;

    pub fn serialize<S: Serializer>(
        frameworks: &Option<Vec<Framework>>,
        out: S,
    ) -> Result<S::Ok, S::Error> {
        match frameworks {
            Some(list) => out.serialize_some(&list.iter().map(|f| f.name()).collect::<Vec<_>>()),
            None => out.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        input: D,
    ) -> Result<Option<Vec<Framework>>, D::Error> {
        let names = Option::<Vec<String>>::deserialize(input)?;
        Ok(names.map(|names| {
            names
                .iter()
                .filter_map(|name| Framework::from_name(name))
                .collect()
        }))
    }
}

/// Whether a device's figures are current.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "state", content = "reason")]
pub enum DeviceHealth {
    Ok,
    /// The last poll did not answer in time: figures are from an earlier poll.
    Stale,
    /// The driver says the GPU has fallen off the bus; re-initialisation is retried.
    Lost(String),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceSnapshot {
    pub index: u32,
    pub name: String,
    pub uuid: Option<String>,
    /// True for the simulated device: every screen and output says so.
    pub simulated: bool,
    pub health: DeviceHealth,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    /// Memory the driver keeps for itself (NVML memory_info v2 `reserved`).
    pub memory_reserved_bytes: Option<u64>,
    pub gpu_util_pct: Option<u32>,
    pub memory_util_pct: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    pub power_limit_mw: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub memory_clock_mhz: Option<u32>,
    pub pcie_rx_kib_s: Option<u32>,
    pub pcie_tx_kib_s: Option<u32>,
    pub fan_pct: Option<u32>,
    pub performance_state: Option<u32>,
    pub mig_enabled: Option<bool>,
    pub processes: Vec<ProcessSnapshot>,
}

impl DeviceSnapshot {
    /// A device with a name and nothing known yet.
    pub fn unknown(index: u32, name: impl Into<String>, simulated: bool) -> Self {
        DeviceSnapshot {
            index,
            name: name.into(),
            uuid: None,
            simulated,
            health: DeviceHealth::Ok,
            memory_total_bytes: None,
            memory_used_bytes: None,
            memory_free_bytes: None,
            memory_reserved_bytes: None,
            gpu_util_pct: None,
            memory_util_pct: None,
            temperature_c: None,
            power_mw: None,
            power_limit_mw: None,
            sm_clock_mhz: None,
            memory_clock_mhz: None,
            pcie_rx_kib_s: None,
            pcie_tx_kib_s: None,
            fan_pct: None,
            performance_state: None,
            mig_enabled: None,
            processes: Vec::new(),
        }
    }

    /// Memory used that no listed process accounts for: used - sum(process memory).
    /// NVML's v2 `used` excludes the driver's reservation, so what is left here is held by
    /// processes we cannot see (other containers, no permission) or by none.
    pub fn unattributed_bytes(&self) -> Option<u64> {
        let used = self.memory_used_bytes?;
        let attributed: u64 = self
            .processes
            .iter()
            .filter_map(|p| p.used_memory_bytes)
            .sum();
        Some(used.saturating_sub(attributed))
    }
}

/// The version of a `SystemSnapshot`'s shape as JSON, carried as `schema` by
/// `--once --json` and `/api/snapshot` (docs/json.md): bumped when a field is removed,
/// renamed or changes type or meaning, not when one is added.
pub const SNAPSHOT_SCHEMA: u32 = 1;

/// One poll of the whole machine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SystemSnapshot {
    pub hostname: String,
    /// "NVML" or "simulated (no NVIDIA driver found)": where the figures come from.
    pub source: String,
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
    pub devices: Vec<DeviceSnapshot>,
    /// Milliseconds since the Unix epoch when the poll finished.
    pub taken_at_ms: u64,
    /// Problems met during the poll that did not stop it (no permission, say).
    pub warnings: Vec<String>,
}

/// A source of telemetry. `poll` never fails as a whole: what cannot be read is `None`
/// or a warning, so one broken field never blanks the screen.
pub trait TelemetrySource: Send {
    fn poll(&mut self) -> SystemSnapshot;

    /// Where the time of opening and of the last poll went, when the source was opened
    /// with timing on (`--once --timings`); empty otherwise.
    fn take_spans(&mut self) -> Vec<(String, std::time::Duration)> {
        Vec::new()
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(frameworks: Option<Vec<Framework>>) -> ProcessSnapshot {
        ProcessSnapshot {
            pid: 7,
            kind: ProcessKind::Compute,
            used_memory_bytes: Some(1 << 30),
            sm_util_pct: None,
            user: None,
            command: None,
            cpu_pct: None,
            rss_bytes: None,
            host_view: HostView::Visible,
            cgroup: None,
            frameworks,
        }
    }

    #[test]
    fn frameworks_travel_by_name_and_unknown_stays_null() {
        let both = process(Some(vec![Framework::PyTorch, Framework::CuPy]));
        let json = serde_json::to_value(&both).expect("serialise");
        assert_eq!(json["frameworks"], serde_json::json!(["PyTorch", "CuPy"]));
        let back: ProcessSnapshot = serde_json::from_value(json).expect("read back");
        assert_eq!(back, both);

        let none = serde_json::to_value(process(Some(vec![]))).expect("serialise");
        assert_eq!(none["frameworks"], serde_json::json!([]));
        let unknown = serde_json::to_value(process(None)).expect("serialise");
        assert!(unknown["frameworks"].is_null());
        let back: ProcessSnapshot = serde_json::from_value(unknown).expect("read back");
        assert_eq!(back.frameworks, None);
    }

    #[test]
    fn older_and_newer_hosts_still_read() {
        let mut json = serde_json::to_value(process(None)).expect("serialise");
        let object = json.as_object_mut().expect("an object");
        object.remove("frameworks");
        let older: ProcessSnapshot = serde_json::from_value(json.clone()).expect("older host");
        assert_eq!(older.frameworks, None);
        // A framework this build does not know is left out; the ones it knows stay.
        json["frameworks"] = serde_json::json!(["JAX/XLA", "Mojo"]);
        let newer: ProcessSnapshot = serde_json::from_value(json).expect("newer host");
        assert_eq!(newer.frameworks, Some(vec![Framework::Jax]));
    }
}
