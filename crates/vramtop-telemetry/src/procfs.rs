//! Host-side facts about a pid from /proc: user, command line, CPU share, RSS, the
//! container or systemd unit it runs in and the frameworks it has loaded. CPU share needs
//! two readings, so `ProcSampler` keeps the last one per pid; the cgroup and the mapped
//! libraries are read once per process (pid and start time).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use vramtop_alloc::framework::Framework;

use super::cgroup::{parse_proc_cgroup, CgroupOrigin};

/// What /proc says about one process. Any field can be missing (no permission, a
/// process that exited between reads).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcInfo {
    pub user: Option<String>,
    pub command: Option<String>,
    pub cpu_pct: Option<f32>,
    pub rss_bytes: Option<u64>,
    pub cgroup: Option<CgroupOrigin>,
    /// Frameworks among its mapped libraries: empty for none, None when /proc/PID/maps
    /// could not be read (another user's process without the permission to trace it).
    pub frameworks: Option<Vec<Framework>>,
}

/// What is read once per process: a process does not change container, and by the time
/// it holds GPU memory its framework's libraries are loaded. Its maps can run to megabytes
/// (a PyTorch process maps hundreds of libraries), so they are never read on every poll.
#[derive(Clone, Debug)]
struct Lasting {
    /// Start time in ticks after boot: it tells a reused pid from the old process.
    start: u64,
    cgroup: Option<CgroupOrigin>,
    frameworks: Option<Vec<Framework>>,
}

/// Reads /proc (or another root, for tests) and remembers CPU ticks between calls.
pub struct ProcSampler {
    root: PathBuf,
    last_ticks: HashMap<u32, (u64, Instant)>,
    users: HashMap<u32, String>,
    lasting: HashMap<u32, Lasting>,
    ticks_per_second: f64,
    page_size: u64,
}

impl Default for ProcSampler {
    fn default() -> Self {
        Self::new("/proc")
    }
}

