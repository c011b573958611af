//! The attacher: scans the socket directory every interval, keeps one connection per
//! hooked job (reconnecting on the next scan after a drop), takes in what connections
//! report, and publishes the jobs as one owned snapshot. It runs on its own thread; the
//! UI only ever sees the latest snapshot, never a backlog.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::client::{self, Peer, PeerEvent};
use super::discovery::{pid_alive, scan, FileId};
use super::job::{short_command, AttachedJob, JobFrame, JobView, OomExplained};
use super::other_caches::{self, OtherCache};

/// Ended jobs kept on screen, newest first, beyond the running ones.
const ENDED_KEPT: usize = 16;

/// Every job the attacher knows, running or ended, by pid.
#[derive(Clone, Debug, Default)]
pub struct AttachedJobs {
    pub jobs: Vec<JobView>,
    /// Why the socket directory could not be read, if it could not.
    pub scan_error: Option<String>,
    /// Scans done so far (a headless caller waits for the first).
    pub scans: u64,
}

impl AttachedJobs {
    pub fn get(&self, pid: u32) -> Option<&JobView> {
        self.jobs.iter().find(|j| j.pid == pid)
    }
}

enum Input {
    Peer(u32, PeerEvent),
    /// `vramtop run` knows its child's exit code before any scan would.
    ExitCode(u32, i64),
    Stop,
}

/// A handle on the attacher thread; dropping it stops the thread.
pub struct Attacher {
    pub jobs: watch::Receiver<Arc<AttachedJobs>>,
    input: Sender<Input>,
}

impl Drop for Attacher {
    fn drop(&mut self) {
        let _ = self.input.send(Input::Stop);
    }
}

impl Attacher {
    /// Starts the attach threads; `Err` only when the OS refuses a thread.
    pub fn spawn(dir: PathBuf, interval: Duration) -> std::io::Result<Self> {
        let (tx, rx) = watch::channel(Arc::new(AttachedJobs::default()));
        let (input, inputs) = mpsc::channel();
        let peer_input = input.clone();
        let (peer_tx, peer_rx) = mpsc::channel::<(u32, PeerEvent)>();
        // Connections report on their own channel; this forwards it into the one the
        // attacher waits on, so the attacher has a single interruptible wait.
        thread::Builder::new()
            .name("vramtop-attach-fwd".into())
            .spawn(move || {
                while let Ok((pid, event)) = peer_rx.recv() {
                    if peer_input.send(Input::Peer(pid, event)).is_err() {
                        return;
                    }
                }
            })?;
        let mut state = State {
            dir,
            interval_s: interval.as_secs_f64(),
            jobs: BTreeMap::new(),
            peers: BTreeMap::new(),
            peer_tx,
            files: BTreeMap::new(),
            ended_at: BTreeMap::new(),
            scan_error: None,
            scans: 0,
        };
        thread::Builder::new()
            .name("vramtop-attach".into())
            .spawn(move || state.run(interval, &inputs, &tx))?;
        Ok(Attacher { jobs: rx, input })
    }

    /// Records the exit code of a job vramtop itself started.
    pub fn job_exited(&self, pid: u32, code: i64) {
        let _ = self.input.send(Input::ExitCode(pid, code));
    }

    /// The latest published jobs.
    pub fn snapshot(&self) -> Arc<AttachedJobs> {
        self.jobs.borrow().clone()
    }
}

struct State {
    dir: PathBuf,
    interval_s: f64,
    jobs: BTreeMap<u32, AttachedJob>,
    peers: BTreeMap<u32, Peer>,
    peer_tx: Sender<(u32, PeerEvent)>,
    /// The socket file each job was last connected through (`JobSocket::file`).
    files: BTreeMap<u32, FileId>,
    /// The scan each ended job was first seen ended at: the oldest are forgotten first.
    ended_at: BTreeMap<u32, u64>,
    scan_error: Option<String>,
    scans: u64,
}

