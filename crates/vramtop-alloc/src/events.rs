//! The event ring: a fixed-capacity broadcast ring with a global sequence number.
//! The allocator (one writer, under its lock) never waits on readers; a reader that
//! falls a lap behind learns how many events it missed and should re-sync from
//! `Allocator::layout()`. Slots are seqlocks over atomics: a reader copies a slot and
//! keeps it only if the slot's stamp did not move while it read.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;

use super::types::{Event, EventKind, StreamId, TagId};

/// Stamp of a slot being written.
const WRITING: u64 = u64::MAX;
const HAS_TAG: u64 = 1 << 8;
const HAS_ID: u64 = 1 << 9;

const KINDS: [EventKind; 8] = [
    EventKind::Alloc,
    EventKind::Free,
    EventKind::FreeRequested,
    EventKind::SegmentAlloc,
    EventKind::SegmentFree,
    EventKind::PageMap,
    EventKind::PageUnmap,
    EventKind::Oom,
];

fn kind_code(kind: EventKind) -> u64 {
    KINDS.iter().position(|&k| k == kind).unwrap_or(0) as u64
}

#[derive(Default)]
struct Slot {
    /// seq + 1 of the event held (0: never written), or WRITING.
    stamp: AtomicU64,
    time_ns: AtomicU64,
    addr: AtomicU64,
    size: AtomicU64,
    /// kind | HAS_TAG | HAS_ID | stream << 32
    meta: AtomicU64,
    tag: AtomicU64,
    alloc_id: AtomicU64,
}

/// What the allocator hands the ring; `seq` is assigned by the ring.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EventData {
    pub time_ns: u64,
    pub kind: EventKind,
    pub addr: u64,
    pub size: u64,
    pub stream: StreamId,
    pub tag: Option<TagId>,
    pub alloc_id: Option<u64>,
}

pub(crate) struct EventRing {
    slots: Box<[Slot]>,
    mask: u64,
    /// Sequence number of the next event to be written.
    head: AtomicU64,
}

impl EventRing {
    /// A ring of `capacity` rounded up to a power of two (at least 16).
    pub fn new(capacity: usize) -> Self {
        let n = capacity.clamp(16, 1 << 30).next_power_of_two();
        EventRing {
            slots: (0..n).map(|_| Slot::default()).collect(),
            mask: n as u64 - 1,
            head: AtomicU64::new(0),
        }
    }

    pub fn capacity(&self) -> u64 {
        self.mask + 1
    }

    /// Events written so far (the next sequence number).
    pub fn head(&self) -> u64 {
        self.head.load(Ordering::Acquire)
    }

    /// Appends one event. Must only be called by one thread at a time (the allocator
    /// calls it under its lock).
    pub fn push(&self, e: EventData) {
        let seq = self.head.load(Ordering::Relaxed);
        let slot = &self.slots[(seq & self.mask) as usize];
        slot.stamp.store(WRITING, Ordering::Relaxed);
        fence(Ordering::Release);
        let mut meta = kind_code(e.kind) | (u64::from(e.stream) << 32);
        if let Some(tag) = e.tag {
            meta |= HAS_TAG;
            slot.tag.store(u64::from(tag.0), Ordering::Relaxed);
        }
        if let Some(id) = e.alloc_id {
            meta |= HAS_ID;
            slot.alloc_id.store(id, Ordering::Relaxed);
        }
        slot.time_ns.store(e.time_ns, Ordering::Relaxed);
        slot.addr.store(e.addr, Ordering::Relaxed);
        slot.size.store(e.size, Ordering::Relaxed);
        slot.meta.store(meta, Ordering::Relaxed);
        slot.stamp.store(seq + 1, Ordering::Release);
        self.head.store(seq + 1, Ordering::Release);
    }

    /// The event with sequence number `seq`, if its slot still holds it.
    fn read(&self, seq: u64) -> Option<Event> {
        let slot = &self.slots[(seq & self.mask) as usize];
        if slot.stamp.load(Ordering::Acquire) != seq + 1 {
            return None;
        }
        let time_ns = slot.time_ns.load(Ordering::Relaxed);
        let addr = slot.addr.load(Ordering::Relaxed);
        let size = slot.size.load(Ordering::Relaxed);
        let meta = slot.meta.load(Ordering::Relaxed);
        let tag = slot.tag.load(Ordering::Relaxed);
        let alloc_id = slot.alloc_id.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if slot.stamp.load(Ordering::Relaxed) != seq + 1 {
            return None;
        }
        Some(Event {
            seq,
            time_ns,
            kind: KINDS[(meta & 0xff) as usize % KINDS.len()],
            addr,
            size,
            stream: (meta >> 32) as StreamId,
            tag: (meta & HAS_TAG != 0).then_some(TagId(tag as u32)),
            alloc_id: (meta & HAS_ID != 0).then_some(alloc_id),
        })
    }
}

