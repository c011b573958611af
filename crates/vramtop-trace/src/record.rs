//! vramtop's own trace format, written by `--record FILE` and read back by `load`:
//! JSON lines, a header line `{"vramtop_trace":1,...}` first, then one object a line,
//! either a block live from the start (`"kind":"live_at_start"`) or an event (`"kind"`
//! as in `TraceEventKind`, snake_case). Streaming writer, whole-text reader.

use std::io::{self, Write};

use serde::{Deserialize, Serialize};

use super::{bump, LiveAtStart, Trace, TraceErrorKind, TraceEvent, TraceEventKind, TraceFormat};
use vramtop_alloc::StreamId;

/// The format version this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;

const LIVE_AT_START: &str = "live_at_start";

/// The first line of a recording.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordHeader {
    pub vramtop_trace: u32,
    #[serde(default)]
    pub device: i64,
    /// Where the events came from, when they were converted from another format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<TraceFormat>,
    /// The program that wrote the file ("vramtop 0.1.0").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writer: Option<String>,
}

/// Whether `line` is a recording's header line.
pub fn is_header(line: &str) -> bool {
    line.trim_start().starts_with('{') && line.contains("\"vramtop_trace\"")
}

/// Writes a recording line by line, so a live session can append as events happen.
/// Wrap the output in a `BufWriter`; call `flush` when a reader may look.
pub struct RecordWriter<W: Write> {
    out: W,
}

#[derive(Serialize)]
struct LiveLine<'a> {
    kind: &'static str,
    #[serde(flatten)]
    block: &'a LiveAtStart,
}

impl<W: Write> RecordWriter<W> {
    /// Writes the header line.
    pub fn new(mut out: W, device: i64, source: Option<TraceFormat>) -> io::Result<Self> {
        let header = RecordHeader {
            vramtop_trace: FORMAT_VERSION,
            device,
            source,
            writer: Some(concat!("vramtop ", env!("CARGO_PKG_VERSION")).to_string()),
        };
        serde_json::to_writer(&mut out, &header)?;
        out.write_all(b"\n")?;
        Ok(RecordWriter { out })
    }

    pub fn live_at_start(&mut self, block: &LiveAtStart) -> io::Result<()> {
        let line = LiveLine {
            kind: LIVE_AT_START,
            block,
        };
        serde_json::to_writer(&mut self.out, &line)?;
        self.out.write_all(b"\n")
    }

    pub fn event(&mut self, event: &TraceEvent) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, event)?;
        self.out.write_all(b"\n")
    }

    /// Notes that `count` events were lost before being written. Readers count the line
    /// as an unknown action, so `replay` warns that the recording has a gap.
    pub fn missed(&mut self, count: u64) -> io::Result<()> {
        writeln!(
            self.out,
            r#"{{"kind":"missed","addr":0,"size":{count},"stream":0}}"#
        )
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    pub fn into_inner(self) -> W {
        self.out
    }
}

/// Writes a whole trace: header, initial blocks, events. Segments are not recorded.
pub fn write_trace<W: Write>(out: W, trace: &Trace) -> io::Result<W> {
    let mut writer = RecordWriter::new(out, trace.device, Some(trace.source))?;
    for block in &trace.initial {
        writer.live_at_start(block)?;
    }
    for event in &trace.events {
        writer.event(event)?;
    }
    writer.flush()?;
    Ok(writer.into_inner())
}

/// Any line after the header. `kind` stays a string so that a newer writer's kinds
/// are counted as unknown rather than rejected.
#[derive(Deserialize)]
struct Line {
    kind: String,
    addr: u64,
    size: u64,
    #[serde(default)]
    stream: StreamId,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    time_us: Option<i64>,
}

/// Reads a recording (the whole text, header first).
pub fn read(text: &str) -> Result<Trace, TraceErrorKind> {
    let mut lines = text.lines().enumerate();
    let header_text = lines.next().map(|(_, l)| l).unwrap_or("");
    let header: RecordHeader =
        serde_json::from_str(header_text).map_err(|e| TraceErrorKind::Record {
            line: 1,
            message: format!("bad header ({e})"),
        })?;
    if header.vramtop_trace > FORMAT_VERSION || header.vramtop_trace == 0 {
        return Err(TraceErrorKind::Record {
            line: 1,
            message: format!(
                "format version {} is not one this vramtop reads (1 to {FORMAT_VERSION}); \
                 update vramtop",
                header.vramtop_trace
            ),
        });
    }
    let mut trace = Trace {
        source: TraceFormat::VramtopRecord,
        device: header.device,
        initial: Vec::new(),
        initial_segments: Vec::new(),
        events: Vec::new(),
        segments_at_end: Vec::new(),
        settings: Default::default(),
        stats: Default::default(),
    };
    for (i, text) in lines {
        if text.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(text).map_err(|e| TraceErrorKind::Record {
            line: i + 1,
            message: format!("not a trace event ({e})"),
        })?;
        if line.kind == LIVE_AT_START {
            trace.initial.push(LiveAtStart {
                addr: line.addr,
                size: line.size,
                stream: line.stream,
                tag: line.tag.map(Into::into),
            });
            continue;
        }
        bump(&mut trace.stats.actions, &line.kind);
        let Some(kind) = kind_of(&line.kind) else {
            bump(&mut trace.stats.unknown_actions, &line.kind);
            continue;
        };
        trace.events.push(TraceEvent {
            kind,
            addr: line.addr,
            size: line.size,
            stream: line.stream,
            tag: line.tag.map(Into::into),
            time_us: line.time_us,
        });
    }
    trace.tally();
    Ok(trace)
}

fn kind_of(name: &str) -> Option<TraceEventKind> {
    // The names are serde's own, so parse them the way the writer wrote them.
    serde_json::from_value(serde_json::Value::String(name.to_string())).ok()
}
