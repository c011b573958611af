//! Import of a PyTorch memory snapshot (`torch.cuda.memory._snapshot()`), streamed
//! through `pickle`: trace entries are turned into compact events the moment the reader
//! finishes each one (`EntryReader`), so a snapshot of millions of events is never held
//! as a tree; frame lists become one interned call-site tag each. One device's
//! `device_traces` become the event stream, its `segments` the state at the end, and
//! blocks live before the trace began the initial state. Every action PyTorch writes is
//! read (`oom` has no address: it carries the device's free bytes); an unknown action or
//! a malformed entry is skipped and counted, so a newer PyTorch never makes a file
//! unreadable. Knows nothing of files or of other formats.

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasherDefault;
use std::io::Read;
use std::rc::Rc;
use std::sync::Arc;

use super::cause::{AllocatedSeries, GpuProcess, GpuProcesses};
use super::history;
use super::pickle::{self, Dict, Finished, IdHasher, Value};
use super::roles::Roles;
use super::{
    AllocatorSettings, InitialSegment, KeptOom, LiveAtStart, LoadOptions, SnapshotBlock,
    SnapshotSegment, StreamIds, Trace, TraceErrorKind, TraceEvent, TraceEventKind, TraceFormat,
    TraceStats,
};
use vramtop_alloc::{BlockState, Pool};

const WHAT_TO_DO: &str = "expected a dict from torch.cuda.memory._snapshot() with 'segments' \
                          and 'device_traces'; write one with torch.cuda.memory._dump_snapshot()";

fn not_a_snapshot(what: String) -> TraceErrorKind {
    TraceErrorKind::NotASnapshot(what)
}

/// Reads a pickled snapshot from `reader` (already gunzipped).
pub(super) fn import_reader(
    reader: impl Read,
    opts: &LoadOptions,
) -> Result<Trace, TraceErrorKind> {
    let mut entries = EntryReader::default();
    let root = {
        let mut reduce = |finished: Finished<'_>| entries.reduce(finished);
        pickle::from_reader(
            reader,
            opts.max_bytes,
            opts.pickle_limits,
            Some(&mut reduce),
        )
    }
    .map_err(|e| match e {
        pickle::ReadError::Io(e) => TraceErrorKind::Io(e),
        pickle::ReadError::TooLarge => TraceErrorKind::TooLarge {
            limit: opts.max_bytes,
        },
        pickle::ReadError::Pickle(e) => TraceErrorKind::Pickle(e),
    })?;
    import(&root, entries, opts)
}

