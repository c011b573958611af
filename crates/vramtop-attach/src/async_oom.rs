//! The OOM of a job under `backend:cudaMallocAsync`, read from PyTorch's own message.
//!
//! That backend gives the hook no OOM observer and no blocks, so PyTorch's exception is
//! all there is. Its allocator (c10/cuda/CUDAMallocAsyncAllocator.cpp, `mallocAsync`)
//! says, for every OOM:
//!
//! ```text
//! Allocation on device 0 would exceed allowed memory. (out of memory)
//! Currently allocated     : 6.00 GiB
//! Requested               : 1024.00 MiB
//! Device limit            : 139.80 GiB
//! Free (according to CUDA): 122.17 GiB
//! PyTorch limit (set by user-supplied memory fraction)
//!                         : 6.99 GiB
//! ```
//!
//! It refuses a request when the bytes it has handed out ("Currently allocated": live
//! tensors, as it counts only what callers hold) and the request exceed the memory
//! fraction's limit, or when CUDA's pool cannot map it. Without a fraction the limit is
//! printed as a huge number.

/// PyTorch's figures at an OOM of the async backend, in bytes (rounded as it prints them:
/// two decimals of the unit).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AsyncOom {
    pub allocated_bytes: u64,
    pub requested_bytes: u64,
    pub device_total_bytes: u64,
    pub device_free_bytes: u64,
    /// The memory fraction's limit; `None` where none was set.
    pub limit_bytes: Option<u64>,
}

impl AsyncOom {
    /// The figures of PyTorch's message, or `None` for any other message.
    pub fn parse(message: &str) -> Option<Self> {
        if !message.contains("would exceed allowed memory") {
            return None;
        }
        let figure = |label: &str| -> Option<u64> {
            let after = &message[message.find(label)? + label.len()..];
            let after = after.trim_start_matches([' ', '\n', ':']);
            let end = after.find('\n').unwrap_or(after.len());
            size(&after[..end])
        };
        let device_total_bytes = figure("Device limit")?;
        let limit = figure("set by user-supplied memory fraction)");
        Some(AsyncOom {
            allocated_bytes: figure("Currently allocated")?,
            requested_bytes: figure("Requested")?,
            device_total_bytes,
            device_free_bytes: figure("Free (according to CUDA)")?,
            // No fraction: PyTorch prints its "no limit" (the largest u64), far over the GPU.
            limit_bytes: limit.filter(|&l| l <= device_total_bytes),
        })
    }

    /// The request, to two places as PyTorch printed it.
    pub fn needed(&self) -> String {
        two_places(self.requested_bytes)
    }

    /// Why it ran out, in one line, from PyTorch's own test: what is live and the request
    /// against the limit; else the GPU's free memory against the request. PyTorch prints
    /// each figure to two places of its unit, so a sum within that rounding of the limit
    /// is "at" it, not over it by a figure; and there, a GPU with less free than the
    /// request is named as the cause instead.
    pub fn cause(&self) -> String {
        let live = two_places(self.allocated_bytes);
        let asked = self.needed();
        let wanted = self.allocated_bytes.saturating_add(self.requested_bytes);
        let rounding = [self.allocated_bytes, self.requested_bytes]
            .into_iter()
            .chain(self.limit_bytes)
            .map(half_a_printed_place)
            .sum::<u64>();
        let gpu_full = self.device_free_bytes < self.requested_bytes;
        match self.limit_bytes {
            Some(limit)
                if wanted > limit.saturating_add(rounding) || (wanted > limit && !gpu_full) =>
            {
                let by = wanted - limit;
                let by = if by > rounding {
                    format!("by {}", two_places(by))
                } else {
                    "within PyTorch's rounding".to_string()
                };
                format!(
                    "the job's live tensors ({live}) and the request ({asked}) exceed the limit \
                     its memory fraction sets ({}) {by}: no allocator setting changes what is \
                     live; only less live memory or a larger fraction fits it ({} free on \
                     the GPU)",
                    two_places(limit),
                    two_places(self.device_free_bytes),
                )
            }
            // The job's own live tensors and the request are more than the GPU has.
            _ if wanted > self.device_total_bytes => format!(
                "the job's live tensors ({live}) and the request ({asked}) exceed the GPU \
                 ({}): no allocator setting changes what is live; only less live memory \
                 fits it",
                two_places(self.device_total_bytes),
            ),
            _ => format!(
                "CUDA's pool could not map the request ({asked}) with {} free on the GPU \
                 and {live} live in this job: other processes hold the rest, or memory \
                 CUDA's pool keeps",
                two_places(self.device_free_bytes),
            ),
        }
    }
}

/// Half the last place PyTorch printed `bytes` to (two places of KiB, MiB or GiB): how far
/// the figure read back may lie from the true one.
fn half_a_printed_place(bytes: u64) -> u64 {
    let unit: u64 = if bytes > 1 << 30 {
        1 << 30
    } else if bytes > 1 << 20 {
        1 << 20
    } else {
        1 << 10
    };
    unit / 200
}

