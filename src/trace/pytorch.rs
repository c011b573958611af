//! Import of a PyTorch memory snapshot (`torch.cuda.memory._snapshot()`), already
//! decoded by `pickle`: one device's `device_traces` become the event stream, its
//! `segments` the state at the end, and blocks live at the end but never allocated in
//! the trace become the initial state. Knows nothing of files or of other formats.

use std::collections::{HashMap, HashSet};

use super::pickle::{Dict, Value};
use super::{
    bump, LiveAtStart, SnapshotBlock, SnapshotSegment, StreamIds, Trace, TraceErrorKind,
    TraceEvent, TraceEventKind, TraceFormat, TraceStats,
};
use crate::alloc::{BlockState, Pool};

const WHAT_TO_DO: &str = "expected a dict from torch.cuda.memory._snapshot() with 'segments' \
                          and 'device_traces'; write one with torch.cuda.memory._dump_snapshot()";

fn not_a_snapshot(what: String) -> TraceErrorKind {
    TraceErrorKind::NotASnapshot(what)
}

pub(super) fn import(root: &Value, device: Option<i64>) -> Result<Trace, TraceErrorKind> {
    let (traces, segments) = top_level(root)?;
    let devices_with_traces: Vec<i64> = traces
        .iter()
        .enumerate()
        .filter(|(_, t)| t.as_seq().is_some_and(|events| !events.is_empty()))
        .map(|(i, _)| i as i64)
        .collect();
    // Unless told, the first device with a trace; failing that, the first with segments.
    let chosen = match device {
        Some(d) => d,
        None => devices_with_traces
            .first()
            .copied()
            .or_else(|| segments.first().and_then(|s| int_field(s, "device")))
            .unwrap_or(0),
    };
    let device_trace: &[Value] = usize::try_from(chosen)
        .ok()
        .and_then(|i| traces.get(i))
        .and_then(Value::as_seq)
        .unwrap_or(&[]);

    let mut streams = StreamIds::default();
    let mut tags = TagCache::default();
    let mut stats = TraceStats {
        devices_with_traces,
        no_history: device_trace.is_empty(),
        ..TraceStats::default()
    };
    let events = import_events(device_trace, chosen, &mut stats, &mut streams, &mut tags)?;
    let segments_at_end = import_segments(segments, chosen, &mut streams, &mut tags)?;
    if device.is_some() && device_trace.is_empty() && segments_at_end.is_empty() {
        return Err(not_a_snapshot(format!(
            "device {chosen} has neither a trace nor segments in this snapshot; \
             pick another device"
        )));
    }
    let mut trace = Trace {
        source: TraceFormat::PytorchSnapshot,
        device: chosen,
        initial: live_from_start(&segments_at_end, &events),
        events,
        segments_at_end,
        stats,
    };
    trace.tally();
    Ok(trace)
}

/// `device_traces` and `segments`, or why this pickle is not a snapshot.
fn top_level(root: &Value) -> Result<(&[Value], &[Value]), TraceErrorKind> {
    let Some(dict) = root.as_dict() else {
        return Err(not_a_snapshot(format!(
            "the pickle holds {}, not a memory snapshot; {WHAT_TO_DO}",
            root.describe()
        )));
    };
    let segments = dict.get("segments");
    let traces = dict.get("device_traces");
    if segments.is_none() && traces.is_none() {
        let keys: Vec<&str> = dict
            .iter()
            .filter_map(|(k, _)| k.as_str())
            .take(8)
            .collect();
        return Err(not_a_snapshot(format!(
            "the pickle holds a dict with keys [{}], not a memory snapshot; {WHAT_TO_DO}",
            keys.join(", ")
        )));
    }
    Ok((
        list_or_empty("device_traces", traces)?,
        list_or_empty("segments", segments)?,
    ))
}

fn list_or_empty<'v>(name: &str, value: Option<&'v Value>) -> Result<&'v [Value], TraceErrorKind> {
    match value {
        None | Some(Value::None) => Ok(&[]),
        Some(v) => v
            .as_seq()
            .ok_or_else(|| not_a_snapshot(format!("'{name}' is {}, not a list", v.describe()))),
    }
}

fn import_events(
    device_trace: &[Value],
    device: i64,
    stats: &mut TraceStats,
    streams: &mut StreamIds,
    tags: &mut TagCache,
) -> Result<Vec<TraceEvent>, TraceErrorKind> {
    let mut events = Vec::with_capacity(device_trace.len());
    for (i, entry) in device_trace.iter().enumerate() {
        let at = || format!("device_traces[{device}][{i}]");
        let fields = EventFields::of(entry, &at)?;
        let action = fields
            .action
            .and_then(Value::as_str)
            .ok_or_else(|| not_a_snapshot(format!("{}: no 'action' string", at())))?;
        bump(&mut stats.actions, action);
        let Some(kind) = kind_of(action) else {
            bump(&mut stats.unknown_actions, action);
            continue;
        };
        let number = |key: &str, value: Option<&Value>| match value {
            Some(v) => to_u64(v).ok_or_else(|| {
                not_a_snapshot(format!(
                    "{}: '{key}' is {}, not a non-negative integer",
                    at(),
                    v.describe()
                ))
            }),
            None => Err(not_a_snapshot(format!("{}: no '{key}' field", at()))),
        };
        let stream = match fields.stream {
            None | Some(Value::None) => 0,
            stream => number("stream", stream)?,
        };
        events.push(TraceEvent {
            kind,
            addr: number("addr", fields.addr)?,
            size: number("size", fields.size)?,
            stream: streams.id(stream),
            tag: fields.frames.and_then(|f| tags.tag(f)),
            time_us: fields.time_us.and_then(Value::as_int),
        });
    }
    Ok(events)
}

