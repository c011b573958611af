//! The process table's rows: every GPU process of a snapshot with its memory trend, kept
//! to those matching the filter text, sorted by any column either way. No drawing here.

use std::cmp::Ordering;

use vramtop_alloc::framework::{label, Framework};
use vramtop_telemetry::trend::ProcessTrend;
use vramtop_telemetry::{HostView, ProcessSnapshot, SystemSnapshot};

/// A column the table can be sorted by, in the order the table shows them (the sort key
/// cycles through them in this order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    Gpu,
    Pid,
    User,
    /// Most GPU memory first.
    Memory,
    /// Fastest-growing first.
    Trend,
    SmUtil,
    Cpu,
    Rss,
    /// Container, pod or systemd unit.
    Group,
    /// JAX/XLA, PyTorch, ...: named first, then none, then not known.
    Framework,
    Command,
}

impl SortKey {
    pub const ALL: [SortKey; 11] = [
        SortKey::Gpu,
        SortKey::Pid,
        SortKey::User,
        SortKey::Memory,
        SortKey::Trend,
        SortKey::SmUtil,
        SortKey::Cpu,
        SortKey::Rss,
        SortKey::Group,
        SortKey::Framework,
        SortKey::Command,
    ];

    /// The column's name in the settings file (`sort = "memory"`).
    pub fn name(self) -> &'static str {
        self.label().trim_start_matches("by ").trim_end_matches('%')
    }

    /// The column named `name` in the settings file.
    pub fn from_name(name: &str) -> Option<SortKey> {
        SortKey::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn label(self) -> &'static str {
        match self {
            SortKey::Gpu => "by gpu",
            SortKey::Pid => "by pid",
            SortKey::User => "by user",
            SortKey::Memory => "by memory",
            SortKey::Trend => "by trend",
            SortKey::SmUtil => "by sm%",
            SortKey::Cpu => "by cpu%",
            SortKey::Rss => "by rss",
            SortKey::Group => "by group",
            SortKey::Framework => "by framework",
            SortKey::Command => "by command",
        }
    }

    /// The next column to sort by.
    pub fn next(self) -> SortKey {
        let i = SortKey::ALL.iter().position(|&k| k == self).unwrap_or(0);
        SortKey::ALL[(i + 1) % SortKey::ALL.len()]
    }

    /// Figures sort largest first, names and ids smallest first, as nvtop and top do.
    fn descending_by_default(self) -> bool {
        matches!(
            self,
            SortKey::Memory | SortKey::Trend | SortKey::SmUtil | SortKey::Cpu | SortKey::Rss
        )
    }
}

/// One row of the process table: a process, the device it runs on, and its memory trend.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessRow {
    pub device: u32,
    pub process: ProcessSnapshot,
    /// Least-squares slope of its GPU memory over the trend window; None until two samples.
    pub trend_bytes_per_s: Option<f64>,
    /// Its memory looks like a leak: a floor still rising (see `vramtop_telemetry::trend`).
    pub growing: bool,
    /// A job vramtop is attached to through its hook.
    pub hooked: bool,
    /// Its launcher's `RANK` (torchrun), when hooked and started as a rank.
    pub rank: Option<u32>,
}

impl ProcessRow {
    /// The container, pod or unit cell, when /proc says.
    pub fn group(&self) -> Option<String> {
        self.process.cgroup.as_ref().and_then(|c| c.label())
    }

    /// The frameworks its mapped libraries name; empty for none, None when not known.
    pub fn frameworks(&self) -> Option<&[Framework]> {
        self.process.frameworks.as_deref()
    }

    /// "JAX/XLA", "PyTorch + CuPy": None when it has none or they are not known.
    pub fn framework_label(&self) -> Option<String> {
        self.frameworks().filter(|f| !f.is_empty()).map(label)
    }

    /// The command as the table shows it (processes we cannot see say why).
    pub fn command_text(&self) -> String {
        match self.process.host_view {
            HostView::Visible => self.process.command.clone().unwrap_or_default(),
            HostView::OtherNamespace => "(not in our PID namespace)".to_string(),
            HostView::Exited => "(exited)".to_string(),
        }
    }

