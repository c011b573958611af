//! The files the hook keeps at each OOM of a job (`OomKeeper` in the hook): where they go,
//! what they are called, and finding a run's files afterwards. The hook writes them, viewer
//! or not, so an OOM in a job nobody watched is still there to open.
//!
//! A file is `vramtop-oom-[TAG-]PID-N.pickle` (N = 1, 2, 3, then `last`, rewritten at each
//! later OOM): a PyTorch memory snapshot, which `vramtop snapshot` and PyTorch's own
//! `torch.cuda._memory_viz` read alike. Under a backend that tracks no blocks
//! (cudaMallocAsync) the hook keeps PyTorch's words of each OOM instead, caught or not:
//! `vramtop-oom-[TAG-]PID-N-untracked.json`, N as for the pickles (hook 1.11; before,
//! only the one it died of, `...-PID-untracked.json`; `async_oom::KeptUntracked`).
//! A process of a `vramtop run` job dying of an OOM (its main thread's uncaught
//! exception) is marked `vramtop-oom-TAG-PID-dying.json`, so that a job that does not end
//! after it (a torchrun job waiting on a failed rank) has that OOM explained meanwhile.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The hook's environment for keeping OOMs.
pub const DIR_ENV: &str = "VRAMTOP_OOM_DIR";
pub const TAG_ENV: &str = "VRAMTOP_OOM_TAG";
pub const QUIET_ENV: &str = "VRAMTOP_OOM_QUIET";

/// How `vramtop run` asks its job's hook to keep OOMs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OomKeeping {
    /// Where the files go.
    pub dir: PathBuf,
    /// Names this run in the file names, so it finds its own job's files.
    pub tag: String,
    /// The hook says nothing at an OOM: `vramtop run` explains it after the job.
    pub quiet: bool,
}

impl OomKeeping {
    /// For the run of vramtop process `run_pid`, keeping files in `dir`. The tag holds the
    /// pid and the start time: in a container vramtop is often pid 1 at every run, and a
    /// run must never take an earlier run's files for its own.
    pub fn for_run(dir: PathBuf, run_pid: u32, quiet: bool) -> OomKeeping {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        // Absolute: the job may change directory (Hydra does) before it runs out.
        let dir = std::path::absolute(&dir).unwrap_or(dir);
        OomKeeping {
            dir,
            tag: format!("run{run_pid}.{started}"),
            quiet,
        }
    }

    /// The variables the job is started with.
    pub fn env(&self) -> Vec<(&'static str, OsString)> {
        let mut env = vec![
            (DIR_ENV, self.dir.clone().into_os_string()),
            (TAG_ENV, OsString::from(&self.tag)),
        ];
        if self.quiet {
            env.push((QUIET_ENV, OsString::from("1")));
        }
        env
    }

    /// This run's files, oldest first (by the time they were written, then by name).
    pub fn files(&self) -> Vec<PathBuf> {
        self.files_ending(".pickle")
    }

    /// This run's OOMs under a backend that tracks no blocks (`-untracked.json`, up to four
    /// a process): PyTorch's words, kept by the hook where there was no state to keep.
    pub fn untracked_files(&self) -> Vec<PathBuf> {
        self.files_ending("-untracked.json")
    }

    /// This run's processes that died of an OOM, as the hook marked them (`-dying.json`):
    /// (pid, when it was marked), oldest first. The time is the mark's own `time_s`, the
    /// job's clock (a file server's may differ), else the file's.
    pub fn dying(&self) -> Vec<(u32, std::time::SystemTime)> {
        let marked_at = |path: &Path| -> Option<std::time::SystemTime> {
            let text = std::fs::read_to_string(path).ok()?;
            let value: serde_json::Value = serde_json::from_str(&text).ok()?;
            let seconds = value
                .get("time_s")?
                .as_f64()
                .filter(|s| s.is_finite() && *s >= 0.0)?;
            std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_secs_f64(seconds))
        };
        self.found("-dying.json")
            .into_iter()
            .filter_map(|(modified, path)| {
                Some((self.pid_of(&path)?, marked_at(&path).unwrap_or(modified)))
            })
            .collect()
    }

    /// Removes the marks `dying` reads: they are for the run's own waiting, not for the
    /// user's folder.
    pub fn clear_dying(&self) {
        for (_, path) in self.found("-dying.json") {
            let _ = std::fs::remove_file(path);
        }
    }

    /// The job process a file of this run was kept by (the PID in its name).
    pub fn pid_of(&self, path: &Path) -> Option<u32> {
        let name = path.file_name()?.to_str()?;
        let rest = name.strip_prefix(&self.prefix())?;
        rest.split('-').next()?.parse().ok()
    }

    /// `vramtop-oom-TAG-`: how every file of this run begins (the hook's
    /// `OomKeeper.path_of` names them), the job process's pid next.
    fn prefix(&self) -> String {
        format!("vramtop-oom-{}-", self.tag)
    }

    fn files_ending(&self, suffix: &str) -> Vec<PathBuf> {
        self.found(suffix)
            .into_iter()
            .map(|(_, path)| path)
            .collect()
    }

    fn found(&self, suffix: &str) -> Vec<(std::time::SystemTime, PathBuf)> {
        let prefix = self.prefix();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut found: Vec<(std::time::SystemTime, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with(&prefix) && name.ends_with(suffix)
            })
            .filter_map(|e| {
                let modified = e.metadata().ok()?.modified().ok()?;
                Some((modified, e.path()))
            })
            .collect();
        found.sort();
        found
    }
}

