//! The replays a trace's remedies are judged from: which runs are asked (`asked`), doing
//! them on as many threads as there are cores (`Runs::done`), and reading a verdict off
//! them that holds across every start and address order a run has (`Runs::verdict`).

use super::super::{replay_emptying_at, AddressOrder, OomCheck, ReplayError, ReplayOptions};
use super::{CapacityBounds, MAX_SPLIT_TRIED_MB, MIB};
use crate::{AllocatorSettings, Trace};
use vramtop_alloc::remedy::{Remedy, Verdict, GC_THRESHOLD_TRIED};
use vramtop_alloc::PolicyKind;

/// The `roundup_power2_divisions` tried, each as the value for every size interval.
/// PyTorch takes powers of two; 1 rounds as no setting does (512 B granules), and past 16
/// a step between two powers of two is under 64 KiB for sizes below 2 MiB, close to none.
pub(super) const ROUNDUP_TRIED: [u32; 4] = [2, 4, 8, 16];

/// How much less than the lower capacity bound a `roundup_power2_divisions` run must also
/// fit in for its "fits": a hundredth of it, in 2 MiB steps. The replay of a job's history
/// under another rounding places blocks of sizes the job never made, so the segments it
/// makes and keeps are its own guess, not PyTorch's. On a Llama trained in bf16 under a
/// 7 GiB cap (H200), the replay of the plain job's history fitted N = 16 with nothing to
/// spare (8 MiB less failed); PyTorch, run with it, failed the same request 64 MiB short
/// (0.9 % of the cap), under four placements of CUDA's address space. The N that PyTorch
/// fitted had more room in the replay: 96 MiB of 6 GiB (1.6 %, gpt2var's N = 4), 488 MiB
/// of 13.1 GiB, 648 MiB of 14 GiB.
fn roundup_room(capacity: u64) -> u64 {
    (capacity / 100).next_multiple_of(EXPANDABLE_PAGE)
}

/// `capacity` less `roundup_room`: where a roundup run must fit too.
fn with_room(capacity: u64) -> u64 {
    capacity.saturating_sub(roundup_room(capacity))
}

/// PyTorch's page for expandable segments (the large pool's granularity).
const EXPANDABLE_PAGE: u64 = 2 << 20;

/// The address orders a remedy's verdict must hold under: the trace's own (PyTorch's
/// segment addresses while the remedy makes the segments the job made) and CUDA's
/// (`AddressOrder::Cuda`, where its driver would put each new segment). Only where these
/// two agree is it given.
///
/// Orders no driver follows are not among them. Bottom-up: in five GPU-kept traces
/// (PyTorch 2.11, H100) CUDA put 1 to 4 % of new segments above every live one and 33 to
/// 59 % below. Segments at random free places (two such orders were asked until
/// 2026-11-27): in every row of the GPU-kept histories where they alone disagreed with
/// the trace's order and plain top-down, PyTorch did what those two said (the GAN's GC 0.6
/// and roundup 4, gpt2stream's max_split 256, t5beam's GC 0.6, gpt2ckpt's roundup 4,
/// kvcache_steps' emptied cache, llamamix's max_split 64). Of those, the GAN's two rows
/// and gpt2stream's 256 were rerun with CUDA's placement moved by 0 to 512 MiB
/// (`whatif_ab.py nudge`, 4 placements each), and PyTorch's outcome stayed the same.
/// Plain top-down (each new segment below the last; until 2026-11-27) left gpt2sgd's
/// max_split 256 and 512 and gpt2stream's 512 open where PyTorch fitted them under four
/// placements each; CUDA's ranges decide them as PyTorch did, and moved no other verdict
/// at a job's last OOM over the GPU-kept files and fixtures.
const ADDRESS_ORDERS: [AddressOrder; 2] = [AddressOrder::Trace, AddressOrder::Cuda];

/// One replay asked for: a policy at a capacity, with a remedy's setting.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Run {
    pub policy: PolicyKind,
    pub capacity: u64,
    pub max_split: Option<u64>,
    /// With `garbage_collection_threshold:0.6` (else the job's own threshold).
    pub gc_tried: bool,
    /// With `roundup_power2_divisions:N` for every interval (else the job's own).
    pub roundup: Option<u32>,
    /// With `torch.cuda.empty_cache()` after each of the job's steps (marked, or its rounds).
    pub empty_steps: bool,
    pub start: Start,
    pub addresses: AddressOrder,
}

