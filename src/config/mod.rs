//! Settings that stick: the file at the XDG location (`file`), layered under the command
//! line so that a flag beats its environment variable, which beats the file, which beats
//! the built-in default. A bad file costs one line and the defaults, never the start.
//! Must not depend on ratatui or on the app loop.

pub mod file;

use std::path::PathBuf;

pub use file::Settings;

use crate::cli::{Cli, Command};

/// The settings file of this run: where it is and what is in effect, so the live view can
/// save the current settings back to it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigFile {
    pub path: Option<PathBuf>,
    /// What the file said (defaults where it said nothing or was bad).
    pub from_file: Settings,
    /// Why the file was not used, as the one line to show.
    pub notice: Option<String>,
}

/// Read the settings file (`--config`, `VRAMTOP_CONFIG`, else the XDG location) for the
/// modes that use it, and fill every option `cli` left at its default.
pub fn apply(cli: &mut Cli) -> ConfigFile {
    let uses_settings = matches!(
        cli.command,
        None | Some(Command::Serve(_)) | Some(Command::Probe { .. }) | Some(Command::Demo { .. })
    );
    if !uses_settings {
        return ConfigFile::default();
    }
    let path = cli.config.clone().or_else(file::default_path);
    let (from_file, notice) = match path.as_deref().map(file::read) {
        None | Some(Ok(None)) => (Settings::default(), None),
        Some(Ok(Some(settings))) => (settings, None),
        Some(Err(line)) => (Settings::default(), Some(line)),
    };
    layer(cli, &from_file);
    ConfigFile {
        path,
        from_file,
        notice,
    }
}

/// Fill the options that neither a flag nor an environment variable set.
pub fn layer(cli: &mut Cli, file: &Settings) {
    let d = cli.defaulted;
    let probe = |opts: &mut crate::cli::ProbeOptions| {
        if let (true, Some(p)) = (d.policy, file.policy) {
            opts.policy = p;
        }
        if let (true, Some(b)) = (d.backing, file.backing) {
            opts.backing = b;
        }
        if let (true, Some(limit)) = (d.probe_limit, file.probe_limit) {
            opts.probe_limit = Some(limit);
        }
    };
    match &mut cli.command {
        None => {
            if let (true, Some(i)) = (d.interval, file.interval) {
                cli.live.interval = i;
            }
            probe(&mut cli.live.probe_opts);
        }
        Some(Command::Serve(args)) => {
            if let (true, Some(i)) = (d.interval, file.interval) {
                args.interval = i;
            }
            probe(&mut args.probe_opts);
        }
        Some(Command::Probe { opts, .. }) => probe(opts),
        Some(Command::Demo { opts, .. }) => {
            if let (true, Some(theme)) = (d.theme, file.theme) {
                opts.theme = theme;
            }
        }
        Some(_) => {}
    }
}

/// What the F12 key of the live view saves: the settings of this run, with the sort
/// order and interval as they are when the key is pressed, over what the file said (so a
/// theme set for talks survives a save from the monitor).
#[derive(Clone, Debug)]
pub struct Saver {
    config: ConfigFile,
    base: Settings,
}

impl Saver {
    pub fn new(config: ConfigFile, live: &crate::cli::LiveArgs) -> Saver {
        let o = &live.probe_opts;
        let base = Settings {
            interval: Some(live.interval),
            theme: config.from_file.theme,
            sort: config.from_file.sort,
            policy: Some(o.policy),
            backing: Some(o.backing),
            probe_limit: o.probe_limit,
            columns: config.from_file.columns.clone(),
            tour: config.from_file.tour,
        };
        Saver { config, base }
    }

    /// The settings a save writes now.
    pub fn current(&self, interval_s: f64, sort: crate::app::SortKey) -> Settings {
        Settings {
            interval: Some(interval_s),
            sort: Some(sort),
            ..self.base.clone()
        }
    }

    /// Save the current settings where this run's file is; the one line to show.
    pub fn save(&self, interval_s: f64, sort: crate::app::SortKey) -> String {
        let Some(path) = &self.config.path else {
            return "settings not saved: no home directory; set XDG_CONFIG_HOME or use --config"
                .to_string();
        };
        match file::write(path, &self.current(interval_s, sort)) {
            Ok(()) => format!("settings saved to {}", path.display()),
            Err(e) => format!("settings not saved: {e}"),
        }
    }
}
