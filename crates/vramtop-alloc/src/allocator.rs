//! `Allocator`: the thread-safe front of a policy over a backing. It checks receipts,
//! keeps the counters and the live-block ledger, and announces every change on the
//! event ring. One mutex guards everything but the ring, which readers use lock-free.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use super::arena::{LiveInfo, NodeState};
use super::caching::Caching;
use super::events::{EventData, EventReceiver, EventRing};
use super::expandable::Expandable;
use super::fit::{AddrIndex, Fit};
use super::ledger::{oldest, Ledger};
use super::metrics::Counters;
use super::policy::{BackingCx, Placement, Policy, Shortfall};
use super::pytorch_expandable::PytorchExpandable;
use super::size_index::SizeIndex;
use super::tlsf::TlsfIndex;
use super::types::{
    Block, EventKind, FreeForRequests, Layout, OomReport, PolicyKind, Pool, Stats, StreamId, TagId,
    GRAIN,
};
use crate::backing::{Backing, BackingError};
use crate::error::AllocError;

/// Allocator options; `Default` gives PyTorch's defaults and a 65536-event ring.
#[derive(Clone, Debug, PartialEq)]
pub struct AllocConfig {
    /// `caching` (and `pytorch-expandable`, for finding cached blocks only, as in
    /// PyTorch's `get_free_block`): blocks of at least this size are never split, and cached
    /// blocks this large only serve requests this large (PyTorch's
    /// `max_split_size_mb`, in bytes). `None`: unlimited.
    pub max_split_size: Option<u64>,
    /// `caching` only: PyTorch's `roundup_power2_divisions` per size interval (see
    /// `trace::AllocatorSettings`); all 0: plain 512 B rounding.
    pub roundup_power2_divisions: [u32; 16],
    /// Events the ring holds before slow observers start missing some.
    pub event_ring: usize,
    /// `caching` only: PyTorch's `garbage_collection_threshold`, which it acts on only
    /// under a memory fraction; the backing's capacity stands for that fraction.
    pub garbage_collection_threshold: Option<f64>,
    /// Whether events and blocks are stamped with the time since the allocator began
    /// (ages on the block map, the event ring's times). A replay's would be the replay's
    /// own speed, not the job's, and reading the clock at each event took 10 % of a
    /// replay's time: replays stamp 0.
    pub clock: bool,
}

impl Default for AllocConfig {
    fn default() -> Self {
        AllocConfig {
            max_split_size: None,
            roundup_power2_divisions: [0; 16],
            event_ring: 65536,
            garbage_collection_threshold: None,
            clock: true,
        }
    }
}

/// A live block as leak queries report it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LiveBlock {
    pub id: u64,
    pub addr: u64,
    pub size: u64,
    pub requested: u64,
    pub stream: StreamId,
    pub tag: TagId,
    pub tag_name: String,
    pub born_ns: u64,
    pub age_ns: u64,
    pub pending_free: bool,
}

/// Live bytes of one allocation site.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TagUsage {
    pub tag: TagId,
    pub tag_name: String,
    pub bytes: u64,
    pub blocks: u64,
}

fn make_policy(kind: PolicyKind, config: &AllocConfig) -> Box<dyn Policy> {
    match kind {
        PolicyKind::Caching => Box::new(
            Caching::new(config.max_split_size)
                .with_roundup(config.roundup_power2_divisions)
                .with_gc_threshold(config.garbage_collection_threshold),
        ),
        PolicyKind::BestFit => Box::<Fit<SizeIndex>>::default(),
        PolicyKind::FirstFit => Box::<Fit<AddrIndex>>::default(),
        PolicyKind::Tlsf => Box::<Fit<TlsfIndex>>::default(),
        PolicyKind::Expandable => Box::new(Expandable::default()),
        PolicyKind::PytorchExpandable => Box::new(PytorchExpandable::new(config.max_split_size)),
    }
}

/// What a checked receipt stands for.
#[derive(Clone, Copy, Debug)]
struct LiveRef {
    slot: u32,
    addr: u64,
    size: u64,
    live: LiveInfo,
    pending: bool,
}

static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

struct Inner {
    policy: Box<dyn Policy>,
    backing: Box<dyn Backing>,
    counters: Counters,
    ledger: Ledger,
    next_id: u64,
}

