//! Host-side facts about a pid from /proc: user, command line, CPU share, RSS and the
//! container or systemd unit it runs in. CPU share needs two readings, so `ProcSampler`
//! keeps the last one per pid; the cgroup is read once per process (pid and start time).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

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
}

/// Reads /proc (or another root, for tests) and remembers CPU ticks between calls.
pub struct ProcSampler {
    root: PathBuf,
    last_ticks: HashMap<u32, (u64, Instant)>,
    users: HashMap<u32, String>,
    /// pid -> (start time in ticks, origin): a process does not change container, so its
    /// cgroup file is read once; the start time tells a reused pid from the old one.
    cgroups: HashMap<u32, (u64, Option<CgroupOrigin>)>,
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
            cgroups: HashMap::new(),
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
        let cgroup = self.cgroup_of(pid, &dir, parse_stat_start(&stat));
        Some(ProcInfo {
            user,
            command,
            cpu_pct,
            rss_bytes,
            cgroup,
        })
    }

    fn cgroup_of(
        &mut self,
        pid: u32,
        dir: &std::path::Path,
        start: Option<u64>,
    ) -> Option<CgroupOrigin> {
        let start = start.unwrap_or(0);
        if let Some((known_start, origin)) = self.cgroups.get(&pid) {
            if *known_start == start {
                return origin.clone();
            }
        }
        let origin = std::fs::read_to_string(dir.join("cgroup"))
            .ok()
            .and_then(|text| parse_proc_cgroup(&text));
        self.cgroups.insert(pid, (start, origin.clone()));
        origin
    }

    /// Forget pids no longer asked about, so the map does not grow over a long session.
    pub fn retain(&mut self, live: &[u32]) {
        self.last_ticks.retain(|pid, _| live.contains(pid));
        self.cgroups.retain(|pid, _| live.contains(pid));
    }
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

    #[test]
    fn missing_pid_is_none() {
        let mut sampler = ProcSampler::default();
        assert!(sampler.sample(u32::MAX - 1).is_none());
        assert!(!sampler.exists(u32::MAX - 1));
    }
}