fn import(
    root: &Value,
    mut entries: EntryReader,
    opts: &LoadOptions,
) -> Result<Trace, TraceErrorKind> {
    let device = opts.device;
    let (traces, segments) = top_level(root)?;
    // A device's trace counts when it holds more than `snapshot` markers: PyTorch writes
    // one into every device's ring at each snapshot, so a DDP rank's file has a trace of
    // markers alone for each other GPU its process touched (rank 0 of a torchrun job on
    // two H200s: one for cuda:1), which must not be taken for the rank's own.
    let holds_history = |e: &Value| match e {
        Value::Reduced(i) => {
            entries.skipped.contains_key(i)
                || entries
                    .entries
                    .get(*i as usize)
                    .is_some_and(|event| event.kind != TraceEventKind::Snapshot)
        }
        _ => true,
    };
    let devices_with_traces: Vec<i64> = traces
        .iter()
        .enumerate()
        .filter(|(_, t)| {
            t.as_seq()
                .is_some_and(|events| events.iter().any(holds_history))
        })
        .map(|(i, _)| i as i64)
        .collect();
    // A file the hook kept at an OOM is about the device that ran out.
    let kept = root.get("vramtop_oom").and_then(kept_oom);
    // Unless told, the first device with a trace; failing that, the first with segments.
    let chosen = match (device, &kept) {
        (Some(d), _) => d,
        (None, Some(kept)) => kept.device,
        (None, None) => devices_with_traces
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

    // The hook's `oom` entry in a snapshot kept without history is not history.
    let added_by_hook =
        |e: &Value| matches!(e, Value::Reduced(i) if entries.hook_added.contains(i));
    let mut stats = TraceStats {
        devices_with_traces,
        no_history: device_trace.iter().all(added_by_hook),
        kept_oom: kept,
        ..TraceStats::default()
    };
    // Hook 1.3: the history begins at a checkpoint; the ring's first entries are in it.
    // It is the OOM's device's: another device's trace begins at CUDA's start.
    let checkpoint = root
        .get("vramtop_oom")
        .filter(|_| stats.kept_oom.as_ref().is_some_and(|k| k.device == chosen))
        .and_then(|k| k.get("checkpoint"))
        .filter(|c| c.as_dict().is_some());
    let skip = checkpoint
        .and_then(|c| int_field(c, "skip"))
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0)
        .min(device_trace.len());
    let mut events = entries.events_of(&device_trace[skip..], chosen, &mut stats);
    let segments_at_end = import_segments(segments, chosen, &mut entries)?;
    if device.is_some() && device_trace.is_empty() && segments_at_end.is_empty() {
        return Err(not_a_snapshot(format!(
            "device {chosen} has neither a trace nor segments in this snapshot; \
             pick another device"
        )));
    }
    // Where the replay starts: the checkpoint's segments, else what the events and the
    // final segments say was there before the trace began.
    let (initial, initial_segments) = match checkpoint {
        Some(cp) => {
            // A checkpoint that cannot be read leaves the file's state at the OOM readable:
            // only its history is unusable (no verdict is replayed from it).
            let Ok(at_checkpoint) = import_segments(
                cp.get("segments").and_then(Value::as_seq).unwrap_or(&[]),
                chosen,
                &mut entries,
            ) else {
                if let Some(kept) = stats.kept_oom.as_mut() {
                    kept.ring_complete = false;
                }
                return Ok(finish(
                    chosen,
                    (Vec::new(), Vec::new()),
                    events,
                    segments_at_end,
                    root,
                    stats,
                ));
            };
            let time_us = match cp.get("time_s") {
                Some(Value::Float(s)) if s.is_finite() => (*s * 1e6) as i64,
                _ => 0,
            };
            let (reconciled, contradictions) =
                super::checkpoint::reconcile(&at_checkpoint, &mut events);
            // Hook 1.5: the history before the checkpoint, when it stitches up to it.
            // Its ring must not have been full (the oldest entries gone), nor may the events
            // since the checkpoint contradict it: from the job's start no checkpoint is
            // left to say so.
            let ring_size = root
                .get("vramtop_oom")
                .and_then(|k| k.get("ring"))
                .and_then(|r| int_field(r, "max_entries"))
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(usize::MAX);
            let stitched = root
                .get("vramtop_oom")
                .and_then(|k| k.get("history"))
                .and_then(|h| history_pieces(h, chosen, ring_size, opts, &mut entries))
                .and_then(history::stitch)
                .filter(|s| {
                    s.contradictions == 0
                        && contradictions == 0
                        && history::same_live(&s.last, &at_checkpoint)
                });
            let Some(stitched) = stitched else {
                if let Some(kept) = stats.kept_oom.as_mut() {
                    kept.checkpoint = Some(crate::Checkpoint {
                        time_us,
                        skipped: skip as u64,
                        reconciled,
                        contradictions,
                    });
                }
                return Ok(finish(
                    chosen,
                    super::checkpoint::initial_state(&at_checkpoint),
                    events,
                    segments_at_end,
                    root,
                    stats,
                ));
            };
            let from = stitched.events.first().and_then(|e| e.time_us);
            if let Some(kept) = stats.kept_oom.as_mut() {
                kept.history = Some(crate::KeptHistory {
                    pieces: stitched.pieces,
                    from_start: stitched.base.is_none(),
                    filled: stitched.filled,
                    events: stitched.events.len(),
                    restart: stitched
                        .restart
                        .clone()
                        .map(|(event, segments)| crate::GapRestart { event, segments }),
                    gaps: stitched.gaps.clone(),
                });
                // From the job's start there is no checkpoint to begin from.
                kept.checkpoint = stitched.base.as_ref().map(|_| crate::Checkpoint {
                    time_us: from.unwrap_or(time_us),
                    skipped: skip as u64,
                    reconciled,
                    contradictions,
                });
            }
            let mut all = stitched.events;
            all.append(&mut events);
            events = all;
            match &stitched.base {
                Some(base) => super::checkpoint::initial_state(base),
                None => (Vec::new(), Vec::new()),
            }
        }
        None => super::initial::infer(&segments_at_end, &events),
    };
    Ok(finish(
        chosen,
        (initial, initial_segments),
        events,
        segments_at_end,
        root,
        stats,
    ))
}

