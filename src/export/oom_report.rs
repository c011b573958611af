//! An OOM explained in a few plain lines, from a snapshot the hook kept at it: what
//! `vramtop run` prints in a batch job's log after the job, and what `vramtop snapshot`
//! says of such a file. The same figures the live view shows at an OOM (needed, free,
//! runs, largest), PyTorch's own words, what a replay says, each remedy's verdict (for a
//! file of one state, the live view's own answers), who held the memory, and how to open
//! the file.

use std::collections::HashMap;
use std::path::Path;

use crate::advice::line_with;
use vramtop_alloc::remedy::Verdict;
use vramtop_alloc::{human_bytes, BlockState, PolicyKind};
use vramtop_trace::cause;
use vramtop_trace::ooms::{trace_ooms, TraceOom};
use vramtop_trace::replay::remedies::{self, OomRemedies};
use vramtop_trace::replay::{self, plan_capacity};
use vramtop_trace::roles::RoleBreakdown;
use vramtop_trace::Trace;

/// The policies a trace with history is replayed through for the failed request.
const REPLAYED: [PolicyKind; 2] = [PolicyKind::Caching, PolicyKind::PytorchExpandable];

/// Sites listed among the largest holders.
const HOLDERS_SHOWN: usize = 3;

/// The lines for the last OOM in `trace` (read from `path`, `file_bytes` long); empty when
/// the file holds no OOM. A file the hook kept at the OOM also gets who held the memory
/// and where the file is. No prefix: the caller adds its own.
pub fn explain(trace: &Trace, path: &Path, file_bytes: u64) -> Vec<String> {
    let ooms = trace_ooms(trace);
    let Some(oom) = ooms.last() else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    lines.push(match &trace.stats.kept_oom {
        Some(kept) => format!(
            "OOM {} of pid {}{} ({}) on device {}",
            kept.number,
            kept.pid,
            match kept.rank {
                Some((rank, Some(world))) => format!(", rank {rank} of {world}"),
                Some((rank, None)) => format!(", rank {rank}"),
                None => String::new(),
            },
            command_line(&kept.argv),
            kept.device
        ),
        None => format!(
            "the trace's last OOM, at event {} of {} on device {}",
            oom.event + 1,
            trace.events.len(),
            trace.device
        ),
    });
    let asked = trace.stats.kept_oom.as_ref().map(|k| k.requested_bytes);
    lines.push(format!(
        "  OOM: {}; PyTorch held {} reserved, {} allocated",
        oom.explain_as_asked(asked),
        human_bytes(oom.reserved_bytes),
        human_bytes(oom.allocated_bytes)
    ));
    // Every remedy at this OOM, replayed once: the cause names the one that fits.
    let answers = remedies::remedies(trace, &ooms, None)
        .map(|all| all.into_iter().find(|r| r.event == oom.event))
        .map_err(|e| e.to_string());
    let at = answers.as_ref().ok().and_then(Option::as_ref);
    let causes = cause::of_kept_file(trace, oom, at);
    for (i, c) in causes.iter().enumerate() {
        let head = if i == 0 { "cause" } else { "also" };
        lines.push(format!("  {head}: {}", line_with(&c.line(), c.missing())));
    }
    if let Some(roles) = trace.stats.kept_oom.as_ref().and_then(|k| k.roles.as_ref()) {
        let breakdown = RoleBreakdown::of(roles, oom.allocated_bytes, oom.reserved_bytes);
        lines.push(format!("  memory: {}", breakdown.line()));
        let shortfall = causes.iter().find_map(|c| c.shortfall());
        let request = trace
            .stats
            .kept_oom
            .as_ref()
            .map_or(oom.requested_bytes, |k| k.requested_bytes);
        if let Some(knobs) = shortfall.and_then(|s| breakdown.knobs_line(s, request)) {
            lines.push(format!("  knobs: {knobs}"));
        }
    }
    if let Some(kept) = trace
        .stats
        .kept_oom
        .as_ref()
        .filter(|k| !k.summary.is_empty())
    {
        lines.push(format!("  PyTorch: {}", kept.summary));
    }
    // The segments are the state at the OOM only in a file kept at it: a snapshot taken
    // later has moved on.
    let Some(_) = &trace.stats.kept_oom else {
        lines.push(format!("  {}", replay_line(trace, &ooms, &REPLAYED)));
        lines.extend(remedy_lines(&answers));
        return lines;
    };
    // One state and no events: a replay from it would pack the live tensors (the best
    // case), so the remedies are the live view's own answers for that state.
    let replayed: &[PolicyKind] = if trace.stats.no_history {
        &[PolicyKind::Caching]
    } else {
        &REPLAYED
    };
    lines.push(format!("  {}", replay_line(trace, &ooms, replayed)));
    lines.extend(remedy_lines(&answers));
    lines.push(format!("  {}", holders_line(trace)));
    let open = path.display();
    lines.push(format!(
        "  kept in {open} ({}); open it with: vramtop snapshot {open}",
        human_bytes(file_bytes)
    ));
    lines
}

