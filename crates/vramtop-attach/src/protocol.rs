//! The attach protocol, version 1 (crates/vramtop-attach/PROTOCOL.md): framing, the messages, and
//! their limits. Everything a hook sends is untrusted input: a frame is checked for
//! size before a byte of it is read, and a message that breaks the framing or is not a
//! JSON object drops the peer with one line saying why. A well-framed message of an
//! unknown type is ignored; one that lacks a field it needs is skipped alone.

use std::fmt;
use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};
use vramtop_trace::cause::{AllocatedSeries, GpuProcesses};
use vramtop_trace::roles::Roles;

pub const PROTOCOL_VERSION: u64 = 1;
/// Largest frame either side may send (16 MiB).
pub const MAX_FRAME_BYTES: u64 = 16 * 1024 * 1024;
/// Most blocks a `state` or `oom` may carry, over all its segments.
pub const MAX_BLOCKS: usize = 200_000;
/// The pace a viewer may ask for, in seconds.
pub const MIN_INTERVAL_S: f64 = 0.05;
pub const MAX_INTERVAL_S: f64 = 3600.0;

/// Why a peer was dropped: one line, shown on screen and in JSON.
#[derive(Clone, Debug, PartialEq)]
pub enum ProtocolError {
    /// The peer closed the connection (the job may have exited).
    Closed,
    /// The length prefix announced more than `MAX_FRAME_BYTES`.
    FrameTooLarge(u64),
    /// Not UTF-8, not JSON, not an object or no string `type`.
    Garbage(String),
    /// Nothing arrived in time (no hello within 2 s, or silence after subscribing).
    Silent(String),
    /// A hello for a protocol this vramtop does not speak.
    Version(u64),
    Io(String),
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::Closed => write!(f, "closed the connection"),
            ProtocolError::FrameTooLarge(n) => write!(
                f,
                "announced a frame of {} (the limit is {}): not a vramtop hook, dropped",
                vramtop_alloc::human_bytes(*n),
                vramtop_alloc::human_bytes(MAX_FRAME_BYTES)
            ),
            ProtocolError::Garbage(why) => write!(f, "sent garbage ({why}): dropped"),
            ProtocolError::Silent(why) => write!(f, "{why}: dropped"),
            ProtocolError::Version(v) => write!(
                f,
                "speaks attach protocol {v}, this vramtop speaks {PROTOCOL_VERSION}: use the \
                 same vramtop version as the one that wrote the hook"
            ),
            ProtocolError::Io(e) => write!(f, "connection failed: {e}"),
        }
    }
}

/// Reads one frame: the 4-byte big-endian length, checked against the limit before the
/// body is read, then the body.
pub fn read_frame(reader: &mut impl Read) -> Result<Vec<u8>, ProtocolError> {
    let mut header = [0u8; 4];
    reader.read_exact(&mut header).map_err(io_error)?;
    let len = u64::from(u32::from_be_bytes(header));
    if len > MAX_FRAME_BYTES {
        return Err(ProtocolError::FrameTooLarge(len));
    }
    let mut body = vec![0u8; len as usize];
    reader.read_exact(&mut body).map_err(io_error)?;
    Ok(body)
}

fn io_error(e: io::Error) -> ProtocolError {
    match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe => ProtocolError::Closed,
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            ProtocolError::Silent("sent nothing in time".to_string())
        }
        _ => ProtocolError::Io(e.to_string()),
    }
}

/// Writes `message` as one frame.
pub fn write_frame(writer: &mut impl Write, message: &impl Serialize) -> io::Result<()> {
    let body = serde_json::to_vec(message).map_err(io::Error::other)?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&n| u64::from(n) <= MAX_FRAME_BYTES)
        .ok_or_else(|| io::Error::other("message larger than a frame may be"))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    writer.write_all(&frame)?;
    writer.flush()
}

/// The viewer's only message: the pace at which it wants `state`s.
#[derive(Clone, Debug, Serialize)]
pub struct Subscribe {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub interval_s: f64,
}

impl Subscribe {
    pub fn new(interval_s: f64) -> Self {
        Subscribe {
            kind: "subscribe",
            interval_s: interval_s.clamp(MIN_INTERVAL_S, MAX_INTERVAL_S),
        }
    }
}