/// Hook 1.5: the pieces of `vramtop_oom.history` for `device`, each a snapshot as
/// PyTorch's C++ pickles it, zlib-compressed. Where an older piece cannot be read, or the
/// pieces inflate past the reader's limit, they begin at the newest state after it; None
/// where that leaves nothing the checkpoint does not say (the history then begins at the
/// checkpoint, as without it). Streams keep the numbers the file's own entries gave them.
fn history_pieces(
    history: &Value,
    device: i64,
    ring_size: usize,
    opts: &LoadOptions,
    entries: &mut EntryReader,
) -> Option<Vec<history::Piece>> {
    if int_field(history, "version") != Some(1) {
        return None;
    }
    let listed = history.get("pieces").and_then(Value::as_seq)?;
    let mut reader = EntryReader {
        streams: std::mem::take(&mut entries.streams),
        ..EntryReader::default()
    };
    // Newest first: where the pieces inflate past the reader's limit, or one cannot be
    // read, the history still begins at the newest checkpoint before them (rather than
    // nowhere, which left a full 32 MiB history of a long job unread).
    let mut newest_first = Vec::new();
    let mut left = opts.max_bytes;
    for piece in listed.iter().rev() {
        // Compressed once the checkpoint is past; an OOM right at it finds the last ones
        // as read.
        let (bytes, compressed) = match (piece.get("zlib"), piece.get("pickle")) {
            (Some(Value::Bytes(b)), _) => (b, true),
            (_, Some(Value::Bytes(b))) => (b, false),
            _ => break,
        };
        let kind = piece.get("kind").and_then(Value::as_str);
        let read = read_piece(
            bytes,
            compressed,
            kind,
            device,
            ring_size,
            left,
            opts,
            &mut reader,
        );
        let Some((piece, size)) = read else { break };
        left = left.saturating_sub(size);
        newest_first.push(piece);
    }
    let whole = newest_first.len() == listed.len();
    let mut pieces: Vec<history::Piece> = newest_first.into_iter().rev().collect();
    if !whole {
        // Cut short, it can only begin at a state; and a state with no events after it
        // is the checkpoint the file carries anyway.
        let first_state = pieces
            .iter()
            .position(|p| matches!(p, history::Piece::State(_)))
            .unwrap_or(pieces.len());
        pieces.drain(..first_state);
        if pieces.len() < 3 {
            pieces.clear();
        }
    }
    entries.streams = std::mem::take(&mut reader.streams);
    (!pieces.is_empty()).then_some(pieces)
}

/// One piece: its events (`events`) or its segments (`state`), and the bytes it took.
#[allow(clippy::too_many_arguments)]
fn read_piece(
    bytes: &[u8],
    compressed: bool,
    kind: Option<&str>,
    device: i64,
    ring_size: usize,
    left: u64,
    opts: &LoadOptions,
    reader: &mut EntryReader,
) -> Option<(history::Piece, u64)> {
    let mut inflated = Vec::new();
    let pickled: &[u8] = if compressed {
        flate2::read::ZlibDecoder::new(bytes)
            .take(left.saturating_add(1))
            .read_to_end(&mut inflated)
            .ok()?;
        &inflated
    } else {
        bytes
    };
    if pickled.len() as u64 > left {
        return None;
    }
    // Each piece's entries are its own: numbered from 0 again.
    reader.entries.clear();
    reader.skipped.clear();
    reader.hook_added.clear();
    let root = {
        let mut reduce = |finished: Finished<'_>| reader.reduce(finished);
        pickle::from_reader(pickled, left, opts.pickle_limits, Some(&mut reduce)).ok()?
    };
    let (traces, segments) = top_level(&root).ok()?;
    let piece = match kind? {
        "events" => {
            let trace = usize::try_from(device)
                .ok()
                .and_then(|i| traces.get(i))
                .and_then(Value::as_seq)
                .unwrap_or(&[]);
            if trace.len() >= ring_size {
                return None; // a full ring: its oldest entries are gone
            }
            let mut stats = TraceStats::default();
            history::Piece::Events(reader.events_of(trace, device, &mut stats))
        }
        "state" => history::Piece::State(import_segments(segments, device, reader).ok()?),
        _ => return None,
    };
    Some((piece, pickled.len() as u64))
}

