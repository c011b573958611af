//! Who may see a hooked job: its own user and root, nobody else. A real hooked job (the
//! real hook, against the stub torch) runs as root; a second local user, made with
//! `useradd`, tries to look at it as a user would: `vramtop attach` pointed at the job's
//! directory, and a plain connect to its socket. Then the directory and socket are opened
//! up by mistake (0755 / 0777) and the hook's own check (SO_PEERCRED) must still refuse.
//!
//! Needs root (to add the user and run as it). Without root the test says so and passes,
//! except in CI (CI=true), which runs as root and must run it.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

#[path = "support/serve_support.rs"]
mod serve_support;
#[path = "support/temp_dir.rs"]
mod temp_dir;
#[path = "support/hook_wire.rs"]
mod wire;

const PEER: &str = "vramtop-peer";

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// The second user's uid and gid, made when missing; None (with why) when we cannot.
fn second_user() -> Option<(u32, u32)> {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        assert!(
            !in_ci(),
            "CI=true but not root: the second-user test must run in CI"
        );
        eprintln!("skipped: not root, so no second user can be made");
        return None;
    }
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").args([flag, PEER]).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    if id("-u").is_none() {
        let made = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                PEER,
            ])
            .status();
        // Two test binaries may race to make it: only its absence afterwards fails.
        if !matches!(made, Ok(s) if s.success()) && id("-u").is_none() {
            panic!("useradd {PEER} failed ({made:?}): install the passwd package (apt-get install passwd)");
        }
    }
    Some((id("-u")?, id("-g")?))
}

/// A job under the real hook (python/vramtop/_hook), against the stub torch, as root.
fn hooked_job(dir: &Path) -> Child {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = format!(
        "{}:{}",
        root.join("python/vramtop/_hook").display(),
        root.join("tests/hook/stub_torch").display()
    );
    let mut job = Command::new("python3")
        .arg(root.join("tests/hook/job_driver.py"))
        .env("PYTHONPATH", path)
        .env("VRAMTOP_SOCKET_DIR", dir)
        .env("PYTHONUNBUFFERED", "1")
        .env_remove("VRAMTOP_HISTORY")
        .env_remove("RANK")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 with the hook");
    let mut stdin = job.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(job.stdout.take().expect("stdout"));
    for command in ["import", "init"] {
        writeln!(stdin, "{command}").expect("job stdin");
        let mut reply = String::new();
        stdout.read_line(&mut reply).expect("job reply");
        assert!(reply.starts_with("ok"), "job said {reply:?} to {command}");
    }
    // Kept open: closing stdin ends the driver.
    std::mem::forget(stdin);
    std::mem::forget(stdout);
    job
}

