//! Import of RMM `logging_resource_adaptor` logs: CSV with the header
//! `Thread,Time,Action,Pointer,Size,Stream` and actions `allocate`, `free` (older docs:
//! `deallocate`) and `allocate failure`. A row that cannot be read is an error naming
//! its row number (the header is row 1). Knows nothing of files or other formats.

use super::{bump, StreamIds, Trace, TraceErrorKind, TraceEvent, TraceEventKind, TraceFormat};

/// Whether `line` is an RMM log header: it names at least Action, Pointer and Size.
pub(super) fn is_header(line: &str) -> bool {
    let cols: Vec<&str> = line.split(',').map(str::trim).collect();
    ["Action", "Pointer", "Size"]
        .iter()
        .all(|want| cols.contains(want))
}

struct Columns {
    time: Option<usize>,
    action: usize,
    pointer: usize,
    size: usize,
    stream: Option<usize>,
    count: usize,
}

impl Columns {
    fn from_header(line: &str) -> Option<Columns> {
        let cols: Vec<&str> = line.split(',').map(str::trim).collect();
        let find = |name: &str| cols.iter().position(|c| *c == name);
        Some(Columns {
            time: find("Time"),
            action: find("Action")?,
            pointer: find("Pointer")?,
            size: find("Size")?,
            stream: find("Stream"),
            count: cols.len(),
        })
    }
}

pub(super) fn import(text: &[u8]) -> Result<Trace, TraceErrorKind> {
    let mut lines = text.split(|&b| b == b'\n');
    let header = String::from_utf8_lossy(lines.next().unwrap_or(&[])).into_owned();
    let Some(columns) = Columns::from_header(header.trim_end_matches('\r')) else {
        return Err(TraceErrorKind::Csv {
            row: 1,
            message: "header lacks Action, Pointer or Size columns".to_string(),
        });
    };
    let mut trace = Trace {
        source: TraceFormat::RmmCsv,
        device: 0,
        initial: Vec::new(),
        initial_segments: Vec::new(),
        events: Vec::new(),
        segments_at_end: Vec::new(),
        settings: Default::default(),
        stats: Default::default(),
    };
    let mut streams = StreamIds::default();
    let mut clock = Clock::default();
    for (i, raw) in lines.enumerate() {
        let row = i + 2;
        let line = String::from_utf8_lossy(raw);
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let bad = |message: String| TraceErrorKind::Csv { row, message };
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        if cells.len() != columns.count {
            return Err(bad(format!(
                "{} fields where the header has {}",
                cells.len(),
                columns.count
            )));
        }
        let action = cells[columns.action];
        bump(&mut trace.stats.actions, action);
        let kind = match action {
            "allocate" => TraceEventKind::Alloc,
            "free" | "deallocate" => TraceEventKind::FreeCompleted,
            "allocate failure" => TraceEventKind::Oom,
            _ => {
                bump(&mut trace.stats.unknown_actions, action);
                continue;
            }
        };
        let addr = parse_pointer(cells[columns.pointer])
            .ok_or_else(|| bad(format!("bad pointer '{}'", cells[columns.pointer])))?;
        let size = cells[columns.size]
            .parse::<u64>()
            .map_err(|_| bad(format!("bad size '{}'", cells[columns.size])))?;
        let stream = match columns.stream.map(|c| cells[c]) {
            None | Some("") => 0,
            Some(s) => parse_pointer(s).ok_or_else(|| bad(format!("bad stream '{s}'")))?,
        };
        let time_us = match columns.time.map(|c| cells[c]) {
            None | Some("") => None,
            Some(t) => Some(
                clock
                    .micros(t)
                    .ok_or_else(|| bad(format!("bad time '{t}'")))?,
            ),
        };
        trace.events.push(TraceEvent {
            kind,
            addr,
            size,
            stream: streams.id(stream),
            tag: None,
            time_us,
        });
    }
    trace.tally();
    Ok(trace)
}

/// `%p` output: "0x7f8a40000000", "(nil)" or "0" for a null pointer; plain decimal too.
fn parse_pointer(cell: &str) -> Option<u64> {
    if cell == "(nil)" || cell == "nullptr" {
        return Some(0);
    }
    match cell.strip_prefix("0x").or_else(|| cell.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => cell.parse().ok(),
    }
}

/// Turns times of day ("14:03:07.123456", what the adaptor writes) into microseconds
/// that keep rising across midnight; seconds since the epoch ("1634567890.123456") pass
/// through as they are.
#[derive(Default)]
struct Clock {
    last: Option<i64>,
    day_offset: i64,
}

const DAY_US: i64 = 86_400_000_000;

impl Clock {
    fn micros(&mut self, cell: &str) -> Option<i64> {
        if !cell.contains(':') {
            return epoch_micros(cell);
        }
        let (hms, frac) = cell.split_once('.').unwrap_or((cell, ""));
        let mut parts = hms.split(':');
        let h: i64 = parts.next()?.parse().ok()?;
        let m: i64 = parts.next()?.parse().ok()?;
        let s: i64 = parts.next()?.parse().ok()?;
        if parts.next().is_some() || h > 23 || m > 59 || s > 60 {
            return None;
        }
        let of_day = (h * 3600 + m * 60 + s) * 1_000_000 + fraction_micros(frac)?;
        // A time more than half a day earlier than the last one means midnight passed.
        if let Some(last) = self.last {
            if of_day + DAY_US / 2 < last {
                self.day_offset += DAY_US;
            }
        }
        self.last = Some(of_day);
        Some(of_day + self.day_offset)
    }
}

fn epoch_micros(cell: &str) -> Option<i64> {
    let (secs, frac) = cell.split_once('.').unwrap_or((cell, ""));
    let secs: i64 = secs.parse().ok()?;
    secs.checked_mul(1_000_000)?
        .checked_add(fraction_micros(frac)?)
}

/// Digits after the decimal point as microseconds ("123" is 123000, "123456789" 123456).
fn fraction_micros(frac: &str) -> Option<i64> {
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits: String = frac.chars().chain(std::iter::repeat('0')).take(6).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_reads_both_time_styles_and_crosses_midnight() {
        let mut clock = Clock::default();
        assert_eq!(clock.micros("23:59:59.5"), Some(86_399_500_000));
        assert_eq!(clock.micros("00:00:00.000001"), Some(DAY_US + 1));
        assert_eq!(clock.micros("1634567890.25"), Some(1_634_567_890_250_000));
        assert_eq!(clock.micros("12:xx:00"), None);
    }

    #[test]
    fn pointers_in_printf_styles() {
        assert_eq!(parse_pointer("0x7f8a40000000"), Some(0x7f8a_4000_0000));
        assert_eq!(parse_pointer("(nil)"), Some(0));
        assert_eq!(parse_pointer("zz"), None);
    }
}
