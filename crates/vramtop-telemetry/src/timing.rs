//! Named spans of wall time, for `--once --timings`: where a one-shot run's time goes
//! (loading NVML, opening devices, each group of driver calls, /proc). Off by default;
//! when off a lap costs one branch and no clock read.

use std::time::{Duration, Instant};

/// Laps since the previous lap, each with a name.
#[derive(Debug)]
pub struct Laps {
    enabled: bool,
    last: Instant,
    spans: Vec<(String, Duration)>,
}

impl Laps {
    pub fn new(enabled: bool) -> Self {
        Laps {
            enabled,
            last: Instant::now(),
            spans: Vec::new(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Start timing afresh from now (the time since the last lap is not counted).
    pub fn restart(&mut self) {
        if self.enabled {
            self.last = Instant::now();
        }
    }

    /// Close a span: the time since the last lap (or restart), under `name()`. The name is
    /// built only when timing is on.
    pub fn lap(&mut self, name: impl FnOnce() -> String) {
        if self.enabled {
            let now = Instant::now();
            self.spans.push((name(), now.duration_since(self.last)));
            self.last = now;
        }
    }

    /// Add a span measured elsewhere.
    pub fn push(&mut self, name: impl Into<String>, took: Duration) {
        if self.enabled {
            self.spans.push((name.into(), took));
        }
    }

    /// Add a span measured before this recorder existed, ahead of the others.
    pub fn push_first(&mut self, name: impl Into<String>, took: Duration) {
        if self.enabled {
            self.spans.insert(0, (name.into(), took));
        }
    }

    pub fn take(&mut self) -> Vec<(String, Duration)> {
        std::mem::take(&mut self.spans)
    }
}

/// The spans as a table for stderr: milliseconds, then the name; nested spans indented.
pub fn report(spans: &[(String, Duration)]) -> String {
    let mut out = String::from("timings (wall, ms):\n");
    for (name, took) in spans {
        out.push_str(&format!("{:>9.3}  {name}\n", took.as_secs_f64() * 1e3));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_are_recorded_only_when_enabled() {
        let mut off = Laps::new(false);
        off.lap(|| unreachable!("names are not built when timing is off"));
        off.push("x", Duration::from_millis(1));
        assert!(off.take().is_empty());

        let mut on = Laps::new(true);
        std::thread::sleep(Duration::from_millis(2));
        on.lap(|| "sleep".to_string());
        on.push("given", Duration::from_millis(5));
        let spans = on.take();
        assert_eq!(spans.len(), 2);
        assert!(spans[0].1 >= Duration::from_millis(2));
        assert_eq!(spans[1], ("given".to_string(), Duration::from_millis(5)));
        assert!(report(&spans).contains("    5.000  given"));
    }
}