/// The trace of `device`, from where its replay starts, its events and its final segments.
fn finish(
    device: i64,
    (initial, initial_segments): (Vec<LiveAtStart>, Vec<InitialSegment>),
    mut events: Vec<TraceEvent>,
    segments_at_end: Vec<SnapshotSegment>,
    root: &Value,
    stats: TraceStats,
) -> Trace {
    super::graph_pools::separate(&mut events, &initial_segments, &segments_at_end);
    let mut trace = Trace {
        source: TraceFormat::PytorchSnapshot,
        device,
        initial,
        initial_segments,
        events,
        segments_at_end,
        settings: settings_of(root.get("allocator_settings")),
        stats,
    };
    trace.tally();
    trace
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

/// A trace entry the reader could not use: skipped and counted.
enum Skipped {
    /// An action this version of vramtop does not know.
    Unknown(Arc<str>),
    /// A required field missing or of the wrong type.
    Bad(BadEntry),
}

/// What is wrong with a trace entry vramtop skips (counted as malformed in the stats).
#[derive(Clone, Debug)]
enum BadEntry {
    /// A number field holding something else (`found` describes it).
    NotANumber { key: &'static str, found: String },
    /// A field this kind of entry needs.
    Missing(&'static str),
    /// A reference to something that is not one of the trace's entries.
    NotAnEntry,
    /// A dict without an 'action' string.
    NoAction,
    /// Not a dict at all (`found` describes it).
    NotADict(String),
}

impl fmt::Display for BadEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadEntry::NotANumber { key, found } => {
                write!(f, "'{key}' is {found}, not a non-negative integer")
            }
            BadEntry::Missing(key) => write!(f, "no '{key}' field"),
            BadEntry::NotAnEntry => f.write_str("is not a trace entry"),
            BadEntry::NoAction => f.write_str("no 'action' string"),
            BadEntry::NotADict(found) => write!(f, "is {found}, not a dict"),
        }
    }
}

/// A frame dict, held, and the call-site tag it gives.
type FrameTag = (Rc<Dict>, Option<Arc<str>>);

/// `Value::Reduced` numbers with this bit set are call-site tags (a frame list), the
/// others trace entries.
const TAG_BIT: u32 = 1 << 31;

/// Turns trace entries and frame lists into compact events and interned tags while the
/// pickle is read: the reducer `pickle` calls for every list and dict it finishes.
#[derive(Default)]
struct EntryReader {
    /// Every trace entry read, by number; skipped ones hold a placeholder event and
    /// their reason in `skipped`. Kept as events so one device's trace (the usual
    /// case) becomes the event stream without a copy.
    entries: Vec<TraceEvent>,
    skipped: HashMap<u32, Skipped>,
    streams: StreamIds,
    /// Call-site tags by number: the innermost user frame of a frame list, or None.
    tags: Vec<Option<Arc<str>>>,
    tag_ids: HashMap<Option<Arc<str>>, u32>,
    /// The user frame of each frame dict (shared by every list that holds it), by address.
    /// The dict is held here too: one the memo does not hold would otherwise be freed,
    /// and a later frame at its address would take its tag.
    by_frame: HashMap<*const Dict, FrameTag, BuildHasherDefault<IdHasher>>,
    /// Entries the vramtop hook added (`vramtop_added`): an `oom` in a snapshot kept
    /// without history, which is not history.
    hook_added: std::collections::HashSet<u32>,
}

impl EntryReader {
    fn reduce(&mut self, finished: Finished<'_>) -> Option<Value> {
        match finished {
            Finished::List(items) if is_frame_list(items) => {
                let tag = self.user_frame(items);
                let next = self.tags.len() as u32;
                if next >= TAG_BIT {
                    return None;
                }
                let id = *self.tag_ids.entry(tag.clone()).or_insert_with(|| {
                    self.tags.push(tag);
                    next
                });
                Some(Value::Reduced(TAG_BIT | id))
            }
            Finished::Dict(dict) => {
                let action = dict.get("action")?.as_str()?;
                let index = u32::try_from(self.entries.len())
                    .ok()
                    .filter(|&i| i < TAG_BIT)?;
                if dict.get("vramtop_added").and_then(Value::as_bool) == Some(true) {
                    self.hook_added.insert(index);
                }
                let event = match self.entry(action, dict) {
                    Ok(event) => event,
                    Err(skipped) => {
                        self.skipped.insert(index, skipped);
                        PLACEHOLDER
                    }
                };
                self.entries.push(event);
                Some(Value::Reduced(index))
            }
            Finished::List(_) => None,
        }
    }