impl State {
    fn run(
        &mut self,
        interval: Duration,
        inputs: &Receiver<Input>,
        out: &watch::Sender<Arc<AttachedJobs>>,
    ) {
        let mut next_scan = Instant::now();
        loop {
            if Instant::now() >= next_scan {
                let before = self.fingerprint();
                self.scan();
                next_scan = Instant::now() + interval;
                // Publish only what a scan changed: every publish wakes the screen for a
                // redraw, and an idle directory at 0.1 s doubled the live view's frames.
                if (self.scans == 1 || self.fingerprint() != before) && !self.publish(out) {
                    return;
                }
            }
            let wait = next_scan.saturating_duration_since(Instant::now());
            let first = match inputs.recv_timeout(wait) {
                Ok(input) => input,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            // Take in everything that is waiting, then publish once.
            for input in std::iter::once(first).chain(inputs.try_iter()) {
                match input {
                    Input::Stop => return,
                    Input::Peer(pid, event) => self.take(pid, event),
                    Input::ExitCode(pid, code) => {
                        if let Some(job) = self.jobs.get_mut(&pid) {
                            job.set_exit_code(code);
                        }
                    }
                }
            }
            if !self.publish(out) {
                return;
            }
        }
    }

    /// What a scan can change: jobs known, connections, ended jobs, drops, the error.
    fn fingerprint(&self) -> (usize, usize, usize, Vec<Option<String>>, Option<String>) {
        let ended = self.jobs.values().filter(|j| j.view.ended).count();
        let drops = self
            .jobs
            .values()
            .map(|j| j.view.last_drop.clone())
            .collect();
        (
            self.jobs.len(),
            self.peers.len(),
            ended,
            drops,
            self.scan_error.clone(),
        )
    }

    fn job(&mut self, pid: u32) -> &mut AttachedJob {
        let interval_s = self.interval_s;
        self.jobs
            .entry(pid)
            .or_insert_with(|| AttachedJob::new(pid, interval_s))
    }

    fn scan(&mut self) {
        self.scans += 1;
        let sockets = match scan(&self.dir) {
            Ok(s) => {
                self.scan_error = None;
                s
            }
            Err(e) => {
                self.scan_error = Some(format!("cannot read {}: {e}", self.dir.display()));
                Vec::new()
            }
        };
        for socket in sockets {
            if self.peers.contains_key(&socket.pid) {
                continue;
            }
            if self.jobs.get(&socket.pid).is_some_and(|j| j.view.ended) {
                // The ended job's own socket, left while its process finishes (after the
                // hook's bye, or a process that lingers): the job stays as it ended, OOM
                // and all. Forgetting it here, and connecting anew to a hook still
                // listening, lost the job's last OOM from the view.
                if self.files.get(&socket.pid) == Some(&socket.file) {
                    continue;
                }
                // Another file under the name: a new process that got the pid.
                self.forget(socket.pid);
            }
            match client::connect(
                &socket.path,
                socket.pid,
                self.interval_s,
                self.peer_tx.clone(),
            ) {
                Ok(peer) => {
                    self.job(socket.pid);
                    self.peers.insert(socket.pid, peer);
                    self.files.insert(socket.pid, socket.file);
                }
                // Refused: the job is still starting its server, or just ended.
                Err(e) => {
                    if self.jobs.contains_key(&socket.pid) {
                        self.job(socket.pid).view.last_drop = Some(format!("cannot connect: {e}"));
                    }
                }
            }
        }
        for job in self.jobs.values_mut() {
            if !job.view.ended
                && !self.peers.contains_key(&job.view.pid)
                && !pid_alive(job.view.pid)
            {
                job.view.ended = true;
            }
        }
        self.forget_old_ended();
    }

    /// Keeps the ENDED_KEPT jobs that ended last, with their OOMs; by pid, a job that
    /// ended a minute ago could go before one that ended an hour ago.
    fn forget_old_ended(&mut self) {
        let mut ended: Vec<u32> = self
            .jobs
            .values()
            .filter(|j| j.view.ended && !self.peers.contains_key(&j.view.pid))
            .map(|j| j.view.pid)
            .collect();
        for &pid in &ended {
            self.ended_at.entry(pid).or_insert(self.scans);
        }
        if ended.len() > ENDED_KEPT {
            ended.sort_by_key(|pid| (self.ended_at.get(pid).copied(), *pid));
            for &pid in &ended[..ended.len() - ENDED_KEPT] {
                self.forget(pid);
            }
        }
    }

    fn forget(&mut self, pid: u32) {
        self.jobs.remove(&pid);
        self.files.remove(&pid);
        self.ended_at.remove(&pid);
    }

    fn take(&mut self, pid: u32, event: PeerEvent) {
        if !self.peers.contains_key(&pid) {
            // A report from a connection already given up: nothing to add.
            return;
        }
        let event = match event {
            PeerEvent::Oom(mut oom) => {
                let others = self.other_caches(pid, &oom);
                let elsewhere = other_caches::empty_cache_elsewhere(&oom, &others);
                oom.remedies.extend(elsewhere);
                PeerEvent::Oom(oom)
            }
            event => event,
        };
        let job = self.job(pid);
        match event {
            PeerEvent::Hello(hello) => job.on_hello(hello),
            PeerEvent::Frame(frame) => job.on_frame(*frame),
            PeerEvent::Oom(oom) => job.on_oom(*oom),
            PeerEvent::Error(error) => job.on_error(error),
            PeerEvent::UntrackedOom(oom) => job.on_untracked_oom(oom),
            PeerEvent::Bye(bye) => job.on_bye(bye),
            PeerEvent::Skipped(why) => job.on_skipped(why),
            PeerEvent::Dropped(reason) => {
                let alive = pid_alive(pid);
                job.on_dropped(reason.to_string(), alive);
                self.peers.remove(&pid);
            }
        }
    }

    /// The other hooked processes on the GPU `pid` ran out of memory on, at their last
    /// states (see `other_caches`).
    fn other_caches(&self, pid: u32, oom: &OomExplained) -> Vec<OtherCache> {
        // The GPU's UUID where both hooks send it, else the ordinal through each
        // process's CUDA_VISIBLE_DEVICES as it started.
        let gpu = other_caches::gpu_of(pid, oom.device);
        let same_gpu = |other: u32, frame: &JobFrame| match (&oom.device_uuid, &frame.device_uuid) {
            (Some(a), Some(b)) => a == b,
            _ => gpu.is_some() && other_caches::gpu_of(other, frame.device) == gpu,
        };
        self.jobs
            .values()
            .filter(|j| j.view.pid != pid && !j.view.ended)
            .filter_map(|j| {
                // A state taken after the OOM (one replayed to a viewer that came later,
                // or one that overtook the OOM on its way) is not what the device held then.
                let frame = j.frame_at(oom.time_s)?;
                same_gpu(j.view.pid, frame).then(|| {
                    let argv = j
                        .view
                        .hello
                        .as_ref()
                        .map(|h| h.argv.as_slice())
                        .unwrap_or(&[]);
                    OtherCache::of(j.view.pid, short_command(argv), frame, oom.time_s)
                })
            })
            .collect()
    }

    /// `false` when nobody listens any more.
    fn publish(&self, out: &watch::Sender<Arc<AttachedJobs>>) -> bool {
        let jobs = AttachedJobs {
            jobs: self.jobs.values().map(|j| j.view.clone()).collect(),
            scan_error: self.scan_error.clone(),
            scans: self.scans,
        };
        out.send_replace(Arc::new(jobs));
        !out.is_closed()
    }
}

/// Attaches to every job in `dir` for at most `wait`, and returns them once each has
/// sent a state, ended or been dropped: what `--once --json` prints.
pub fn collect_once(dir: PathBuf, wait: Duration) -> std::io::Result<Vec<JobView>> {
    // No live job socket: nothing to attach to. Starting the attacher and waiting for its
    // first scan cost `--once` 20 ms on the H100, two thirds of nvidia-smi's whole run.
    // A directory that cannot be scanned goes on, so the attacher reports why.
    if matches!(super::discovery::scan(&dir), Ok(sockets) if sockets.is_empty()) {
        return Ok(Vec::new());
    }
    let attacher = Attacher::spawn(dir, Duration::from_millis(100))?;
    let deadline = Instant::now() + wait;
    loop {
        let jobs = attacher.snapshot();
        let settled = jobs.scans > 0
            && jobs.jobs.iter().all(|j| {
                j.frame.is_some()
                    || j.ended
                    || j.last_drop.is_some()
                    || j.hello.as_ref().is_some_and(|h| !h.cuda_ready)
            });
        if settled || Instant::now() >= deadline {
            return Ok(jobs.jobs.clone());
        }
        thread::sleep(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        State {
            dir: PathBuf::new(),
            interval_s: 1.0,
            jobs: BTreeMap::new(),
            peers: BTreeMap::new(),
            peer_tx: mpsc::channel().0,
            files: BTreeMap::new(),
            ended_at: BTreeMap::new(),
            scan_error: None,
            scans: 0,
        }
    }

    fn end(state: &mut State, pid: u32) {
        state.job(pid).view.ended = true;
    }

    #[test]
    fn the_jobs_that_ended_first_are_forgotten_first_whatever_their_pids() {
        let mut state = state();
        // Pids counting down: the first to end has the highest.
        for (scan, pid) in (0..ENDED_KEPT as u32 + 2).rev().enumerate() {
            state.scans = scan as u64;
            end(&mut state, 1000 + pid);
            state.forget_old_ended();
        }
        let kept: Vec<u32> = state.jobs.keys().copied().collect();
        let newest: Vec<u32> = (1000..1000 + ENDED_KEPT as u32).collect();
        assert_eq!(kept, newest);
        assert_eq!(state.ended_at.len(), ENDED_KEPT);
        // A job still running is never counted among the ended.
        state.job(5);
        state.scans += 1;
        end(&mut state, 6);
        state.forget_old_ended();
        assert!(state.jobs.contains_key(&5) && state.jobs.contains_key(&6));
        assert!(!state.jobs.contains_key(&(1000 + ENDED_KEPT as u32 - 1)));
    }
}
