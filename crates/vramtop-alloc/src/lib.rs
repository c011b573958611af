//! vramtop-alloc: the instrumented allocator. Policies (PyTorch's caching allocator and
//! expandable segments, best-fit, first-fit, TLSF, an ideal page-mapped one) over a
//! `Backing` (CUDA segments and VMM pages behind the `cuda` feature, host memory, or
//! bookkeeping only), with events, metrics, the what-if of a request, and the leak
//! detector that watches live bytes per allocation site. Metadata lives outside the memory
//! it manages (node slabs and bitmaps on the host), so one policy runs over GPU, host or
//! no memory.
//!
//! The bottom layer of vramtop: it imports no other vramtop crate, and no tokio, ratatui
//! or clap. Policies depend on the `Policy` seam (`policy.rs`) and the shared parts
//! (`arena`, `heap`, `size_index`, `metrics`, `types`), the `Allocator` on the policies,
//! never the reverse.
//!
//! ```text
//! Allocator::new(PolicyKind, Box<dyn Backing>, AllocConfig) -> Allocator  (Send + Sync)
//!   alloc(size, stream, tag) -> Result<Block, AllocError>
//!   free(&Block) / free_deferred(&Block) -> Result<(), AllocError>; process_pending() -> u64
//!   empty_cache(); stats() -> Stats; reserved_bytes() -> u64; layout() -> Layout
//!   subscribe() -> EventReceiver
//!   live_blocks_by_age(limit) -> Vec<LiveBlock>; live_bytes_by_tag() -> Vec<TagUsage>
//!   tag_name(TagId) -> Option<String>; policy(); capacity(); owner_id(); backing_name()
//!   fill_block(&Block, seed) -> Result<bool, _>; verify_block(&Block, seed) -> Result<Option<u64>, _>
//! EventReceiver::drain(&mut Vec<Event>) -> u64 (missed); next_seq()
//! bench::run(&[PolicyKind], &[usize], pairs, seed) -> Vec<BenchRow>
//! whatif::expandable_fits(&[LiveSpan], request, stream, budget) -> ExpandableWhatIf
//! ```
//!
//! Policies: `caching.rs` (PyTorch's caching allocator), `fit.rs` (best-fit and
//! first-fit, and the growth shared with tlsf), `tlsf.rs`, `expandable.rs` (the ideal
//! page-mapped allocator), `pytorch_expandable.rs` (PyTorch's expandable segments); shared
//! machinery: `arena.rs` (node slab, segments), `heap.rs` (split/coalesce/release),
//! `size_index.rs` (O(1) exact best fit), `events.rs`, `ledger.rs` (tags, deferred
//! frees), `metrics.rs`, `policy.rs` (the policy seam and the only path to the backing).
//!
//! Defined behaviour where callers might wonder:
//! - Sizes round up to 512 B. A 0-byte request gets a live 512 B block (requested 0),
//!   freed like any other, so every `Ok` is a real, distinct receipt.
//! - A request whose rounded size exceeds the backing's capacity fails at once with a
//!   typed out-of-memory and changes nothing but the OOM counters.
//! - Any `StreamId` works; the caching policy opens per-stream pools on first use,
//!   the other policies record the stream but ignore it for placement.
//! - Freeing a block twice (or after `free_deferred`), a stale receipt whose slot now
//!   holds another block, or a forged one is `DoubleFree`; a block of another
//!   allocator is `ForeignBlock`; neither changes any state.
//! - When the backing is exhausted every policy releases wholly free cached segments
//!   and tries once more (`Stats::retries`) before reporting out-of-memory. OOM
//!   reports count free runs inside reserved memory; the expandable policy also counts
//!   unmapped address space up to the backing's headroom (see `expandable.rs`).
//! - `segment_*`/`page_*` count successful backing calls; one map/unmap call covers a
//!   contiguous run of pages (at most one per alloc or free).
//! - `Layout::generation` is the event sequence number: it moves on every change.
//! - `fill_block`/`verify_block` cover the block's rounded size and hold the allocator
//!   lock while the backing touches memory (first version; fine for probe-sized blocks).

mod allocator;
mod arena;
pub mod backing;
pub mod bench;
mod caching;
pub mod error;
pub mod events;
mod expandable;
mod fit;
pub mod framework;
pub mod hash;
mod heap;
pub mod leaks;
mod ledger;
pub mod metrics;
mod policy;
mod pytorch_expandable;
pub mod remedy;
pub mod rng;
mod size_index;
mod tlsf;
pub mod types;
pub mod whatif;

pub use allocator::{AllocConfig, Allocator, LiveBlock, TagUsage};
pub use caching::allocation_size as segment_size_for;
pub use caching::round_size as pytorch_round_size;
pub use error::{AllocError, BackingError, UnknownBacking};
pub use events::EventReceiver;
pub use types::*;