    /// The innermost frame outside torch itself, as "file:line function".
    fn user_frame(&mut self, frames: &[Value]) -> Option<Arc<str>> {
        for frame in frames {
            let Value::Dict(dict) = frame else {
                continue;
            };
            let (_, tag) = self
                .by_frame
                .entry(Rc::as_ptr(dict))
                .or_insert_with(|| (dict.clone(), user_frame_tag(dict).map(Arc::from)));
            if tag.is_some() {
                return tag.clone();
            }
        }
        None
    }

    /// The tag a `frames` value stands for (a reduced frame list, or a plain one).
    fn tag_of(&mut self, frames: Option<&Value>) -> Option<Arc<str>> {
        match frames? {
            Value::Reduced(n) if n & TAG_BIT != 0 => {
                self.tags.get((n & !TAG_BIT) as usize).cloned().flatten()
            }
            Value::List(items) | Value::Tuple(items) => self.user_frame(items),
            _ => None,
        }
    }

    fn entry(&mut self, action: &str, dict: &Dict) -> Result<TraceEvent, Skipped> {
        let Some(kind) = kind_of(action) else {
            return Err(Skipped::Unknown(Arc::from(action)));
        };
        let fields = EventFields::of(dict);
        let number = |key: &'static str, value: Option<&Value>| -> Result<Option<u64>, BadEntry> {
            match value {
                None | Some(Value::None) => Ok(None),
                Some(v) => to_u64(v).map(Some).ok_or_else(|| BadEntry::NotANumber {
                    key,
                    found: v.describe(),
                }),
            }
        };
        let parsed = (|| -> Result<TraceEvent, BadEntry> {
            let addr = number("addr", fields.addr)?;
            let size = number("size", fields.size)?;
            let device_free = number("device_free", fields.device_free)?;
            let required = |name: &'static str, v: Option<u64>| v.ok_or(BadEntry::Missing(name));
            let (addr, size) = match kind {
                // PyTorch writes the device's free bytes in 'device_free' (older versions
                // put them in 'addr'); an OOM has no address of its own.
                TraceEventKind::Oom => (device_free.or(addr).unwrap_or(0), required("size", size)?),
                TraceEventKind::Snapshot => (addr.unwrap_or(0), size.unwrap_or(0)),
                _ => (required("addr", addr)?, required("size", size)?),
            };
            Ok(TraceEvent {
                kind,
                addr,
                size,
                stream: self
                    .streams
                    .id(number("stream", fields.stream)?.unwrap_or(0)),
                tag: None,
                time_us: fields.time_us.and_then(Value::as_int),
            })
        })();
        let mut event = parsed.map_err(Skipped::Bad)?;
        event.tag = self.tag_of(fields.frames);
        Ok(event)
    }

    /// The events of one device's trace, in order; skipped entries are counted in `stats`.
    fn events_of(
        &mut self,
        trace: &[Value],
        device: i64,
        stats: &mut TraceStats,
    ) -> Vec<TraceEvent> {
        let in_order = trace.len() == self.entries.len()
            && trace
                .iter()
                .enumerate()
                .all(|(i, v)| matches!(v, Value::Reduced(n) if *n as usize == i));
        let mut events = if in_order {
            // One device and nothing odd: the entries are its events, in order.
            std::mem::take(&mut self.entries)
        } else {
            let mut picked = Vec::with_capacity(trace.len());
            for value in trace {
                let event = match value {
                    Value::Reduced(n) if n & TAG_BIT == 0 => self.entries.get(*n as usize).cloned(),
                    _ => None,
                };
                picked.push(event.unwrap_or(PLACEHOLDER));
            }
            picked
        };
        // Skipped entries are dropped here, where their position is known.
        let mut i = 0;
        events.retain(|_| {
            let position = i;
            i += 1;
            let why = match &trace[position] {
                Value::Reduced(n) if n & TAG_BIT == 0 => match self.skipped.get(n) {
                    None if (*n as usize) < self.entries.len() || in_order => return true,
                    None => Skipped::Bad(BadEntry::NotAnEntry),
                    Some(Skipped::Unknown(action)) => Skipped::Unknown(action.clone()),
                    Some(Skipped::Bad(why)) => Skipped::Bad(why.clone()),
                },
                Value::Dict(_) => Skipped::Bad(BadEntry::NoAction),
                other => Skipped::Bad(BadEntry::NotADict(other.describe())),
            };
            match why {
                Skipped::Unknown(action) => {
                    super::bump(&mut stats.actions, &action);
                    super::bump(&mut stats.unknown_actions, &action);
                }
                Skipped::Bad(why) => {
                    stats.note_malformed(format!("device_traces[{device}][{position}]: {why}"))
                }
            }
            false
        });
        let mut per_kind = [0u64; KINDS.len()];
        for event in &events {
            per_kind[event.kind as usize] += 1;
        }
        for (kind, count) in KINDS.iter().zip(per_kind) {
            if count > 0 {
                *stats
                    .actions
                    .entry(action_name(*kind).to_string())
                    .or_default() += count;
            }
        }
        events
    }
}