/// Why a job under another backend gets no map, history or remedy: what every display of
/// such a job says after its figures.
pub const UNTRACKED_WHY: &str = "PyTorch tracks no blocks or segments under this backend \
     (its own pool holds them): no map, no history, and no remedy is judged; \
     expandable_segments, max_split_size_mb, garbage_collection_threshold and \
     roundup_power2_divisions apply to the native allocator only";

/// What the hook keeps at each OOM of a job under a backend that tracks no blocks
/// (`vramtop-oom-[TAG-]PID-N-untracked.json`, N = 1 to 3 then `last`; before hook 1.11
/// only the OOM it died of, `...-PID-untracked.json`): the backend and PyTorch's
/// exception.
#[derive(Clone, Debug, Default, serde::Deserialize)]
pub struct KeptUntracked {
    pub backend: String,
    pub kind: String,
    pub message: String,
    /// The OOM's number in the process (hook 1.11).
    #[serde(default)]
    pub number: Option<u64>,
    /// The process died of it (hook 1.11 marks it so at the uncaught exception).
    #[serde(default)]
    pub uncaught: bool,
}

impl KeptUntracked {
    /// The lines `vramtop run` prints after a batch job (of process `pid`, where its file
    /// names it): the OOM named where PyTorch's message gives its figures
    /// (cudaMallocAsync), else what it said and why no more. "Caught by the job" only
    /// where the job ended well (`ended_well`: exit 0) and the process did not die of
    /// it: a launcher that exits on an exception without Python's excepthook
    /// (`mp.spawn`'s workers, Hydra) leaves no mark on the OOM it died of.
    pub fn explain(&self, pid: Option<u32>, ended_well: bool) -> Vec<String> {
        let number = self.number.map_or_else(String::new, |n| format!(" {n}"));
        let of = pid.map_or_else(String::new, |p| format!(" of pid {p}"));
        let caught = if self.number.is_some() && !self.uncaught && ended_well {
            " (caught by the job)"
        } else {
            ""
        };
        let head = format!("OOM{number}{of} under backend:{}{caught}", self.backend);
        let mut lines = match AsyncOom::parse(&self.message) {
            Some(oom) => vec![format!(
                "{head}: needed {}; cause: {}",
                oom.needed(),
                oom.cause()
            )],
            None => vec![format!(
                "{head}: PyTorch said \"{}\"",
                self.message.lines().next().unwrap_or("").trim()
            )],
        };
        lines.push(UNTRACKED_WHY.to_string());
        lines
    }
}

/// Sizes to two places, as PyTorch's message has them: a limit of 6.99 GiB does not read
/// as 7.0 GiB beside a request that exceeds it by 10 MiB.
fn two_places(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    UNITS.iter().find(|(_, scale)| bytes >= *scale).map_or_else(
        || format!("{bytes} B"),
        |(unit, scale)| format!("{:.2} {unit}", bytes as f64 / *scale as f64),
    )
}

