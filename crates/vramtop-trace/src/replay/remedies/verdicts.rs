//! What each remedy's replays say, in words: one function per remedy, from the verdict
//! its runs agree on (`Runs::verdict`) to the line users read.

use super::runs::ROUNDUP_TRIED;
use super::StepsBy;
use super::MAX_SPLIT_TRIED_MB;
use vramtop_alloc::remedy::{Missing, Remedy, RemedyVerdict, Verdict, GC_THRESHOLD_TRIED};

/// `empty_cache()` between steps, from the history replayed with the cache emptied after
/// each of the `steps` steps the hook marked before the OOM (optimizer steps, steps
/// GradScaler skipped, `vramtop.step()`), or where none is marked, after each of the
/// passes it marked or else of the job's rounds (`by`).
pub(super) fn between_steps(verdict: Verdict, steps: usize, by: StepsBy) -> RemedyVerdict {
    // A job that marked no steps is emptied between its passes, else its rounds.
    // "each of its 8 steps", "its one step"
    let its = |noun: &str| match steps {
        1 => format!("its one {noun}"),
        n => format!("each of its {n} {noun}s"),
    };
    let each = match by {
        // Not "training" steps: a decode loop's `vramtop.step()` marks are steps too.
        StepsBy::Marks => format!("{} marked in its history", its("step")),
        StepsBy::Passes => format!(
            "{}, before its model's next forward (no optimizer step is marked in its \
             history; a step ends where the model's forward runs again after a backward \
             whose gradients were since released or changed)",
            its("step")
        ),
        StepsBy::Rounds => format!(
            "{} (no step is marked in its history; a round ends where its memory in use came \
             back down to what it keeps)",
            its("round")
        ),
    };
    let reason = match verdict {
        Verdict::Fits => {
            format!(
                "the job's history replayed with the cache emptied after {each} serves the request"
            )
        }
        Verdict::Fails => format!(
            "the job's history replayed with the cache emptied after {each} still fails the \
             request"
        ),
        Verdict::CannotTell => format!(
            "replayed with the cache emptied after {each}, it fits at the trace's lower \
             capacity bound only"
        ),
    };
    RemedyVerdict::new(Remedy::EmptyCacheBetweenSteps, verdict, reason)
}

/// `roundup_power2_divisions:N`: requests rounded up to the next of N equal steps between
/// two powers of two, so that varying sizes reuse the same blocks. `verdict(n)`: the runs'
/// verdict, and whether a "fits" is close (it does not fit with `runs::roundup_room` less).
/// The values trusted as for `max_split_size_mb` (`Tried::pick`), except that no value is
/// trusted alone for being the first: none is the safest by the allocator's rules. The N
/// named is the last trusted that is not close, else a close one: the caller, once the rest
/// of the step has had its say, leaves a "fits" that names a close N open (`too_close`).
pub(super) fn roundup(verdict: &dyn Fn(u32) -> (Verdict, bool)) -> RemedyVerdict {
    let tried = Tried::of(&ROUNDUP_TRIED, &|n| verdict(n).0);
    let is_close = |n: u32| verdict(n) == (Verdict::Fits, true);
    let range = format!(
        "tried {} to {}",
        ROUNDUP_TRIED[0],
        ROUNDUP_TRIED[ROUNDUP_TRIED.len() - 1]
    );
    let rounded = "requests rounded as PyTorch rounds them under it";
    if let Some(picked) = tried.pick(false) {
        let (close, roomy): (Vec<u32>, Vec<u32>) =
            picked.values.iter().partition(|&&n| is_close(n));
        let named = roomy.last().copied().unwrap_or(picked.value);
        let (listed, close) = if roomy.is_empty() {
            (close, String::new())
        } else if close.is_empty() {
            (roomy, String::new())
        } else {
            (roomy, format!("; {}: not counted", too_close_words(&close)))
        };
        return RemedyVerdict::new(
            Remedy::RoundupPower2Divisions(Some(named)),
            Verdict::Fits,
            format!(
                "the job's history replayed with {rounded} serves the request (fits with \
                 N = {}{}{close}; {range})",
                joined(&listed),
                picked.also()
            ),
        );
    }
    const NAME: Remedy = Remedy::RoundupPower2Divisions(None);
    if let Some(alone) = tried.fitting() {
        return RemedyVerdict::new(
            NAME,
            Verdict::CannotTell,
            format!(
                "the job's history replayed with {rounded} serves the request with N = \
                 {alone} alone, each between values that do not fit: the outcome turns on \
                 the exact order of the job's allocations, which varies from run to run \
                 ({range})"
            ),
        );
    }
    if tried.any_open() {
        return RemedyVerdict::new(
            NAME,
            Verdict::CannotTell,
            format!(
                "the replay fits some N at the trace's lower capacity bound only, or from one \
                 start of the checkpoint only ({range})"
            ),
        )
        .lacking(Missing::MemoryCap);
    }
    RemedyVerdict::new(
        NAME,
        Verdict::Fails,
        format!(
            "the job's history replayed with {rounded} still fails the request at every N \
             ({range})"
        ),
    )
}