impl Run {
    /// The job's own settings at `capacity`, replayed as PyTorch had it: every run is this
    /// and a remedy, and this one must fail where PyTorch failed.
    pub fn plain(capacity: u64) -> Run {
        Run {
            policy: PolicyKind::Caching,
            capacity,
            max_split: None,
            gc_tried: false,
            roundup: None,
            empty_steps: false,
            start: Start::AsFound,
            addresses: AddressOrder::Trace,
        }
    }

    /// Whether this run is one that judges any of `remedies` (the job's own run judges
    /// none: every judging asks it).
    pub fn judges_any(&self, remedies: &[Remedy]) -> bool {
        remedies.iter().any(|remedy| match remedy {
            Remedy::ExpandableSegments | Remedy::ExpandableWithGc(_) => {
                self.policy == PolicyKind::PytorchExpandable
            }
            Remedy::MaxSplitSizeMb(_) => self.max_split.is_some(),
            Remedy::RoundupPower2Divisions(_) => self.roundup.is_some(),
            Remedy::GarbageCollectionThreshold(_) => self.gc_tried,
            Remedy::EmptyCacheBetweenSteps => self.empty_steps,
            Remedy::EmptyCache | Remedy::EmptyCacheElsewhere { .. } => false,
        })
    }

    pub fn is_plain(&self) -> bool {
        self.policy == PolicyKind::Caching
            && self.max_split.is_none()
            && !self.gc_tried
            && self.roundup.is_none()
            && !self.empty_steps
    }
}

/// Where a replay from a checkpoint starts: the blocks live then, where PyTorch had them
/// (`AsFound`: its segments adopted, free parts and all); packed into a fresh allocator in
/// address order (`Packed`); or, for expandable segments, each large block grown to whole
/// pages plus one (`Padded`: a block can touch at most that many pages wherever it lies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Start {
    AsFound,
    Packed,
    Padded,
}

/// What the variants of a run disagree on (see `Starts::variants`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Disagreement {
    Start,
    Addresses,
}

/// The traces each `Start` replays (only made for a trace that begins at a checkpoint).
pub(super) struct Starts {
    packed: Option<Trace>,
    padded: Option<Trace>,
}

impl Starts {
    pub fn of(trace: &Trace, from_checkpoint: bool) -> Starts {
        if !from_checkpoint {
            return Starts {
                packed: None,
                padded: None,
            };
        }
        let packed = Trace {
            initial_segments: Vec::new(),
            ..trace.clone()
        };
        let mut padded = packed.clone();
        for b in &mut padded.initial {
            if b.size >= EXPANDABLE_PAGE / 2 {
                b.size = (b.size.div_ceil(EXPANDABLE_PAGE) + 1) * EXPANDABLE_PAGE;
            }
        }
        Starts {
            packed: Some(packed),
            padded: Some(padded),
        }
    }

    fn trace<'a>(&'a self, own: &'a Trace, start: Start) -> &'a Trace {
        match start {
            Start::AsFound => own,
            Start::Packed => self.packed.as_ref().unwrap_or(own),
            Start::Padded => self.padded.as_ref().unwrap_or(own),
        }
    }

    /// The variants of `run` its verdict must agree across, `run` itself first: the job's
    /// own run is only as PyTorch had it; a remedy's from every start (from a checkpoint)
    /// under every address order.
    fn variants(&self, run: Run) -> Vec<Run> {
        if run.is_plain() {
            return vec![run];
        }
        let starts: &[Start] = match (&self.packed, run.policy) {
            (None, _) => &[Start::AsFound],
            // It cannot adopt PyTorch's segments: its own start is the packed one.
            (Some(_), PolicyKind::PytorchExpandable) => &[Start::AsFound, Start::Padded],
            (Some(_), _) => &[Start::AsFound, Start::Packed],
        };
        let mut out = vec![Run {
            start: Start::AsFound,
            addresses: AddressOrder::Trace,
            ..run
        }];
        for &start in starts {
            for addresses in ADDRESS_ORDERS {
                let v = Run {
                    start,
                    addresses,
                    ..run
                };
                if !out.contains(&v) {
                    out.push(v);
                }
            }
        }
        out
    }
}