/// What a hook says, by `type`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HookMessage {
    Hello(Hello),
    State(JobState),
    Oom(OomState),
    Error(ErrorReport),
    UntrackedOom(UntrackedOom),
    Bye(Bye),
    /// A type from a newer hook: ignored.
    #[serde(other)]
    Unknown,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct Hello {
    pub protocol: u64,
    pub pid: u32,
    #[serde(default)]
    pub ppid: Option<u32>,
    #[serde(default)]
    pub argv: Vec<String>,
    #[serde(default)]
    pub hook_version: String,
    #[serde(default)]
    pub torch_version: Option<String>,
    #[serde(default)]
    pub cuda_ready: bool,
    #[serde(default)]
    pub history: bool,
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub missing: Vec<String>,
    /// The launcher's `RANK`, `LOCAL_RANK` and `WORLD_SIZE` (torchrun, accelerate), absent
    /// from older hooks and from processes no launcher started.
    #[serde(default)]
    pub rank: Option<u32>,
    #[serde(default)]
    pub local_rank: Option<u32>,
    #[serde(default)]
    pub world_size: Option<u32>,
    /// PyTorch's allocator backend, `native` or `cudaMallocAsync` (hook 1.10); absent
    /// from older hooks and where this torch does not say.
    #[serde(default)]
    pub allocator_backend: Option<String>,
}

/// `torch.cuda.memory_stats()` figures, bytes for the job's device; `None` where this
/// PyTorch does not count a figure.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct TorchStats {
    pub allocated_bytes: Option<u64>,
    pub reserved_bytes: Option<u64>,
    pub active_bytes: Option<u64>,
    pub inactive_split_bytes: Option<u64>,
    pub requested_bytes: Option<u64>,
    pub peak_allocated_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
    pub num_alloc_retries: Option<u64>,
    pub num_ooms: Option<u64>,
    pub num_device_alloc: Option<u64>,
    pub num_device_free: Option<u64>,
}