/// Blocks live at the end (allocated or pending free) at an address the trace never
/// allocated: they were live before recording began.
fn live_from_start(segments: &[SnapshotSegment], events: &[TraceEvent]) -> Vec<LiveAtStart> {
    let allocated: HashSet<u64> = events
        .iter()
        .filter(|e| e.kind == TraceEventKind::Alloc)
        .map(|e| e.addr)
        .collect();
    segments
        .iter()
        .flat_map(|seg| seg.blocks.iter().map(move |b| (seg.stream, b)))
        .filter(|(_, b)| matches!(b.state, BlockState::Allocated | BlockState::PendingFree))
        .filter(|(_, b)| !allocated.contains(&b.addr))
        .map(|(stream, b)| LiveAtStart {
            addr: b.addr,
            size: b.size,
            stream,
            tag: b.tag.clone(),
        })
        .collect()
}

fn import_segments(
    segments: &[Value],
    device: i64,
    streams: &mut StreamIds,
    tags: &mut TagCache,
) -> Result<Vec<SnapshotSegment>, TraceErrorKind> {
    let mut out = Vec::new();
    for (i, seg) in segments.iter().enumerate() {
        let at = || format!("segments[{i}]");
        if int_field(seg, "device").is_some_and(|d| d != device) {
            continue;
        }
        let addr = u64_field(seg, "address", &at)?;
        let pool = match seg.get("segment_type").and_then(Value::as_str) {
            Some("small") => Pool::Small,
            _ => Pool::Large,
        };
        let blocks_value = seg.get("blocks").and_then(Value::as_seq).unwrap_or(&[]);
        let mut blocks = Vec::with_capacity(blocks_value.len());
        // Older snapshots give blocks no address: they tile the segment in order.
        let mut next_addr = addr;
        for (j, block) in blocks_value.iter().enumerate() {
            let at = || format!("segments[{i}].blocks[{j}]");
            let size = u64_field(block, "size", &at)?;
            let block_addr = opt_u64_field(block, "address", &at)?.unwrap_or(next_addr);
            next_addr = block_addr.saturating_add(size);
            let state = match block.get("state").and_then(Value::as_str) {
                Some("active_allocated") => BlockState::Allocated,
                Some("active_pending_free") => BlockState::PendingFree,
                _ => BlockState::Free,
            };
            blocks.push(SnapshotBlock {
                addr: block_addr,
                size,
                requested_size: opt_u64_field(block, "requested_size", &at)?.unwrap_or(size),
                state,
                tag: block.get("frames").and_then(|f| tags.tag(f)),
            });
        }
        out.push(SnapshotSegment {
            addr,
            total_size: u64_field(seg, "total_size", &at)?,
            stream: streams.id(opt_u64_field(seg, "stream", &at)?.unwrap_or(0)),
            pool,
            is_expandable: seg
                .get("is_expandable")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            blocks,
        });
    }
    Ok(out)
}

/// The fields of one trace entry, found in one pass over its dict (the hot loop).
#[derive(Default)]
struct EventFields<'v> {
    action: Option<&'v Value>,
    addr: Option<&'v Value>,
    size: Option<&'v Value>,
    stream: Option<&'v Value>,
    time_us: Option<&'v Value>,
    frames: Option<&'v Value>,
}

impl<'v> EventFields<'v> {
    fn of(entry: &'v Value, at: &dyn Fn() -> String) -> Result<Self, TraceErrorKind> {
        let Some(dict) = entry.as_dict() else {
            return Err(not_a_snapshot(format!(
                "{} is {}, not a dict",
                at(),
                entry.describe()
            )));
        };
        let mut fields = EventFields::default();
        for (key, value) in dict.iter() {
            let slot = match key.as_str() {
                Some("action") => &mut fields.action,
                Some("addr") => &mut fields.addr,
                Some("size") => &mut fields.size,
                Some("stream") => &mut fields.stream,
                Some("time_us") => &mut fields.time_us,
                Some("frames") => &mut fields.frames,
                _ => continue,
            };
            *slot = Some(value);
        }
        Ok(fields)
    }
}

