//! The settings file's text: where it lives, how it reads (every mistake one line naming
//! the file, the line and the field) and how it is written back.
//! Pure text in and out, apart from `read` and `write`; knows nothing of the command line.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::app::SortKey;
use crate::ui::screen_theme::ScreenTheme;
use vramtop_alloc::backing::BackingChoice;
use vramtop_alloc::PolicyKind;

/// What the settings file may set. `None` is "not in the file": the default applies.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    /// Seconds between telemetry polls.
    pub interval: Option<f64>,
    /// Colours of the presenter screen (`vramtop demo`).
    pub theme: Option<ScreenTheme>,
    /// Order of the process table.
    pub sort: Option<SortKey>,
    /// Allocator policy of probes.
    pub policy: Option<PolicyKind>,
    /// Where probe memory comes from.
    pub backing: Option<BackingChoice>,
    /// Most memory a probe may hold, in bytes.
    pub probe_limit: Option<u64>,
    /// Columns the process table shows (by their sort names), when narrower than all.
    pub columns: Option<Vec<SortKey>>,
    /// Whether the simulated device plays the built-in scenarios when no probe is asked for.
    pub tour: Option<bool>,
}

/// The file as written: plain strings and numbers, checked field by field after parsing
/// so each mistake can name its line.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    interval: Option<Spanned<f64>>,
    theme: Option<Spanned<String>>,
    sort: Option<Spanned<String>>,
    policy: Option<Spanned<String>>,
    backing: Option<Spanned<String>>,
    probe_limit: Option<Spanned<SizeValue>>,
    columns: Option<Spanned<Vec<String>>>,
    tour: Option<bool>,
}

/// `probe_limit = "512MiB"` or `probe_limit = 536870912`.
#[derive(Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

/// The settings file named by the environment: `$XDG_CONFIG_HOME/vramtop/config.toml`, or
/// `~/.config/vramtop/config.toml` when XDG_CONFIG_HOME is unset or relative (as the XDG
/// base directory spec says). None without a home directory.
pub fn default_path() -> Option<PathBuf> {
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let base = xdg.or_else(|| {
        std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .map(|home| home.join(".config"))
    })?;
    Some(base.join("vramtop").join("config.toml"))
}

/// The 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    let offset = offset.min(text.len());
    text.as_bytes()[..offset]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The key written on `line` (the part before `=`), to name the field of a type error.
fn key_on_line(text: &str, line: usize) -> Option<String> {
    let (key, _) = text.lines().nth(line - 1)?.split_once('=')?;
    let key = key.trim().trim_matches('"');
    (!key.is_empty() && !key.starts_with('[')).then(|| key.to_string())
}

/// A mistake in the file: where, which field, what.
#[derive(Clone, Debug, PartialEq)]
pub struct FileError {
    pub line: usize,
    pub field: Option<String>,
    pub message: String,
}

impl FileError {
    /// The one line the user sees.
    pub fn describe(&self, path: &Path) -> String {
        let field = self
            .field
            .as_deref()
            .map_or_else(String::new, |f| format!(" `{f}`:"));
        format!(
            "{} line {}:{field} {}; starting with the default settings",
            path.display(),
            self.line,
            self.message
        )
    }
}

fn field_error<T>(text: &str, field: &str, value: &Spanned<T>, message: String) -> FileError {
    FileError {
        line: line_of(text, value.span().start),
        field: Some(field.to_string()),
        message,
    }
}

