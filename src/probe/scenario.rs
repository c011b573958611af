//! Probe scenarios as data: a TOML file of phases (assets/scenarios/*.toml, built into
//! the binary, or a path given on the command line). Parsing is strict: an unknown field
//! or a bad value names the file, the line and the field.

use std::io::Read;
use std::path::Path;

use serde::Deserialize;

/// The built-in scenarios, embedded so the binary works from any directory.
pub const BUILTIN: &[(&str, &str)] = &[
    (
        "checkerboard",
        include_str!("../../assets/scenarios/checkerboard.toml"),
    ),
    ("churn", include_str!("../../assets/scenarios/churn.toml")),
    ("leak", include_str!("../../assets/scenarios/leak.toml")),
    ("steady", include_str!("../../assets/scenarios/steady.toml")),
    (
        "streams",
        include_str!("../../assets/scenarios/streams.toml"),
    ),
    (
        "training",
        include_str!("../../assets/scenarios/training.toml"),
    ),
];

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    pub summary: String,
    #[serde(rename = "phase")]
    pub phases: Vec<Phase>,
}

/// A size in bytes: an integer, or a string such as "512B", "4MiB", "1.5GiB".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

/// Reads a size from an integer or a string, so a bad string reports its own error
/// (untagged enums would hide it behind "did not match any variant").
struct SizeVisitor;

impl<'de> serde::de::Visitor<'de> for SizeVisitor {
    type Value = u64;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a size: bytes as an integer, or a string such as \"4MiB\"")
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::custom(format!("size {v} is negative")))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<u64, E> {
        parse_size(v).map_err(E::custom)
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SizeVisitor).map(Size)
    }
}

/// A size drawn log-uniformly from `[min, max]` each time; a single size is fixed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeRange {
    pub min: u64,
    pub max: u64,
}

struct SizeRangeVisitor;

