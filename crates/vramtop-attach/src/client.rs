//! A viewer's connection to one hooked job, on a thread of its own so that a slow,
//! silent or hostile peer never touches the UI task: connect, expect a `hello` within
//! 2 s, subscribe at the app's interval, then read frames, convert each `state` into a
//! block map here, and hand the results to the attacher. Any protocol error ends the
//! connection with one line of reason; the attacher reconnects on its next scan.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc::{self, Sender};
use std::thread;
use std::time::Duration;

use super::job::{JobFrame, OomExplained};
use super::protocol::{
    decode, read_frame, write_frame, Bye, Decoded, ErrorReport, Hello, HookMessage, HookSegment,
    OomState, ProtocolError, Subscribe, UntrackedOom, PROTOCOL_VERSION,
};

/// A peer that sends no `hello` this long after connecting is dropped.
pub const HELLO_WITHIN: Duration = Duration::from_secs(2);
/// Silence allowed after subscribing, beyond three intervals.
pub const SILENCE_GRACE: Duration = Duration::from_secs(5);

/// What a connection reports to the attacher.
#[derive(Debug)]
pub enum PeerEvent {
    Hello(Hello),
    Frame(Box<JobFrame>),
    Oom(Box<OomExplained>),
    Error(ErrorReport),
    UntrackedOom(UntrackedOom),
    Bye(Bye),
    /// A message skipped for a bad field; the connection goes on.
    Skipped(String),
    /// The connection is over, with the reason.
    Dropped(ProtocolError),
}

/// A running connection. Dropping it shuts the socket, which ends the thread.
pub struct Peer {
    stream: UnixStream,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// Connects to `path` and serves the connection on a new thread, reporting to `events`
/// tagged with `pid`. Fails only when the socket cannot be connected to.
pub fn connect(
    path: &Path,
    pid: u32,
    interval_s: f64,
    events: Sender<(u32, PeerEvent)>,
) -> io::Result<Peer> {
    let stream = UnixStream::connect(path)?;
    let reader = stream.try_clone()?;
    thread::Builder::new()
        .name(format!("vramtop-peer-{pid}"))
        .spawn(move || {
            let result = serve(reader, interval_s, pid, &events);
            if let Err(reason) = result {
                let _ = events.send((pid, PeerEvent::Dropped(reason)));
            }
        })?;
    Ok(Peer { stream })
}

/// The conversation, reported to `events` tagged with `pid`. Returns `Ok` only when the
/// listener went away.
pub fn serve(
    mut stream: UnixStream,
    interval_s: f64,
    pid: u32,
    events: &Sender<(u32, PeerEvent)>,
) -> Result<(), ProtocolError> {
    let report = &mut |event| events.send((pid, event)).is_ok();
    let io = |e: io::Error| ProtocolError::Io(e.to_string());
    stream.set_read_timeout(Some(HELLO_WITHIN)).map_err(io)?;
    let not_hello = || ProtocolError::Garbage("the first message was not a hello".to_string());
    let hello = match read_message(&mut stream) {
        Ok(Decoded::Message(message)) => match *message {
            HookMessage::Hello(hello) => hello,
            _ => return Err(not_hello()),
        },
        Ok(Decoded::Skipped(_)) => return Err(not_hello()),
        Err(ProtocolError::Silent(_)) => {
            return Err(ProtocolError::Silent(format!(
                "sent no hello within {} s",
                HELLO_WITHIN.as_secs()
            )))
        }
        Err(e) => return Err(e),
    };
    if hello.protocol != PROTOCOL_VERSION {
        return Err(ProtocolError::Version(hello.protocol));
    }
    let cuda_ready = hello.cuda_ready;
    if !report(PeerEvent::Hello(hello)) {
        return Ok(());
    }
    stream.set_write_timeout(Some(HELLO_WITHIN)).map_err(io)?;
    write_frame(&mut stream, &Subscribe::new(interval_s)).map_err(io)?;
    let mut judge = Judge::new(pid, events.clone());
    let result = converse(stream, interval_s, cuda_ready, &mut judge, report);
    // However the conversation ended, the OOMs it brought are reported before the end is.
    judge.finish();
    result
}

/// The conversation after the hello: states, OOMs (explained by `judge`), the end.
fn converse(
    mut stream: UnixStream,
    interval_s: f64,
    mut cuda_ready: bool,
    judge: &mut Judge,
    report: &mut dyn FnMut(PeerEvent) -> bool,
) -> Result<(), ProtocolError> {
    let io = |e: io::Error| ProtocolError::Io(e.to_string());
    // The segments of the last state that had them, with its time, for the states that
    // carry stats only (`segments_omitted`).
    let mut last_segments: (Vec<HookSegment>, f64) = (Vec::new(), 0.0);
    let silence = Duration::from_secs_f64(interval_s.max(0.0) * 3.0) + SILENCE_GRACE;
    loop {
        // A job whose CUDA is not ready yet sends nothing by design: wait for it
        // without a limit (dropping it would only reconnect, again and again).
        let limit = cuda_ready.then_some(silence);
        stream.set_read_timeout(limit).map_err(io)?;
        let decoded = match read_message(&mut stream) {
            Ok(d) => d,
            Err(ProtocolError::Silent(_)) => {
                return Err(ProtocolError::Silent(format!(
                    "went silent for {:.0} s",
                    silence.as_secs_f64()
                )))
            }
            Err(e) => return Err(e),
        };
        let event = match decoded {
            Decoded::Skipped(why) => PeerEvent::Skipped(why),
            Decoded::Message(message) => match *message {
                HookMessage::State(mut state) => {
                    cuda_ready = true;
                    let map_time_s = if state.segments_omitted {
                        state.segments = last_segments.0.clone();
                        last_segments.1
                    } else {
                        last_segments = (state.segments.clone(), state.time_s);
                        state.time_s
                    };
                    let mut frame = JobFrame::from_state(&state);
                    frame.map_time_s = map_time_s;
                    PeerEvent::Frame(Box::new(frame))
                }
                HookMessage::Oom(oom) => {
                    judge.ask(oom);
                    continue;
                }
                HookMessage::Error(error) => PeerEvent::Error(error),
                HookMessage::UntrackedOom(oom) => PeerEvent::UntrackedOom(oom),
                HookMessage::Bye(bye) => {
                    // The job's last OOM is told before its end.
                    judge.finish();
                    PeerEvent::Bye(bye)
                }
                // Sent again when CUDA comes up, with the final capabilities.
                HookMessage::Hello(hello) => {
                    cuda_ready |= hello.cuda_ready;
                    PeerEvent::Hello(hello)
                }
                HookMessage::Unknown => continue,
            },
        };
        if !report(event) {
            return Ok(());
        }
    }
}

/// Explains a connection's OOMs on a thread of its own. Explaining one from the job's
/// history replays it (a second or more for a long history), and a reader that stops
/// reading that long can lose the OOM the job died of: a convolutional GAN under a cap
/// (H200, PyTorch 2.11) ran out 47 times in half a second inside cuDNN's workspace
/// search, each OOM caught by PyTorch itself, then a 48th killed it; the reader, judging
/// the first ones, left the hook's socket unread until its half-second drain at exit was
/// over, and the live view kept the 47th (without history) as the job's last OOM. The
/// worker explains the newest OOM waiting, never an older one after it (the view shows the
/// last OOM; PyTorch's own count of them comes with every state).
struct Judge {
    pid: u32,
    events: Sender<(u32, PeerEvent)>,
    to: Option<mpsc::Sender<OomState>>,
    worker: Option<thread::JoinHandle<()>>,
}

impl Judge {
    fn new(pid: u32, events: Sender<(u32, PeerEvent)>) -> Judge {
        Judge {
            pid,
            events,
            to: None,
            worker: None,
        }
    }