/// Settings from the file's text: all of it, or the first mistake.
pub fn parse(text: &str) -> Result<Settings, FileError> {
    let raw: RawSettings = toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(1, |span| line_of(text, span.start));
        // toml's message is one sentence (the multi-line form quotes the file).
        let message = e.message().trim().replace('\n', " ");
        let field = key_on_line(text, line).filter(|_| !message.starts_with("unknown field"));
        FileError {
            line,
            field,
            message,
        }
    })?;
    let mut settings = Settings {
        tour: raw.tour,
        ..Settings::default()
    };
    if let Some(v) = &raw.interval {
        let checked = crate::cli::parse_interval(&v.get_ref().to_string());
        settings.interval = Some(checked.map_err(|e| field_error(text, "interval", v, e))?);
    }
    if let Some(v) = &raw.theme {
        let theme = <ScreenTheme as clap::ValueEnum>::from_str(v.get_ref(), true)
            .map_err(|_| "not a theme; use dark, light or high-contrast".to_string());
        settings.theme = Some(theme.map_err(|e| field_error(text, "theme", v, e))?);
    }
    if let Some(v) = &raw.sort {
        let sort = SortKey::from_name(v.get_ref().as_str()).ok_or_else(|| {
            let names: Vec<&str> = SortKey::ALL.iter().map(|k| k.name()).collect();
            format!("not a sort column; use one of {}", names.join(", "))
        });
        settings.sort = Some(sort.map_err(|e| field_error(text, "sort", v, e))?);
    }
    if let Some(v) = &raw.policy {
        let policy = v.get_ref().parse::<PolicyKind>();
        settings.policy = Some(policy.map_err(|e| field_error(text, "policy", v, e))?);
    }
    if let Some(v) = &raw.backing {
        let backing = v.get_ref().parse::<BackingChoice>();
        settings.backing =
            Some(backing.map_err(|e| field_error(text, "backing", v, e.to_string()))?);
    }
    if let Some(v) = &raw.columns {
        let mut columns = Vec::new();
        for name in v.get_ref() {
            let key = SortKey::from_name(name).ok_or_else(|| {
                let names: Vec<&str> = SortKey::ALL.iter().map(|k| k.name()).collect();
                format!("no column '{name}'; columns: {}", names.join(", "))
            });
            columns.push(key.map_err(|e| field_error(text, "columns", v, e))?);
        }
        settings.columns = Some(columns);
    }
    if let Some(v) = &raw.probe_limit {
        let text_value = match v.get_ref() {
            SizeValue::Bytes(n) => n.to_string(),
            SizeValue::Text(s) => s.clone(),
        };
        let limit = crate::cli::parse_probe_limit(&text_value);
        settings.probe_limit = Some(limit.map_err(|e| field_error(text, "probe_limit", v, e))?);
    }
    Ok(settings)
}

/// Read the file at `path`: Ok(None) when there is none, Err with the one line to show
/// when it cannot be read or has a mistake.
pub fn read(path: &Path) -> Result<Option<Settings>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(format!(
                "{}: {e}; starting with the default settings",
                path.display()
            ))
        }
    };
    parse(&text).map(Some).map_err(|e| e.describe(path))
}

/// The file as `write` saves it, each field in the spelling `parse` reads.
#[derive(Serialize)]
struct SavedSettings {
    #[serde(skip_serializing_if = "Option::is_none")]
    interval: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    theme: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sort: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    backing: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    probe_limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    columns: Option<Vec<&'static str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tour: Option<bool>,
}

fn value_name(value: impl clap::ValueEnum) -> Option<String> {
    value.to_possible_value().map(|v| v.get_name().to_string())
}

/// The text `write` puts in the file.
pub fn render(settings: &Settings) -> Result<String, String> {
    let saved = SavedSettings {
        interval: settings.interval,
        theme: settings.theme.and_then(value_name),
        sort: settings.sort.map(SortKey::name),
        policy: settings.policy.map(PolicyKind::name),
        backing: settings.backing.map(|b| b.name().to_string()),
        probe_limit: settings.probe_limit,
        columns: settings
            .columns
            .as_ref()
            .map(|c| c.iter().map(|k| k.name()).collect()),
        tour: settings.tour,
    };
    let body = toml::to_string(&saved).map_err(|e| format!("could not write settings: {e}"))?;
    Ok(format!(
        "# vramtop settings, saved from the live view (F12). Flags and VRAMTOP_* variables\n\
         # override them; see `vramtop --help` for what each one means.\n{body}"
    ))
}

