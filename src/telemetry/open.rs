//! Choosing a telemetry source from `--device`: NVML when asked for or available,
//! otherwise the simulated device, which is always labelled.

use color_eyre::eyre::{eyre, Result};

use super::sim::{SimSource, WorkloadGauge};
use super::TelemetrySource;
use crate::cli::DeviceChoice;

/// The chosen source, and a one-line notice to show when we fell back.
pub struct Opened {
    pub source: Box<dyn TelemetrySource>,
    pub notice: Option<String>,
}

pub fn open(choice: DeviceChoice, seed: u64, workload: WorkloadGauge) -> Result<Opened> {
    let sim = |notice| Opened {
        source: Box::new(SimSource::new(seed, workload.clone())),
        notice,
    };
    match choice {
        DeviceChoice::Sim => Ok(sim(None)),
        DeviceChoice::Auto => Ok(sim(Some(
            "NVML support is not built in yet: showing the simulated device".to_string(),
        ))),
        DeviceChoice::Nvml => Err(eyre!(
            "--device nvml: NVML support is not yet available in this build; use --device sim"
        )),
    }
}
