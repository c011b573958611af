//! Label values the Prometheus exports share (the GPUs' processes in `metrics`, the
//! hooked jobs in `torch_metrics`): bounded, since every distinct value is a new series.

/// Commands longer than this are cut in the `command` label: a full command line can run
/// to kilobytes, and every distinct value is a new series.
pub const MAX_COMMAND_LABEL: usize = 128;

/// The command cut to `MAX_COMMAND_LABEL` characters, on a character boundary.
pub fn command_label(command: &str) -> &str {
    match command.char_indices().nth(MAX_COMMAND_LABEL) {
        Some((end, _)) => &command[..end],
        None => command,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn long_commands_are_cut_on_a_char_boundary() {
        let long = "é".repeat(MAX_COMMAND_LABEL + 10);
        assert_eq!(command_label(&long).chars().count(), MAX_COMMAND_LABEL);
        assert_eq!(command_label("short"), "short");
    }
}