/// Save `settings` to `path`, creating its folder; written to a temporary file and renamed,
/// so a crash never leaves half a file. The error is one line naming the path.
pub fn write(path: &Path, settings: &Settings) -> Result<(), String> {
    let text = render(settings)?;
    let fail = |what: &str, e: std::io::Error| format!("{what} {}: {e}", path.display());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| fail("could not create the folder of", e))?;
    }
    let temporary = path.with_extension("toml.tmp");
    std::fs::write(&temporary, text).map_err(|e| fail("could not write", e))?;
    std::fs::rename(&temporary, path).map_err(|e| fail("could not replace", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_field() {
        let text = "interval = 0.5\ntheme = \"light\"\nsort = \"pid\"\npolicy = \"tlsf\"\n\
                    backing = \"host\"\nprobe_limit = \"64MiB\"\n";
        let s = parse(text).unwrap();
        assert_eq!(s.interval, Some(0.5));
        assert_eq!(s.theme, Some(ScreenTheme::Light));
        assert_eq!(s.sort, Some(SortKey::Pid));
        assert_eq!(s.policy, Some(PolicyKind::Tlsf));
        assert_eq!(s.backing, Some(BackingChoice::Host));
        assert_eq!(s.probe_limit, Some(64 << 20));
        assert_eq!(parse("interval = 2").unwrap().interval, Some(2.0));
        assert_eq!(
            parse("probe_limit = 4194304").unwrap().probe_limit,
            Some(4 << 20)
        );
        assert_eq!(parse("").unwrap(), Settings::default());
    }

    #[test]
    fn a_mistake_names_line_and_field() {
        let cases = [
            (
                "sort = \"pid\"\ninterval = 0\n",
                2,
                Some("interval"),
                "accepted range",
            ),
            (
                "\n\ninterval = \"fast\"\n",
                3,
                Some("interval"),
                "invalid type",
            ),
            (
                "policy = \"worst-fit\"",
                1,
                Some("policy"),
                "unknown policy",
            ),
            ("theme = \"pink\"", 1, Some("theme"), "dark, light"),
            ("sort = \"name\"", 1, Some("sort"), "not a sort column"),
            ("backing = \"disk\"", 1, Some("backing"), "bookkeeping"),
            (
                "probe_limit = \"1KiB\"",
                1,
                Some("probe_limit"),
                "at least 2MiB",
            ),
            (
                "interval = 1\nintervall = 2\n",
                2,
                None,
                "unknown field `intervall`",
            ),
            ("interval = = 1", 1, Some("interval"), ""),
            (
                "interval = 1\ncolumns = [\"pid\", \"nope\"]\n",
                2,
                Some("columns"),
                "no column 'nope'",
            ),
            ("\ntour = \"no\"\n", 2, Some("tour"), "invalid type"),
        ];
        for (text, line, field, says) in cases {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e:?}");
            assert_eq!(e.field.as_deref(), field, "{text:?}: {e:?}");
            assert!(e.message.contains(says), "{text:?}: {e:?}");
            let shown = e.describe(Path::new("/home/u/.config/vramtop/config.toml"));
            assert_eq!(shown.lines().count(), 1, "{shown}");
            assert!(shown.starts_with(&format!("/home/u/.config/vramtop/config.toml line {line}")));
        }
    }

    #[test]
    fn what_is_written_reads_back() {
        let settings = Settings {
            interval: Some(0.25),
            theme: Some(ScreenTheme::HighContrast),
            sort: Some(SortKey::Pid),
            policy: Some(PolicyKind::BestFit),
            backing: Some(BackingChoice::Bookkeeping),
            probe_limit: Some(1 << 30),
            columns: Some(vec![SortKey::Pid, SortKey::Memory, SortKey::Command]),
            tour: Some(false),
        };
        let text = render(&settings).unwrap();
        assert!(text.contains("tour = false"), "{text}");
        assert_eq!(parse(&text).unwrap(), settings, "{text}");
        assert_eq!(
            parse(&render(&Settings::default()).unwrap()).unwrap(),
            Settings::default()
        );
    }
}