/// Every run the remedies need, at both capacity bounds: the job's own, expandable
/// segments, each `max_split_size_mb` and `roundup_power2_divisions` tried (the latter at
/// the lower bound less `roundup_room` too), the cache
/// emptied between steps (where the job's steps are known: marked, or its rounds), and the GC threshold at a known cap
/// (`gc_cap`, when the job had none of its own); each then from every start and address
/// order it must agree across.
pub(super) fn asked(
    settings: &AllocatorSettings,
    bounds: CapacityBounds,
    steps_marked: bool,
    gc_cap: Option<u64>,
    starts: &Starts,
) -> Vec<Run> {
    let mut asked: Vec<Run> = Vec::new();
    for capacity in [bounds.low, bounds.high] {
        let run = Run::plain(capacity);
        asked.push(run);
        if !settings.expandable_segments {
            asked.push(Run {
                policy: PolicyKind::PytorchExpandable,
                ..run
            });
        }
        for mb in MAX_SPLIT_TRIED_MB {
            if settings.max_split_size != Some(mb * MIB) {
                asked.push(Run {
                    max_split: Some(mb * MIB),
                    ..run
                });
            }
        }
        if settings.roundup_power2_divisions == [0; 16] {
            for n in ROUNDUP_TRIED {
                let rounded = Run {
                    roundup: Some(n),
                    ..run
                };
                asked.push(rounded);
                if capacity == bounds.low {
                    asked.push(Run {
                        capacity: with_room(capacity),
                        ..rounded
                    });
                }
            }
        }
        if steps_marked {
            asked.push(Run {
                empty_steps: true,
                ..run
            });
        }
        if bounds.low == bounds.high {
            break;
        }
    }
    if let Some(cap) = gc_cap {
        asked.push(Run {
            gc_tried: true,
            ..Run::plain(cap)
        });
    }
    // Each remedy's run from every start and under every address order (the job's own
    // run stays as PyTorch had it: it must fail where PyTorch failed).
    let others: Vec<Run> = asked
        .iter()
        .flat_map(|&r| starts.variants(r).into_iter().skip(1))
        .collect();
    asked.extend(others);
    asked
}

/// The runs done, each with what it answered at every OOM of the trace.
pub(super) struct Runs<'a> {
    starts: &'a Starts,
    bounds: CapacityBounds,
    done: Vec<(Run, Vec<OomCheck>)>,
}