/// A `roundup_power2_divisions` "fits" that names a close N (`roundup`), left open.
pub(super) fn too_close(n: u32) -> RemedyVerdict {
    RemedyVerdict::new(
        Remedy::RoundupPower2Divisions(None),
        Verdict::CannotTell,
        format!(
            "{} (tried {} to {})",
            too_close_words(&[n]),
            ROUNDUP_TRIED[0],
            ROUNDUP_TRIED[ROUNDUP_TRIED.len() - 1]
        ),
    )
}

fn too_close_words(close: &[u32]) -> String {
    format!(
        "N = {} served it with less than a hundredth of the cap to spare, too close to call \
         for a replay that guesses which segments PyTorch would make under it",
        joined(close)
    )
}

/// "20, 64, 128": values as a reason lists them.
fn joined<T: std::fmt::Display>(values: &[T]) -> String {
    values
        .iter()
        .map(T::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `garbage_collection_threshold:0.6` under a memory fraction, from the history replayed
/// with PyTorch's garbage collector (`own`: the job already ran with a threshold).
pub(super) fn gc_threshold(own: Option<f64>, verdict: Verdict) -> RemedyVerdict {
    const NAME: Remedy = Remedy::GarbageCollectionThreshold(GC_THRESHOLD_TRIED);
    if let Some(own) = own {
        // Its replay (the plain one) failed where PyTorch did.
        let (verdict, reason) = if own == GC_THRESHOLD_TRIED {
            (
                Verdict::Fails,
                "already on: the job ran with it".to_string(),
            )
        } else {
            (
                Verdict::CannotTell,
                format!(
                    "the job ran with garbage_collection_threshold:{own}; 0.6 was not replayed"
                ),
            )
        };
        return RemedyVerdict::new(NAME, verdict, reason);
    }
    let (verdict, reason) = match verdict {
        Verdict::Fits => (
            Verdict::Fits,
            "the job's history replayed with PyTorch's garbage collector (free cached \
             segments released once reserved passes 60 % of the cap) serves the request",
        ),
        Verdict::Fails => (
            Verdict::Fails,
            "the job's history replayed with PyTorch's garbage collector (free cached \
             segments released once reserved passes 60 % of the cap) still fails the request",
        ),
        Verdict::CannotTell => {
            return RemedyVerdict::new(
                NAME,
                Verdict::CannotTell,
                "it acts at a share of the memory cap, which this trace only bounds",
            )
            .lacking(Missing::MemoryCap)
        }
    };
    RemedyVerdict::new(NAME, verdict, reason)
}

/// `partial`: the trace began with blocks already live, which the replay packs (the best
/// case): then its "fits" is no answer.
pub(super) fn expandable(
    already_on: bool,
    partial: bool,
    verdict: impl Fn() -> Verdict,
) -> RemedyVerdict {
    const NAME: Remedy = Remedy::ExpandableSegments;
    if already_on {
        return RemedyVerdict::new(
            NAME,
            Verdict::Fails,
            "already on: PyTorch unmapped every free page and retried before it raised",
        );
    }
    let (verdict, reason) = match verdict() {
        Verdict::Fits if partial => (
            Verdict::CannotTell,
            "it fits only with the blocks live at the trace's start packed tight (the best \
             case): record the job from its start",
        ),
        Verdict::Fits => (
            Verdict::Fits,
            "the job's own history replayed with PyTorch's expandable rules (20 MiB pages) \
             serves the request",
        ),
        Verdict::Fails => (
            Verdict::Fails,
            "the job's own history replayed with PyTorch's expandable rules (20 MiB pages) \
             still fails the request",
        ),
        Verdict::CannotTell => {
            return RemedyVerdict::new(
                NAME,
                Verdict::CannotTell,
                "the replay fits it at the trace's lower capacity bound only",
            )
            .lacking(Missing::MemoryCap)
        }
    };
    RemedyVerdict::new(NAME, verdict, reason)
}

/// The verdicts of one setting at each value tried, in the order tried.
struct Tried<T> {
    verdicts: Vec<(T, Verdict)>,
}

/// The value a "fits" names, with the others trusted beside it and those left out.
struct Picked<T> {
    value: T,
    /// Every value trusted, the one named among them.
    values: Vec<T>,
    /// Values that fitted alone, between values that do not fit.
    lone: Vec<T>,
}

impl<T: Copy + std::fmt::Display> Picked<T> {
    /// What the reason adds about the values left out.
    fn also(&self) -> String {
        if self.lone.is_empty() {
            return String::new();
        }
        format!(
            "; N = {} also served it alone, between values that do not, which turns on the \
             exact order of the job's allocations: not counted",
            joined(&self.lone)
        )
    }
}

impl<T: Copy + std::fmt::Display> Tried<T> {
    fn of(values: &[T], verdict: &dyn Fn(T) -> Verdict) -> Self {
        Tried {
            verdicts: values.iter().map(|&v| (v, verdict(v))).collect(),
        }
    }

    fn fits(&self, i: usize) -> bool {
        self.verdicts
            .get(i)
            .is_some_and(|(_, v)| *v == Verdict::Fits)
    }

    /// The values at these indices.
    fn values(&self, list: impl Iterator<Item = usize>) -> Vec<T> {
        list.map(|j| self.verdicts[j].0).collect()
    }

    /// Every value that fits, where any does ("64, 512").
    fn fitting(&self) -> Option<String> {
        let all = self.values((0..self.verdicts.len()).filter(|&i| self.fits(i)));
        (!all.is_empty()).then(|| joined(&all))
    }

    fn any_open(&self) -> bool {
        self.verdicts.iter().any(|(_, v)| *v == Verdict::CannotTell)
    }

    /// The value to name, the last tried of those trusted.
    ///
    /// The values that fit are trusted when they form one run of neighbouring values
    /// tried. Where they are scattered, fitting, failing and fitting again, a value that
    /// fits with both neighbours failing turns on the exact order of the job's
    /// allocations, which is not the same from run to run: only a value beside another
    /// that fits is then trusted, or the first tried where `first_alone` says it is the
    /// safest by the allocator's rules.
    fn pick(&self, first_alone: bool) -> Option<Picked<T>> {
        let n = self.verdicts.len();
        let fits = |i: usize| self.fits(i);
        let runs = (0..n)
            .filter(|&i| fits(i) && (i == 0 || !fits(i - 1)))
            .count();
        let i = (0..n)
            .rev()
            .find(|&i| fits(i) && (runs == 1 || (i > 0 && fits(i - 1)) || fits(i + 1)))
            .or_else(|| (first_alone && fits(0)).then_some(0))?;
        let alone = |j: usize| {
            let left_fails = j == 0 || !fits(j - 1);
            let trusted_first = first_alone && j == 0;
            j != i && runs > 1 && fits(j) && left_fails && !fits(j + 1) && !trusted_first
        };
        let (lone, trusted): (Vec<usize>, Vec<usize>) =
            (0..n).filter(|&j| fits(j)).partition(|&j| alone(j));
        Some(Picked {
            value: self.verdicts[i].0,
            values: self.values(trusted.into_iter()),
            lone: self.values(lone.into_iter()),
        })
    }
}

/// The largest `max_split_size_mb` that fits for sure, else whether any might.
///
/// The values that fit are trusted as `Tried::pick` says. On the H100 PyTorch's own
/// reruns of one seeded GPT-2 job with `max_split_size_mb:512` (the replay's fits were 20
/// and 512, each alone) fitted once and failed once. The smallest tried (20) is trusted
/// alone: it gives every request of 20 MiB or more a segment of its own size and so leaves
/// the least to the order of allocations. Wherever the replay fitted it under every
/// address order, PyTorch fitted it (that GPT-2 job; gpt2mixed in every run on H100 and
/// H200, where 1024, also alone, fitted in four runs under four placements and 64 in three
/// of four). A value that fits alone, other than the one named, is not among those said
/// to fit (on a Llama generating, the replay's lone 128 was one PyTorch failed, H200).
pub(super) fn max_split(verdict: &dyn Fn(u64) -> Verdict) -> RemedyVerdict {
    let tried_values = Tried::of(&MAX_SPLIT_TRIED_MB, verdict);
    let tried = format!(
        "tried {} to {} MiB",
        MAX_SPLIT_TRIED_MB[0],
        MAX_SPLIT_TRIED_MB[MAX_SPLIT_TRIED_MB.len() - 1]
    );
    if let Some(picked) = tried_values.pick(true) {
        return RemedyVerdict::new(
            Remedy::MaxSplitSizeMb(Some(picked.value)),
            Verdict::Fits,
            format!(
                "the job's history replayed with it serves the request (fits with N = {}{}; {tried})",
                joined(&picked.values),
                picked.also()
            ),
        );
    }
    if let Some(fitting) = tried_values.fitting() {
        return RemedyVerdict::new(
            Remedy::MaxSplitSizeMb(None),
            Verdict::CannotTell,
            format!(
                "the job's history replayed serves the request with N = {fitting} alone, each \
                 between values that do not fit: the outcome turns on the exact order of the \
                 job's allocations, which varies from run to run ({tried})"
            ),
        );
    }
    if tried_values.any_open() {
        return RemedyVerdict::new(
            Remedy::MaxSplitSizeMb(None),
            Verdict::CannotTell,
            format!("some N fit only at the trace's lower capacity bound ({tried})"),
        )
        .lacking(Missing::MemoryCap);
    }
    RemedyVerdict::new(
        Remedy::MaxSplitSizeMb(None),
        Verdict::Fails,
        format!("no value fits: the job's history replayed with each still fails ({tried})"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_the_cap_would_decide_says_the_cap_is_missing() {
        let open = gc_threshold(None, Verdict::CannotTell);
        assert_eq!(open.missing, Some(Missing::MemoryCap), "{open:?}");
        assert!(
            !open.reason.contains("--"),
            "no flag in a library's words: {open:?}"
        );
        let decided = gc_threshold(None, Verdict::Fails);
        assert_eq!(decided.missing, None, "{decided:?}");
        let split = max_split(&|_| Verdict::CannotTell);
        assert_eq!(split.missing, Some(Missing::MemoryCap), "{split:?}");
    }

    #[test]
    fn a_max_split_that_fits_alone_between_failures_is_not_a_verdict() {
        use Verdict::{Fails, Fits};
        let only =
            |set: &'static [u64]| move |mb: u64| if set.contains(&mb) { Fits } else { Fails };
        // Alone between 256 and 1024, which fail: the order of the job's allocations
        // decides it (PyTorch fitted and failed in two runs of such a job).
        let lone = max_split(&only(&[64, 512]));
        assert_eq!(lone.verdict, Verdict::CannotTell, "{lone:?}");
        assert!(lone.reason.contains("N = 64, 512 alone"), "{lone:?}");
        // The smallest is trusted alone; another lone fit is named as such.
        let smallest_alone = max_split(&only(&[20, 1024]));
        assert_eq!(
            (smallest_alone.verdict, &smallest_alone.remedy),
            (Fits, &Remedy::MaxSplitSizeMb(Some(20)))
        );
        assert!(
            smallest_alone
                .reason
                .contains("fits with N = 20; N = 1024 also served it alone"),
            "{smallest_alone:?}"
        );
        // Scattered fits: the largest beside another that fits.
        let pair = max_split(&only(&[256, 512, 2048]));
        assert_eq!(
            (pair.verdict, pair.remedy),
            (Fits, Remedy::MaxSplitSizeMb(Some(512)))
        );
        // One run of fits, however short, is trusted whole.
        let top = max_split(&only(&[2048, 4096]));
        assert_eq!(top.remedy, Remedy::MaxSplitSizeMb(Some(4096)));
        let smallest = max_split(&only(&[20]));
        assert_eq!(
            (smallest.verdict, smallest.remedy.to_string().as_str()),
            (Fits, "max_split_size_mb:20")
        );
        assert_eq!(max_split(&only(&[256])).verdict, Fits);
        assert_eq!(max_split(&only(&[])).verdict, Fails);
    }

    #[test]
    fn a_roundup_names_an_n_with_room_and_leaves_a_lone_or_close_one_out() {
        use Verdict::{Fails, Fits};
        let of = |fitting: &'static [u32], close: &'static [u32]| {
            roundup(&move |n| {
                let v = if fitting.contains(&n) { Fits } else { Fails };
                (v, close.contains(&n))
            })
        };
        // One run of neighbours: trusted whole, the last named.
        let run = of(&[4, 8, 16], &[]);
        assert_eq!(
            (run.verdict, &run.remedy),
            (Fits, &Remedy::RoundupPower2Divisions(Some(16)))
        );
        assert!(
            run.reason.contains("fits with N = 4, 8, 16; tried 2 to 16"),
            "{run:?}"
        );
        // Scattered, each alone: the first value is not trusted for being first.
        let lone = of(&[2, 16], &[]);
        assert_eq!(lone.verdict, Verdict::CannotTell, "{lone:?}");
        assert_eq!(lone.remedy, Remedy::RoundupPower2Divisions(None));
        assert!(lone.reason.contains("N = 2, 16 alone"), "{lone:?}");
        // A close value beside values with room: named among them, listed apart.
        let beside = of(&[4, 8, 16], &[16]);
        assert_eq!(beside.remedy, Remedy::RoundupPower2Divisions(Some(8)));
        assert!(
            beside
                .reason
                .contains("fits with N = 4, 8; N = 16 served it with less than a hundredth"),
            "{beside:?}"
        );
        // Only close values: named, for the caller to leave open once the step is judged.
        let close = of(&[16], &[16]);
        assert_eq!(close.remedy, Remedy::RoundupPower2Divisions(Some(16)));
        let open = too_close(16);
        assert_eq!(
            (open.verdict, &open.remedy),
            (Verdict::CannotTell, &Remedy::RoundupPower2Divisions(None))
        );
        assert!(open.reason.contains("N = 16 served it"), "{open:?}");
        let none = of(&[], &[]);
        assert_eq!(none.verdict, Fails);
        assert!(
            none.reason.contains("at every N (tried 2 to 16)"),
            "{none:?}"
        );
    }
}
