//! Stories as data: a TOML file of acts (assets/stories/*.toml, built into the binary, or
//! a path given on the command line). Each act runs scenario phases, the same
//! `[[phase]]` entries as a probe scenario, against one allocator policy on a fresh
//! device. Parsing is strict, as for scenarios: a bad field names the file and the field.

use std::path::Path;

use serde::Deserialize;

use crate::probe::scenario::{
    check_phases, read_toml_file, toml_error_line, Phase, Scenario, Size,
};
use vramtop_alloc::PolicyKind;

/// The built-in stories, embedded so the binary works from any directory.
pub const BUILTIN: &[(&str, &str)] = &[(
    "oom-with-free-memory",
    include_str!("../../assets/stories/oom-with-free-memory.toml"),
)];

/// Device capacity of a story that does not give one.
pub const DEFAULT_CAPACITY: u64 = 128 << 20;
pub const DEFAULT_OPS_PER_S: f64 = 10.0;
/// A story runs in memory vramtop holds itself; keep it small enough to fill in a moment.
pub const MAX_CAPACITY: u64 = 4 << 30;

/// Where a story's memory comes from. Never the GPU: a talk must run on any laptop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum StoryBacking {
    /// Address ranges only, no memory behind them
    #[default]
    Bookkeeping,
    /// Real host memory, filled and verified
    Host,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct RawStory {
    name: String,
    title: String,
    summary: String,
    #[serde(default)]
    capacity: Option<Size>,
    #[serde(default)]
    backing: StoryBacking,
    #[serde(default)]
    ops_per_s: Option<f64>,
    #[serde(rename = "act", default)]
    acts: Vec<RawAct>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct RawAct {
    title: String,
    policy: String,
    #[serde(default)]
    intro: Option<String>,
    /// A built-in scenario name or a path, instead of `[[act.phase]]` entries.
    #[serde(default)]
    scenario: Option<String>,
    #[serde(rename = "phase", default)]
    phases: Vec<Phase>,
}

/// One act: a policy, an optional intro caption shown before it starts, and the
/// scenario it plays.
#[derive(Clone, Debug, PartialEq)]
pub struct Act {
    pub title: String,
    pub policy: PolicyKind,
    pub intro: Option<String>,
    pub scenario: Scenario,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Story {
    pub name: String,
    pub title: String,
    pub summary: String,
    pub capacity: u64,
    pub backing: StoryBacking,
    pub ops_per_s: f64,
    pub acts: Vec<Act>,
}

impl Story {
    pub fn from_toml(text: &str, origin: &str) -> Result<Story, String> {
        let raw: RawStory = toml::from_str(text)
            .map_err(|e| format!("story {origin}: {}", toml_error_line(&e, text)))?;
        let capacity = raw.capacity.map_or(DEFAULT_CAPACITY, |s| s.0);
        if !(1..=MAX_CAPACITY).contains(&capacity) {
            return Err(format!(
                "story {origin}: capacity {capacity} B is out of range; accepted range: 1 B to 4 GiB"
            ));
        }
        let ops_per_s = raw.ops_per_s.unwrap_or(DEFAULT_OPS_PER_S);
        if !ops_per_s.is_finite() || !(0.1..=100_000.0).contains(&ops_per_s) {
            return Err(format!(
                "story {origin}: ops_per_s = {ops_per_s}; accepted range: 0.1 to 100000"
            ));
        }
        if raw.acts.is_empty() {
            return Err(format!("story {origin}: no [[act]] entries"));
        }
        let mut acts = Vec::with_capacity(raw.acts.len());
        for (i, act) in raw.acts.into_iter().enumerate() {
            acts.push(act_from_raw(
                act,
                &raw.name,
                &format!("story {origin}, act {}", i + 1),
            )?);
        }
        Ok(Story {
            name: raw.name,
            title: raw.title,
            summary: raw.summary,
            capacity,
            backing: raw.backing,
            ops_per_s,
            acts,
        })
    }

    /// A built-in name, or a path to a TOML file.
    pub fn load(name_or_path: &str) -> Result<Story, String> {
        if let Some((_, text)) = BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
            return Story::from_toml(text, &format!("'{name_or_path}' (built in)"));
        }
        let path = Path::new(name_or_path);
        if name_or_path.ends_with(".toml") || path.exists() {
            let text = read_toml_file(path, "story")?;
            return Story::from_toml(&text, &path.display().to_string());
        }
        Err(format!(
            "unknown story '{name_or_path}'; known stories: {} (or give a path to a story .toml file)",
            names().join(", ")
        ))
    }
}

fn act_from_raw(act: RawAct, story: &str, origin: &str) -> Result<Act, String> {
    let policy: PolicyKind = act
        .policy
        .parse()
        .map_err(|e: String| format!("{origin}: {e}"))?;
    let scenario = match (act.scenario, act.phases.is_empty()) {
        (Some(name), true) => Scenario::load(&name).map_err(|e| format!("{origin}: {e}"))?,
        (None, false) => {
            check_phases(&act.phases, origin)?;
            Scenario {
                name: story.to_string(),
                summary: act.title.clone(),
                phases: act.phases,
            }
        }
        (Some(_), false) => {
            return Err(format!(
                "{origin}: give either scenario = \"NAME\" or [[act.phase]] entries, not both"
            ))
        }
        (None, true) => {
            return Err(format!(
                "{origin}: no phases; give scenario = \"NAME\" or [[act.phase]] entries"
            ))
        }
    };
    Ok(Act {
        title: act.title,
        policy,
        intro: act.intro,
        scenario,
    })
}

pub fn names() -> Vec<&'static str> {
    BUILTIN.iter().map(|(n, _)| *n).collect()
}

