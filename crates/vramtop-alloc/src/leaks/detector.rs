//! The leak detector: live bytes per allocation site, sampled by the caller and grouped
//! into windows (training steps, or spans of time); a site whose floor keeps rising is a
//! suspect. Pure state fed by samples: no allocator, no clock, no UI.
//!
//! The rule. For each site and window the detector keeps the *floor*: the least live
//! bytes the site held at any sample of the window (and its blocks at that moment). A
//! leak never gives memory back, so its floor rises window after window; a transient
//! buffer (activations, gradients, a batch of random size) returns to its baseline
//! inside every step, so its floor stays put however high its peaks go; a flat site
//! has a flat floor. End-of-window values work too when the caller samples exactly at
//! step boundaries, but the floor does not care where in a step the app's tick lands:
//! one sample per window taken between the frees of a step and the allocations of the
//! next is enough, and more samples only make the floor truer.
//!
//! A site is a suspect when, walking back from the newest closed window, its floor
//! - never fell (a leak never gives back),
//! - rose in at least `windows` (N) windows, each time by at least `min_growth_bytes`
//!   and, by default, by at least one more block (a batch-sized buffer caught mid-step
//!   changes size, not count: without this, random batches rise three times in a row
//!   about once in 24 windows),
//! - with at most `max_flat_gap` flat windows in a row between rises, and since the last
//!   one (a leak that strikes every third step still rises in most windows shorter than
//!   its period; a leak that stopped stops being reported).
//!
//! Co-retained sites. A kept tensor keeps alive what its autograd graph saved, and that
//! was allocated *before* it, at other sites; those sites then grow in lockstep with the
//! real leak (linear_leak: the kept relu output at line 68 holds the Linear's input from
//! line 67). When two suspects rise in the same windows (±1) by the same number of
//! blocks, and one always leaves its old floor after the other and before the other's
//! next rise, the later one is reported and the earlier one is listed in its
//! `retained_with`: an object can hold what existed before it, never what came after.
//! With coarse samples (one per step) both leave their floors at the same sample and
//! nothing is merged.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::TagUsage;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DetectorConfig {
    /// N: windows whose floor must have risen before a site is a suspect.
    pub windows: usize,
    /// Flat windows tolerated in a row between rises and after the last one.
    pub max_flat_gap: usize,
    /// A floor rise smaller than this does not count as growth.
    pub min_growth_bytes: u64,
    /// Count a rise only when the floor also gained blocks (see the module doc).
    pub require_new_blocks: bool,
    /// Closed windows remembered per site (at least `windows + 2` are kept).
    pub history: usize,
}

impl Default for DetectorConfig {
    fn default() -> Self {
        DetectorConfig {
            windows: 3,
            max_flat_gap: 1,
            min_growth_bytes: 1,
            require_new_blocks: true,
            history: 64,
        }
    }
}

/// A site whose live memory keeps growing, with the evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspect {
    pub tag: String,
    /// At the latest sample.
    pub live_bytes: u64,
    pub live_blocks: u64,
    /// The floor of the newest closed window: what the site never went below.
    pub floor_bytes: u64,
    /// Mean floor growth over the last N windows.
    pub growth_bytes_per_window: u64,
    /// Windows of the current run in which the floor rose.
    pub windows_growing: u32,
    /// Index of the window whose floor rose first in the current run.
    pub first_seen: u64,
    /// Sites that grow in lockstep because this one holds their blocks.
    pub retained_with: Vec<RetainedSite>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetainedSite {
    pub tag: String,
    pub live_bytes: u64,
    pub live_blocks: u64,
    pub growth_bytes_per_window: u64,
}

/// One site's live memory and its floors, oldest first: for a trend line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteTrend {
    pub tag: String,
    pub live_bytes: u64,
    pub live_blocks: u64,
    pub floors: Vec<u64>,
}

/// `Allocator::live_bytes_by_tag()` as detector samples.
pub fn usage_samples(usage: &[TagUsage]) -> Vec<(&str, u64, u64)> {
    usage
        .iter()
        .map(|u| (u.tag_name.as_str(), u.bytes, u.blocks))
        .collect()
}