/// What vramtop's replay of the trace says of the failed request, policy by policy, as
/// `replay --report` says it.
fn replay_line(trace: &Trace, ooms: &[TraceOom], policies: &[PolicyKind]) -> String {
    let Some(last) = ooms.last() else {
        return String::new();
    };
    let opts = plan_capacity(trace, None, ooms);
    match replay::report(trace, policies, opts) {
        Ok(rows) => {
            let answers: Vec<String> = rows
                .iter()
                .filter_map(|row| {
                    let check = row.trace_ooms.iter().find(|c| c.event == last.event)?;
                    let verdict = if check.fails { "fails too" } else { "fits" };
                    Some(format!("{} {verdict}", row.policy))
                })
                .collect();
            format!("vramtop replay: {}", answers.join(", "))
        }
        Err(e) => format!("vramtop replay failed: {e}"),
    }
}

/// Every remedy at the last OOM, a line each, and what would fit when none does.
fn remedy_lines(answers: &Result<Option<OomRemedies>, String>) -> Vec<String> {
    let at = match answers {
        Ok(Some(at)) => at,
        Ok(None) => return Vec::new(),
        Err(e) => return vec![format!("  remedies: the replay failed: {e}")],
    };
    let mut lines: Vec<String> = at
        .remedies
        .iter()
        .map(|r| format!("  {}", line_with(&r.line(), r.missing)))
        .collect();
    if let Some(would) = at
        .what_would_fit
        .as_ref()
        .filter(|_| !at.remedies.iter().any(|r| r.verdict == Verdict::Fits))
    {
        lines.push(format!("  what would: {}", would.line()));
    }
    lines
}

/// The call sites holding the most live memory, or the largest blocks without sites.
fn holders_line(trace: &Trace) -> String {
    let mut by_site: HashMap<Option<&str>, (u64, u64)> = HashMap::new();
    let mut largest: Vec<u64> = Vec::new();
    for block in trace.segments_at_end.iter().flat_map(|s| &s.blocks) {
        if block.state != BlockState::Allocated {
            continue;
        }
        let held = by_site.entry(block.tag.as_deref()).or_default();
        held.0 = held.0.saturating_add(block.size);
        held.1 += 1;
        largest.push(block.size);
    }
    let mut sites: Vec<(&str, u64, u64)> = by_site
        .iter()
        .filter_map(|(site, &(bytes, blocks))| site.map(|s| (s, bytes, blocks)))
        .collect();
    if sites.is_empty() {
        largest.sort_unstable_by(|a, b| b.cmp(a));
        let sizes: Vec<String> = largest
            .iter()
            .take(HOLDERS_SHOWN)
            .map(|&b| human_bytes(b))
            .collect();
        return format!(
            "largest live blocks: {} (no call sites: run with --history to see who holds them)",
            if sizes.is_empty() {
                "none".to_string()
            } else {
                sizes.join(", ")
            }
        );
    }
    sites.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let shown: Vec<String> = sites
        .iter()
        .take(HOLDERS_SHOWN)
        .map(|(site, bytes, blocks)| format!("{site} {} in {blocks} blocks", human_bytes(*bytes)))
        .collect();
    format!("largest holders: {}", shown.join("; "))
}

/// The job's command line as a shell would show it, cut short.
fn command_line(argv: &[String]) -> String {
    let text = argv.join(" ");
    if text.is_empty() {
        return "command unknown".to_string();
    }
    crate::units::truncate(&text, 60)
}
