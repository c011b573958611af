//! Choosing a telemetry source from `--device`: NVML when asked for or available,
//! otherwise the simulated device, which is always labelled.

use super::nvml::{self, NvmlOpenError, NvmlOptions};
use super::sim::{SimSource, WorkloadGauge};
use super::{TelemetryError, TelemetrySource};

/// Where telemetry comes from (`--device`, `VRAMTOP_DEVICE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    /// NVML when libnvidia-ml.so.1 loads, else the simulated device.
    Auto,
    /// NVML only: opening fails when it cannot be loaded.
    Nvml,
    /// The simulated device, labelled as such.
    Sim,
}

impl DeviceChoice {
    pub const ALL: [DeviceChoice; 3] = [DeviceChoice::Auto, DeviceChoice::Nvml, DeviceChoice::Sim];

    /// The spelling on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DeviceChoice::Auto => "auto",
            DeviceChoice::Nvml => "nvml",
            DeviceChoice::Sim => "sim",
        }
    }
}

impl std::str::FromStr for DeviceChoice {
    type Err = TelemetryError;

    fn from_str(s: &str) -> Result<Self, TelemetryError> {
        DeviceChoice::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| TelemetryError::UnknownDeviceSource(s.to_string()))
    }
}

/// The chosen source, and a one-line notice to show when we fell back.
pub struct Opened {
    pub source: Box<dyn TelemetrySource>,
    /// Why NVML is not in use, when `auto` fell back to the simulated device.
    pub notice: Option<String>,
    pub simulated: bool,
}

/// The source `choice` names; `Err` only where NVML was required and could not be opened.
pub fn open(
    choice: DeviceChoice,
    seed: u64,
    workload: WorkloadGauge,
) -> Result<Opened, TelemetryError> {
    open_with(choice, seed, workload, NvmlOptions::default())
}

/// `open` with NVML options (a one-shot run leaves out the slow fields, may time itself).
pub fn open_with(
    choice: DeviceChoice,
    seed: u64,
    workload: WorkloadGauge,
    options: NvmlOptions,
) -> Result<Opened, TelemetryError> {
    let sim = |notice| Opened {
        source: Box::new(SimSource::new(seed, workload.clone())),
        notice,
        simulated: true,
    };
    match choice {
        DeviceChoice::Sim => Ok(sim(None)),
        DeviceChoice::Auto => match nvml::open_with(options) {
            Ok(source) => Ok(Opened {
                source: Box::new(source),
                notice: None,
                simulated: false,
            }),
            Err(e) => Ok(sim(Some(fallback_notice(&e)))),
        },
        DeviceChoice::Nvml => nvml::open_with(options)
            .map(|source| Opened {
                source: Box::new(source) as Box<dyn TelemetrySource>,
                notice: None,
                simulated: false,
            })
            .map_err(TelemetryError::Nvml),
    }
}

fn fallback_notice(e: &NvmlOpenError) -> String {
    format!("{e}; showing a simulated device")
}