/// The least a site held in one closed window, and the last sample at which it held it.
#[derive(Clone, Copy, Debug)]
struct Floor {
    window: u64,
    bytes: u64,
    blocks: u64,
    last_at_min: u64,
}

/// The running floor of the open window.
#[derive(Clone, Copy, Debug)]
struct RunningMin {
    bytes: u64,
    blocks: u64,
    last_at_min: u64,
}

impl RunningMin {
    fn update(current: Option<RunningMin>, bytes: u64, blocks: u64, seq: u64) -> RunningMin {
        let fresh = RunningMin {
            bytes,
            blocks,
            last_at_min: seq,
        };
        match current {
            Some(m) if m.bytes < bytes => m,
            _ => fresh,
        }
    }
}

/// One floor rise: the window whose floor rose, the last sample at the old floor, and
/// the blocks gained.
#[derive(Clone, Copy, Debug)]
struct Rise {
    window: u64,
    left_at: u64,
    blocks: u64,
}

#[derive(Debug)]
struct Site {
    tag: String,
    floors: VecDeque<Floor>,
    running: Option<RunningMin>,
    live_bytes: u64,
    live_blocks: u64,
    /// Sums of the current `observe` call (a tag may come twice in one sample).
    sample_seq: u64,
    sample_bytes: u64,
    sample_blocks: u64,
}

#[derive(Clone, Copy, Debug)]
struct OpenWindow {
    id: u64,
    first_seq: u64,
}

#[derive(Debug)]
pub struct LeakDetector {
    config: DetectorConfig,
    sites: Vec<Site>,
    index: HashMap<String, usize>,
    open: Option<OpenWindow>,
    /// The newest closed window and the seq of its last sample.
    last_closed: Option<(u64, u64)>,
    /// Sequence number of the next sample.
    seq: u64,
    windows_closed: u64,
}

impl LeakDetector {
    pub fn new(config: DetectorConfig) -> Self {
        LeakDetector {
            config,
            sites: Vec::new(),
            index: HashMap::new(),
            open: None,
            last_closed: None,
            seq: 0,
            windows_closed: 0,
        }
    }

    pub fn config(&self) -> &DetectorConfig {
        &self.config
    }

    /// Windows closed so far (a window closes when a sample of a later one arrives, or
    /// at `close_window`).
    pub fn windows_closed(&self) -> u64 {
        self.windows_closed
    }

    /// One sample: live bytes and blocks of every site that has any. A site left out
    /// holds nothing now. A larger `window` than the open one closes it; a smaller one
    /// is counted in the open window (windows never go back).
    pub fn observe(&mut self, window: u64, samples: &[(&str, u64, u64)]) {
        if self.open.is_some_and(|open| window > open.id) {
            self.close_window();
        }
        let open = *self.open.get_or_insert(OpenWindow {
            id: window,
            first_seq: self.seq,
        });
        let seq = self.seq;
        self.seq += 1;
        for &(tag, bytes, blocks) in samples {
            let i = match self.index.get(tag) {
                Some(&i) => i,
                None => self.add_site(tag, open, seq),
            };
            let site = &mut self.sites[i];
            if site.sample_seq == seq {
                site.sample_bytes = site.sample_bytes.saturating_add(bytes);
                site.sample_blocks = site.sample_blocks.saturating_add(blocks);
            } else {
                site.sample_seq = seq;
                site.sample_bytes = bytes;
                site.sample_blocks = blocks;
            }
        }
        for site in &mut self.sites {
            let (bytes, blocks) = if site.sample_seq == seq {
                (site.sample_bytes, site.sample_blocks)
            } else {
                (0, 0)
            };
            site.live_bytes = bytes;
            site.live_blocks = blocks;
            site.running = Some(RunningMin::update(site.running, bytes, blocks, seq));
        }
    }