impl<'de> serde::de::Visitor<'de> for SizeRangeVisitor {
    type Value = SizeRange;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a size (\"4MiB\") or a range of two sizes ([\"512B\", \"8MiB\"])")
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<SizeRange, E> {
        Ok(SizeRange { min: v, max: v })
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<SizeRange, E> {
        SizeVisitor
            .visit_i64(v)
            .map(|n| SizeRange { min: n, max: n })
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<SizeRange, E> {
        SizeVisitor
            .visit_str(v)
            .map(|n| SizeRange { min: n, max: n })
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<SizeRange, A::Error> {
        use serde::de::Error;
        let min: Size = seq
            .next_element()?
            .ok_or_else(|| A::Error::custom("a size range needs two sizes"))?;
        let max: Size = seq
            .next_element()?
            .ok_or_else(|| A::Error::custom("a size range needs two sizes"))?;
        if seq.next_element::<Size>()?.is_some() {
            return Err(A::Error::custom("a size range has exactly two sizes"));
        }
        if min.0 > max.0 {
            return Err(A::Error::custom(format!(
                "size range [{}, {}] has its minimum above its maximum",
                min.0, max.0
            )));
        }
        Ok(SizeRange {
            min: min.0,
            max: max.0,
        })
    }
}

impl<'de> Deserialize<'de> for SizeRange {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SizeRangeVisitor)
    }
}

fn default_one() -> u32 {
    1
}
fn default_two() -> u32 {
    2
}
fn default_full() -> f64 {
    1.0
}

/// One phase of a scenario. Each has a caption, shown in the live view and in talks, and
/// may say how a talk (`vramtop demo`) goes on when it ends: `pause = true` waits for the
/// speaker, `hold_s = N` waits N seconds; neither goes on at once. Probes ignore both.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Phase {
    /// `count` allocations of `size` on `stream`, kept until freed by a later phase.
    Alloc {
        caption: String,
        #[serde(default)]
        pause: bool,
        #[serde(default)]
        hold_s: Option<f64>,
        tag: String,
        size: SizeRange,
        #[serde(default = "default_one")]
        count: u32,
        #[serde(default)]
        stream: u32,
    },
    /// Allocate blocks until `until` (a fraction of the probe's capacity) is allocated
    /// or the allocator runs out: the OOM that ends a fill is expected, not counted.
    Fill {
        caption: String,
        #[serde(default)]
        pause: bool,
        #[serde(default)]
        hold_s: Option<f64>,
        tag: String,
        size: SizeRange,
        #[serde(default = "default_full")]
        until: f64,
    },
    /// Free every `every`-th live block of `tag`, starting at `offset`.
    FreeEvery {
        caption: String,
        #[serde(default)]
        pause: bool,
        #[serde(default)]
        hold_s: Option<f64>,
        tag: String,
        #[serde(default = "default_two")]
        every: u32,
        #[serde(default)]
        offset: u32,
    },
    /// Free every live block of `tag`.
    FreeTag {
        caption: String,
        #[serde(default)]
        pause: bool,
        #[serde(default)]
        hold_s: Option<f64>,
        tag: String,
    },
    /// Release cached memory back to the backing.
    EmptyCache {
        caption: String,
        #[serde(default)]
        pause: bool,
        #[serde(default)]
        hold_s: Option<f64>,
    },
    /// `count` allocations of varied sizes, freed in random order, at most `max_live` live.
    Churn {
        caption: String,
        #[serde(default)]
        pause: bool,
        #[serde(default)]
        hold_s: Option<f64>,
        tag: String,
        count: u32,
        size: SizeRange,
        max_live: u32,
    },
    /// A training loop: a forward pass allocates one activation per layer (scaled by a
    /// batch drawn each step), a backward pass frees them in reverse with a short-lived
    /// gradient buffer per layer. `leak`, when set, keeps one buffer per step forever.
    Steps {
        caption: String,
        #[serde(default)]
        pause: bool,
        #[serde(default)]
        hold_s: Option<f64>,
        steps: u32,
        layers: u32,
        /// Batch size drawn uniformly from [min, max] each step.
        batch: [u32; 2],
        /// Activation bytes per layer per unit of batch.
        activation_per_sample: Size,
        gradient: Size,
        #[serde(default)]
        leak: Option<Size>,
    },
    /// `streams` streams interleaving allocations with lifetimes of [min, max] operations;
    /// frees are stream-ordered: pending until the allocator processes its events, every
    /// `process_every` operations.
    Streams {
        caption: String,
        #[serde(default)]
        pause: bool,
        #[serde(default)]
        hold_s: Option<f64>,
        streams: u32,
        ops: u32,
        size: SizeRange,
        lifetime: [u32; 2],
        process_every: u32,
    },
    /// A fixed working set: `blocks` live blocks, each step frees one and allocates one of
    /// the same size, for a quiet baseline.
    Steady {
        caption: String,
        #[serde(default)]
        pause: bool,
        #[serde(default)]
        hold_s: Option<f64>,
        tag: String,
        blocks: u32,
        size: SizeRange,
        steps: u32,
    },
}

/// How a talk goes on when a phase ends.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Pacing {
    /// Start the next phase at once.
    #[default]
    Continue,
    /// Wait for the speaker.
    Pause,
    /// Wait this many seconds (at speed x1).
    Hold(f64),
}

impl Phase {
    /// The phase's `pause` and `hold_s` fields, which every kind of phase carries.
    fn pause_and_hold(&self) -> (bool, Option<f64>) {
        match self {
            Phase::Alloc { pause, hold_s, .. }
            | Phase::Fill { pause, hold_s, .. }
            | Phase::FreeEvery { pause, hold_s, .. }
            | Phase::FreeTag { pause, hold_s, .. }
            | Phase::EmptyCache { pause, hold_s, .. }
            | Phase::Churn { pause, hold_s, .. }
            | Phase::Steps { pause, hold_s, .. }
            | Phase::Streams { pause, hold_s, .. }
            | Phase::Steady { pause, hold_s, .. } => (*pause, *hold_s),
        }
    }

    /// `pause` wins over `hold_s` when a phase sets both.
    pub fn pacing(&self) -> Pacing {
        match self.pause_and_hold() {
            (true, _) => Pacing::Pause,
            (false, Some(s)) if s > 0.0 => Pacing::Hold(s),
            _ => Pacing::Continue,
        }
    }