/// The allocator's settings (`PYTORCH_CUDA_ALLOC_CONF` as the job sees it).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(default)]
pub struct AllocatorSettings {
    pub expandable_segments: Option<bool>,
    pub max_split_size: Option<u64>,
    pub roundup_power2_divisions: serde_json::Value,
    pub garbage_collection_threshold: Option<f64>,
    pub raw: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct HookSegment {
    pub address: u64,
    pub total_size: u64,
    #[serde(default)]
    pub stream: u64,
    #[serde(default)]
    pub segment_type: String,
    #[serde(default)]
    pub is_expandable: bool,
    #[serde(default)]
    pub blocks: Vec<HookBlock>,
}

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct HookBlock {
    pub address: u64,
    pub size: u64,
    #[serde(default)]
    pub requested_size: u64,
    pub state: String,
    #[serde(default)]
    pub site: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct JobState {
    #[serde(default)]
    pub seq: u64,
    /// The GPU's UUID as torch reports it (hook 1.2): the same GPU in every process,
    /// whatever each one's CUDA_VISIBLE_DEVICES makes of its ordinal.
    #[serde(default)]
    pub device_uuid: Option<String>,
    #[serde(default)]
    pub time_s: f64,
    #[serde(default)]
    pub device: i64,
    /// Required, but may be `null` (a hook that could not read them).
    pub stats: Option<TorchStats>,
    #[serde(default)]
    pub settings: AllocatorSettings,
    pub segments: Vec<HookSegment>,
    /// Hook 1.3: this state carries the stats only (reading the segments would have meant
    /// converting a long event ring): the segments are those of the last state with them.
    #[serde(default)]
    pub segments_omitted: bool,
    #[serde(default)]
    pub truncated: bool,
    /// What reading the allocator cost the job, in milliseconds.
    #[serde(default)]
    pub collect_ms: Option<f64>,
    /// With history: the share of allocations whose stacks the hook has PyTorch record
    /// (1.0 = all; less when the job allocates faster than the hook's budget allows).
    #[serde(default)]
    pub history_share: Option<f64>,
    /// Hook 1.4: bytes of the job's parameters, gradients and optimizer state on this
    /// device; null where the hook found no model or optimizer.
    #[serde(default)]
    pub roles: Option<Roles>,
}

/// The allocator's state at an out-of-memory, before the exception unwound the job.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct OomState {
    #[serde(default)]
    pub time_s: f64,
    #[serde(default)]
    pub device: i64,
    /// Rounded as PyTorch's message says it "Tried to allocate".
    pub requested_bytes: u64,
    #[serde(default)]
    pub device_free_bytes: Option<u64>,
    /// The allowed maximum under `set_per_process_memory_fraction`, else the total.
    #[serde(default)]
    pub device_total_bytes: Option<u64>,
    #[serde(default)]
    pub stats: Option<TorchStats>,
    #[serde(default)]
    pub segments: Vec<HookSegment>,
    #[serde(default)]
    pub truncated: bool,
    /// PyTorch's own figures in its words, for jobs that catch the exception.
    #[serde(default)]
    pub summary: Option<String>,
    /// The allocator's settings (hooks before 0.4 did not send them: unknown).
    #[serde(default)]
    pub settings: AllocatorSettings,
    /// The hook's event ring at the OOM (hooks before 1.2 kept none).
    #[serde(default)]
    pub ring: Option<RingAtOom>,
    /// The file the hook kept this OOM's state in (None: not kept).
    #[serde(default)]
    pub kept_path: Option<String>,
    /// As in `JobState` (hook 1.2).
    #[serde(default)]
    pub device_uuid: Option<String>,
    /// Hook 1.4: the device's own total (`device_total_bytes` is the cap when one is set).
    #[serde(default)]
    pub physical_total_bytes: Option<u64>,
    /// Hook 1.4: the job's allocated bytes over its life, in time and after optimizer steps.
    #[serde(default)]
    pub series: Option<AllocatedSeries>,
    #[serde(default)]
    pub step_series: Option<AllocatedSeries>,
    /// Hook 1.4: every process NVML listed on the GPU (None: NVML could not say).
    #[serde(default)]
    pub gpu_processes: Option<GpuProcesses>,
    /// Hook 1.4: as in `JobState`, at the OOM.
    #[serde(default)]
    pub roles: Option<Roles>,
}

/// PyTorch's trace ring of alloc/free events, as the hook had it at an OOM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct RingAtOom {
    pub max_entries: u64,
    pub entries: u64,
    /// Began before the job's first allocation and never full: the whole history.
    pub complete: bool,
}

/// An exception text PyTorch raised (the OOM message, say).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct ErrorReport {
    #[serde(default)]
    pub time_s: f64,
    #[serde(default)]
    pub kind: String,
    pub message: String,
    /// The `untracked_oom` (its number) this error is, or was raised from (hook 1.11).
    #[serde(default)]
    pub oom_number: Option<u64>,
}

/// An OOM under a backend that tracks no blocks (cudaMallocAsync, a pluggable allocator),
/// seen as PyTorch made its exception (hook 1.11), whether the job catches it or dies of
/// it: PyTorch's words, numbered within the process from 1.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct UntrackedOom {
    #[serde(default)]
    pub time_s: f64,
    #[serde(default)]
    pub number: u64,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Bye {
    #[serde(default)]
    pub time_s: f64,
    #[serde(default)]
    pub exit_code: Option<i64>,
}

/// A frame's body, decoded.
#[derive(Clone, Debug, PartialEq)]
pub enum Decoded {
    Message(Box<HookMessage>),
    /// Well framed, but the message lacks or mistypes a field it needs, or holds more
    /// blocks than allowed: this message alone is skipped.
    Skipped(String),
}