impl Inner {
    /// The policy, its window on the backing (counters and the event ring included) and
    /// the ledger, borrowed apart: every call into the policy needs them at once.
    fn split<'a>(
        &'a mut self,
        events: &'a EventRing,
        now_ns: u64,
        stream: StreamId,
    ) -> (&'a mut dyn Policy, BackingCx<'a>, &'a mut Ledger) {
        let Inner {
            policy,
            backing,
            counters,
            ledger,
            ..
        } = self;
        let cx = BackingCx {
            backing: backing.as_mut(),
            counters,
            events,
            now_ns,
            stream,
        };
        (policy.as_mut(), cx, ledger)
    }
}

pub struct Allocator {
    owner: u64,
    kind: PolicyKind,
    capacity: u64,
    /// When the allocator began, where it keeps time (`AllocConfig::clock`).
    start: Option<Instant>,
    ring: Arc<EventRing>,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("owner", &self.owner)
            .field("policy", &self.kind)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl Allocator {
    pub fn new(policy: PolicyKind, backing: Box<dyn Backing>, config: AllocConfig) -> Allocator {
        Allocator {
            owner: NEXT_OWNER.fetch_add(1, Ordering::Relaxed),
            kind: policy,
            capacity: backing.capacity(),
            start: config.clock.then(Instant::now),
            ring: Arc::new(EventRing::new(config.event_ring)),
            inner: Mutex::new(Inner {
                policy: make_policy(policy, &config),
                backing,
                counters: Counters::default(),
                ledger: Ledger::default(),
                next_id: 1,
            }),
        }
    }

    pub fn policy(&self) -> PolicyKind {
        self.kind
    }

    /// The id stamped into `Block::owner` of every block this allocator issues.
    pub fn owner_id(&self) -> u64 {
        self.owner
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn backing_name(&self) -> String {
        self.lock().backing.name().to_owned()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now_ns(&self) -> u64 {
        self.start
            .map_or(0, |start| start.elapsed().as_nanos() as u64)
    }

    fn announce(
        &self,
        kind: EventKind,
        addr: u64,
        size: u64,
        stream: StreamId,
        live: Option<(TagId, u64)>,
        now_ns: u64,
    ) {
        self.ring.push(EventData {
            time_ns: now_ns,
            kind,
            addr,
            size,
            stream,
            tag: live.map(|(tag, _)| tag),
            alloc_id: live.map(|(_, id)| id),
        });
    }

    /// Allocates `size` bytes on `stream` for the allocation site `tag`. Any stream id
    /// works; the caching policy opens pools for a new stream on first use.
    pub fn alloc(&self, size: u64, stream: StreamId, tag: &str) -> Result<Block, AllocError> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let now_ns = self.now_ns();
        let tag = inner.ledger.tags.intern(tag);
        let rounded = match inner.policy.round(size) {
            Some(r) if r <= self.capacity => r,
            other => return Err(self.oom(inner, size, other.unwrap_or(u64::MAX), stream, now_ns)),
        };
        let live = LiveInfo {
            id: inner.next_id,
            requested: size,
            stream,
            tag,
            born_ns: now_ns,
        };
        let placed = match self.place(inner, rounded, live, now_ns) {
            Ok(p) => p,
            Err(Shortfall::Exhausted) => return Err(self.oom(inner, size, rounded, stream, now_ns)),
            Err(Shortfall::Backing(msg)) => return Err(AllocError::Backing(msg)),
        };
        inner.next_id += 1;
        inner.ledger.tags.add(tag, placed.size);
        inner.counters.add_live(placed.size, size);
        self.announce(
            EventKind::Alloc,
            placed.addr,
            placed.size,
            stream,
            Some((tag, live.id)),
            now_ns,
        );
        Ok(Block {
            id: live.id,
            owner: self.owner,
            addr: placed.addr,
            size: placed.size,
            requested: size,
            stream,
            tag,
            slot: placed.node,
        })
    }

    /// Whether `adopt_segment` works for this allocator's policy.
    pub fn can_adopt(&self) -> bool {
        self.lock().policy.can_adopt()
    }

    /// Where the next segment of `size` bytes should go, if the backing can choose (see
    /// `Backing::hint_segment`); `(0, 0)` clears it.
    pub fn hint_segment(&self, addr: u64, size: u64) {
        self.lock().backing.hint_segment(addr, size);
    }

    /// Books a segment of `size` bytes with live blocks already at the given places, as
    /// the traced allocator had them when a trace began: `blocks` are (offset, size,
    /// tag), each a multiple of 512 B, in offset order, not overlapping, inside the
    /// segment. Returns the blocks in that order; `Ok(None)` when the policy cannot adopt
    /// (nothing was booked: place the blocks with `alloc`). A bad layout is refused
    /// whole, also with `Ok(None)`.
    pub fn adopt_segment(
        &self,
        size: u64,
        pool: Pool,
        stream: StreamId,
        blocks: &[(u64, u64, &str)],
    ) -> Result<Option<Vec<Block>>, AllocError> {
        let aligned = |n: u64| n % GRAIN == 0;
        let mut end = 0;
        for &(offset, block_size, _) in blocks {
            let fits = offset >= end
                && block_size > 0
                && offset.checked_add(block_size).is_some_and(|e| e <= size);
            if !fits || !aligned(offset) || !aligned(block_size) {
                return Ok(None);
            }
            end = offset + block_size;
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        if !inner.policy.can_adopt() || size == 0 || !aligned(size) {
            return Ok(None);
        }
        let now_ns = self.now_ns();
        let mut lives = Vec::with_capacity(blocks.len());
        for &(offset, block_size, tag) in blocks {
            let tag = inner.ledger.tags.intern(tag);
            lives.push((
                offset,
                block_size,
                LiveInfo {
                    id: inner.next_id,
                    requested: block_size,
                    stream,
                    tag,
                    born_ns: now_ns,
                },
            ));
            inner.next_id += 1;
        }
        let (policy, mut cx, ledger) = inner.split(&self.ring, now_ns, stream);
        let addr = match cx.alloc_segment(size) {
            Ok(addr) => addr,
            Err(BackingError::Exhausted { .. }) => {
                return Err(self.oom(&mut guard, size, size, stream, now_ns))
            }
            Err(BackingError::Failed(msg)) => return Err(AllocError::Backing(msg)),
        };
        let placed = policy
            .adopt(addr, size, pool, stream, &lives)
            .unwrap_or_default();
        let mut out = Vec::with_capacity(placed.len());
        for (p, (_, _, live)) in placed.iter().zip(&lives) {
            ledger.tags.add(live.tag, p.size);
            cx.counters.add_live(p.size, live.requested);
            self.announce(
                EventKind::Alloc,
                p.addr,
                p.size,
                stream,
                Some((live.tag, live.id)),
                now_ns,
            );
            out.push(Block {
                id: live.id,
                owner: self.owner,
                addr: p.addr,
                size: p.size,
                requested: live.requested,
                stream,
                tag: live.tag,
                slot: p.node,
            });
        }
        Ok(Some(out))
    }

    /// Asks the policy; on exhaustion releases cached segments and asks once more, as
    /// PyTorch's malloc does: first just enough oversize ones (under max_split_size),
    /// then all of them.
    fn place(
        &self,
        inner: &mut Inner,
        size: u64,
        live: LiveInfo,
        now_ns: u64,
    ) -> Result<Placement, Shortfall> {
        let (policy, mut cx, _) = inner.split(&self.ring, now_ns, live.stream);
        match policy.alloc(size, live, &mut cx) {
            Err(Shortfall::Exhausted) => {}
            other => return other,
        }
        let reserved = cx.counters.reserved;
        if policy.release_available(size, live.stream, &mut cx) {
            match policy.alloc_after_release(size, live, &mut cx) {
                Err(Shortfall::Exhausted) => {}
                other => {
                    cx.counters.retries += 1;
                    return other;
                }
            }
        }
        // Oversize segments released above stay released even where they did not add up
        // to the request (release_available_cached_blocks returns false then), and
        // PyTorch's release_cached_blocks always answers true: the last try is made
        // whenever anything at all was given back, by either. A request into a private
        // pool is taken to be made while its CUDA graph is captured, and PyTorch releases
        // nothing more then (`captures_underway`: freeing memory mid-capture is unsafe).
        // (A `MemPool`'s, made outside any capture, is not told apart: PyTorch would.)
        let released_oversize = cx.counters.reserved < reserved;
        let capturing = crate::types::in_graph_pool(live.stream);
        let released_all = !capturing && policy.release_cached(&mut cx) > 0;
        if !released_all && !released_oversize {
            return Err(Shortfall::Exhausted);
        }
        let placed = policy.alloc_after_release(size, live, &mut cx)?;
        cx.counters.retries += 1;
        Ok(placed)
    }

    fn oom(
        &self,
        inner: &mut Inner,
        size: u64,
        rounded: u64,
        stream: StreamId,
        now_ns: u64,
    ) -> AllocError {
        let headroom = self.capacity.saturating_sub(inner.backing.held());
        let view = inner.policy.oom_view(headroom);
        let report = OomReport {
            requested_bytes: size,
            rounded_bytes: rounded,
            total_free_bytes: view.total,
            largest_free_bytes: view.largest,
            free_runs: view.runs,
            reserved_bytes: inner.counters.reserved,
            capacity_bytes: self.capacity,
            stream,
        };
        inner.counters.ooms += 1;
        inner.counters.last_oom = Some(report.clone());
        self.announce(EventKind::Oom, 0, size, stream, None, now_ns);
        AllocError::OutOfMemory(Box::new(report))
    }

    /// The books on a receipt, if it is live and ours.
    fn check(&self, inner: &Inner, block: &Block) -> Result<LiveRef, AllocError> {
        if block.owner != self.owner {
            return Err(AllocError::ForeignBlock { id: block.id });
        }
        match inner.policy.arena().try_get(block.slot) {
            Some(node)
                if node.state().is_live()
                    && node.live().id == block.id
                    && node.addr == block.addr
                    && node.size == block.size =>
            {
                Ok(LiveRef {
                    slot: block.slot,
                    addr: node.addr,
                    size: node.size,
                    live: node.live(),
                    pending: node.state() == NodeState::PendingFree,
                })
            }
            _ => Err(AllocError::DoubleFree { id: block.id }),
        }
    }

    /// Returns a block now. Freeing it twice, or a block another allocator issued, is
    /// an error that changes nothing.
    pub fn free(&self, block: &Block) -> Result<(), AllocError> {
        let mut guard = self.lock();
        let live = self.check(&guard, block)?;
        if live.pending {
            return Err(AllocError::DoubleFree { id: block.id });
        }
        let now_ns = self.now_ns();
        self.complete_free(&mut guard, live, now_ns);
        Ok(())
    }

    fn complete_free(&self, inner: &mut Inner, block: LiveRef, now_ns: u64) {
        let (policy, mut cx, ledger) = inner.split(&self.ring, now_ns, block.live.stream);
        policy.free(block.slot, &mut cx);
        cx.counters.remove_live(block.size, block.live.requested);
        ledger.tags.remove(block.live.tag, block.size);
        if block.pending {
            cx.counters.pending_blocks -= 1;
        }
        let LiveInfo {
            id, tag, stream, ..
        } = block.live;
        self.announce(
            EventKind::Free,
            block.addr,
            block.size,
            stream,
            Some((tag, id)),
            now_ns,
        );
    }

    /// Stream-ordered free: the block stays held (counted allocated, drawn
    /// pending-free) until `process_pending`.
    pub fn free_deferred(&self, block: &Block) -> Result<(), AllocError> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let live = self.check(inner, block)?;
        if live.pending {
            return Err(AllocError::DoubleFree { id: block.id });
        }
        inner.policy.set_pending(live.slot);
        inner.ledger.pending.push((live.slot, block.id));
        inner.counters.pending_blocks += 1;
        let now_ns = self.now_ns();
        let LiveInfo {
            id, tag, stream, ..
        } = live.live;
        self.announce(
            EventKind::FreeRequested,
            live.addr,
            live.size,
            stream,
            Some((tag, id)),
            now_ns,
        );
        Ok(())
    }

    /// Completes every deferred free (the streams caught up); returns how many.
    pub fn process_pending(&self) -> u64 {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let pending = std::mem::take(&mut inner.ledger.pending);
        let now_ns = self.now_ns();
        let mut done = 0;
        for (slot, id) in pending {
            let live = match inner.policy.arena().try_get(slot) {
                Some(node) if node.state() == NodeState::PendingFree && node.live().id == id => {
                    LiveRef {
                        slot,
                        addr: node.addr,
                        size: node.size,
                        live: node.live(),
                        pending: true,
                    }
                }
                _ => continue,
            };
            self.complete_free(inner, live, now_ns);
            done += 1;
        }
        done
    }

    /// Gives cached, wholly free segments back to the backing.
    pub fn empty_cache(&self) {
        let mut guard = self.lock();
        let now_ns = self.now_ns();
        let (policy, mut cx, _) = guard.split(&self.ring, now_ns, 0);
        policy.release_cached(&mut cx);
    }

    /// Bytes the backing holds for us now: `stats().reserved_bytes` without building
    /// the rest of `Stats` (replays check it after every event).
    pub fn reserved_bytes(&self) -> u64 {
        self.lock().counters.reserved
    }

    pub fn stats(&self) -> Stats {
        let inner = self.lock();
        let free = inner.policy.free_summary();
        inner.counters.stats(self.kind, self.capacity, &free)
    }

    /// What an out-of-memory report would count as free if a request failed now.
    pub fn free_for_requests(&self) -> FreeForRequests {
        let inner = self.lock();
        let headroom = self.capacity.saturating_sub(inner.backing.held());
        let view = inner.policy.oom_view(headroom);
        FreeForRequests {
            runs: view.runs,
            total_bytes: view.total,
            largest_bytes: view.largest,
        }
    }

    pub fn layout(&self) -> Layout {
        let inner = self.lock();
        let mut segments = Vec::new();
        inner.policy.layout(&mut segments);
        Layout {
            policy: Some(self.kind),
            capacity: self.capacity,
            segments,
            tags: inner.ledger.tags.names.clone(),
            generation: self.ring.head(),
        }
    }

    /// A receiver of every event from now on.
    pub fn subscribe(&self) -> EventReceiver {
        EventReceiver::new(self.ring.clone())
    }

    pub fn tag_name(&self, tag: TagId) -> Option<String> {
        self.lock().ledger.tags.name(tag).map(str::to_owned)
    }

    /// The `limit` oldest live blocks, oldest first (leak suspects).
    pub fn live_blocks_by_age(&self, limit: usize) -> Vec<LiveBlock> {
        let inner = self.lock();
        let now_ns = self.now_ns();
        let arena = inner.policy.arena();
        let ids = arena
            .live_nodes()
            .map(|(slot, n)| (n.live().id, slot))
            .collect();
        oldest(ids, limit)
            .into_iter()
            .filter_map(|(_, slot)| arena.try_get(slot))
            .map(|node| (node, node.live()))
            .map(|(node, live)| LiveBlock {
                id: live.id,
                addr: node.addr,
                size: node.size,
                requested: live.requested,
                stream: live.stream,
                tag: live.tag,
                tag_name: inner.ledger.tags.name(live.tag).unwrap_or("?").to_owned(),
                born_ns: live.born_ns,
                age_ns: now_ns.saturating_sub(live.born_ns),
                pending_free: node.state() == NodeState::PendingFree,
            })
            .collect()
    }

    /// Live bytes and blocks per allocation site, largest first; sites with nothing
    /// live are left out.
    pub fn live_bytes_by_tag(&self) -> Vec<TagUsage> {
        let inner = self.lock();
        let tags = &inner.ledger.tags;
        let mut usage: Vec<TagUsage> = tags
            .usage
            .iter()
            .enumerate()
            .filter(|(_, &(_, blocks))| blocks > 0)
            .map(|(i, &(bytes, blocks))| TagUsage {
                tag: TagId(i as u32),
                tag_name: tags.names[i].clone(),
                bytes,
                blocks,
            })
            .collect();
        usage.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.tag.cmp(&b.tag)));
        usage
    }