    /// Close the open window so its floor counts (the end of a trace or a run).
    pub fn close_window(&mut self) {
        let Some(open) = self.open.take() else {
            return;
        };
        let keep = self.config.history.max(self.config.windows + 2);
        for site in &mut self.sites {
            if let Some(m) = site.running.take() {
                site.floors.push_back(Floor {
                    window: open.id,
                    bytes: m.bytes,
                    blocks: m.blocks,
                    last_at_min: m.last_at_min,
                });
                while site.floors.len() > keep {
                    site.floors.pop_front();
                }
            }
        }
        self.last_closed = Some((open.id, self.seq.saturating_sub(1)));
        self.windows_closed += 1;
    }

    /// A site seen for the first time held nothing before: in the previous window, and
    /// in the samples of this window that did not list it.
    fn add_site(&mut self, tag: &str, open: OpenWindow, seq: u64) -> usize {
        let mut floors = VecDeque::new();
        if let Some((window, last_seq)) = self.last_closed {
            floors.push_back(Floor {
                window,
                bytes: 0,
                blocks: 0,
                last_at_min: last_seq,
            });
        }
        let running = (seq > open.first_seq).then(|| RunningMin {
            bytes: 0,
            blocks: 0,
            last_at_min: seq - 1,
        });
        self.sites.push(Site {
            tag: tag.to_string(),
            floors,
            running,
            live_bytes: 0,
            live_blocks: 0,
            sample_seq: u64::MAX,
            sample_bytes: 0,
            sample_blocks: 0,
        });
        let i = self.sites.len() - 1;
        self.index.insert(tag.to_string(), i);
        i
    }

    /// Rises of the current run, newest first (see the module doc for the rule).
    fn growth_run(&self, floors: &VecDeque<Floor>) -> Vec<Rise> {
        let c = &self.config;
        let mut rises = Vec::new();
        let mut flat = 0;
        for i in (1..floors.len()).rev() {
            let (prev, cur) = (floors[i - 1], floors[i]);
            if cur.bytes < prev.bytes {
                break;
            }
            let gained = cur.blocks.saturating_sub(prev.blocks);
            let rose = cur.bytes - prev.bytes >= c.min_growth_bytes.max(1)
                && (!c.require_new_blocks || gained > 0);
            if rose {
                rises.push(Rise {
                    window: cur.window,
                    left_at: prev.last_at_min,
                    blocks: gained,
                });
                flat = 0;
            } else {
                flat += 1;
                if flat > c.max_flat_gap {
                    break;
                }
            }
        }
        rises
    }

    fn suspect_of(&self, site: &Site) -> Option<(Suspect, Vec<Rise>)> {
        let n = self.config.windows.max(1);
        let rises = self.growth_run(&site.floors);
        if rises.len() < n {
            return None;
        }
        let floors = &site.floors;
        let newest = floors[floors.len() - 1];
        let base = floors[floors.len() - 1 - n];
        let suspect = Suspect {
            tag: site.tag.clone(),
            live_bytes: site.live_bytes,
            live_blocks: site.live_blocks,
            floor_bytes: newest.bytes,
            growth_bytes_per_window: newest.bytes.saturating_sub(base.bytes) / n as u64,
            windows_growing: u32::try_from(rises.len()).unwrap_or(u32::MAX),
            first_seen: rises.last().map_or(newest.window, |r| r.window),
            retained_with: Vec::new(),
        };
        Some((suspect, rises))
    }

