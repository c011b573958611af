//! The instrumented allocator: policies over a `Backing`, with events, metrics and leak
//! bookkeeping. No UI and no CUDA here: metadata lives outside the memory it manages.
//!
//! ```text
//! Allocator::new(policy, Box<dyn Backing>, AllocConfig) -> Allocator      (Send + Sync)
//!   alloc(size, stream, tag) -> Result<Block, AllocError>
//!   free(&Block) / free_deferred(&Block) -> Result<(), AllocError>; process_pending() -> u64
//!   empty_cache(); stats() -> Stats; reserved_bytes() -> u64; layout() -> Layout
//!   subscribe() -> EventReceiver
//!   live_blocks_by_age(limit) -> Vec<LiveBlock>; live_bytes_by_tag() -> Vec<TagUsage>
//!   fill_block(&Block, seed) -> Result<bool, _>; verify_block(&Block, seed) -> Result<Option<u64>, _>
//! ```
//!
//! Defined behaviour where callers might wonder:
//! - Sizes round up to 512 B. A 0-byte request gets a live 512 B block (requested 0),
//!   freed like any other, so every `Ok` is a real receipt.
//! - A request whose rounded size exceeds the backing's capacity fails at once with a
//!   typed out-of-memory and changes nothing but the OOM counters.
//! - Any `StreamId` works; the caching policy opens per-stream pools on first use,
//!   the other policies ignore streams for placement and only record them.
//! - Freeing a block twice (or after `free_deferred`), or a forged receipt, is
//!   `DoubleFree`; a block of another allocator is `ForeignBlock`; neither changes state.
//! - When the backing is exhausted every policy releases wholly free cached segments
//!   and tries once more (`Stats::retries`) before reporting out-of-memory.
//! - `page_maps`/`page_unmaps` count backing calls; one call covers a contiguous run
//!   of pages (at most one per alloc or free).
//! - `Layout::generation` is the event sequence number: it moves on every change.

mod allocator;
mod arena;
pub mod bench;
mod caching;
pub mod events;
mod expandable;
mod fit;
mod heap;
mod ledger;
pub mod metrics;
mod policy;
mod size_index;
mod tlsf;
pub mod types;

pub use allocator::{round_size, AllocConfig, Allocator, LiveBlock, TagUsage};
pub use events::EventReceiver;
pub use types::*;