fn kind_of(action: &str) -> Option<TraceEventKind> {
    Some(match action {
        "alloc" => TraceEventKind::Alloc,
        "free_requested" => TraceEventKind::FreeRequested,
        "free_completed" => TraceEventKind::FreeCompleted,
        "segment_alloc" => TraceEventKind::SegmentAlloc,
        "segment_free" => TraceEventKind::SegmentFree,
        "segment_map" => TraceEventKind::SegmentMap,
        "segment_unmap" => TraceEventKind::SegmentUnmap,
        "oom" => TraceEventKind::Oom,
        "snapshot" => TraceEventKind::Snapshot,
        _ => return None,
    })
}

fn field<'v>(
    entry: &'v Value,
    key: &str,
    at: &dyn Fn() -> String,
) -> Result<&'v Value, TraceErrorKind> {
    if entry.as_dict().is_none() {
        return Err(not_a_snapshot(format!(
            "{} is {}, not a dict",
            at(),
            entry.describe()
        )));
    }
    entry
        .get(key)
        .ok_or_else(|| not_a_snapshot(format!("{}: no '{key}' field", at())))
}

fn int_field(entry: &Value, key: &str) -> Option<i64> {
    entry.get(key).and_then(Value::as_int)
}

fn u64_field(entry: &Value, key: &str, at: &dyn Fn() -> String) -> Result<u64, TraceErrorKind> {
    let value = field(entry, key, at)?;
    to_u64(value).ok_or_else(|| {
        not_a_snapshot(format!(
            "{}: '{key}' is {}, not a non-negative integer",
            at(),
            value.describe()
        ))
    })
}

fn opt_u64_field(
    entry: &Value,
    key: &str,
    at: &dyn Fn() -> String,
) -> Result<Option<u64>, TraceErrorKind> {
    match entry.get(key) {
        None | Some(Value::None) => Ok(None),
        Some(_) => u64_field(entry, key, at).map(Some),
    }
}

fn to_u64(value: &Value) -> Option<u64> {
    value.as_int().and_then(|i| u64::try_from(i).ok())
}

/// The frame dicts of a snapshot are memoized and shared by every event with that
/// frame (the resnet50 trace has 53 of them for 68,861 events): judge and format each
/// one once. The key is only compared, never dereferenced; the frames outlive the cache.
#[derive(Default)]
struct TagCache {
    by_frame: HashMap<*const Dict, Option<String>>,
}

impl TagCache {
    /// The innermost frame outside torch itself, as "file:line function".
    fn tag(&mut self, frames: &Value) -> Option<String> {
        for frame in frames.as_seq()? {
            let Some(dict) = frame.as_dict() else {
                continue;
            };
            let tag = self
                .by_frame
                .entry(dict as *const Dict)
                .or_insert_with(|| user_frame_tag(dict));
            if let Some(tag) = tag {
                return Some(tag.clone());
            }
        }
        None
    }
}

/// "file:line function" for a frame the user wrote; None for torch's own frames.
fn user_frame_tag(frame: &Dict) -> Option<String> {
    let file = frame.get("filename")?.as_str()?;
    if is_internal(file) {
        return None;
    }
    let line = frame.get("line").and_then(Value::as_int).unwrap_or(0);
    let name = frame.get("name").and_then(Value::as_str).unwrap_or("?");
    Some(format!("{file}:{line} {name}"))
}

/// Frames the user did not write: torch's own Python, C++ and other native frames,
/// and generated code ("<frozen runpy>", "<eval_with_key>.3").
fn is_internal(file: &str) -> bool {
    const NATIVE: [&str; 9] = [
        ".cpp", ".cc", ".cxx", ".c", ".cu", ".cuh", ".h", ".hpp", ".so",
    ];
    file.is_empty()
        || file == "??"
        || file.starts_with('<')
        || file.starts_with("torch/")
        || file.starts_with("torch\\")
        || file.contains("/torch/")
        || file.contains("\\torch\\")
        || file.contains(".so.")
        || NATIVE.iter().any(|ext| file.ends_with(ext))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    fn frame(file: &str, line: i64, name: &str) -> Value {
        Value::Dict(Rc::new(Dict::from_pairs([
            (Value::Str("filename".into()), Value::Str(file.into())),
            (Value::Str("line".into()), Value::Int(line)),
            (Value::Str("name".into()), Value::Str(name.into())),
        ])))
    }

    #[test]
    fn tag_skips_torch_and_native_frames() {
        let frames = [
            frame("??", 0, "c10::cuda::CUDACachingAllocator::malloc"),
            frame(
                "/opt/pytorch/aten/src/ATen/native/Linear.cpp",
                90,
                "at::linear",
            ),
            frame("torch/nn/modules/linear.py", 134, "forward"),
            frame(
                "/usr/lib/python3/site-packages/torch/nn/modules/module.py",
                1790,
                "_call_impl",
            ),
            frame("torch_trace.py", 68, "step"),
            frame("torch_trace.py", 17, "run"),
        ];
        let mut tags = TagCache::default();
        let list = |n: usize| Value::List(Rc::new(frames[..n].to_vec()));
        assert_eq!(
            tags.tag(&list(6)).as_deref(),
            Some("torch_trace.py:68 step")
        );
        assert_eq!(tags.tag(&list(3)), None);
        assert_eq!(tags.tag(&Value::List(Rc::new(vec![]))), None);
    }
}