/// Where a batch run keeps OOMs when the user did not say (`VRAMTOP_OOM_DIR`): beside the
/// file its output goes to (`> job.log`), else the current directory.
pub fn batch_dir(stdout_target: Option<&Path>) -> PathBuf {
    if let Some(dir) = std::env::var_os(DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    match stdout_target.and_then(Path::parent) {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The regular file our standard output goes to, if it is one (not a pipe or a terminal).
pub fn stdout_file() -> Option<PathBuf> {
    let target = std::fs::read_link("/proc/self/fd/1").ok()?;
    std::fs::metadata(&target)
        .ok()
        .filter(|m| m.is_file())
        .map(|_| target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_files_are_found_by_tag_and_others_left() {
        let dir = std::env::temp_dir().join(format!("vramtop-oom-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let keep = OomKeeping::for_run(dir.clone(), 77, true);
        assert!(keep.tag.starts_with("run77."), "{}", keep.tag);
        let mine = |rest: &str| format!("vramtop-oom-{}-{rest}", keep.tag);
        for name in [
            mine("100-1.pickle"),
            mine("100-last.pickle"),
            "vramtop-oom-run77.1-100-1.pickle".to_string(),
            "vramtop-oom-run78-100-1.pickle".to_string(),
            "vramtop-oom-100-1.pickle".to_string(),
            mine("100-2.pickle.9.part"),
        ] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        let names: Vec<String> = keep
            .files()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(sorted, [mine("100-1.pickle"), mine("100-last.pickle")]);
        assert!(keep.dir.is_absolute());
        let relative = OomKeeping::for_run(PathBuf::from("."), 1, false);
        assert!(relative.dir.is_absolute(), "{}", relative.dir.display());
        assert!(keep.env().contains(&(QUIET_ENV, OsString::from("1"))));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dying_marks_give_their_pid_and_their_own_time() {
        let dir = std::env::temp_dir().join(format!("vramtop-oom-dying-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let keep = OomKeeping::for_run(dir.clone(), 78, true);
        let mine = |rest: &str| dir.join(format!("vramtop-oom-{}-{rest}", keep.tag));
        std::fs::write(
            mine("4321-dying.json"),
            br#"{"kind": "OutOfMemoryError", "time_s": 1000.5}"#,
        )
        .unwrap();
        std::fs::write(mine("99-dying.json"), b"not json").unwrap();
        std::fs::write(dir.join("vramtop-oom-run1.2-55-dying.json"), b"{}").unwrap();
        std::fs::write(mine("4321-dying.json.tmp"), b"{}").unwrap();
        let mut dying = keep.dying();
        dying.sort();
        assert_eq!(dying.len(), 2, "{dying:?}");
        assert_eq!(dying[0].0, 99);
        // Unreadable: the file's own time, now or so.
        assert!(dying[0].1.elapsed().unwrap_or_default() < std::time::Duration::from_secs(60));
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(1000.5);
        assert_eq!(dying[1], (4321, at));
        assert_eq!(keep.pid_of(&mine("4321-last.pickle")), Some(4321));
        assert_eq!(keep.pid_of(&mine("17-untracked.json")), Some(17));
        assert_eq!(
            keep.pid_of(&dir.join("vramtop-oom-run1.2-55-1.pickle")),
            None
        );
        keep.clear_dying();
        assert!(keep.dying().is_empty());
        assert!(
            mine("4321-dying.json.tmp").exists(),
            "only marks are removed"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_batch_run_keeps_beside_its_log() {
        if std::env::var_os(DIR_ENV).is_none() {
            assert_eq!(
                batch_dir(Some(Path::new("/data/jobs/job.log"))),
                PathBuf::from("/data/jobs")
            );
            assert_eq!(batch_dir(None), PathBuf::from("."));
        }
    }
}