/// Decodes one frame body. `Err` means the peer must be dropped.
pub fn decode(body: &[u8]) -> Result<Decoded, ProtocolError> {
    let text =
        std::str::from_utf8(body).map_err(|e| ProtocolError::Garbage(format!("not UTF-8: {e}")))?;
    match serde_json::from_str::<HookMessage>(text) {
        Ok(message) => Ok(check_limits(message)),
        // Classify the failure: the framing contract (an object with a string `type`) is
        // the peer's to keep; a bad field is one message's problem.
        Err(typed) => {
            let value: serde_json::Value = serde_json::from_str(text)
                .map_err(|e| ProtocolError::Garbage(format!("not JSON: {e}")))?;
            let kind = value
                .as_object()
                .ok_or_else(|| ProtocolError::Garbage("not a JSON object".to_string()))?
                .get("type")
                .and_then(|t| t.as_str())
                .ok_or_else(|| ProtocolError::Garbage("no string `type` field".to_string()))?;
            Ok(Decoded::Skipped(format!(
                "a `{kind}` message was skipped: {typed}"
            )))
        }
    }
}

fn check_limits(message: HookMessage) -> Decoded {
    let segments = match &message {
        HookMessage::State(s) => &s.segments,
        HookMessage::Oom(o) => &o.segments,
        _ => return Decoded::Message(Box::new(message)),
    };
    let blocks: usize = segments.iter().map(|s| s.blocks.len()).sum();
    if blocks > MAX_BLOCKS {
        return Decoded::Skipped(format!(
            "a message with {blocks} blocks was skipped (the limit is {MAX_BLOCKS})"
        ));
    }
    Decoded::Message(Box::new(message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(body);
        f
    }

    #[test]
    fn a_huge_frame_is_refused_before_it_is_read() {
        let announced = (100u32 << 20).to_be_bytes();
        let err = read_frame(&mut &announced[..]).unwrap_err();
        assert_eq!(err, ProtocolError::FrameTooLarge(100 << 20));
        assert!(err.to_string().contains("100.0 MiB"), "{err}");
    }

    #[test]
    fn frames_round_trip_and_eof_is_closed() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Subscribe::new(0.001)).unwrap();
        let body = read_frame(&mut &buf[..]).unwrap();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"type":"subscribe","interval_s":0.05}"#
        );
        assert_eq!(read_frame(&mut &buf[..3]), Err(ProtocolError::Closed));
    }

    #[test]
    fn garbage_drops_bad_fields_skip_unknown_types_pass() {
        assert!(matches!(
            decode(b"\xff\xfe"),
            Err(ProtocolError::Garbage(_))
        ));
        assert!(matches!(decode(b"{nope"), Err(ProtocolError::Garbage(_))));
        assert!(matches!(decode(b"[1,2]"), Err(ProtocolError::Garbage(_))));
        assert!(matches!(
            decode(b"{\"a\":1}"),
            Err(ProtocolError::Garbage(_))
        ));
        assert_eq!(
            decode(br#"{"type":"telemetry2","x":1}"#),
            Ok(Decoded::Message(Box::new(HookMessage::Unknown)))
        );
        let skipped = decode(br#"{"type":"state","stats":null}"#).unwrap();
        assert!(
            matches!(&skipped, Decoded::Skipped(why) if why.contains("segments")),
            "{skipped:?}"
        );
        let negative = decode(br#"{"type":"oom","requested_bytes":-1}"#).unwrap();
        assert!(matches!(negative, Decoded::Skipped(_)));
        let hello =
            decode(br#"{"type":"hello","protocol":1,"pid":7,"argv":["python"],"future":true}"#)
                .unwrap();
        assert!(
            matches!(hello, Decoded::Message(m) if matches!(*m, HookMessage::Hello(ref h) if h.pid == 7))
        );
        assert_eq!(frame(b"{}").len(), 6);
    }

    #[test]
    fn an_untracked_oom_and_the_error_it_became_are_read() {
        let told = decode(br#"{"type":"untracked_oom","time_s":2.5,"number":3,"message":"m"}"#);
        let expected = UntrackedOom {
            time_s: 2.5,
            number: 3,
            message: "m".into(),
        };
        assert_eq!(
            told,
            Ok(Decoded::Message(Box::new(HookMessage::UntrackedOom(
                expected
            ))))
        );
        let error =
            decode(br#"{"type":"error","kind":"OutOfMemoryError","message":"m","oom_number":3}"#);
        assert!(
            matches!(&error, Ok(Decoded::Message(m)) if matches!(**m, HookMessage::Error(ref e) if e.oom_number == Some(3))),
            "{error:?}"
        );
    }
}
