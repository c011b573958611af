//! What each remedy's replays say, in words: one function per remedy, from the verdict
//! its runs agree on (`Runs::verdict`) to the line users read.

use super::runs::ROUNDUP_TRIED;
use super::StepsBy;
use super::MAX_SPLIT_TRIED_MB;
use vramtop_alloc::remedy::{Missing, Remedy, RemedyVerdict, Verdict, GC_THRESHOLD_TRIED};

/// `empty_cache()` between steps, from the history replayed with the cache emptied after
/// each of the `steps` optimizer steps the hook marked before the OOM, or where none is
/// marked, after each of the passes it marked or else of the job's rounds (`by`).
pub(super) fn between_steps(verdict: Verdict, steps: usize, by: StepsBy) -> RemedyVerdict {
    // A job that marked no steps is emptied between its passes, else its rounds.
    let each = match by {
        StepsBy::Marks => format!("each of its {steps} optimizer steps"),
        StepsBy::Passes => format!(
            "each of its {steps} steps, before its model's next forward (no optimizer step \
             is marked in its history; a step ends where the model's forward runs again \
             after a backward whose gradients were since released or changed)"
        ),
        StepsBy::Rounds => format!(
            "each of its {steps} rounds (no step is marked in its history; a round ends where \
             its memory in use came back down to what it keeps)"
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

/// `roundup_power2_divisions:4`: requests rounded up to the next quarter of a power of
/// two, so that varying sizes reuse the same blocks.
pub(super) fn roundup(verdict: Verdict) -> RemedyVerdict {
    let reason = match verdict {
        Verdict::Fits => {
            "the job's history replayed with requests rounded as PyTorch rounds them \
                          under it serves the request"
        }
        Verdict::Fails => {
            "the job's history replayed with requests rounded as PyTorch rounds \
                           them under it still fails the request"
        }
        Verdict::CannotTell => {
            "the replay fits it at the trace's lower capacity bound only, or \
                                from one start of the checkpoint only"
        }
    };
    RemedyVerdict::new(
        Remedy::RoundupPower2Divisions(ROUNDUP_TRIED),
        verdict,
        reason,
    )
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

/// The largest `max_split_size_mb` that fits for sure, else whether any might.
///
/// The values that fit are trusted when they form one run of neighbouring tried values
/// (a smaller N splits fewer large blocks: fitting below some N and failing above is what
/// the allocator's rules give). Where they are scattered, fitting, failing and fitting
/// again as N grows, a value that fits with both neighbours failing turns on the exact
/// order of the job's allocations, which is not the same from run to run: on the H100
/// PyTorch's own reruns of one seeded GPT-2 job with `max_split_size_mb:512` (the
/// replay's fits were 20 and 512) fitted once and failed once. Only a value beside
/// another that fits is then trusted, or the smallest tried (20), which gives every
/// request of 20 MiB or more a segment of its own size and so leaves the least to the
/// order of allocations: wherever the replay fitted it under every address order, PyTorch
/// fitted it (that GPT-2 job; gpt2mixed in every run on H100 and H200, where 1024, also
/// alone, fitted in four runs under four placements and 64 in three of four).
pub(super) fn max_split(verdict: &dyn Fn(u64) -> Verdict) -> RemedyVerdict {
    let verdicts: Vec<(u64, Verdict)> = MAX_SPLIT_TRIED_MB
        .iter()
        .map(|&mb| (mb, verdict(mb)))
        .collect();
    let tried = format!(
        "tried {} to {} MiB",
        MAX_SPLIT_TRIED_MB[0],
        MAX_SPLIT_TRIED_MB[MAX_SPLIT_TRIED_MB.len() - 1]
    );
    let fits = |i: usize| verdicts.get(i).is_some_and(|(_, v)| *v == Verdict::Fits);
    let fitting: Vec<String> = verdicts
        .iter()
        .filter(|(_, v)| *v == Verdict::Fits)
        .map(|(mb, _)| mb.to_string())
        .collect();
    // Runs of neighbouring values that fit: one run is trusted whole.
    let runs = (0..verdicts.len())
        .filter(|&i| fits(i) && (i == 0 || !fits(i - 1)))
        .count();
    let steady = (0..verdicts.len())
        .rev()
        .find(|&i| fits(i) && (runs == 1 || (i > 0 && fits(i - 1)) || fits(i + 1)))
        .or_else(|| fits(0).then_some(0));
    if let Some(i) = steady {
        // Values that fit alone, between values that do not fit, other than the one named:
        // not among those said to fit (on a Llama generating, the replay's lone 128 was
        // one PyTorch failed, H200).
        let alone =
            |j: usize| j != i && runs > 1 && j > 0 && fits(j) && !fits(j - 1) && !fits(j + 1);
        let (lone, trusted): (Vec<usize>, Vec<usize>) = (0..verdicts.len())
            .filter(|&j| fits(j))
            .partition(|&j| alone(j));
        let named = |list: &[usize]| -> String {
            list.iter()
                .map(|&j| verdicts[j].0.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let also = if lone.is_empty() {
            String::new()
        } else {
            format!(
                "; N = {} also served it alone, between values that do not, which turns on \
                 the exact order of the job's allocations: not counted",
                named(&lone)
            )
        };
        return RemedyVerdict::new(
            Remedy::MaxSplitSizeMb(Some(verdicts[i].0)),
            Verdict::Fits,
            format!(
                "the job's history replayed with it serves the request (fits with N = {}{also}; {tried})",
                named(&trusted)
            ),
        );
    }
    if !fitting.is_empty() {
        return RemedyVerdict::new(
            Remedy::MaxSplitSizeMb(None),
            Verdict::CannotTell,
            format!(
                "the job's history replayed serves the request with N = {} alone, each \
                 between values that do not fit: the outcome turns on the exact order of the \
                 job's allocations, which varies from run to run ({tried})",
                fitting.join(", ")
            ),
        );
    }
    if verdicts.iter().any(|(_, v)| *v == Verdict::CannotTell) {
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
}