/// The built-in stories, one per line: name and title, for `vramtop demo` alone.
pub fn listing() -> String {
    let mut out = String::from("Stories (play one with: vramtop demo NAME)\n");
    let width = names().iter().map(|n| n.len()).max().unwrap_or(0);
    for (name, text) in BUILTIN {
        let title = Story::from_toml(text, name)
            .map(|s| format!("{}: {}", s.title, s.summary))
            .unwrap_or_else(|e| format!("(does not parse: {e})"));
        out.push_str(&format!("  {name:<width$}  {title}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_parses() {
        for (name, text) in BUILTIN {
            let s = Story::from_toml(text, name).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&s.name, name);
        }
    }

    const HEAD: &str = "name = \"s\"\ntitle = \"t\"\nsummary = \"u\"\n";

    #[test]
    fn an_act_may_name_a_scenario() {
        let text = format!(
            "{HEAD}[[act]]\ntitle = \"a\"\npolicy = \"tlsf\"\nscenario = \"checkerboard\"\n"
        );
        let s = Story::from_toml(&text, "x").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.acts[0].policy, PolicyKind::Tlsf);
        assert_eq!(s.acts[0].scenario.name, "checkerboard");
        assert_eq!(s.capacity, DEFAULT_CAPACITY);
    }

    #[test]
    fn bad_acts_say_what_is_wrong() {
        let no_phases = format!("{HEAD}[[act]]\ntitle = \"a\"\npolicy = \"caching\"\n");
        assert!(Story::from_toml(&no_phases, "x")
            .unwrap_err()
            .contains("no phases"));
        let bad_policy =
            format!("{HEAD}[[act]]\ntitle = \"a\"\npolicy = \"magic\"\nscenario = \"leak\"\n");
        let err = Story::from_toml(&bad_policy, "x.toml").unwrap_err();
        assert!(
            err.contains("act 1") && err.contains("known policies"),
            "{err}"
        );
        let unknown_field = format!(
            "{HEAD}colour = 1\n[[act]]\ntitle = \"a\"\npolicy = \"caching\"\nscenario = \"leak\"\n"
        );
        assert!(Story::from_toml(&unknown_field, "x")
            .unwrap_err()
            .contains("colour"));
    }

    #[test]
    fn unknown_name_lists_the_known_ones() {
        let err = Story::load("nope").unwrap_err();
        assert!(err.contains("oom-with-free-memory"), "{err}");
        assert_eq!(err.lines().count(), 1);
    }
}