impl<'a> Runs<'a> {
    /// Replays every run in `asked`, a thread each, as many at once as there are cores
    /// (a hundred runs or more from a checkpoint; this runs on a viewer's reader thread at
    /// a live OOM too). `own_gc`: the job's own GC threshold, where PyTorch acted on it.
    /// `steps`: where the job's steps begin (`replay::steps`, found once for every run;
    /// every start holds the same events).
    pub fn done(
        trace: &Trace,
        starts: &'a Starts,
        bounds: CapacityBounds,
        own_gc: Option<f64>,
        steps: &[usize],
        asked: Vec<Run>,
    ) -> Result<Runs<'a>, ReplayError> {
        let at = |run: Run| {
            let opts = ReplayOptions {
                capacity: run.capacity,
                source: bounds.source,
                max_split_size: run.max_split,
                gc_threshold: if run.gc_tried {
                    Some(GC_THRESHOLD_TRIED)
                } else {
                    own_gc
                },
                roundup_power2_divisions: run.roundup.map(|n| [n; 16]),
                empty_cache_at_steps: run.empty_steps,
                addresses: run.addresses,
            };
            replay_emptying_at(starts.trace(trace, run.start), run.policy, opts, steps)
                .map(|run| run.oom_checks)
        };
        let workers = std::thread::available_parallelism().map_or(4, |n| n.get());
        let mut answers: Vec<Result<Vec<OomCheck>, ReplayError>> = Vec::with_capacity(asked.len());
        for batch in asked.chunks(workers) {
            // They share nothing but the trace.
            std::thread::scope(|scope| {
                let handles: Vec<_> = batch
                    .iter()
                    .map(|&run| scope.spawn(move || at(run)))
                    .collect();
                answers.extend(
                    handles
                        .into_iter()
                        .map(|h| h.join().unwrap_or_else(|_| Ok(Vec::new()))),
                );
            });
        }
        let mut done = Vec::with_capacity(asked.len());
        for (run, answer) in asked.into_iter().zip(answers) {
            done.push((run, answer?));
        }
        Ok(Runs {
            starts,
            bounds,
            done,
        })
    }

    /// Would a job run so have died by the OOM at `event`: there, or at an allocation
    /// before it that the run could not place (PyTorch's own run placed them all)? `None`
    /// where the history cannot say: the run served an OOM the job caught earlier
    /// (`served_caught`) before anything failed, so the job run so went another way.
    pub fn fails(&self, event: usize, run: Run) -> Option<bool> {
        let checks = self.checks(run)?;
        let at = checks.iter().find(|c| c.event == event)?;
        match served_caught(checks, event, run) {
            Some(_) => None,
            None => Some(at.fails || at.failed_before > 0),
        }
    }

    /// The first OOM before `event` that the job caught and went on from, and that `run`,
    /// in any variant, would have served instead (`None`: none), at the lower capacity
    /// bound, where a "fits" is asked: there it keeps the verdict from fitting. (At the
    /// higher bound alone, the lower one may still decide it, and the cap would settle it.)
    pub fn diverged(&self, event: usize, run: Run) -> Option<&OomCheck> {
        self.starts
            .variants(run)
            .into_iter()
            .filter_map(|v| {
                let v = Run {
                    capacity: self.bounds.low,
                    ..v
                };
                served_caught(self.checks(v)?, event, v)
            })
            .min_by_key(|c| c.event)
    }

    /// What a run answered at each of the trace's OOMs, where it was asked.
    fn checks(&self, run: Run) -> Option<&[OomCheck]> {
        self.done
            .iter()
            .find(|(k, _)| *k == run)
            .map(|(_, checks)| checks.as_slice())
    }

    /// Fits only where it fits at the low capacity in every variant; fails only where it
    /// fails at the high capacity in every variant.
    pub fn verdict(&self, event: usize, run: Run) -> Verdict {
        let variants = self.starts.variants(run);
        let at = |capacity: u64| {
            variants
                .iter()
                .map(move |&v| self.fails(event, Run { capacity, ..v }))
        };
        if at(self.bounds.low).all(|f| f == Some(false)) {
            Verdict::Fits
        } else if at(self.bounds.high).all(|f| f == Some(true)) {
            Verdict::Fails
        } else {
            Verdict::CannotTell
        }
    }

    /// Whether a `roundup_power2_divisions` run fits at the lower capacity bound less
    /// `roundup_room` in every variant (`asked` asks it there).
    pub fn fits_with_room(&self, event: usize, run: Run) -> bool {
        let capacity = with_room(self.bounds.low);
        self.starts
            .variants(run)
            .iter()
            .all(|&v| self.fails(event, Run { capacity, ..v }) == Some(false))
    }

    /// Why variants of a run disagree, at some capacity: the start (where the blocks live
    /// at a checkpoint would have been), or the addresses (where CUDA would have put the
    /// remedy's new segments).
    pub fn disagreement(&self, event: usize, run: Run) -> Option<Disagreement> {
        let variants = self.starts.variants(run);
        let split = |same: &dyn Fn(&Run) -> bool| {
            [self.bounds.low, self.bounds.high].iter().any(|&capacity| {
                let mut seen = variants
                    .iter()
                    .filter(|v| same(v))
                    .map(|&v| self.fails(event, Run { capacity, ..v }));
                let first = seen.next().flatten();
                seen.any(|f| f != first)
            })
        };
        if split(&|v| v.addresses == AddressOrder::Trace) {
            Some(Disagreement::Start)
        } else if split(&|v| v.start == Start::AsFound) {
            Some(Disagreement::Addresses)
        } else if split(&|_| true) {
            // Only a start and an order together part them (the blocks packed anew and
            // new segments where CUDA would put them, say): the checkpoint's blocks decide
            // it either way.
            Some(Disagreement::Start)
        } else {
            None
        }
    }
}

/// The first of a run's checks before `event` at an OOM the job caught and went on from
/// (the trace goes on past it) that the run served: a job run so would have had what it
/// asked for there and gone another way from there (cuDNN, trying a convolution's
/// algorithms, keeps the first whose workspace it gets, and asks for it again each time;
/// a batch-size finder keeps the batch that fits). The job's history holds only the way
/// it went. A run that had already failed an allocation before it had run out by then,
/// as far as the history says. The job's own run (`Run::is_plain`) is PyTorch's,
/// whatever it serves.
fn served_caught(checks: &[OomCheck], event: usize, run: Run) -> Option<&OomCheck> {
    if run.is_plain() {
        return None;
    }
    checks
        .iter()
        .find(|c| c.event < event && !c.fails)
        .filter(|c| c.failed_before == 0)
}

#[cfg(test)]
mod tests {
    use super::super::super::OomCheck;
    use super::*;
    use crate::ooms::CapacitySource;

    const GIB: u64 = 1 << 30;