    pub fn caption(&self) -> &str {
        match self {
            Phase::Alloc { caption, .. }
            | Phase::Fill { caption, .. }
            | Phase::FreeEvery { caption, .. }
            | Phase::FreeTag { caption, .. }
            | Phase::EmptyCache { caption, .. }
            | Phase::Churn { caption, .. }
            | Phase::Steps { caption, .. }
            | Phase::Streams { caption, .. }
            | Phase::Steady { caption, .. } => caption,
        }
    }
}

/// "4MiB", "512 B", "1.5GiB", "2048" -> bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size: write e.g. 512B, 4MiB or 1.5GiB"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "TiB" | "T" => 1 << 40,
        other => {
            return Err(format!(
                "unknown size unit '{other}' in '{text}': use B, KiB, MiB, GiB or TiB"
            ))
        }
    };
    let bytes = (value * scale as f64).round();
    // `as u64` would quietly clamp a size too large to hold; refuse it instead.
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("size '{text}' is too large"));
    }
    Ok(bytes as u64)
}

impl Scenario {
    pub fn from_toml(text: &str, origin: &str) -> Result<Scenario, String> {
        let scenario: Scenario = toml::from_str(text)
            .map_err(|e| format!("scenario {origin}: {}", toml_error_line(&e, text)))?;
        if scenario.phases.is_empty() {
            return Err(format!("scenario {origin}: no [[phase]] entries"));
        }
        check_phases(&scenario.phases, &format!("scenario {origin}"))?;
        Ok(scenario)
    }

    /// A built-in name, or a path to a TOML file.
    pub fn load(name_or_path: &str) -> Result<Scenario, String> {
        if let Some((_, text)) = BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
            return Scenario::from_toml(text, &format!("'{name_or_path}' (built in)"));
        }
        let path = Path::new(name_or_path);
        if name_or_path.ends_with(".toml") || path.exists() {
            let text = read_toml_file(path, "scenario")?;
            return Scenario::from_toml(&text, &path.display().to_string());
        }
        Err(format!(
            "unknown scenario '{name_or_path}'; known scenarios: {} (or give a path to a .toml file)",
            names().join(", ")
        ))
    }
}

/// Checks what serde cannot: `hold_s` is a number of seconds a talk can wait.
/// Allocator calls a scenario may plan at most: plans are drawn whole before a run, so a
/// typo like `count = 4000000000` must be refused, not exhaust memory.
pub const MAX_PLANNED_OPS: u64 = 5_000_000;

/// Allocator calls a phase plans, roughly (saturating, so huge values stay huge).
fn planned_ops(phase: &Phase) -> u64 {
    let n = |v: u32| u64::from(v);
    match phase {
        Phase::Alloc { count, .. } => n(*count),
        Phase::Churn { count, .. } => n(*count).saturating_mul(2),
        Phase::Steps { steps, layers, .. } => {
            n(*steps).saturating_mul(n(*layers).saturating_mul(3).saturating_add(2))
        }
        Phase::Streams { ops, .. } => n(*ops).saturating_mul(2),
        Phase::Steady { blocks, steps, .. } => {
            n(*blocks).saturating_add(n(*steps).saturating_mul(3))
        }
        Phase::Fill { .. }
        | Phase::FreeEvery { .. }
        | Phase::FreeTag { .. }
        | Phase::EmptyCache { .. } => 1,
    }
}

pub fn check_phases(phases: &[Phase], origin: &str) -> Result<(), String> {
    let total = phases
        .iter()
        .map(planned_ops)
        .fold(0u64, u64::saturating_add);
    if total > MAX_PLANNED_OPS {
        return Err(format!(
            "{origin}: the phases plan about {total} allocator calls; at most {MAX_PLANNED_OPS} (lower count, steps or ops)"
        ));
    }
    for (i, phase) in phases.iter().enumerate() {
        if let (_, Some(s)) = phase.pause_and_hold() {
            if !s.is_finite() || !(0.0..=MAX_HOLD_S).contains(&s) {
                return Err(format!(
                    "{origin}: phase {} has hold_s = {s}; accepted range: 0 to {MAX_HOLD_S} seconds",
                    i + 1
                ));
            }
        }
    }
    Ok(())
}

