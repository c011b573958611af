//! The real NVML source on whatever machine the tests run on: with no NVIDIA driver (CI,
//! the development machines) `open()` must fail with one clear line, never panic.

#[test]
fn open_without_a_driver_gives_one_clear_line() {
    match vramtop::telemetry::nvml::open() {
        // A machine with a driver: the real source must poll.
        Ok(mut src) => {
            let snap = vramtop::telemetry::TelemetrySource::poll(&mut src);
            assert!(!snap.devices.is_empty());
        }
        Err(e) => {
            let text = e.to_string();
            assert!(!text.contains('\n'), "{text}");
            assert!(text.starts_with("NVML"), "{text}");
            if !std::path::Path::new("/dev/nvidiactl").exists() {
                assert_eq!(
                    text,
                    "NVML not available: libnvidia-ml.so.1 could not be loaded (is the NVIDIA driver installed?)"
                );
            }
        }
    }
}