    /// Runs done by hand: each variant of a `max_split_size_mb:64` run at one capacity,
    /// failing or not at the OOM at event 10.
    fn runs_of<'a>(starts: &'a Starts, failing: &[(Start, AddressOrder)]) -> Runs<'a> {
        let bounds = CapacityBounds {
            low: GIB,
            high: GIB,
            source: CapacitySource::Given,
        };
        let run = Run {
            max_split: Some(64 * MIB),
            ..Run::plain(GIB)
        };
        let done = starts
            .variants(run)
            .into_iter()
            .map(|v| {
                let check = OomCheck {
                    event: 10,
                    requested_bytes: GIB / 2,
                    fails: failing.contains(&(v.start, v.addresses)),
                    failed_before: 0,
                    reserved_bytes: GIB,
                    largest_free_bytes: 0,
                };
                (v, vec![check])
            })
            .collect();
        Runs {
            starts,
            bounds,
            done,
        }
    }

    #[test]
    fn a_verdict_holds_under_the_trace_s_order_and_cuda_s_from_every_start() {
        let trace = Trace::bare(Vec::new(), Vec::new());
        let starts = Starts::of(&trace, true);
        let run = Run {
            max_split: Some(64 * MIB),
            ..Run::plain(GIB)
        };
        let mut seen: Vec<(Start, AddressOrder)> = starts
            .variants(run)
            .iter()
            .map(|v| (v.start, v.addresses))
            .collect();
        seen.sort_by_key(|&(s, a)| (s as u8, a == AddressOrder::Cuda));
        assert_eq!(
            seen,
            [
                (Start::AsFound, AddressOrder::Trace),
                (Start::AsFound, AddressOrder::Cuda),
                (Start::Packed, AddressOrder::Trace),
                (Start::Packed, AddressOrder::Cuda),
            ]
        );

        let agree = runs_of(&starts, &[]);
        assert_eq!(agree.verdict(10, run), Verdict::Fits);
        assert_eq!(agree.disagreement(10, run), None);

        let by_order = runs_of(&starts, &[(Start::AsFound, AddressOrder::Cuda)]);
        assert_eq!(by_order.verdict(10, run), Verdict::CannotTell);
        assert_eq!(
            by_order.disagreement(10, run),
            Some(Disagreement::Addresses)
        );

        // Packed anew and CUDA's order alone fail: neither the start nor the order alone
        // parts the runs, yet they are parted, and the reason must say by what.
        let by_both = runs_of(&starts, &[(Start::Packed, AddressOrder::Cuda)]);
        assert_eq!(by_both.verdict(10, run), Verdict::CannotTell);
        assert_eq!(by_both.disagreement(10, run), Some(Disagreement::Start));
    }

    /// A remedy's replay that serves what the job was refused at an OOM it caught and went
    /// on from (event 5; the judged OOM is event 10) says nothing of the judged one: the
    /// job run so went another way. Unless the run had already failed an allocation
    /// before it, or it is the job's own run.
    #[test]
    fn a_run_given_what_the_job_caught_an_oom_for_went_another_way() {
        let check = |event, fails, failed_before| OomCheck {
            event,
            requested_bytes: GIB / 2,
            fails,
            failed_before,
            reserved_bytes: GIB,
            largest_free_bytes: 0,
        };
        let trace = Trace::bare(Vec::new(), Vec::new());
        let starts = Starts::of(&trace, false);
        let bounds = CapacityBounds {
            low: GIB,
            high: GIB,
            source: CapacitySource::Given,
        };
        let remedy = Run {
            max_split: Some(64 * MIB),
            ..Run::plain(GIB)
        };
        let runs = |run: Run, checks: Vec<OomCheck>| Runs {
            starts: &starts,
            bounds,
            done: starts
                .variants(run)
                .into_iter()
                .map(|v| (v, checks.clone()))
                .collect(),
        };
        // Served at the caught OOM, served at the judged one: open, not "fits".
        let served = runs(remedy, vec![check(5, false, 0), check(10, false, 0)]);
        assert_eq!(served.fails(10, remedy), None);
        assert_eq!(served.verdict(10, remedy), Verdict::CannotTell);
        assert_eq!(served.diverged(10, remedy).map(|c| c.event), Some(5));
        // Failing the judged one after it: open too.
        let then_failed = runs(remedy, vec![check(5, false, 0), check(10, true, 0)]);
        assert_eq!(then_failed.verdict(10, remedy), Verdict::CannotTell);
        // Refused there as the job was: the history holds the way it went.
        let refused = runs(remedy, vec![check(5, true, 0), check(10, false, 0)]);
        assert_eq!(refused.verdict(10, remedy), Verdict::Fits);
        assert!(refused.diverged(10, remedy).is_none());
        // An allocation failed before the caught OOM: it had run out already.
        let died_first = runs(remedy, vec![check(5, false, 1), check(10, false, 1)]);
        assert_eq!(died_first.verdict(10, remedy), Verdict::Fails);
        // The job's own run is PyTorch's, whatever it serves.
        let plain = Run::plain(GIB);
        let own = runs(plain, vec![check(5, false, 0), check(10, false, 0)]);
        assert_eq!(own.verdict(10, plain), Verdict::Fits);
    }
}