/// Stands in for a skipped entry until it is dropped.
const PLACEHOLDER: TraceEvent = TraceEvent {
    kind: TraceEventKind::Snapshot,
    addr: 0,
    size: 0,
    stream: 0,
    tag: None,
    time_us: None,
};

/// A non-empty list of frame dicts (the first has a 'filename'; a frame list is
/// uniform, and `user_frame` skips anything else).
fn is_frame_list(items: &[Value]) -> bool {
    items
        .first()
        .and_then(Value::as_dict)
        .is_some_and(|d| d.get("filename").is_some())
}

/// The snapshot's `allocator_settings`, as PyTorch 2.x writes them; what is missing
/// or of another shape keeps PyTorch's default.
fn settings_of(value: Option<&Value>) -> AllocatorSettings {
    let mut settings = AllocatorSettings::default();
    let Some(dict) = value.and_then(Value::as_dict) else {
        return settings;
    };
    settings.max_split_size = dict
        .get("max_split_size")
        .and_then(Value::as_int)
        .and_then(|n| u64::try_from(n).ok())
        .filter(|&n| n > 0 && n < u64::MAX / 2);
    settings.garbage_collection_threshold = match dict.get("garbage_collection_threshold") {
        Some(Value::Float(f)) if *f > 0.0 => Some(*f),
        _ => None,
    };
    settings.expandable_segments = dict
        .get("expandable_segments")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    settings.conf = dict
        .get("PYTORCH_CUDA_ALLOC_CONF")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
        .map(str::to_string);
    // {"1": d, "2": d, ..., "32768": d}: divisions per interval, keyed by its MiB start.
    if let Some(divisions) = dict
        .get("roundup_power2_divisions")
        .and_then(Value::as_dict)
    {
        for (key, value) in divisions.iter() {
            let (Some(mib), Some(d)) = (
                key.as_str().and_then(|k| k.parse::<u64>().ok()),
                value.as_int(),
            ) else {
                continue;
            };
            if mib.is_power_of_two() {
                let index = mib.trailing_zeros() as usize;
                if let (Some(slot), Ok(d)) = (
                    settings.roundup_power2_divisions.get_mut(index),
                    u32::try_from(d),
                ) {
                    *slot = d;
                }
            }
        }
    }
    settings
}

/// More blocks than any device holds (a block is at least 512 B: 10 M blocks are 5 GB
/// of the smallest): past it a snapshot is refused rather than expanded.
const MAX_BLOCKS: usize = 10_000_000;

