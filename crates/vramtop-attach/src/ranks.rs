//! One launched job, all its ranks: the hooked processes a launcher (torchrun, accelerate,
//! deepspeed) started with a `RANK`, grouped by the parent they share, and the launcher
//! itself, which imports torch (so it is hooked) but never initialises CUDA.
//!
//! Grouping is by parent pid: every rank of one torchrun on this host is a child of the
//! same launcher process, and a launcher's restart of its workers (elastic) makes new
//! children of the same parent, so a rank number keeps one slot: the running process
//! holding it, else the last one that ended (an OOM'd rank stays visible after it died).

use std::collections::BTreeMap;

use super::job::{short_command, JobView};
use super::watcher::AttachedJobs;

/// The ranks of one launched job on this host.
#[derive(Clone, Debug)]
pub struct RankGroup<'a> {
    /// The parent the ranks share (the launcher's pid).
    pub parent_pid: Option<u32>,
    /// The launcher's own view, when it is hooked.
    pub launcher: Option<&'a JobView>,
    /// One process per rank number, lowest rank first.
    pub ranks: Vec<&'a JobView>,
}

impl RankGroup<'_> {
    /// `WORLD_SIZE` as the ranks report it (the largest any of them says).
    pub fn world_size(&self) -> Option<u32> {
        self.ranks.iter().filter_map(|j| j.world_size()).max()
    }

    /// Where `pid` sits among the ranks.
    pub fn position(&self, pid: u32) -> Option<usize> {
        self.ranks.iter().position(|j| j.pid == pid)
    }

    /// "torchrun --nproc-per-node 2 train.py" from the launcher, else the first rank's
    /// "train.py ...": the interpreter and the program's directory left out, as a title
    /// has little room.
    pub fn command(&self) -> Option<String> {
        let argv = &self
            .launcher
            .or(self.ranks.first().copied())?
            .hello
            .as_ref()?
            .argv;
        Some(short_command(argv)).filter(|c| !c.is_empty())
    }
}

impl AttachedJobs {
    /// The ranks started beside `pid`, itself included, when `pid` is a hooked process
    /// with a rank.
    pub fn rank_group(&self, pid: u32) -> Option<RankGroup<'_>> {
        let job = self.get(pid)?;
        job.rank()?;
        let parent = job.ppid();
        let mut by_rank: BTreeMap<u32, &JobView> = BTreeMap::new();
        for other in self.jobs.iter().filter(|j| j.ppid() == parent) {
            let Some(rank) = other.rank() else { continue };
            // The running holder of a rank wins; between equals, the later process.
            let key = |j: &JobView| (!j.ended, j.pid);
            let keep = by_rank.get(&rank).is_none_or(|held| key(other) > key(held));
            if keep {
                by_rank.insert(rank, other);
            }
        }
        // A rank slot held by another process than `pid` (a restart) still groups `pid`
        // with the ranks of its own start; show `pid` in its slot.
        let rank = job.rank().unwrap_or(0);
        by_rank.insert(rank, job);
        Some(RankGroup {
            parent_pid: parent,
            launcher: parent.and_then(|p| self.get(p)),
            ranks: by_rank.into_values().collect(),
        })
    }

    /// Every group of ranks, in the order of their lowest rank's pid.
    pub fn rank_groups(&self) -> Vec<RankGroup<'_>> {
        let mut parents: Vec<Option<u32>> = Vec::new();
        let mut groups = Vec::new();
        for job in self.jobs.iter().filter(|j| j.rank().is_some()) {
            if parents.contains(&job.ppid()) {
                continue;
            }
            parents.push(job.ppid());
            if let Some(group) = self.rank_group(job.pid) {
                groups.push(group);
            }
        }
        groups
    }

    /// A hooked process that never initialised CUDA and started hooked processes: a
    /// launcher, the job's parent rather than a GPU process.
    pub fn is_launcher(&self, pid: u32) -> bool {
        is_launcher(&self.jobs, pid)
    }
}

/// `AttachedJobs::is_launcher` over a plain list of jobs (`--once`, `attach`).
pub fn is_launcher(jobs: &[JobView], pid: u32) -> bool {
    jobs.iter().any(|j| j.pid == pid && !j.cuda_ready())
        && jobs.iter().any(|j| j.ppid() == Some(pid))
}

/// The ranks a launcher started, lowest first ("0, 1").
pub fn ranks_of(jobs: &[JobView], launcher: u32) -> Vec<u32> {
    let mut ranks: Vec<u32> = jobs
        .iter()
        .filter(|j| j.ppid() == Some(launcher))
        .filter_map(JobView::rank)
        .collect();
    ranks.sort_unstable();
    ranks.dedup();
    ranks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Hello;

    fn job(pid: u32, ppid: u32, rank: Option<u32>, cuda: bool, ended: bool) -> JobView {
        JobView {
            pid,
            ended,
            hello: Some(Hello {
                protocol: 1,
                pid,
                ppid: Some(ppid),
                cuda_ready: cuda,
                rank,
                world_size: rank.map(|_| 2),
                ..Hello::default()
            }),
            ..JobView::default()
        }
    }

    #[test]
    fn ranks_group_by_their_launcher_and_the_launcher_is_no_gpu_process() {
        let jobs = AttachedJobs {
            jobs: vec![
                job(100, 1, None, false, false),
                job(102, 100, Some(1), true, false),
                job(101, 100, Some(0), true, false),
                // Another torchrun's rank 0: a group of its own.
                job(201, 200, Some(0), true, false),
                // A plain job.
                job(300, 1, None, true, false),
            ],
            ..AttachedJobs::default()
        };
        let group = jobs.rank_group(102).expect("a rank");
        assert_eq!(
            group.ranks.iter().map(|j| j.pid).collect::<Vec<_>>(),
            [101, 102]
        );
        assert_eq!(group.launcher.map(|j| j.pid), Some(100));
        assert_eq!(group.world_size(), Some(2));
        assert!(jobs.is_launcher(100));
        assert!(!jobs.is_launcher(101));
        assert!(!jobs.is_launcher(300));
        assert!(jobs.rank_group(300).is_none());
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            short_command(&argv(&[
                "/usr/bin/python3",
                "-u",
                "/usr/local/bin/torchrun",
                "--nproc-per-node",
                "2",
                "train.py"
            ])),
            "torchrun --nproc-per-node 2 train.py"
        );
        assert_eq!(
            short_command(&argv(&["python", "-m", "torch.distributed.run", "t.py"])),
            "torch.distributed.run t.py"
        );
        assert_eq!(
            short_command(&argv(&["/opt/bin/accelerate", "launch", "t.py"])),
            "accelerate launch t.py"
        );
        assert_eq!(jobs.rank_groups().len(), 2);
    }

    #[test]
    fn a_restarted_rank_shows_the_running_process_and_an_ended_rank_stays() {
        let jobs = AttachedJobs {
            jobs: vec![
                job(101, 100, Some(0), true, true),
                job(111, 100, Some(0), true, false),
                job(102, 100, Some(1), true, true),
            ],
            ..AttachedJobs::default()
        };
        let group = jobs.rank_group(102).expect("a rank");
        assert_eq!(
            group.ranks.iter().map(|j| j.pid).collect::<Vec<_>>(),
            [111, 102]
        );
        // Asked from the ended rank 0, that process holds its own slot.
        let group = jobs.rank_group(101).expect("a rank");
        assert_eq!(group.ranks[0].pid, 101);
    }
}