    /// Whether the row holds `needle` (already lower-case) in its pid, user, command,
    /// group or frameworks; an empty needle matches everything.
    pub fn matches(&self, needle: &str) -> bool {
        if needle.is_empty() {
            return true;
        }
        let p = &self.process;
        let hay = [
            Some(p.pid.to_string()),
            p.user.clone(),
            Some(self.command_text()),
            self.group(),
            self.framework_label(),
        ];
        hay.iter()
            .flatten()
            .any(|text| text.to_lowercase().contains(needle))
    }
}

/// Every process of the snapshot, with its trend from `trends` (one list per device, in
/// the snapshot's device order), kept when it matches `filter` (any case).
pub fn gather(
    snapshot: Option<&SystemSnapshot>,
    trends: &[Vec<ProcessTrend>],
    filter: &str,
) -> Vec<ProcessRow> {
    let needle = filter.to_lowercase();
    let Some(snapshot) = snapshot else {
        return Vec::new();
    };
    let mut rows = Vec::new();
    for (i, device) in snapshot.devices.iter().enumerate() {
        let device_trends = trends.get(i).map(Vec::as_slice).unwrap_or(&[]);
        for process in &device.processes {
            let trend = device_trends.iter().find(|t| t.pid == process.pid);
            let row = ProcessRow {
                device: device.index,
                process: process.clone(),
                trend_bytes_per_s: trend.and_then(|t| t.slope_bytes_per_s),
                growing: trend.is_some_and(|t| t.growing),
                hooked: false,
                rank: None,
            };
            if row.matches(&needle) {
                rows.push(row);
            }
        }
    }
    rows
}

/// Sort by `key`, in its natural direction unless `reversed`. Unknown figures go last
/// either way; ties fall back to pid, then device, so the order is stable between polls.
pub fn sort(rows: &mut [ProcessRow], key: SortKey, reversed: bool) {
    let descending = key.descending_by_default() != reversed;
    rows.sort_by(|a, b| {
        compare(a, b, key, descending)
            .then(a.process.pid.cmp(&b.process.pid))
            .then(a.device.cmp(&b.device))
    });
}

fn compare(a: &ProcessRow, b: &ProcessRow, key: SortKey, descending: bool) -> Ordering {
    let (p, q) = (&a.process, &b.process);
    match key {
        SortKey::Gpu => known(Some(a.device), Some(b.device), descending),
        SortKey::Pid => known(Some(p.pid), Some(q.pid), descending),
        SortKey::User => known(p.user.as_ref(), q.user.as_ref(), descending),
        SortKey::Memory => known(p.used_memory_bytes, q.used_memory_bytes, descending),
        SortKey::Trend => known(a.trend_bytes_per_s, b.trend_bytes_per_s, descending),
        SortKey::SmUtil => known(p.sm_util_pct, q.sm_util_pct, descending),
        SortKey::Cpu => known(p.cpu_pct, q.cpu_pct, descending),
        SortKey::Rss => known(p.rss_bytes, q.rss_bytes, descending),
        SortKey::Group => known(a.group(), b.group(), descending),
        // Named before none: (false, name) sorts ahead of (true, "").
        SortKey::Framework => known(
            a.frameworks().map(|f| (f.is_empty(), label(f))),
            b.frameworks().map(|f| (f.is_empty(), label(f))),
            descending,
        ),
        SortKey::Command => known(
            Some(a.command_text()).filter(|c| !c.is_empty()),
            Some(b.command_text()).filter(|c| !c.is_empty()),
            descending,
        ),
    }
}

