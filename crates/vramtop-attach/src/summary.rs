//! One line per hooked job, for people: who it is, its allocator's figures, its last OOM,
//! whether it ended. `vramtop attach` prints it every interval; `--once` under its table.

use super::job::JobView;
use super::ranks::{is_launcher, ranks_of};
use vramtop_alloc::human_bytes;
use vramtop_alloc::remedy::Missing;

/// One line per job: who (with its rank, or as a launcher), the allocator's figures, its
/// last OOM, whether it ended. `all` is every job shown, to tell launchers. `advise`
/// follows a line lacking something (`Missing`) with how to give it: the application's
/// words, since only it knows its command line.
pub fn job_line(
    job: &JobView,
    all: &[JobView],
    advise: impl Fn(&str, Option<Missing>) -> String,
) -> String {
    let mut parts = vec![format!(
        "pid {} {}",
        job.pid,
        job.command()
            .unwrap_or_else(|| "(no hello yet)".to_string())
    )];
    if let Some(rank) = job.rank() {
        let world = job
            .world_size()
            .map_or_else(String::new, |w| format!("/{w}"));
        let local = job
            .local_rank()
            .map_or_else(String::new, |l| format!(" (local {l})"));
        parts.push(format!("rank {rank}{world}{local}"));
    }
    if let Some(torch) = job.hello.as_ref().and_then(|h| h.torch_version.as_deref()) {
        parts.push(format!("torch {torch}"));
    }
    match (job.map(), job.figures()) {
        // PyTorch tracks no blocks under this backend: its totals, and no map's figures.
        (Some(_), Some(f)) if job.blocks_untracked() => {
            let (allocated, reserved) = job.torch_totals_shown();
            parts.push(format!(
                "gpu {} · backend:{}, no segments or OOM state · reserved {reserved} · \
                 allocated {allocated}",
                f.device,
                job.allocator_backend().unwrap_or("?"),
            ));
        }
        (Some(map), Some(f)) => parts.push(format!(
            "gpu {} · {} segments · reserved {} · allocated {} · largest free {} · frag {:.2}",
            f.device,
            map.layout.segments.len(),
            human_bytes(f.reserved_bytes),
            human_bytes(f.allocated_bytes),
            human_bytes(f.largest_free_bytes),
            f.external_fragmentation
        )),
        _ if is_launcher(all, job.pid) => {
            let ranks: Vec<String> = ranks_of(all, job.pid).iter().map(u32::to_string).collect();
            let ranks = if ranks.is_empty() {
                "hooked children".to_string()
            } else {
                format!("ranks {}", ranks.join(", "))
            };
            parts.push(format!(
                "launcher of {ranks} (no CUDA: the job's parent, on no GPU)"
            ));
        }
        _ => parts.push("no state yet (CUDA not initialised?)".to_string()),
    }
    if let Some(oom) = &job.oom {
        let remedies: Vec<String> = oom
            .remedies
            .iter()
            .map(|r| format!("{} {}", r.remedy, r.verdict))
            .collect();
        // From the job's whole history, the remedies say it all; from one state, the
        // expandable line gives its bounds.
        // The cause first: it says what the remedies then address.
        if let Some(cause) = oom.causes.first() {
            parts.push(format!(
                "OOM cause: {}",
                advise(&cause.line(), cause.missing())
            ));
        }
        parts.push(match oom.history_events {
            Some(events) => format!(
                "OOM: {}; remedies from the job's whole history ({events} events replayed): {}",
                oom.line(),
                remedies.join(", ")
            ),
            None => format!(
                "OOM: {}; {}; remedies: {}",
                oom.line(),
                oom.expandable_line(),
                remedies.join(", ")
            ),
        });
    }
    if let Some(oom) = job.async_oom() {
        let which = match job.untracked_oom_went_on() {
            Some((went_on, true)) => format!(" {}, caught by the job", went_on.number),
            Some((went_on, false)) => format!(" {}", went_on.number),
            None => String::new(),
        };
        parts.push(format!(
            "OOM (cudaMallocAsync{which}): needed {}; cause: {}",
            oom.needed(),
            oom.cause()
        ));
    }
    if let Some(suspect) = job.suspects.first() {
        parts.push(format!("leak suspect {}", suspect.tag));
    }
    if job.ended {
        parts.push(match job.exit_code {
            Some(code) => format!("ended (exit {code})"),
            None => "ended".to_string(),
        });
    } else if let Some(reason) = &job.last_drop {
        parts.push(format!("dropped: {reason}"));
    }
    parts.join(" · ")
}