fn import_segments(
    segments: &[Value],
    device: i64,
    entries: &mut EntryReader,
) -> Result<Vec<SnapshotSegment>, TraceErrorKind> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut total_blocks = 0usize;
    for (i, seg) in segments.iter().enumerate() {
        let at = || format!("segments[{i}]");
        if int_field(seg, "device").is_some_and(|d| d != device) {
            continue;
        }
        let addr = u64_field(seg, "address", &at)?;
        // A pickle can name one segment many times (memo references): it is one segment.
        if !seen.insert(addr) {
            continue;
        }
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
            // Blocks tile their segment in address order: one that starts before the end
            // of the last (a repeated reference) is not a block of its own.
            if j > 0 && block_addr < next_addr {
                continue;
            }
            total_blocks += 1;
            if total_blocks > MAX_BLOCKS {
                return Err(not_a_snapshot(format!(
                    "{}: the segments hold more than {MAX_BLOCKS} blocks; this is not a \
                     snapshot PyTorch wrote",
                    at()
                )));
            }
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
                tag: entries.tag_of(block.get("frames")),
            });
        }
        let stream = opt_u64_field(seg, "stream", &at)?.unwrap_or(0);
        out.push(SnapshotSegment {
            addr,
            total_size: u64_field(seg, "total_size", &at)?,
            stream: entries.streams.in_pool(stream, pool_id(seg)),
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

/// A segment's `segment_pool_id` (PyTorch 2.1 on): (0, 0) for the allocator's own pools,
/// another pair for a private pool (a CUDA graph's, a `MemPool`'s). Absent or unreadable:
/// (0, 0).
fn pool_id(seg: &Value) -> (i64, i64) {
    let pair = seg.get("segment_pool_id").and_then(Value::as_seq);
    match pair {
        Some([a, b]) => (a.as_int().unwrap_or(0), b.as_int().unwrap_or(0)),
        _ => (0, 0),
    }
}

/// The fields of one trace entry, found in one pass over its dict (the hot loop).
#[derive(Default)]
struct EventFields<'v> {
    addr: Option<&'v Value>,
    size: Option<&'v Value>,
    stream: Option<&'v Value>,
    time_us: Option<&'v Value>,
    frames: Option<&'v Value>,
    device_free: Option<&'v Value>,
}

impl<'v> EventFields<'v> {
    fn of(dict: &'v Dict) -> Self {
        let mut fields = EventFields::default();
        for (key, value) in dict.iter() {
            let slot = match key.as_str() {
                Some("addr") => &mut fields.addr,
                Some("size") => &mut fields.size,
                Some("stream") => &mut fields.stream,
                Some("time_us") => &mut fields.time_us,
                Some("frames") => &mut fields.frames,
                Some("device_free") => &mut fields.device_free,
                _ => continue,
            };
            *slot = Some(value);
        }
        fields
    }
}

/// Every kind, in declaration order (`kind as usize` indexes it).
const KINDS: [TraceEventKind; 9] = [
    TraceEventKind::Alloc,
    TraceEventKind::FreeRequested,
    TraceEventKind::FreeCompleted,
    TraceEventKind::SegmentAlloc,
    TraceEventKind::SegmentFree,
    TraceEventKind::SegmentMap,
    TraceEventKind::SegmentUnmap,
    TraceEventKind::Oom,
    TraceEventKind::Snapshot,
];

/// The action as PyTorch spells it.
fn action_name(kind: TraceEventKind) -> &'static str {
    match kind {
        TraceEventKind::Alloc => "alloc",
        TraceEventKind::FreeRequested => "free_requested",
        TraceEventKind::FreeCompleted => "free_completed",
        TraceEventKind::SegmentAlloc => "segment_alloc",
        TraceEventKind::SegmentFree => "segment_free",
        TraceEventKind::SegmentMap => "segment_map",
        TraceEventKind::SegmentUnmap => "segment_unmap",
        TraceEventKind::Oom => "oom",
        TraceEventKind::Snapshot => "snapshot",
    }
}