    /// Sites whose floor keeps rising, co-retained sites folded into the site that
    /// holds them; fastest growth first.
    pub fn suspects(&self) -> Vec<Suspect> {
        let found: Vec<(Suspect, Vec<Rise>)> = self
            .sites
            .iter()
            .filter_map(|s| self.suspect_of(s))
            .collect();
        let n = self.config.windows.max(1);
        let holders: Vec<Vec<usize>> = (0..found.len())
            .map(|a| {
                (0..found.len())
                    .filter(|&b| b != a && holds(&found[b].1, &found[a].1, n))
                    .collect()
            })
            .collect();
        let mut out: Vec<Suspect> = Vec::new();
        let mut held_by: Vec<Option<usize>> = vec![None; found.len()];
        for (a, followers) in holders.iter().enumerate() {
            // The holder is itself a root, the one that left its floor last.
            held_by[a] = followers
                .iter()
                .copied()
                .filter(|&b| holders[b].is_empty())
                .max_by_key(|&b| found[b].1.first().map_or(0, |r| r.left_at));
        }
        let mut slot_of: Vec<Option<usize>> = vec![None; found.len()];
        for (i, (suspect, _)) in found.iter().enumerate() {
            if held_by[i].is_none() {
                slot_of[i] = Some(out.len());
                out.push(suspect.clone());
            }
        }
        for (i, (suspect, _)) in found.iter().enumerate() {
            if let Some(slot) = held_by[i].and_then(|h| slot_of[h]) {
                out[slot].retained_with.push(RetainedSite {
                    tag: suspect.tag.clone(),
                    live_bytes: suspect.live_bytes,
                    live_blocks: suspect.live_blocks,
                    growth_bytes_per_window: suspect.growth_bytes_per_window,
                });
            }
        }
        for s in &mut out {
            s.retained_with.sort_by(|a, b| a.tag.cmp(&b.tag));
        }
        out.sort_by(|a, b| {
            b.growth_bytes_per_window
                .cmp(&a.growth_bytes_per_window)
                .then_with(|| a.tag.cmp(&b.tag))
        });
        out
    }

    /// Every site that holds or held memory, largest now first, with its floors.
    pub fn sites(&self) -> Vec<SiteTrend> {
        let mut out: Vec<SiteTrend> = self
            .sites
            .iter()
            .filter(|s| s.live_bytes > 0 || s.floors.iter().any(|f| f.bytes > 0))
            .map(|s| SiteTrend {
                tag: s.tag.clone(),
                live_bytes: s.live_bytes,
                live_blocks: s.live_blocks,
                floors: s.floors.iter().map(|f| f.bytes).collect(),
            })
            .collect();
        out.sort_by(|a, b| {
            b.live_bytes
                .cmp(&a.live_bytes)
                .then_with(|| a.tag.cmp(&b.tag))
        });
        out
    }
}