impl ProcSampler {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        // SAFETY: sysconf only reads a constant of the running kernel.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        ProcSampler {
            root: root.into(),
            last_ticks: HashMap::new(),
            users: read_passwd(),
            lasting: HashMap::new(),
            ticks_per_second: if ticks > 0 { ticks as f64 } else { 100.0 },
            page_size: if page > 0 { page as u64 } else { 4096 },
        }
    }

    /// Whether the pid exists in our view of /proc (our PID namespace).
    pub fn exists(&self, pid: u32) -> bool {
        self.root.join(pid.to_string()).exists()
    }

    pub fn sample(&mut self, pid: u32) -> Option<ProcInfo> {
        let dir = self.root.join(pid.to_string());
        let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
        let ticks = parse_stat_ticks(&stat);
        let now = Instant::now();
        let cpu_pct = match (ticks, self.last_ticks.get(&pid)) {
            (Some(t), Some(&(prev, at))) => {
                let secs = now.duration_since(at).as_secs_f64();
                (secs > 0.0).then(|| {
                    (t.saturating_sub(prev) as f64 / self.ticks_per_second / secs * 100.0) as f32
                })
            }
            _ => None,
        };
        if let Some(t) = ticks {
            self.last_ticks.insert(pid, (t, now));
        }
        let command = std::fs::read(dir.join("cmdline"))
            .ok()
            .map(|raw| {
                raw.split(|&b| b == 0)
                    .filter(|part| !part.is_empty())
                    // Arguments may hold newlines or escapes (python -c "..."): one table
                    // row must stay one line, so control characters become spaces.
                    .map(|part| {
                        String::from_utf8_lossy(part)
                            .chars()
                            .map(|c| if c.is_control() { ' ' } else { c })
                            .collect::<String>()
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .filter(|c| !c.is_empty())
            .or_else(|| parse_stat_comm(&stat).map(|c| format!("[{c}]")));
        let rss_bytes = std::fs::read_to_string(dir.join("statm"))
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            .map(|pages| pages * self.page_size);
        let user = std::fs::read_to_string(dir.join("status"))
            .ok()
            .and_then(|s| parse_status_uid(&s))
            .map(|uid| {
                self.users
                    .get(&uid)
                    .cloned()
                    .unwrap_or_else(|| uid.to_string())
            });
        let lasting = self.lasting_of(pid, &dir, parse_stat_start(&stat));
        Some(ProcInfo {
            user,
            command,
            cpu_pct,
            rss_bytes,
            cgroup: lasting.cgroup.clone(),
            frameworks: lasting.frameworks.clone(),
        })
    }

    /// The cgroup and frameworks of the process, read on its first sample only.
    fn lasting_of(&mut self, pid: u32, dir: &Path, start: Option<u64>) -> &Lasting {
        let start = start.unwrap_or(0);
        let known = self.lasting.get(&pid).is_some_and(|l| l.start == start);
        if !known {
            let cgroup = std::fs::read_to_string(dir.join("cgroup"))
                .ok()
                .and_then(|text| parse_proc_cgroup(&text));
            self.lasting.insert(
                pid,
                Lasting {
                    start,
                    cgroup,
                    frameworks: read_frameworks(dir),
                },
            );
        }
        &self.lasting[&pid]
    }

    /// Forget pids no longer asked about, so the map does not grow over a long session.
    pub fn retain(&mut self, live: &[u32]) {
        self.last_ticks.retain(|pid, _| live.contains(pid));
        self.lasting.retain(|pid, _| live.contains(pid));
    }
}

/// The frameworks among the libraries mapped into the process whose /proc directory is
/// `dir`; None when its maps cannot be read. Mapped paths need not be UTF-8, so the text is
/// read as bytes and made lossy rather than refused.
fn read_frameworks(dir: &Path) -> Option<Vec<Framework>> {
    let maps = std::fs::read(dir.join("maps")).ok()?;
    Some(Framework::from_maps(&String::from_utf8_lossy(&maps)))
}

/// utime + stime (fields 14 and 15) from /proc/PID/stat. The command name (field 2)
/// may hold spaces and parentheses, so fields are counted after the last ')'.
pub fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, so index 11.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The process's start time (field 22, ticks after boot): with the pid it names one process.
pub fn parse_stat_start(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn parse_stat_comm(stat: &str) -> Option<&str> {
    let start = stat.find('(')? + 1;
    let end = stat.rfind(')')?;
    stat.get(start..end)
}

fn parse_status_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn read_passwd() -> HashMap<u32, String> {
    std::fs::read_to_string("/etc/passwd")
        .map(|text| {
            text.lines()
                .filter_map(|line| {
                    let mut parts = line.split(':');
                    let name = parts.next()?;
                    let uid = parts.nth(1)?.parse().ok()?;
                    Some((uid, name.to_string()))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_ticks_survive_odd_command_names() {
        let stat =
            "42 (a (weird) name) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1 0 100 1000 10";
        assert_eq!(parse_stat_ticks(stat), Some(12));
        assert_eq!(parse_stat_start(stat), Some(100));
        assert_eq!(parse_stat_comm(stat), Some("a (weird) name"));
    }

    #[test]
    fn our_own_process_is_readable() {
        let mut sampler = ProcSampler::default();
        let me = std::process::id();
        let info = sampler.sample(me).expect("own /proc entry");
        assert!(info.rss_bytes.unwrap_or(0) > 0);
        assert!(info.command.is_some());
        assert!(info.user.is_some());
        // Our own maps are readable; a test binary loads no GPU framework.
        assert_eq!(info.frameworks, Some(vec![]));
        // The first reading has no earlier one to compare with.
        assert_eq!(info.cpu_pct, None);
        let again = sampler.sample(me).expect("own /proc entry");
        assert!(again.cpu_pct.is_some());
    }

    #[test]
    fn cgroup_comes_from_the_process_tree_and_is_read_once() {
        let root = std::env::temp_dir().join(format!("vramtop-procfs-{}", std::process::id()));
        let dir = root.join("4242");
        std::fs::create_dir_all(&dir).expect("scratch /proc tree");
        let stat = "4242 (python) S 1 1 1 0 -1 0 0 0 0 0 7 5 0 0 20 0 1 0 777 1000 10";
        std::fs::write(dir.join("stat"), stat).expect("write stat");
        std::fs::write(dir.join("cgroup"), "0::/system.slice/trainer.service\n")
            .expect("write cgroup");
        let mut sampler = ProcSampler::new(&root);
        let first = sampler.sample(4242).and_then(|i| i.cgroup);
        assert_eq!(
            first.and_then(|o| o.unit).as_deref(),
            Some("trainer.service")
        );
        // Same pid, same start time: the cached answer, even though the file changed.
        std::fs::write(dir.join("cgroup"), "0::/system.slice/other.service\n")
            .expect("rewrite cgroup");
        let cached = sampler.sample(4242).and_then(|i| i.cgroup);
        assert_eq!(
            cached.and_then(|o| o.unit).as_deref(),
            Some("trainer.service")
        );
        // A reused pid (new start time) is read afresh.
        std::fs::write(dir.join("stat"), stat.replace(" 777 ", " 778 ")).expect("rewrite stat");
        let reused = sampler.sample(4242).and_then(|i| i.cgroup);
        assert_eq!(
            reused.and_then(|o| o.unit).as_deref(),
            Some("other.service")
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A fake /proc holding one process per (pid, maps text); None: no maps file at all.
    fn fake_proc(name: &str, processes: &[(u32, Option<&str>)]) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("vramtop-procfs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for &(pid, maps) in processes {
            let dir = root.join(pid.to_string());
            std::fs::create_dir_all(&dir).expect("scratch /proc tree");
            let stat =
                format!("{pid} (python) S 1 1 1 0 -1 0 0 0 0 0 7 5 0 0 20 0 1 0 777 1000 10");
            std::fs::write(dir.join("stat"), stat).expect("write stat");
            if let Some(maps) = maps {
                std::fs::write(dir.join("maps"), maps).expect("write maps");
            }
        }
        root
    }

    fn mapping(path: &str) -> String {
        format!("7f3a00000000-7f3a00200000 r-xp 00000000 103:02 5244 /usr/lib/python3/site-packages/{path}\n")
    }

    #[test]
    fn frameworks_come_from_the_mapped_libraries() {
        let jax = [
            "7ffd0000-7ffd1000 rw-p 00000000 00:00 0  [stack]\n".to_string(),
            mapping("jaxlib/xla_extension.so"),
            mapping("jax_plugins/xla_cuda12/xla_cuda_plugin.so"),
        ]
        .concat();
        let torch = [
            mapping("torch/lib/libc10.so"),
            mapping("torch/lib/libtorch_cuda.so"),
            mapping("torch/lib/libc10_cuda.so"),
        ]
        .concat();
        let plain = [
            "00400000-00401000 r-xp 00000000 103:02 17 /usr/local/bin/cuda-app\n".to_string(),
            "7f00-7f10 rw-p 00000000 00:00 0 \n".to_string(),
            mapping("numpy/core/_multiarray_umath.so"),
        ]
        .concat();
        let root = fake_proc(
            "frameworks",
            &[
                (101, Some(&jax)),
                (102, Some(&torch)),
                (103, Some(&plain)),
                (104, None),
                (105, None),
            ],
        );
        // Permission bits do not stop root, so the unreadable maps file is a directory
        // here: reading it fails for every user, as another user's maps fail for us.
        std::fs::create_dir(root.join("105").join("maps")).expect("unreadable maps");
        let mut sampler = ProcSampler::new(&root);
        let frameworks = |sampler: &mut ProcSampler, pid| {
            sampler
                .sample(pid)
                .expect("the fake process has a stat file")
                .frameworks
        };
        assert_eq!(frameworks(&mut sampler, 101), Some(vec![Framework::Jax]));
        assert_eq!(
            frameworks(&mut sampler, 102),
            Some(vec![Framework::PyTorch])
        );
        assert_eq!(
            frameworks(&mut sampler, 103),
            Some(vec![]),
            "none, and known"
        );
        assert_eq!(frameworks(&mut sampler, 104), None, "no maps: unknown");
        assert_eq!(
            frameworks(&mut sampler, 105),
            None,
            "unreadable maps: unknown"
        );
        // The rest of what /proc says is still there for a process whose maps are hidden.
        let hidden = sampler.sample(105).expect("stat still readable");
        assert_eq!(hidden.command.as_deref(), Some("[python]"));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn maps_are_read_once_per_process() {
        let torch = mapping("torch/lib/libtorch_cuda.so");
        let root = fake_proc("maps-once", &[(4343, Some(&torch))]);
        let dir = root.join("4343");
        let mut sampler = ProcSampler::new(&root);
        assert_eq!(
            sampler.sample(4343).and_then(|i| i.frameworks),
            Some(vec![Framework::PyTorch])
        );
        // Same pid, same start time: the maps are not read again, even though they changed
        // (or, here, vanished).
        std::fs::remove_file(dir.join("maps")).expect("remove maps");
        assert_eq!(
            sampler.sample(4343).and_then(|i| i.frameworks),
            Some(vec![Framework::PyTorch])
        );
        // A reused pid (new start time) is a new process: its maps are read afresh.
        let jax = mapping("jaxlib/_jax.so");
        std::fs::write(dir.join("maps"), jax).expect("rewrite maps");
        let stat = std::fs::read_to_string(dir.join("stat")).expect("read stat");
        std::fs::write(dir.join("stat"), stat.replace(" 777 ", " 778 ")).expect("rewrite stat");
        assert_eq!(
            sampler.sample(4343).and_then(|i| i.frameworks),
            Some(vec![Framework::Jax])
        );
        // A process forgotten by `retain` and seen again is read again too.
        std::fs::write(dir.join("maps"), mapping("cupy/_core/core.so")).expect("rewrite maps");
        sampler.retain(&[]);
        assert_eq!(
            sampler.sample(4343).and_then(|i| i.frameworks),
            Some(vec![Framework::CuPy])
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn maps_with_paths_that_are_not_utf8_still_name_the_framework() {
        let mut maps = b"7f00-7f10 r-xp 00000000 08:01 12 /data/caf\xe9/lib.so\n".to_vec();
        maps.extend_from_slice(mapping("torch/lib/libtorch_cuda.so").as_bytes());
        let root = fake_proc("maps-bytes", &[(4444, None)]);
        std::fs::write(root.join("4444").join("maps"), maps).expect("write maps");
        let mut sampler = ProcSampler::new(&root);
        assert_eq!(
            sampler.sample(4444).and_then(|i| i.frameworks),
            Some(vec![Framework::PyTorch])
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn missing_pid_is_none() {
        let mut sampler = ProcSampler::default();
        assert!(sampler.sample(u32::MAX - 1).is_none());
        assert!(!sampler.exists(u32::MAX - 1));
    }
}
