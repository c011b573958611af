//! Shell completions and man pages, generated from the clap definition in `cli` so they
//! never drift from `--help`. Text out only; `main` decides where it goes.

use std::path::Path;

use clap::CommandFactory;
use clap_complete::Shell;

use crate::cli::Cli;

/// The completion script for `shell`.
pub fn completions(shell: Shell) -> Vec<u8> {
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "vramtop", &mut script);
    script
}

/// vramtop(1) in roff.
pub fn man_page() -> std::io::Result<Vec<u8>> {
    let mut page = Vec::new();
    clap_mangen::Man::new(Cli::command()).render(&mut page)?;
    Ok(page)
}

/// vramtop.1 and one page per subcommand (vramtop-serve.1, ...) written into `dir`;
/// the file names written.
pub fn write_man_pages(dir: &Path) -> std::io::Result<Vec<String>> {
    std::fs::create_dir_all(dir)?;
    let command = Cli::command();
    let mut written = Vec::new();
    write_page(dir, command.clone(), "vramtop", &mut written)?;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("vramtop-{}", sub.get_name());
        write_page(dir, sub.clone(), &name, &mut written)?;
    }
    Ok(written)
}

fn write_page(
    dir: &Path,
    command: clap::Command,
    name: &str,
    written: &mut Vec<String>,
) -> std::io::Result<()> {
    let file = format!("{name}.1");
    let mut page = Vec::new();
    // The page's title names the command as typed (`vramtop-serve`), as git's pages do.
    let command = command.name(name.to_string());
    clap_mangen::Man::new(command).render(&mut page)?;
    std::fs::write(dir.join(&file), page)?;
    written.push(file);
    Ok(())
}
