//! The `vramtop` Python package (python/vramtop, shipped in the wheel): its hook files are
//! the ones the binary embeds, and `%load_ext vramtop` works in a real IPython shell, with
//! the stub torch (SIMULATED: tests/hook/stub_torch) and without torch.

#[path = "support/temp_dir.rs"]
mod temp_dir;
use temp_dir::TempDir;

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `vramtop hook-path` (what `vramtop run` puts on PYTHONPATH) writes exactly the
/// package's hook files: one source for the binary and the wheel.
#[test]
fn the_binary_writes_the_packages_hook_files() {
    let dir = socket_dir("hookpath");
    let out = Command::new(env!("CARGO_BIN_EXE_vramtop"))
        .arg("hook-path")
        .env("VRAMTOP_SOCKET_DIR", &dir)
        .output()
        .expect("vramtop hook-path");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    // Every .py of the package's _hook/ folder, and no other, written byte for byte: a
    // module added to the package but not to src/modes/hook.rs fails here.
    let packaged = python_files(&repo("python/vramtop/_hook"));
    let from_binary = python_files(&written);
    assert!(packaged.len() > 2, "{packaged:?}");
    assert_eq!(
        packaged.keys().collect::<Vec<_>>(),
        from_binary.keys().collect::<Vec<_>>(),
        "the binary's hook files are not the package's"
    );
    for (name, text) in &packaged {
        assert!(
            Some(text) == from_binary.get(name),
            "{name} differs between the wheel and the binary"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `.py` files under `dir`, by path relative to it (`__pycache__` is Python's own).
fn python_files(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut found = std::collections::BTreeMap::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("hook folder").flatten() {
            let path = entry.path();
            if path.is_dir() && entry.file_name() != "__pycache__" {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "py") {
                let name = path
                    .strip_prefix(dir)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                found.insert(name, std::fs::read(&path).expect("hook file"));
            }
        }
    }
    found
}

/// python3 with IPython, or None (CI=true requires it: .ci/run installs it).
fn ipython_python() -> Option<&'static str> {
    let ok = Command::new("python3")
        .args(["-c", "import IPython"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "IPython not importable by python3, and CI=true: .ci/run installs it"
        );
        eprintln!("skipped: IPython not installed, so the notebook extension was not tried");
        return None;
    }
    Some("python3")
}

/// Runs `script` in a fresh python3 with the package (and `extra` paths) importable and
/// the built `vramtop` first on PATH: (stdout, stderr).
fn run_python(script: &str, extra: &[PathBuf], socket_dir: &Path) -> (String, String) {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_vramtop"))
        .parent()
        .expect("binary folder")
        .to_path_buf();
    let mut paths = vec![repo("python")];
    paths.extend_from_slice(extra);
    let path = std::env::join_paths(std::iter::once(bin_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("PATH");
    let out = Command::new("python3")
        .args(["-c", script])
        .env(
            "PYTHONPATH",
            std::env::join_paths(paths).expect("PYTHONPATH"),
        )
        .env("PATH", path)
        .env("VRAMTOP_SOCKET_DIR", socket_dir)
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .expect("python3 runs");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const SHELL: &str = "from IPython.core.interactiveshell import InteractiveShell\n\
                     ip = InteractiveShell.instance()\n\
                     ip.run_line_magic('load_ext', 'vramtop')\n";

fn socket_dir(name: &str) -> TempDir {
    TempDir::new(&format!("pkg-{name}"))
}

#[test]
fn the_notebook_extension_hooks_the_kernel_and_reports_its_allocator() {
    if ipython_python().is_none() {
        return;
    }
    let dir = socket_dir("ipython");
    // A stale socket from a kernel that is gone (a restart): cleared when the hook starts.
    std::fs::create_dir_all(&dir).expect("socket dir");
    // As vramtop makes it: private to the user, or the hook refuses it.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let stale = dir.join("vramtop-999999999.sock");
    std::fs::write(&stale, b"").expect("stale socket");
    let script = format!(
        "{SHELL}ip.run_line_magic('vramtop', '')\n\
         import os, time, torch\n\
         torch.cuda.init()\n\
         torch.cuda.stub_alloc('weights', 3 * 1024 * 1024)\n\
         sock = os.path.join(os.environ['VRAMTOP_SOCKET_DIR'], 'vramtop-%d.sock' % os.getpid())\n\
         deadline = time.time() + 10\n\
         while not os.path.exists(sock) and time.time() < deadline: time.sleep(0.05)\n\
         ip.run_line_magic('vramtop', 'status')\n\
         ip.run_line_magic('vramtop', 'nonsense')\n"
    );
    let (stdout, stderr) = run_python(&script, &[repo("tests/hook/stub_torch")], &dir);
    assert!(
        stdout.contains("vramtop: hooked this kernel (pid "),
        "{stdout}\n{stderr}"
    );
    assert!(stdout.contains("attach --pid "), "{stdout}");
    assert!(
        stdout.contains("reserved 4.0 MiB, allocated 3.0 MiB"),
        "the status comes from `vramtop attach --json`: {stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("%vramtop takes nothing or `status`"),
        "{stdout}"
    );
    assert!(!stale.exists(), "the stale socket is gone");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_torch_the_extension_says_so_in_one_line() {
    if ipython_python().is_none() {
        return;
    }
    let dir = socket_dir("notorch");
    // No stub on the path: this python has no torch (the CI machine has none).
    let script = format!(
        "import importlib.util, sys\n\
         if importlib.util.find_spec('torch') is not None: print('SKIP real torch'); sys.exit(0)\n\
         {SHELL}ip.run_line_magic('vramtop', '')\n\
         import vramtop; print('hook path', vramtop.hook_path())\n"
    );
    let (stdout, stderr) = run_python(&script, &[], &dir);
    if stdout.contains("SKIP real torch") {
        eprintln!("skipped: this python has a real torch");
        return;
    }
    let lines: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("vramtop:"))
        .collect();
    assert_eq!(
        lines,
        ["vramtop: torch is not installed in this kernel's Python; there is nothing to watch"],
        "{stdout}\n{stderr}"
    );
    assert!(stdout.contains("hook path "), "{stdout}");
    assert!(stdout.contains("python/vramtop/_hook"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `import vramtop` shows its API and nothing else (no `os`, `json`, `shutil` or
/// `subprocess` among its public names), each name documented.
#[test]
fn the_package_shows_only_its_api() {
    let dir = socket_dir("api");
    let script = "import vramtop\n\
                  public = sorted(n for n in dir(vramtop) if not n.startswith('_'))\n\
                  print(public == sorted(vramtop.__all__), public)\n\
                  print([n for n in vramtop.__all__ if not (getattr(vramtop, n).__doc__ or '').strip()])\n";
    let (out, err) = run_python(script, &[], &dir);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}{err}");
    assert!(
        lines[0].starts_with("True "),
        "public names beyond __all__: {out}"
    );
    assert_eq!(lines[1], "[]", "names without a docstring: {out}");
    for name in [
        "start",
        "hook_path",
        "status",
        "binary",
        "load_ipython_extension",
    ] {
        assert!(
            lines[0].contains(&format!("'{name}'")),
            "{name} missing: {out}"
        );
    }
}
