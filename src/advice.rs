//! How a user gives what a verdict or a cause lacked. The libraries name what is missing
//! (`Missing`) and never a flag; the binary, which owns the command line, says how.

use vramtop_alloc::remedy::Missing;

/// The words that follow a line lacking `missing`: what to run to give it.
pub fn how_to_give(missing: Missing) -> &'static str {
    match missing {
        Missing::MemoryCap => "replay the kept file with `vramtop replay --capacity BYTES`",
        Missing::AllocationSites => "rerun under `vramtop run --history` to name the line",
    }
}

/// `line`, followed by how to give what it lacked, if anything.
pub fn line_with(line: &str, missing: Option<Missing>) -> String {
    match missing {
        Some(m) => format!("{line}: {}", how_to_give(m)),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_lacking_nothing_is_left_as_it_is() {
        assert_eq!(line_with("fits", None), "fits");
        let line = line_with("cannot tell", Some(Missing::MemoryCap));
        assert!(line.starts_with("cannot tell: "), "{line}");
        assert!(line.contains("--capacity"), "{line}");
    }
}