fn kind_of(action: &str) -> Option<TraceEventKind> {
    KINDS.into_iter().find(|&k| action_name(k) == action)
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

/// The hook's `vramtop_oom` dict; None when it is not one (a hand-made or damaged file).
fn kept_oom(value: &Value) -> Option<KeptOom> {
    value.as_dict()?;
    let uint = |key: &str| int_field(value, key).and_then(|v| u64::try_from(v).ok());
    let time_us = match value.get("time_s") {
        Some(Value::Float(s)) if s.is_finite() => (*s * 1e6) as i64,
        Some(v) => v.as_int().map_or(0, |s| s.saturating_mul(1_000_000)),
        None => 0,
    };
    Some(KeptOom {
        number: uint("number")?,
        pid: uint("pid")?,
        argv: value
            .get("argv")
            .and_then(Value::as_seq)
            .map(|args| {
                args.iter()
                    .filter_map(|a| a.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
        time_us,
        device: int_field(value, "device")?,
        requested_bytes: uint("requested_bytes")?,
        device_free_bytes: uint("device_free_bytes").unwrap_or(0),
        device_total_bytes: uint("device_total_bytes").unwrap_or(0),
        summary: value
            .get("summary")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        history_left_out: value.get("history_left_out").and_then(Value::as_bool) == Some(true),
        ring_complete: value
            .get("ring")
            .and_then(|ring| ring.get("complete"))
            .and_then(Value::as_bool)
            == Some(true),
        checkpoint: None, // set by `import`, which reads its segments
        steps_us: times_us(value.get("steps")),
        passes_us: times_us(value.get("passes")),
        accumulating: uint("accumulating").unwrap_or(0),
        physical_total_bytes: uint("physical_total_bytes"),
        series: value.get("series").and_then(allocated_series),
        step_series: value.get("step_series").and_then(allocated_series),
        gpu_processes: value.get("gpu_processes").and_then(gpu_processes),
        roles: value.get("roles").and_then(roles),
        history: None, // set by `import`, which reads its pieces
        rank: uint("rank").map(|rank| (rank, uint("world_size"))),
    })
}

/// `time.time()` marks (`steps`, `passes`) in microseconds; none where absent.
fn times_us(value: Option<&Value>) -> Vec<i64> {
    value
        .and_then(Value::as_seq)
        .map(|times| {
            times
                .iter()
                .filter_map(|t| match t {
                    Value::Float(s) if s.is_finite() && *s > 0.0 => Some((*s * 1e6) as i64),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The hook's `{"period_s": .., "rows": [[time_s, low, high], ..]}`; rows that are not
/// three numbers are skipped.
fn allocated_series(value: &Value) -> Option<AllocatedSeries> {
    let number = |v: &Value| match v {
        Value::Float(f) if f.is_finite() => Some(*f),
        v => v.as_int().map(|i| i as f64),
    };
    let rows = value
        .get("rows")?
        .as_seq()?
        .iter()
        .filter_map(|row| match row.as_seq()? {
            [t, low, high] => Some((number(t)?, number(low)?, number(high)?)),
            _ => None,
        })
        .collect();
    Some(AllocatedSeries {
        period_s: value.get("period_s").and_then(number).unwrap_or(0.0),
        rows,
    })
}

/// The hook's `roles`: bytes by role; None unless a dict with the parameters' bytes.
fn roles(value: &Value) -> Option<Roles> {
    let uint = |key: &str| int_field(value, key).and_then(|v| u64::try_from(v).ok());
    Some(Roles {
        parameters: uint("parameters")?,
        gradients: uint("gradients").unwrap_or(0),
        optimizer_state: uint("optimizer_state").unwrap_or(0),
        trained: uint("trained").unwrap_or(0),
        frozen: uint("frozen").unwrap_or(0),
        models: uint("models").unwrap_or(0),
        optimizers: uint("optimizers").unwrap_or(0),
        time_s: match value.get("time_s") {
            Some(Value::Float(t)) if t.is_finite() => Some(*t),
            _ => None,
        },
        allocated: uint("allocated"),
        reserved: uint("reserved"),
        first_pass: matches!(value.get("first_pass"), Some(Value::Bool(true))),
    })
}

/// The hook's `gpu_processes`: NVML's list with what /proc said of each.
fn gpu_processes(value: &Value) -> Option<GpuProcesses> {
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_string);
    let processes = value
        .get("processes")?
        .as_seq()?
        .iter()
        .filter_map(|p| {
            Some(GpuProcess {
                pid: u32::try_from(int_field(p, "pid")?).ok()?,
                bytes: int_field(p, "bytes").and_then(|b| u64::try_from(b).ok()),
                own: p.get("own").and_then(Value::as_bool) == Some(true),
                user: text(p, "user"),
                command: text(p, "command"),
                frameworks: p.get("frameworks").and_then(Value::as_seq).map(|names| {
                    names
                        .iter()
                        .filter_map(|n| n.as_str().map(str::to_string))
                        .collect()
                }),
            })
        })
        .collect();
    Some(GpuProcesses {
        processes,
        own_pid_listed: value.get("own_pid_listed").and_then(Value::as_bool) == Some(true),
    })
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
        let mut reader = EntryReader::default();
        let list = |n: usize| Value::List(Rc::new(frames[..n].to_vec()));
        assert_eq!(
            reader.tag_of(Some(&list(6))).as_deref(),
            Some("torch_trace.py:68 step")
        );
        assert_eq!(reader.tag_of(Some(&list(3))), None);
        assert_eq!(reader.tag_of(Some(&Value::List(Rc::new(vec![])))), None);
        // A frame list read by the pickle reader becomes one interned tag.
        let reduced = reader.reduce(Finished::List(&frames));
        assert!(matches!(reduced, Some(Value::Reduced(n)) if n & TAG_BIT != 0));
        assert_eq!(
            reader.tag_of(reduced.as_ref()).as_deref(),
            Some("torch_trace.py:68 step")
        );
    }
}