/// One observer's cursor into the ring. Cheap; `Send`; any number may exist.
pub struct EventReceiver {
    ring: Arc<EventRing>,
    next: u64,
}

impl EventReceiver {
    pub(crate) fn new(ring: Arc<EventRing>) -> Self {
        let next = ring.head();
        EventReceiver { ring, next }
    }

    /// Sequence number of the next event this receiver will see.
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// Appends every event since the last drain to `out`, oldest first, and returns
    /// how many were overwritten before they could be read (0 when none). After a
    /// miss, rebuild state from `Allocator::layout()` and keep draining.
    pub fn drain(&mut self, out: &mut Vec<Event>) -> u64 {
        let mut missed = 0;
        loop {
            let head = self.ring.head();
            let oldest = head.saturating_sub(self.ring.capacity());
            if self.next < oldest {
                missed += oldest - self.next;
                self.next = oldest;
            }
            if self.next >= head {
                return missed;
            }
            while self.next < head {
                match self.ring.read(self.next) {
                    Some(event) => {
                        out.push(event);
                        self.next += 1;
                    }
                    // Overwritten while we read: re-check the head and skip ahead.
                    None => break,
                }
            }
            if self.next >= head {
                return missed;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(i: u64) -> EventData {
        EventData {
            time_ns: i,
            kind: if i % 2 == 0 {
                EventKind::Alloc
            } else {
                EventKind::Free
            },
            addr: 0x1000 + i,
            size: 512,
            stream: 3,
            tag: (i % 2 == 0).then_some(TagId(7)),
            alloc_id: Some(i),
        }
    }

    #[test]
    fn round_trips_events_in_order() {
        let ring = Arc::new(EventRing::new(16));
        let mut rx = EventReceiver::new(ring.clone());
        for i in 0..5 {
            ring.push(data(i));
        }
        let mut out = Vec::new();
        assert_eq!(rx.drain(&mut out), 0);
        assert_eq!(out.len(), 5);
        assert_eq!(out[2].seq, 2);
        assert_eq!(out[2].kind, EventKind::Alloc);
        assert_eq!(out[2].tag, Some(TagId(7)));
        assert_eq!(out[3].tag, None);
        assert_eq!(out[4].stream, 3);
        assert_eq!(out[4].alloc_id, Some(4));
    }

    #[test]
    fn slow_reader_learns_what_it_missed() {
        let ring = Arc::new(EventRing::new(16));
        let mut rx = EventReceiver::new(ring.clone());
        for i in 0..40 {
            ring.push(data(i));
        }
        let mut out = Vec::new();
        assert_eq!(rx.drain(&mut out), 24);
        assert_eq!(out.len(), 16);
        assert_eq!(out[0].seq, 24);
        assert_eq!(out[15].seq, 39);
        ring.push(data(40));
        out.clear();
        assert_eq!(rx.drain(&mut out), 0);
        assert_eq!(out[0].seq, 40);
    }

    #[test]
    fn concurrent_reader_sees_gapless_or_counted_sequence() {
        let ring = Arc::new(EventRing::new(64));
        let mut rx = EventReceiver::new(ring.clone());
        let writer = {
            let ring = ring.clone();
            std::thread::spawn(move || {
                for i in 0..20_000 {
                    ring.push(data(i));
                }
            })
        };
        let mut out = Vec::new();
        let mut missed = 0;
        while !writer.is_finished() || rx.next_seq() < 20_000 {
            missed += rx.drain(&mut out);
        }
        let _ = writer.join();
        assert_eq!(out.len() as u64 + missed, 20_000);
        for w in out.windows(2) {
            assert!(w[0].seq < w[1].seq);
        }
        for e in &out {
            assert_eq!(e.addr, 0x1000 + e.seq);
        }
    }
}
