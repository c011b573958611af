//! "Would `expandable_segments:True` have fit?" for a job seen from outside (the
//! attached-job view): its live blocks and one request, placed by `pytorch-expandable`
//! (what PyTorch would do) and by the ideal `expandable` policy (the lower bound) over a
//! bookkeeping backing of the job's budget. A snapshot has no history, so the live
//! blocks are placed in address order, as if allocated so with nothing freed between:
//! for PyTorch's rules that is the best case, so a "no" is firm and a "yes" is an
//! estimate that the job's real history could spoil.

use serde::Serialize;

use super::{AllocConfig, Allocator, PolicyKind, StreamId};
use crate::backing::BookkeepingBacking;

/// Events an answer's allocator keeps: nobody reads them.
const EVENT_RING: usize = 64;

/// A live block of the job, as its snapshot gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveSpan {
    pub addr: u64,
    pub size: u64,
    pub stream: StreamId,
}

/// One policy's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FitAnswer {
    pub policy: PolicyKind,
    /// Every live block and then the request fit in the budget.
    pub fits: bool,
    /// Reserved bytes with the live blocks placed, before the request.
    pub reserved_before_bytes: u64,
    /// Reserved bytes after the request (the same as before when it did not fit).
    pub reserved_after_bytes: u64,
    /// Live blocks that did not fit the budget (then `fits` is false).
    pub live_blocks_left_out: u64,
}

/// The faithful answer and the ideal bound beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ExpandableWhatIf {
    /// `pytorch-expandable`: what PyTorch with expandable segments would do.
    pub faithful: FitAnswer,
    /// `expandable`: an ideal page-mapped allocator, the lower bound.
    pub ideal: FitAnswer,
}

/// Would `request` bytes on `stream` fit next to the `live` blocks in `budget` bytes
/// (e.g. what the job reserves plus what the device has free) with expandable segments?
pub fn expandable_fits(
    live: &[LiveSpan],
    request: u64,
    stream: StreamId,
    budget: u64,
) -> ExpandableWhatIf {
    let mut sorted: Vec<LiveSpan> = live.to_vec();
    sorted.sort_by_key(|b| b.addr);
    ExpandableWhatIf {
        faithful: answer(
            PolicyKind::PytorchExpandable,
            &sorted,
            request,
            stream,
            budget,
        ),
        ideal: answer(PolicyKind::Expandable, &sorted, request, stream, budget),
    }
}

fn answer(
    policy: PolicyKind,
    live: &[LiveSpan],
    request: u64,
    stream: StreamId,
    budget: u64,
) -> FitAnswer {
    let config = AllocConfig {
        event_ring: EVENT_RING,
        ..AllocConfig::default()
    };
    let allocator = Allocator::new(policy, Box::new(BookkeepingBacking::new(budget)), config);
    let left_out = live
        .iter()
        .filter(|b| allocator.alloc(b.size, b.stream, "live").is_err())
        .count() as u64;
    let reserved_before_bytes = allocator.reserved_bytes();
    let fits = left_out == 0 && allocator.alloc(request, stream, "request").is_ok();
    FitAnswer {
        policy,
        fits,
        reserved_before_bytes,
        reserved_after_bytes: allocator.reserved_bytes(),
        live_blocks_left_out: left_out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn spans(sizes: &[u64]) -> Vec<LiveSpan> {
        let mut addr = 0x7f00_0000_0000;
        sizes
            .iter()
            .map(|&size| {
                let span = LiveSpan {
                    addr,
                    size,
                    stream: 0,
                };
                addr += size;
                span
            })
            .collect()
    }

    #[test]
    fn pytorch_pages_can_refuse_what_the_ideal_bound_fits() {
        // 3 x 25 MiB live: PyTorch maps four 20 MiB pages (80 MiB), the ideal policy
        // 2 MiB pages (76 MiB). 8 MiB more needs a fifth 20 MiB page from PyTorch
        // (100 MiB) but only 8 MiB of 2 MiB pages from the ideal allocator (84 MiB).
        let live = spans(&[25 * MIB, 25 * MIB, 25 * MIB]);
        let w = expandable_fits(&live, 8 * MIB, 0, 84 * MIB);
        assert_eq!(w.faithful.reserved_before_bytes, 80 * MIB);
        assert_eq!(w.ideal.reserved_before_bytes, 76 * MIB);
        assert!(!w.faithful.fits);
        assert!(w.ideal.fits);
        assert_eq!(w.faithful.reserved_after_bytes, 80 * MIB);
        assert_eq!(w.ideal.reserved_after_bytes, 84 * MIB);
    }

    #[test]
    fn a_request_that_fits_cached_space_costs_nothing() {
        let live = spans(&[25 * MIB]);
        let w = expandable_fits(&live, 10 * MIB, 0, 1 << 30);
        assert!(w.faithful.fits && w.ideal.fits);
        // 25 MiB maps 40: the request fits the 15 MiB left in the second page.
        assert_eq!(w.faithful.reserved_after_bytes, 40 * MIB);
    }

    #[test]
    fn live_blocks_past_the_budget_are_counted_and_nothing_fits() {
        let live = spans(&[60 * MIB, 60 * MIB]);
        let w = expandable_fits(&live, MIB, 0, 100 * MIB);
        assert_eq!(w.faithful.live_blocks_left_out, 1);
        assert!(!w.faithful.fits && !w.ideal.fits);
    }
}