/// Order two optional values; `None` (not known) always after any known value.
fn known<T: PartialOrd>(a: Option<T>, b: Option<T>, descending: bool) -> Ordering {
    match (a, b) {
        (Some(x), Some(y)) => {
            let order = x.partial_cmp(&y).unwrap_or(Ordering::Equal);
            if descending {
                order.reverse()
            } else {
                order
            }
        }
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramtop_telemetry::cgroup::CgroupOrigin;
    use vramtop_telemetry::ProcessKind;

    fn row(pid: u32, mem: Option<u64>, command: &str, trend: Option<f64>) -> ProcessRow {
        ProcessRow {
            device: 0,
            process: ProcessSnapshot {
                pid,
                kind: ProcessKind::Compute,
                used_memory_bytes: mem,
                sm_util_pct: None,
                user: Some("alice".into()),
                command: Some(command.into()),
                cpu_pct: None,
                rss_bytes: None,
                host_view: HostView::Visible,
                cgroup: None,
                frameworks: None,
            },
            trend_bytes_per_s: trend,
            growing: false,
            hooked: false,
            rank: None,
        }
    }

    fn pids(rows: &[ProcessRow]) -> Vec<u32> {
        rows.iter().map(|r| r.process.pid).collect()
    }

    #[test]
    fn every_key_is_reached_by_cycling() {
        let mut key = SortKey::Memory;
        let mut seen = vec![key];
        for _ in 0..SortKey::ALL.len() - 1 {
            key = key.next();
            seen.push(key);
        }
        assert_eq!(key.next(), SortKey::Memory);
        for k in SortKey::ALL {
            assert!(seen.contains(&k), "{k:?} never reached");
        }
    }

    #[test]
    fn figures_sort_largest_first_and_unknowns_last_either_way() {
        let mut rows = vec![
            row(1, Some(10), "a", None),
            row(2, None, "b", None),
            row(3, Some(30), "c", None),
        ];
        sort(&mut rows, SortKey::Memory, false);
        assert_eq!(pids(&rows), [3, 1, 2]);
        sort(&mut rows, SortKey::Memory, true);
        assert_eq!(pids(&rows), [1, 3, 2]);
    }

    #[test]
    fn names_sort_smallest_first_and_reverse() {
        let mut rows = vec![
            row(1, Some(1), "python train.py", Some(5.0)),
            row(2, Some(1), "jupyter", Some(-3.0)),
            row(3, Some(1), "vllm serve", None),
        ];
        sort(&mut rows, SortKey::Command, false);
        assert_eq!(pids(&rows), [2, 1, 3]);
        sort(&mut rows, SortKey::Command, true);
        assert_eq!(pids(&rows), [3, 1, 2]);
        sort(&mut rows, SortKey::Trend, false);
        assert_eq!(pids(&rows), [1, 2, 3], "growing first, no trend last");
    }

    #[test]
    fn frameworks_sort_by_name_then_none_then_unknown() {
        let with = |pid, frameworks: Option<Vec<Framework>>| {
            let mut r = row(pid, Some(1), "python", None);
            r.process.frameworks = frameworks;
            r
        };
        let mut rows = vec![
            with(1, None),
            with(2, Some(vec![])),
            with(3, Some(vec![Framework::PyTorch])),
            with(4, Some(vec![Framework::Jax])),
        ];
        sort(&mut rows, SortKey::Framework, false);
        assert_eq!(pids(&rows), [4, 3, 2, 1]);
        sort(&mut rows, SortKey::Framework, true);
        assert_eq!(pids(&rows), [2, 3, 4, 1], "reversed: unknown still last");
        assert_eq!(rows[1].framework_label().as_deref(), Some("PyTorch"));
        assert_eq!(rows[0].framework_label(), None, "none has no label");
        assert_eq!(SortKey::from_name("framework"), Some(SortKey::Framework));
    }

    #[test]
    fn filter_matches_frameworks() {
        let mut r = row(9, Some(1), "python serve.py", None);
        r.process.frameworks = Some(vec![Framework::PyTorch, Framework::CuPy]);
        assert!(r.matches("cupy"));
        assert!(r.matches("pytorch"));
        assert!(!r.matches("jax"));
    }

    #[test]
    fn filter_matches_pid_user_command_and_group_in_any_case() {
        let mut r = row(4242, Some(1), "Python train.py", None);
        r.process.cgroup = Some(CgroupOrigin {
            unit: Some("trainer.service".into()),
            ..CgroupOrigin::default()
        });
        assert!(r.matches(""));
        assert!(r.matches("python"));
        assert!(r.matches("424"));
        assert!(r.matches("alice"));
        assert!(r.matches("trainer"));
        assert!(!r.matches("vllm"));
        let mut hidden = row(7, Some(1), "secret", None);
        hidden.process.host_view = HostView::OtherNamespace;
        assert!(hidden.matches("namespace"));
        assert!(!hidden.matches("secret"));
    }
}
