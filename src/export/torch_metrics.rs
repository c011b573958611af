//! `/metrics` for hooked PyTorch jobs: each job's caching allocator as the attacher last
//! saw it, one series per process, labelled with its launcher rank so a fleet of ranks
//! reads as one job in Prometheus. Must not depend on ratatui or the app.
//!
//! The figures are `JobView::figures`, the one function behind the ranks' overview and
//! `vramtop attach`'s lines, so a dashboard and the screen never disagree; nothing is
//! recomputed here.

use prometheus::{GaugeVec, IntCounterVec, Opts, Registry};

use super::labels::command_label;
use vramtop_attach::{AttachedJobs, JobFigures, JobView};

/// Labels of every per-job series.
const JOB_LABELS: [&str; 7] = [
    "hostname",
    "pid",
    "device",
    "rank",
    "local_rank",
    "world_size",
    "job",
];

type FiguresField = fn(&JobFigures) -> f64;

/// Per-job gauges: name, help, value.
const TORCH_GAUGES: [(&str, &str, FiguresField); 5] = [
    (
        "vramtop_torch_reserved_bytes",
        "Bytes the job's PyTorch caching allocator holds (torch.cuda.memory_reserved).",
        |f| f.reserved_bytes as f64,
    ),
    (
        "vramtop_torch_allocated_bytes",
        "Bytes in the job's live tensors (torch.cuda.memory_allocated).",
        |f| f.allocated_bytes as f64,
    ),
    (
        "vramtop_torch_largest_free_bytes",
        "Largest free block inside the job's reserved segments, in bytes.",
        |f| f.largest_free_bytes as f64,
    ),
    (
        "vramtop_torch_external_fragmentation_ratio",
        "1 - largest free block / total free bytes of the job's segments; 0 when nothing is free.",
        |f| f.external_fragmentation,
    ),
    (
        "vramtop_torch_leak_suspects",
        "Allocation sites whose live memory keeps growing (needs the hook's --history).",
        |f| f.leak_suspects as f64,
    ),
];

/// Per-job bytes by role (hook 1.4), one series a role.
const ROLE_BYTES: (&str, &str) = (
    "vramtop_torch_role_bytes",
    "Bytes of the job's memory by role: parameters, gradients, optimizer_state, other \
     (allocated bytes no role claims: activations, temporaries), cache (reserved, not allocated).",
);

const OOMS_TOTAL: (&str, &str) = (
    "vramtop_torch_ooms_total",
    "Out-of-memory errors the job's PyTorch allocator counted (memory_stats num_ooms).",
);

/// The jobs whose allocators are exported, with their figures: running, with a CUDA state
/// to read, and not a launcher (torchrun imports torch, so it is hooked, but holds no GPU
/// memory). An ended job is left out, so its series go away with its process; so is one
/// whose connection is down (a silent hook), rather than exporting its last figures as
/// if they were current: it comes back when the attacher reconnects.
pub fn exported(jobs: &AttachedJobs) -> impl Iterator<Item = (&JobView, JobFigures)> {
    jobs.jobs
        .iter()
        .filter(move |j| !j.ended && j.connected && !jobs.is_launcher(j.pid))
        .filter_map(|j| Some((j, j.figures()?)))
}

/// Registers the per-job series in `registry`, one per exported job.
pub fn register(
    registry: &Registry,
    hostname: &str,
    jobs: &AttachedJobs,
) -> Result<(), prometheus::Error> {
    let gauges = TORCH_GAUGES
        .iter()
        .map(|(name, help, field)| {
            let gauge = GaugeVec::new(Opts::new(*name, *help), &JOB_LABELS)?;
            registry.register(Box::new(gauge.clone()))?;
            Ok((gauge, *field))
        })
        .collect::<Result<Vec<_>, prometheus::Error>>()?;
    let ooms = IntCounterVec::new(Opts::new(OOMS_TOTAL.0, OOMS_TOTAL.1), &JOB_LABELS)?;
    registry.register(Box::new(ooms.clone()))?;
    let role_labels: Vec<&str> = JOB_LABELS.iter().copied().chain(["role"]).collect();
    let roles = GaugeVec::new(Opts::new(ROLE_BYTES.0, ROLE_BYTES.1), &role_labels)?;
    registry.register(Box::new(roles.clone()))?;

    for (view, figures) in exported(jobs) {
        let labels = JobLabels::of(view, &figures);
        let values = labels.values(hostname);
        for (gauge, field) in &gauges {
            gauge.with_label_values(&values).set(field(&figures));
        }
        // A fresh registry per scrape: the counter starts at 0 and takes the total, which
        // PyTorch only ever raises for the life of the process.
        ooms.with_label_values(&values).inc_by(figures.ooms);
        if let Some(breakdown) = view.frame.as_deref().and_then(|f| f.roles) {
            for (role, bytes) in breakdown.parts() {
                let mut with_role = values.to_vec();
                // Label values as JSON names the fields, not as the screen words them.
                with_role.push(match role {
                    "optimizer state" => "optimizer_state",
                    "activations and other" => "other",
                    other => other,
                });
                roles.with_label_values(&with_role).set(bytes as f64);
            }
        }
    }
    Ok(())
}