fn wait_for_socket(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(Instant::now() < deadline, "no socket at {}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The first frame a connection gets: the hook's hello, or None when it is closed.
fn first_frame(stream: &mut UnixStream) -> Option<serde_json::Value> {
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    wire::read_json(stream)
}

/// Runs `command` as the second user.
fn as_peer(mut command: Command, (uid, gid): (u32, u32)) -> Output {
    command
        .uid(uid)
        .gid(gid)
        .env("HOME", "/tmp")
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .expect("run as the second user")
}

/// A stdlib viewer as the second user: prints `hello`, `closed` (no hello, EOF) or the
/// error of its connect.
fn peer_connects(socket: &Path, peer: (u32, u32)) -> String {
    let script = "import socket,sys\n\
        s=socket.socket(socket.AF_UNIX)\n\
        s.settimeout(5)\n\
        try:\n s.connect(sys.argv[1])\nexcept OSError as e:\n print('refused', e.strerror); sys.exit(0)\n\
        data=s.recv(4)\n\
        print('hello' if data else 'closed')\n";
    let mut command = Command::new("python3");
    command.args(["-c", script]).arg(socket);
    let out = as_peer(command, peer);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `vramtop attach` as the second user, pointed at the job's directory.
fn peer_attach(dir: &Path, bin: &Path, peer: (u32, u32)) -> Output {
    let mut command = Command::new(bin);
    command
        .args(["attach", "--seconds", "1", "--json"])
        .env("VRAMTOP_SOCKET_DIR", dir);
    as_peer(command, peer)
}

/// `vramtop serve` (simulated device) as `peer` or as root, pointed at the job's
/// directory: its `/metrics` once a line names `pid_label`, or its last one after 3 s.
fn serve_scrape(dir: &Path, bin: &Path, peer: Option<(u32, u32)>, pid_label: &str) -> String {
    let port = serve_support::free_port();
    let mut command = Command::new(bin);
    command
        .args(["serve", "--device", "sim", "--interval", "0.2", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .env("VRAMTOP_SOCKET_DIR", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some((uid, gid)) = peer {
        command.uid(uid).gid(gid).env("HOME", "/tmp");
    }
    let _serve = serve_support::ChildGuard {
        child: command.spawn().expect("vramtop serve"),
        name: "vramtop serve",
    };
    let addr = format!("127.0.0.1:{port}");
    let mut last = String::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        if std::net::TcpStream::connect(&addr).is_err() {
            continue;
        }
        last = serve_support::get(&addr, "/metrics").1;
        if last.contains(pid_label) {
            break;
        }
    }
    last
}

#[test]
fn a_second_user_can_neither_connect_nor_list_the_job_and_root_can() {
    let Some(peer) = second_user() else { return };
    let dir: PathBuf = std::env::temp_dir().join(format!("vramtop-2nd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).expect("socket dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("0700");
    // The binary where the second user can run it (target/ may not be theirs to enter).
    let bin = dir.with_extension("bin");
    std::fs::copy(env!("CARGO_BIN_EXE_vramtop"), &bin).expect("copy vramtop");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("0755");

    let mut job = hooked_job(&dir);
    let socket = dir.join(format!("vramtop-{}.sock", job.id()));
    wait_for_socket(&socket);

    // Root sees the job: a hello on connect.
    let mut stream = UnixStream::connect(&socket).expect("root connects");
    let hello = first_frame(&mut stream).expect("root gets a hello");
    assert_eq!(hello["type"], "hello");
    drop(stream);

    // As made: the second user cannot enter the 0700 directory.
    let said = peer_connects(&socket, peer);
    assert!(said.starts_with("refused"), "{said}");
    let out = peer_attach(&dir, &bin, peer);
    assert!(!out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains(&format!("\"pid\":{}", job.id())),
        "the second user's viewer listed the job: {stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no hooked job"), "{stderr}");

    // Opened up by mistake: the hook itself still refuses the second user, before any
    // hello, and the viewer refuses a directory that is not its user's.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("0755");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).expect("0777");
    let said = peer_connects(&socket, peer);
    assert_eq!(
        said, "closed",
        "the hook must close a second user's connection unread"
    );
    let out = peer_attach(&dir, &bin, peer);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains(&format!("\"pid\":{}", job.id())),
        "the second user's viewer listed the job: {stdout}"
    );

    // Nor can its `vramtop serve` export the job's allocator, while root's does.
    let series = "vramtop_torch_reserved_bytes{";
    let pid_label = format!("pid=\"{}\"", job.id());
    let peer_scrape = serve_scrape(&dir, &bin, Some(peer), &pid_label);
    assert!(
        peer_scrape.contains("vramtop_memory_total_bytes"),
        "the second user's serve answered: {peer_scrape}"
    );
    assert!(
        !peer_scrape
            .lines()
            .any(|l| l.starts_with(series) && l.contains(&pid_label)),
        "the second user's serve exported the job: {peer_scrape}"
    );
    let root_scrape = serve_scrape(&dir, &bin, None, &pid_label);
    assert!(
        root_scrape
            .lines()
            .any(|l| l.starts_with(series) && l.contains(&pid_label)),
        "root's serve did not export the job: {root_scrape}"
    );

    // Root still does.
    let mut stream = UnixStream::connect(&socket).expect("root connects");
    assert!(first_frame(&mut stream).is_some_and(|h| h["type"] == "hello"));
    drop(stream);

    let _ = job.kill();
    let mut stderr = String::new();
    if let Some(mut e) = job.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    let _ = job.wait();
    assert!(
        stderr.contains(&format!("refused a viewer of uid {}", peer.0)),
        "the hook says whom it refused: {stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&bin);
}

/// Root's viewer and a directory another user made at root's default path (here
/// `$XDG_RUNTIME_DIR/vramtop`) with a socket posing as a job: refused, unless root names
/// the directory itself in VRAMTOP_SOCKET_DIR.
#[test]
fn root_refuses_a_planted_directory_it_did_not_name() {
    let Some((uid, gid)) = second_user() else {
        return;
    };
    let runtime = std::env::temp_dir().join(format!("vramtop-plant-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&runtime);
    let planted = runtime.join("vramtop");
    std::fs::create_dir_all(&planted).expect("planted dir");
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o700)).expect("0700");
    // A live pid of the planter's choosing (here a sleeper) behind a socket that never
    // answers.
    let mut victim = Command::new("sleep").arg("30").spawn().expect("sleep");
    let socket = planted.join(format!("vramtop-{}.sock", victim.id()));
    let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
    for path in [&planted, &socket] {
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("chown to the other user");
    }
    let attach = |named: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_vramtop"));
        command
            .args(["attach", "--seconds", "1", "--json"])
            .env("XDG_RUNTIME_DIR", &runtime)
            .env_remove("VRAMTOP_SOCKET_DIR");
        if named {
            command.env("VRAMTOP_SOCKET_DIR", &planted);
        }
        command.output().expect("vramtop attach")
    };
    let pid = format!("\"pid\":{}", victim.id());
    let out = attach(false);
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains(&pid),
        "root listed a socket in a directory it did not make or name: {out:?}"
    );
    let out = attach(true);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&pid),
        "root named the directory: it looks at that user's jobs: {out:?}"
    );
    let _ = victim.kill();
    let _ = victim.wait();
    let _ = std::fs::remove_dir_all(&runtime);
}