    /// Explained on the worker, started at the connection's first OOM (on the reader
    /// itself where no thread can be started).
    fn ask(&mut self, oom: OomState) {
        if self.to.is_none() {
            self.start();
        }
        let oom = match &self.to {
            Some(to) => match to.send(oom) {
                Ok(()) => return,
                Err(mpsc::SendError(oom)) => oom,
            },
            None => oom,
        };
        let explained = OomExplained::from_oom(&oom);
        let _ = self
            .events
            .send((self.pid, PeerEvent::Oom(Box::new(explained))));
    }

    fn start(&mut self) {
        let (to, inbox) = mpsc::channel::<OomState>();
        let (pid, events) = (self.pid, self.events.clone());
        let worker = thread::Builder::new()
            .name(format!("vramtop-oom-{pid}"))
            .spawn(move || {
                while let Ok(mut oom) = inbox.recv() {
                    // A burst: only the newest is worth the replay.
                    while let Ok(newer) = inbox.try_recv() {
                        oom = newer;
                    }
                    let explained = OomExplained::from_oom(&oom);
                    if events
                        .send((pid, PeerEvent::Oom(Box::new(explained))))
                        .is_err()
                    {
                        return;
                    }
                }
            });
        if let Ok(worker) = worker {
            self.to = Some(to);
            self.worker = Some(worker);
        }
    }

    /// Every OOM asked of it reported: waits for the worker to end.
    fn finish(&mut self) {
        self.to = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

fn read_message(stream: &mut UnixStream) -> Result<Decoded, ProtocolError> {
    decode(&read_frame(stream)?)
}