    /// Writes the pattern of `seed` over the whole block (its rounded size). `false`
    /// when the backing has no memory behind it. Holds the allocator lock meanwhile.
    pub fn fill_block(&self, block: &Block, seed: u64) -> Result<bool, AllocError> {
        let mut guard = self.lock();
        self.check(&guard, block)?;
        guard
            .backing
            .fill(block.addr, block.size, seed)
            .map_err(|e| AllocError::Backing(e.to_string()))
    }

    /// Mismatched 32-bit words of the block against `seed`'s pattern; `None` when the
    /// backing cannot check. Holds the allocator lock meanwhile.
    pub fn verify_block(&self, block: &Block, seed: u64) -> Result<Option<u64>, AllocError> {
        let mut guard = self.lock();
        self.check(&guard, block)?;
        guard
            .backing
            .verify(block.addr, block.size, seed)
            .map_err(|e| AllocError::Backing(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backing::BookkeepingBacking;
    use crate::types::round_size;

    #[test]
    fn allocator_and_receiver_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Allocator>();
        send_sync::<EventReceiver>();
    }

    #[test]
    fn rounding_is_512_with_a_floor() {
        assert_eq!(round_size(0), Some(512));
        assert_eq!(round_size(512), Some(512));
        assert_eq!(round_size(513), Some(1024));
        assert_eq!(round_size(u64::MAX), None);
    }

    #[test]
    fn poisoned_lock_is_recovered() {
        let a = std::sync::Arc::new(Allocator::new(
            PolicyKind::BestFit,
            Box::new(BookkeepingBacking::new(64 << 20)),
            AllocConfig::default(),
        ));
        let b = a.alloc(512, 0, "t").unwrap();
        let a2 = a.clone();
        let _ = std::thread::spawn(move || {
            let _guard = a2.lock();
            panic!("poison the lock");
        })
        .join();
        assert!(a.inner.is_poisoned());
        a.free(&b).unwrap();
        assert_eq!(a.stats().live_blocks, 0);
    }
}
