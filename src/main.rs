//! The vramtop binary: parse the command line, read the settings file, hand over to the
//! chosen mode (`vramtop::modes`), and make sure the terminal is restored before any error
//! or panic report prints.

use std::process::ExitCode;

use vramtop::cli;

fn main() -> ExitCode {
    let mut cli = match cli::parse(std::env::args_os()) {
        Ok(cli) => cli,
        Err((0, text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Err((code, text)) => {
            eprint!("vramtop: {}", text.trim_start_matches("error: "));
            return ExitCode::from(code as u8);
        }
    };
    // Installs the panic and error hooks first, so that ratatui's own hook (installed
    // by ratatui::init) restores the terminal before color-eyre prints anything.
    if let Err(e) = color_eyre::install() {
        eprintln!("vramtop: could not install the error reporter: {e}");
    }
    // Flags and environment first, then the settings file; a bad file is one line and
    // the defaults, never a refusal to start.
    let config = vramtop::config::apply(&mut cli);
    if let Some(notice) = &config.notice {
        eprintln!("vramtop: {notice}");
    }
    match vramtop::modes::run(cli, config) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vramtop: {e:#}");
            ExitCode::from(1)
        }
    }
}