/// PyTorch's `format_size`: "123 bytes", "1.50 KiB", "6.00 GiB".
fn size(text: &str) -> Option<u64> {
    let mut words = text.split_whitespace();
    let value: f64 = words.next()?.parse().ok()?;
    let scale = match words.next()? {
        "bytes" => 1u64,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        _ => return None,
    };
    let bytes = (value * scale as f64).round();
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    /// PyTorch 2.11's message on the H200 (2026-11-28): a 6.99 GiB fraction, 6 GiB live,
    /// 1 GiB asked.
    const UNDER_A_FRACTION: &str = "Allocation on device 0 would exceed allowed memory. \
        (out of memory)\nCurrently allocated     : 6.00 GiB\nRequested               : \
        1024.00 MiB\nDevice limit            : 139.80 GiB\nFree (according to CUDA): \
        122.17 GiB\nPyTorch limit (set by user-supplied memory fraction)\n                  \
              : 6.99 GiB";

    #[test]
    fn a_fractions_oom_names_what_is_live_against_the_limit() {
        let oom = AsyncOom::parse(UNDER_A_FRACTION).expect("parsed");
        assert_eq!(oom.allocated_bytes, 6 * GIB);
        assert_eq!(oom.requested_bytes, 1024 * MIB);
        assert_eq!(oom.limit_bytes, Some((6.99 * GIB as f64).round() as u64));
        assert!(oom.device_free_bytes > 122 * GIB);
        let cause = oom.cause();
        assert!(
            cause.starts_with(
                "the job's live tensors (6.00 GiB) and the request (1.00 GiB) exceed the limit \
                 its memory fraction sets (6.99 GiB) within PyTorch's rounding"
            ),
            "{cause}"
        );
        // Well over it, by how much.
        let over = AsyncOom::parse(&UNDER_A_FRACTION.replace(": 6.00 GiB", ": 8.00 GiB"));
        let cause = over.expect("parsed").cause();
        assert!(
            cause.contains("(6.99 GiB) by 2.01 GiB: no allocator setting"),
            "{cause}"
        );
    }

    #[test]
    fn without_a_fraction_the_gpus_free_memory_is_the_limit() {
        // No fraction: PyTorch prints u64::MAX bytes as GiB.
        let message = UNDER_A_FRACTION
            .replace("6.99 GiB", "17179869184.00 GiB")
            .replace("122.17 GiB", "512.00 MiB");
        let oom = AsyncOom::parse(&message).expect("parsed");
        assert_eq!(oom.limit_bytes, None);
        assert!(
            oom.cause().starts_with(
                "CUDA's pool could not map the request (1.00 GiB) with 512.00 MiB free"
            ),
            "{}",
            oom.cause()
        );
    }

    #[test]
    fn a_gpu_the_job_fills_itself_is_named_so() {
        // PyTorch 2.11 on the H200, no fraction, 4 GiB tensors until it ran out.
        let message = "Allocation on device 0 would exceed allowed memory. (out of memory)\n\
            Currently allocated     : 136.00 GiB\nRequested               : 4.00 GiB\n\
            Device limit            : 139.80 GiB\nFree (according to CUDA): 31.12 MiB\n\
            PyTorch limit (set by user-supplied memory fraction)\n                        \
            : 17179869184.00 GiB";
        let oom = AsyncOom::parse(message).expect("parsed");
        assert_eq!(oom.limit_bytes, None);
        assert!(
            oom.cause().starts_with(
                "the job's live tensors (136.00 GiB) and the request (4.00 GiB) exceed the GPU \
                 (139.80 GiB)"
            ),
            "{}",
            oom.cause()
        );
    }

    #[test]
    fn a_limit_over_the_device_is_no_fraction() {
        let message = UNDER_A_FRACTION.replace("6.99 GiB", "200.00 GiB");
        assert_eq!(AsyncOom::parse(&message).expect("parsed").limit_bytes, None);
    }

    #[test]
    fn at_the_limit_within_rounding_a_full_gpu_is_the_cause() {
        // 6.00 GiB + 1.00 GiB read back against a 7.00 GiB limit: PyTorch's own sum may lie
        // either side of it; the GPU had less free than the request.
        let message = UNDER_A_FRACTION
            .replace("6.99 GiB", "7.00 GiB")
            .replace("122.17 GiB", "512.00 MiB");
        let mut oom = AsyncOom::parse(&message).expect("parsed");
        oom.limit_bytes = oom.limit_bytes.map(|l| l - 4 * MIB);
        assert!(
            oom.cause().starts_with("CUDA's pool could not map"),
            "{}",
            oom.cause()
        );
        // With room on the GPU, the fraction it is, said to be within rounding.
        oom.device_free_bytes = 100 * GIB;
        assert!(
            oom.cause().contains("within PyTorch's rounding"),
            "{}",
            oom.cause()
        );
    }

    #[test]
    fn a_kept_oom_is_explained_from_pytorchs_words() {
        let kept: KeptUntracked = serde_json::from_value(serde_json::json!({
            "backend": "cudaMallocAsync",
            "kind": "OutOfMemoryError",
            "message": UNDER_A_FRACTION,
        }))
        .expect("kept file");
        let lines = kept.explain(None, false);
        assert!(
            lines[0].starts_with(
                "OOM under backend:cudaMallocAsync: needed 1.00 GiB; cause: the job's live tensors"
            ),
            "{lines:?}"
        );
        assert!(lines[1].contains("native allocator only"), "{lines:?}");
        // Words it cannot read: PyTorch's first line, as said.
        let other = KeptUntracked {
            backend: "pluggable".into(),
            kind: "OutOfMemoryError".into(),
            message: "RMM failure: out of memory\nmore".into(),
            ..KeptUntracked::default()
        };
        assert_eq!(
            other.explain(None, true)[0],
            "OOM under backend:pluggable: PyTorch said \"RMM failure: out of memory\""
        );
        // Hook 1.11 numbers each OOM as PyTorch makes it, and marks the one the process
        // died of: the others the job caught, where it ended well.
        let numbered = |uncaught| KeptUntracked {
            number: Some(4),
            uncaught,
            ..other.clone()
        };
        let head = |kept: KeptUntracked, ended_well| kept.explain(Some(77), ended_well)[0].clone();
        assert!(
            head(numbered(false), true).starts_with(
                "OOM 4 of pid 77 under backend:pluggable (caught by the job): PyTorch said"
            ),
            "{}",
            head(numbered(false), true)
        );
        assert!(head(numbered(true), true)
            .starts_with("OOM 4 of pid 77 under backend:pluggable: PyTorch said"));
        // A job that failed may have died of it without the mark (mp.spawn, Hydra).
        assert!(head(numbered(false), false)
            .starts_with("OOM 4 of pid 77 under backend:pluggable: PyTorch said"));
    }

    #[test]
    fn other_messages_and_broken_figures_are_not_taken() {
        assert_eq!(
            AsyncOom::parse("CUDA out of memory. Tried to allocate 1.00 GiB."),
            None
        );
        let broken = UNDER_A_FRACTION.replace("6.00 GiB", "six GiB");
        assert_eq!(AsyncOom::parse(&broken), None);
    }
}