/// Whether the site with rises `later` holds the one with rises `earlier`: their last
/// `n` rises pair up (same window ±1, same blocks gained) and each of `later`'s comes
/// strictly after the paired one of `earlier` and before `earlier`'s next. Newest first.
fn holds(later: &[Rise], earlier: &[Rise], n: usize) -> bool {
    if later.len() < n || earlier.len() < n {
        return false;
    }
    (0..n).all(|i| {
        let (l, e) = (later[i], earlier[i]);
        l.window.abs_diff(e.window) <= 1
            && l.blocks == e.blocks
            && l.left_at > e.left_at
            && (i == 0 || l.left_at < earlier[i - 1].left_at)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn run(detector: &mut LeakDetector, windows: &[&[(&str, u64, u64)]]) {
        for (w, sample) in windows.iter().enumerate() {
            detector.observe(w as u64, sample);
        }
        detector.close_window();
    }

    #[test]
    fn a_rising_floor_is_a_suspect_and_a_flat_one_is_not() {
        let mut d = LeakDetector::new(DetectorConfig::default());
        let windows: Vec<Vec<(&str, u64, u64)>> = (0..6u64)
            .map(|w| vec![("params", 100 * MIB, 4), ("kept", w * MIB, w)])
            .collect();
        let refs: Vec<&[(&str, u64, u64)]> = windows.iter().map(Vec::as_slice).collect();
        run(&mut d, &refs);
        let s = d.suspects();
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].tag, "kept");
        assert_eq!(s[0].growth_bytes_per_window, MIB);
        assert_eq!(s[0].windows_growing, 5);
        assert_eq!(s[0].first_seen, 1);
    }

    #[test]
    fn the_floor_ignores_peaks_inside_a_window() {
        let mut d = LeakDetector::new(DetectorConfig::default());
        for w in 0..8u64 {
            // Peaks grow every window, but the activation returns to nothing each time.
            d.observe(w, &[("activation", (w + 1) * MIB, 1)]);
            d.observe(w, &[]);
        }
        d.close_window();
        assert!(d.suspects().is_empty());
    }

    #[test]
    fn growth_without_new_blocks_is_not_a_leak_by_default() {
        let windows: Vec<Vec<(&str, u64, u64)>> =
            (1..7u64).map(|w| vec![("batch", w * MIB, 1)]).collect();
        let refs: Vec<&[(&str, u64, u64)]> = windows.iter().map(Vec::as_slice).collect();
        let mut d = LeakDetector::new(DetectorConfig::default());
        run(&mut d, &refs);
        assert!(d.suspects().is_empty());
        let mut d = LeakDetector::new(DetectorConfig {
            require_new_blocks: false,
            ..DetectorConfig::default()
        });
        run(&mut d, &refs);
        assert_eq!(d.suspects().len(), 1);
    }

    #[test]
    fn a_leak_every_other_window_is_caught_and_a_stopped_one_is_dropped() {
        let mut d = LeakDetector::new(DetectorConfig::default());
        for w in 0..10u64 {
            let kept = w.div_ceil(2);
            d.observe(w, &[("kept", kept * MIB, kept)]);
        }
        d.close_window();
        assert_eq!(d.suspects().len(), 1);
        for w in 10..13u64 {
            d.observe(w, &[("kept", 5 * MIB, 5)]);
        }
        d.close_window();
        assert!(d.suspects().is_empty(), "{:?}", d.suspects());
    }

    #[test]
    fn a_floor_that_falls_ends_the_run() {
        let mut d = LeakDetector::new(DetectorConfig::default());
        let floors = [1u64, 2, 3, 1, 2, 3];
        for (w, &f) in floors.iter().enumerate() {
            d.observe(w as u64, &[("cache", f * MIB, f)]);
        }
        d.close_window();
        assert!(d.suspects().is_empty());
    }

    #[test]
    fn an_earlier_site_growing_in_lockstep_is_retained_by_the_later() {
        let mut d = LeakDetector::new(DetectorConfig::default());
        for w in 0..6u64 {
            // Input then output allocated in each window; both kept.
            d.observe(w, &[("input", w * MIB, w), ("output", w * MIB, w)]);
            d.observe(
                w,
                &[("input", (w + 1) * MIB, w + 1), ("output", w * MIB, w)],
            );
            d.observe(
                w,
                &[
                    ("input", (w + 1) * MIB, w + 1),
                    ("output", (w + 1) * MIB, w + 1),
                ],
            );
        }
        d.close_window();
        let s = d.suspects();
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].tag, "output");
        assert_eq!(s[0].retained_with.len(), 1);
        assert_eq!(s[0].retained_with[0].tag, "input");
    }

    #[test]
    fn independent_leaks_sampled_coarsely_are_both_reported() {
        let mut d = LeakDetector::new(DetectorConfig::default());
        for w in 0..6u64 {
            d.observe(w, &[("a", w * MIB, w), ("b", 2 * w * MIB, w)]);
        }
        d.close_window();
        let s = d.suspects();
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(s[0].tag, "b");
        assert!(s.iter().all(|s| s.retained_with.is_empty()));
    }

    #[test]
    fn suspects_serialize_with_their_evidence() {
        let s = Suspect {
            tag: "t.py:1 f".into(),
            live_bytes: 2,
            live_blocks: 1,
            floor_bytes: 2,
            growth_bytes_per_window: 1,
            windows_growing: 3,
            first_seen: 4,
            retained_with: Vec::new(),
        };
        let json = serde_json::to_string(&s).unwrap_or_default();
        assert!(json.contains("\"growth_bytes_per_window\":1"), "{json}");
        let back: Result<Suspect, _> = serde_json::from_str(&json);
        assert_eq!(back.ok(), Some(s));
    }
}