/// A job's label values other than the hostname; empty strings for what is unknown.
struct JobLabels {
    pid: String,
    device: String,
    rank: String,
    local_rank: String,
    world_size: String,
    job: String,
}

impl JobLabels {
    fn of(view: &JobView, figures: &JobFigures) -> Self {
        let text = |v: Option<u32>| v.map(|n| n.to_string()).unwrap_or_default();
        // The script's file name ("train.py"), else the program's. Every distinct value
        // is a new series: keep a pathological argv from bloating them.
        let job = view.script().unwrap_or_default();
        JobLabels {
            pid: view.pid.to_string(),
            device: figures.device.to_string(),
            rank: text(view.rank()),
            local_rank: text(view.local_rank()),
            world_size: text(view.world_size()),
            job: command_label(&job).to_string(),
        }
    }

    /// In `JOB_LABELS` order.
    fn values<'s>(&'s self, hostname: &'s str) -> [&'s str; 7] {
        [
            hostname,
            &self.pid,
            &self.device,
            &self.rank,
            &self.local_rank,
            &self.world_size,
            &self.job,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramtop_attach::job::JobFrame;
    use vramtop_attach::protocol::{Hello, JobState};

    fn job(pid: u32, ppid: u32, rank: Option<u32>, cuda: bool) -> JobView {
        let state = JobState {
            seq: 1,
            device_uuid: None,
            time_s: 1.0,
            device: 3,
            stats: None,
            settings: Default::default(),
            segments: Vec::new(),
            segments_omitted: false,
            truncated: false,
            collect_ms: None,
            history_share: None,
            roles: None,
        };
        JobView {
            pid,
            hello: Some(Hello {
                protocol: 1,
                pid,
                ppid: Some(ppid),
                argv: vec!["python".into(), "/home/u/tr\"ain.py".into()],
                cuda_ready: cuda,
                rank,
                world_size: rank.map(|_| 2),
                ..Hello::default()
            }),
            frame: cuda.then(|| std::sync::Arc::new(JobFrame::from_state(&state))),
            connected: true,
            ..JobView::default()
        }
    }

    /// The jobs' series as a scrape of host "h" reads them.
    fn exposition(jobs: &AttachedJobs) -> String {
        let registry = Registry::new();
        register(&registry, "h", jobs).unwrap();
        let mut out = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut out,
        )
        .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn ranks_are_exported_and_launchers_and_ended_jobs_are_not() {
        let mut ended = job(103, 100, Some(1), true);
        ended.ended = true;
        let jobs = AttachedJobs {
            jobs: vec![
                job(100, 1, None, false),
                job(101, 100, Some(0), true),
                ended,
                // A silent hook (connection down, process alive): its last figures are
                // not current.
                JobView {
                    connected: false,
                    ..job(104, 100, Some(2), true)
                },
            ],
            ..AttachedJobs::default()
        };
        let pids: Vec<u32> = exported(&jobs).map(|(j, _)| j.pid).collect();
        assert_eq!(pids, [101]);

        let text = exposition(&jobs);
        assert!(
            text.contains(
                r#"vramtop_torch_reserved_bytes{device="3",hostname="h",job="tr\"ain.py",local_rank="",pid="101",rank="0",world_size="2"} 0"#
            ),
            "{text}"
        );
        assert!(text.contains("# TYPE vramtop_torch_ooms_total counter"));
        assert_eq!(text.matches("# HELP ").count(), 6, "{text}");
    }

    #[test]
    fn a_jobs_roles_are_one_series_a_role() {
        let mut view = job(101, 1, None, true);
        let state = JobState {
            stats: Some(vramtop_attach::protocol::TorchStats {
                allocated_bytes: Some(1000),
                reserved_bytes: Some(1500),
                ..Default::default()
            }),
            roles: Some(vramtop_trace::roles::Roles {
                parameters: 100,
                gradients: 100,
                optimizer_state: 200,
                ..Default::default()
            }),
            ..JobState::default()
        };
        view.frame = Some(std::sync::Arc::new(JobFrame::from_state(&state)));
        let jobs = AttachedJobs {
            jobs: vec![view],
            ..AttachedJobs::default()
        };
        let text = exposition(&jobs);
        for (role, bytes) in [
            ("parameters", 100),
            ("gradients", 100),
            ("optimizer_state", 200),
            ("other", 600),
            ("cache", 500),
        ] {
            assert!(
                text.contains(&format!(
                    r#"pid="101",rank="",role="{role}",world_size=""}} {bytes}"#
                )),
                "{role}: {text}"
            );
        }
    }
}
