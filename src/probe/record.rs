//! `--record FILE`: the allocator's events, as they happen, written in vramtop's own trace
//! format (JSON lines, read back by `vramtop replay`). The recorder reads the allocator's
//! event ring, so it never slows the allocator; if it falls behind, a `missed` line in the
//! file says how many events were lost, and `replay` warns of it.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter};
use std::path::Path;
use std::sync::Arc;

use vramtop_alloc::{Allocator, Event, EventKind, EventReceiver, TagId};
use vramtop_trace::record::RecordWriter;
use vramtop_trace::{TraceEvent, TraceEventKind, TraceFormat};

pub struct Recorder {
    allocator: Arc<Allocator>,
    events: EventReceiver,
    writer: RecordWriter<BufWriter<File>>,
    tags: HashMap<TagId, std::sync::Arc<str>>,
    buffer: Vec<Event>,
    pub written: u64,
    /// Events lost because the ring overflowed before they were read.
    pub missed: u64,
}

impl Recorder {
    /// Creates the file (replacing one that exists) and starts following `allocator`.
    pub fn create(path: &Path, allocator: Arc<Allocator>) -> io::Result<Recorder> {
        let file = File::create(path)?;
        let writer = RecordWriter::new(BufWriter::new(file), 0, Some(TraceFormat::VramtopRecord))?;
        Ok(Recorder {
            events: allocator.subscribe(),
            allocator,
            writer,
            tags: HashMap::new(),
            buffer: Vec::new(),
            written: 0,
            missed: 0,
        })
    }

    /// Writes every event since the last call.
    pub fn drain(&mut self) -> io::Result<()> {
        self.buffer.clear();
        let missed = self.events.drain(&mut self.buffer);
        if missed > 0 {
            self.missed += missed;
            self.writer.missed(missed)?;
        }
        for i in 0..self.buffer.len() {
            let event = self.convert(i);
            self.writer.event(&event)?;
            self.written += 1;
        }
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.drain()?;
        self.writer.flush()
    }

    fn convert(&mut self, i: usize) -> TraceEvent {
        let e = &self.buffer[i];
        let kind = match e.kind {
            EventKind::Alloc => TraceEventKind::Alloc,
            EventKind::FreeRequested => TraceEventKind::FreeRequested,
            // A free in our allocator releases the block (or completes a deferred one).
            EventKind::Free => TraceEventKind::FreeCompleted,
            EventKind::SegmentAlloc => TraceEventKind::SegmentAlloc,
            EventKind::SegmentFree => TraceEventKind::SegmentFree,
            EventKind::PageMap => TraceEventKind::SegmentMap,
            EventKind::PageUnmap => TraceEventKind::SegmentUnmap,
            EventKind::Oom => TraceEventKind::Oom,
        };
        let tag = e.tag.map(|t| {
            let allocator = &self.allocator;
            self.tags
                .entry(t)
                .or_insert_with(|| {
                    allocator
                        .tag_name(t)
                        .unwrap_or_else(|| "?".to_string())
                        .into()
                })
                .clone()
        });
        TraceEvent {
            kind,
            addr: e.addr,
            size: e.size,
            stream: e.stream,
            tag,
            time_us: Some((e.time_ns / 1000) as i64),
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        // Last events and the buffer reach the file even when the app quits mid-run.
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::{Probe, Scenario};
    use vramtop_alloc::backing::BookkeepingBacking;
    use vramtop_alloc::{AllocConfig, PolicyKind};

    #[test]
    fn a_recorded_probe_replays_to_the_same_peak() {
        let path =
            std::env::temp_dir().join(format!("vramtop-record-{}.jsonl", std::process::id()));
        let allocator = Arc::new(Allocator::new(
            PolicyKind::Caching,
            Box::new(BookkeepingBacking::new(1 << 30)),
            AllocConfig::default(),
        ));
        let mut recorder = Recorder::create(&path, allocator.clone()).expect("temp file");
        let scenario = Scenario::load("training").expect("built-in");
        let mut probe = Probe::new(&scenario, allocator.clone(), "bookkeeping", 3);
        while probe.step() {
            recorder.drain().expect("write");
        }
        recorder.flush().expect("flush");
        let written = recorder.written;
        assert_eq!(recorder.missed, 0);
        drop(recorder);
        let trace = vramtop_trace::load(&path).expect("our own recording loads");
        assert_eq!(trace.events.len() as u64, written);
        let allocs = trace
            .events
            .iter()
            .filter(|e| e.kind == TraceEventKind::Alloc)
            .count() as u64;
        assert_eq!(allocs, probe.report().allocs);
        assert!(trace
            .events
            .iter()
            .any(|e| e.tag.as_deref() == Some("parameters")));
        let peak = trace.live_bytes_peak(512);
        assert_eq!(peak, allocator.stats().peak_allocated_bytes);
        let _ = std::fs::remove_file(path);
    }
}
