//! `--gpu INDEX` for cuda probes: a bad value is one line naming the range, exit 2; on a
//! machine without CUDA (CI) a cuda probe on any GPU is one line saying so. The real
//! out-of-range and CUDA_VISIBLE_DEVICES cases run on the GPU machine
//! (scripts/gpu/faults.sh).

use assert_cmd::Command;

fn vramtop() -> Command {
    Command::cargo_bin("vramtop").expect("binary built")
}

fn one_line(args: &[&str], envs: &[(&str, &str)], code: i32, needles: &[&str]) {
    let mut cmd = vramtop();
    cmd.args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.assert().code(code).get_output().clone();
    let err = String::from_utf8(out.stderr).expect("utf-8");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    for needle in needles {
        assert!(err.contains(needle), "{args:?}: no '{needle}' in {err}");
    }
}

#[test]
fn bad_gpu_values_name_the_range() {
    for bad in ["5000", "1.5", "first"] {
        one_line(
            &["probe", "checkerboard", "--gpu", bad],
            &[],
            2,
            &["--gpu", "accepted range: 0 to 1023"],
        );
    }
}

#[test]
fn a_cuda_probe_without_cuda_is_one_line() {
    if vramtop::backing::cuda::driver_present() {
        return; // a CUDA machine: scripts/gpu/faults.sh covers it there.
    }
    one_line(
        &["probe", "checkerboard", "--backing", "cuda", "--gpu", "3"],
        &[("CUDA_VISIBLE_DEVICES", "7")],
        2,
        &["--backing cuda", "libcuda.so.1 could not be loaded"],
    );
}