/// Longest `hold_s` a phase may ask for.
pub const MAX_HOLD_S: f64 = 3600.0;

pub fn names() -> Vec<&'static str> {
    BUILTIN.iter().map(|(n, _)| *n).collect()
}

/// Largest scenario or story file vramtop reads. The built-in ones are under 3 KiB; the
/// bound makes a path like /dev/zero, or a huge file given by mistake, one clear error
/// rather than a process that eats all memory.
pub const MAX_TOML_BYTES: u64 = 1 << 20;

/// Reads a scenario or story file (`what` names which) of at most `MAX_TOML_BYTES`.
pub fn read_toml_file(path: &Path, what: &str) -> Result<String, String> {
    let cannot =
        |e: &dyn std::fmt::Display| format!("cannot read {what} file {}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(|e| cannot(&e))?;
    let mut bytes = Vec::new();
    file.take(MAX_TOML_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| cannot(&e))?;
    if bytes.len() as u64 > MAX_TOML_BYTES {
        return Err(format!(
            "{what} file {} is larger than {} KiB, the most vramtop reads; give a {what} .toml file",
            path.display(),
            MAX_TOML_BYTES >> 10
        ));
    }
    String::from_utf8(bytes).map_err(|_| cannot(&"not UTF-8 text"))
}

/// toml's error as one short line: where, and what. Its own `Display` quotes the
/// offending source line, which can be a megabyte long (deep nesting on one line).
pub fn toml_error_line(e: &toml::de::Error, text: &str) -> String {
    let message = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
    let Some(start) = e.span().map(|span| span.start) else {
        return message;
    };
    // Spans are byte offsets at char boundaries; `get` keeps a bad one from panicking.
    let before = text.get(..start).unwrap_or(text);
    let line = 1 + before.matches('\n').count();
    let column = 1 + before.rsplit('\n').next().unwrap_or("").chars().count();
    format!("TOML error at line {line}, column {column}: {message}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_parses() {
        for (name, text) in BUILTIN {
            let s = Scenario::from_toml(text, name).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&s.name, name);
        }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4MiB"), Ok(4 << 20));
        assert_eq!(parse_size("512B"), Ok(512));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert!(parse_size("4 parsecs").is_err());
    }

    #[test]
    fn bad_field_names_line_and_field() {
        let text = "name = \"x\"\nsummary = \"y\"\n[[phase]]\nkind = \"alloc\"\ncaption = \"c\"\ntag = \"t\"\nsize = \"4MiB\"\ncuont = 3\n";
        let err = Scenario::from_toml(text, "bad.toml").unwrap_err();
        assert!(err.contains("bad.toml"), "{err}");
        // Tagged phases are read whole, so the line is that of the `[[phase]]` holding the field.
        assert!(err.contains("line 3"), "{err}");
        assert!(err.contains("cuont"), "{err}");
    }

    #[test]
    fn pause_and_hold_are_optional_per_phase() {
        let head =
            "name = \"x\"\nsummary = \"y\"\n[[phase]]\nkind = \"empty-cache\"\ncaption = \"c\"\n";
        let plain = Scenario::from_toml(head, "plain").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(plain.phases[0].pacing(), Pacing::Continue);
        let paused = Scenario::from_toml(&format!("{head}pause = true\n"), "p")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(paused.phases[0].pacing(), Pacing::Pause);
        let held = Scenario::from_toml(&format!("{head}hold_s = 2.5\n"), "h")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(held.phases[0].pacing(), Pacing::Hold(2.5));
        let err = Scenario::from_toml(&format!("{head}hold_s = -1\n"), "bad.toml").unwrap_err();
        assert!(err.contains("hold_s") && err.contains("bad.toml"), "{err}");
    }

    #[test]
    fn unknown_name_lists_the_known_ones() {
        let err = Scenario::load("nope").unwrap_err();
        assert!(
            err.contains("checkerboard") && err.contains("training"),
            "{err}"
        );
    }
}
