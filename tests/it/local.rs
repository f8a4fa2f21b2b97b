//! Units on the local sandboxed-process backend, probed from inside: the unit
//! runs a shell probe in place of the executor (`LocalBackend::start_command`,
//! the same helper and confinement path `start` uses) and the test compares
//! what the probe saw with the envelope. Canaries are planted outside the
//! workspace and asserted unreached.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use boxhost::backend::local::{LocalBackend, LocalOptions};
use boxhost::backend::{Backend, BackendError, Envelope, SessionLabel, UnitEnd};
use boxhost::plan::{
    Limits, MountMode, Network, NetworkMode, Requirement, Role, Security, UnitSpec, UserIds,
    WorkspaceSource,
};
use tokio::io::AsyncReadExt;

use crate::support::{box_bin, under_ci};

fn session(name: &str) -> SessionLabel {
    SessionLabel {
        instance: "local-test".to_owned(),
        session: format!("{name}-{}", std::process::id()),
        profile: "test".to_owned(),
    }
}

fn limits() -> Limits {
    Limits {
        memory_bytes: 512 << 20,
        cpus: 1.0,
        pids: 64,
        tmp_bytes: 64 << 20,
        nofile: 256,
        call_timeout: Duration::from_secs(60),
        idle: Duration::from_secs(60),
        lifetime: Duration::from_secs(60),
    }
}

/// A unit spec on `workspace`, landlock required, network none, as the caller.
fn unit_spec(workspace: &Path) -> UnitSpec {
    UnitSpec {
        name: "workspace".to_owned(),
        role: Role::Workspace,
        image: String::new(),
        source: WorkspaceSource::Host(workspace.to_path_buf()),
        root: workspace.to_path_buf(),
        mode: MountMode::ReadWrite,
        user: None,
        network: Network {
            mode: NetworkMode::None,
            allow: Vec::new(),
        },
        limits: limits(),
        env_set: BTreeMap::new(),
        env_pass: Vec::new(),
        env_secrets: Vec::new(),
        security: Security {
            capabilities: Vec::new(),
            read_only_root: true,
            landlock: Requirement::Required,
            neutralise_git: true,
            write_guard: true,
            privileged: false,
            host_namespaces: Vec::new(),
            devices: Vec::new(),
        },
        command: Vec::new(),
        description: String::new(),
    }
}

/// Landlock must be there on this machine; without it the tests would prove
/// nothing, so say so loudly (and fail under CI).
fn require_landlock() -> bool {
    if boxhost::backend::sandbox::landlock_abi() > 0 {
        return true;
    }
    eprintln!("LOCAL BACKEND TESTS SKIPPED: this kernel has no landlock");
    assert!(!under_ci(), "landlock is missing under CI");
    false
}

fn backend() -> LocalBackend {
    LocalBackend::new(box_bin())
}

/// A temp directory the unit's user can enter (a root host runs the fork
/// bomb as nobody).
fn open_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// What one probe saw, and what the backend said.
struct Probe {
    envelope: Envelope,
    output: String,
    end: UnitEnd,
}

async fn probe_with(backend: &LocalBackend, name: &str, spec: &UnitSpec, script: &str) -> Probe {
    // The probe's stderr joins its stdout, so the test sees the shell's errors.
    let script = format!("exec 2>&1; {script}");
    let command: Vec<OsString> = vec!["/bin/sh".into(), "-c".into(), script.into()];
    let started = backend
        .start_command(&session(name), spec, command)
        .await
        .unwrap_or_else(|error| panic!("starting probe {name}: {error}"));
    let envelope = started.envelope.clone();
    let mut io = started.io;
    drop(io.stdin);
    let mut output = String::new();
    tokio::time::timeout(
        Duration::from_secs(60),
        io.stdout.read_to_string(&mut output),
    )
    .await
    .expect("probe finished within 60s")
    .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(30), started.ended)
        .await
        .expect("unit ended after its probe");
    backend.remove(&envelope.id).await.unwrap();
    eprintln!("probe {name} output:\n{output}\nend: {end:?}");
    Probe {
        envelope,
        output,
        end,
    }
}

async fn probe(name: &str, spec: &UnitSpec, script: &str) -> Probe {
    probe_with(&backend(), name, spec, script).await
}

fn status_field<'a>(output: &'a str, name: &str) -> Option<&'a str> {
    output
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':').map(str::trim))
}

#[tokio::test]
async fn posture_seen_from_inside_matches_the_envelope() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    let probe = probe(
        "posture",
        &spec,
        "cat /proc/self/status; echo uid=$(id -u) gid=$(id -g); echo nets: $(ls /sys/class/net)",
    )
    .await;
    for field in ["CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"] {
        assert_eq!(
            status_field(&probe.output, field),
            Some("0000000000000000"),
            "{field}"
        );
    }
    assert_eq!(status_field(&probe.output, "NoNewPrivs"), Some("1"));
    let hardening = &probe.envelope.hardening;
    assert!(hardening.capabilities.is_empty());
    assert!(hardening.no_new_privileges);
    assert!(hardening.landlock_enforced);
    assert_eq!(
        hardening.landlock_abi,
        boxhost::backend::sandbox::landlock_abi()
    );
    assert_eq!(hardening.seccomp, "none");
    let (uid, gid) = probe.envelope.user.split_once(':').unwrap();
    assert!(
        probe.output.contains(&format!("uid={uid} gid={gid}")),
        "envelope user {} not what the probe saw",
        probe.envelope.user
    );
    if probe.envelope.network["namespace"] == true {
        assert!(probe.output.contains("nets: lo\n"), "only lo in the unit");
        assert!(hardening.namespaces.contains(&"net".to_owned()));
    } else {
        assert_eq!(probe.envelope.network["landlockTcpDenied"], true);
    }
    assert_eq!(
        hardening.user_namespace,
        hardening.namespaces.contains(&"user".to_owned())
    );
    assert_eq!(probe.end.exit_code, Some(0));
}

#[tokio::test]
async fn writes_land_only_inside_the_workspace() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("existing"), "untouched").unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.env_set.insert(
        "CANARY_DIR".to_owned(),
        outside.path().display().to_string(),
    );
    let probe = probe(
        "writes",
        &spec,
        "echo inside > inside.txt && echo inside-ok; \
         echo x > \"$CANARY_DIR/created\" || echo create-denied; \
         echo y >> \"$CANARY_DIR/existing\" || echo append-denied; \
         mkdir \"$CANARY_DIR/dir\" || echo mkdir-denied; \
         rm -f \"$CANARY_DIR/existing\" || echo rm-denied; \
         echo tmp > \"$TMPDIR/t\" && echo tmp-ok; \
         echo x > /etc/box-canary || echo etc-denied",
    )
    .await;
    for expected in [
        "inside-ok",
        "create-denied",
        "append-denied",
        "mkdir-denied",
        "rm-denied",
        "tmp-ok",
        "etc-denied",
    ] {
        assert!(probe.output.contains(expected), "missing {expected}");
    }
    assert_eq!(
        std::fs::read_to_string(workspace.path().join("inside.txt")).unwrap(),
        "inside\n"
    );
    assert!(!outside.path().join("created").exists());
    assert!(!outside.path().join("dir").exists());
    assert!(!Path::new("/etc/box-canary").exists());
    assert_eq!(
        std::fs::read_to_string(outside.path().join("existing")).unwrap(),
        "untouched"
    );
}

#[tokio::test]
async fn host_secrets_and_the_host_process_are_out_of_reach() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join(".ssh")).unwrap();
    std::fs::create_dir_all(home.path().join(".aws")).unwrap();
    std::fs::write(home.path().join(".ssh/id_rsa"), "CANARY-SSH-KEY").unwrap();
    std::fs::write(home.path().join(".aws/credentials"), "CANARY-AWS").unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.env_set
        .insert("FAKE_HOME".to_owned(), home.path().display().to_string());
    spec.env_set
        .insert("HOST_PID".to_owned(), std::process::id().to_string());
    let probe = probe(
        "secrets",
        &spec,
        "cat \"$FAKE_HOME/.ssh/id_rsa\" || echo ssh-denied; \
         cat \"$FAKE_HOME/.aws/credentials\" || echo aws-denied; \
         ls \"$FAKE_HOME\" || echo home-denied; \
         cat /proc/$HOST_PID/environ || echo environ-denied; \
         kill -0 $HOST_PID || echo signal-denied; \
         echo home=$HOME",
    )
    .await;
    assert!(!probe.output.contains("CANARY"), "a canary leaked");
    for expected in [
        "ssh-denied",
        "aws-denied",
        "home-denied",
        "environ-denied",
        "signal-denied",
    ] {
        assert!(probe.output.contains(expected), "missing {expected}");
    }
    assert!(
        !probe
            .output
            .contains(&format!("home={}", home.path().display()))
    );
}

#[tokio::test]
async fn network_none_reaches_nothing_on_the_host() {
    if !require_landlock() {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let workspace = tempfile::tempdir().unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.env_set.insert("PORT".to_owned(), port.to_string());
    let probe = probe(
        "network",
        &spec,
        "python3 -c 'import os, socket; socket.create_connection((\"127.0.0.1\", int(os.environ[\"PORT\"])), 2)' \
         && echo connected || echo connect-failed",
    )
    .await;
    assert!(probe.output.contains("connect-failed"));
    assert!(!probe.output.contains("connected\n"));
    assert_eq!(probe.envelope.network["mode"], "none");
}

/// On a root host RLIMIT_NPROC does not bind uid 0, so the unit runs as nobody.
fn unprivileged(spec: &mut UnitSpec) {
    if nix::unistd::geteuid().is_root() {
        spec.user = Some(UserIds {
            uid: 65534,
            gid: 65534,
        });
    }
}

#[tokio::test]
async fn a_fork_bomb_is_contained_by_the_process_limit() {
    if !require_landlock() {
        return;
    }
    let workspace = open_dir();
    let mut spec = unit_spec(workspace.path());
    unprivileged(&mut spec);
    spec.limits.pids = 16;
    let started = std::time::Instant::now();
    let probe = probe(
        "forkbomb",
        &spec,
        "i=0; while [ $i -lt 64 ]; do sleep 300 & i=$((i+1)); done; echo done-forking",
    )
    .await;
    assert!(
        probe.output.contains("fork") || probe.output.contains("unavailable"),
        "forking past the limit failed"
    );
    assert_eq!(probe.envelope.limits["pids"], 16);
    assert!(
        !probe.envelope.limits["notApplied"]
            .to_string()
            .contains("RLIMIT_NPROC")
    );
    // The sleeps died with the unit (pid namespace) or its removal.
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[tokio::test]
async fn a_file_past_the_size_limit_fails_with_efbig() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.limits.tmp_bytes = 1 << 20;
    let probe = probe(
        "fsize",
        &spec,
        "dd if=/dev/zero of=big bs=65536 count=64 2>&1; echo rc=$?",
    )
    .await;
    assert!(probe.output.contains("File too large"));
    assert!(!probe.output.contains("rc=0"));
    assert_eq!(
        std::fs::metadata(workspace.path().join("big"))
            .unwrap()
            .len(),
        1 << 20
    );
    assert_eq!(probe.envelope.limits["fileSizeBytes"], 1 << 20);
}

#[tokio::test]
async fn open_files_and_memory_are_capped() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.limits.nofile = 64;
    spec.limits.memory_bytes = 256 << 20;
    let probe = probe(
        "nofile-memory",
        &spec,
        "echo nofile=$(ulimit -n); \
         python3 -c 'import os; [os.open(\"/dev/null\", os.O_RDONLY) for _ in range(200)]' 2>&1 | tail -1; \
         python3 -c 'b = bytearray(600 << 20); print(\"allocated\")' 2>&1 | tail -1",
    )
    .await;
    assert!(probe.output.contains("nofile=64"));
    assert!(probe.output.contains("Too many open files"));
    assert!(probe.output.contains("MemoryError"));
    assert!(!probe.output.contains("allocated"));
    assert_eq!(probe.envelope.limits["nofile"], 64);
    assert_eq!(probe.envelope.limits["memoryBytes"], 256 << 20);
}

#[tokio::test]
async fn the_end_names_the_exit_code_or_the_signal() {
    if !require_landlock() {
        return;
    }
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    let exited = probe("exit-code", &spec, "exit 7").await;
    assert_eq!(exited.end.exit_code, Some(7));
    assert_eq!(exited.end.reason, "the executor exited with code 7");
    let killed = probe("signal", &spec, "kill -KILL $$").await;
    assert_eq!(killed.end.exit_code, Some(-1));
    assert!(
        killed.end.reason.contains("SIGKILL"),
        "{}",
        killed.end.reason
    );
}

#[tokio::test]
async fn a_required_landlock_abi_the_kernel_lacks_refuses_to_start() {
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    let backend = LocalBackend::with_options(LocalOptions {
        box_exe: box_bin(),
        namespaces: Requirement::BestEffort,
        landlock_min_abi: 99,
    });
    let session = session("refuse");
    let command = vec![OsString::from("/bin/sh"), "-c".into(), "touch ran".into()];
    let error = backend
        .start_command(&session, &spec, command)
        .await
        .err()
        .expect("start refused");
    assert!(
        matches!(&error, BackendError::Unenforceable { control, .. } if control == "landlock (ABI 99)"),
        "{error}"
    );
    assert!(error.to_string().contains("unit workspace"), "{error}");
    assert!(!workspace.path().join("ran").exists(), "the command ran");
    assert!(leftover_temp_dirs(&session).is_empty());
    assert!(backend.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn the_helper_alone_refuses_a_missing_control_before_running_anything() {
    // The helper run by hand, as the backend runs it: the report goes to stderr.
    let workspace = tempfile::tempdir().unwrap();
    let spec = serde_json::json!({
        "unit": "direct", "write": [workspace.path()], "read": [], "cwd": workspace.path(),
        "network": "none", "user": null,
        "rlimits": {"nofile": 64, "nproc": 64, "dataBytes": 1u64 << 30,
                    "addressSpaceBytes": 2u64 << 30, "fsizeBytes": 1u64 << 20, "coreBytes": 0},
        "landlock": "required", "landlockMinAbi": 99, "namespaces": "best-effort",
        "env": [["PATH", "/usr/bin:/bin"]]
    });
    let output = std::process::Command::new(box_bin())
        .arg("sandbox")
        .arg("--spec")
        .arg(spec.to_string())
        .arg("--")
        .arg("/usr/bin/touch")
        .arg(workspace.path().join("ran"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("\"event\":\"refused\""), "{stderr}");
    assert!(stderr.contains("landlock (ABI 99) is required"), "{stderr}");
    assert!(!workspace.path().join("ran").exists());
}

fn leftover_temp_dirs(session: &SessionLabel) -> Vec<PathBuf> {
    let prefix = format!("box-local-{}-", session.session);
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .map(|entry| entry.path())
        .collect()
}

/// The `sleep` processes on this machine whose command line carries `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .bytes()
                .all(|byte| byte.is_ascii_digit())
        })
        .filter_map(|entry| {
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            (cmdline.starts_with("sleep ") && cmdline.contains(marker)).then_some(cmdline)
        })
        .collect()
}

#[tokio::test]
async fn remove_leaves_no_process_and_no_temp_dir_and_is_idempotent() {
    if !require_landlock() {
        return;
    }
    let backend = backend();
    let session = session("remove");
    let mut spec = unit_spec(Path::new("/nonexistent"));
    spec.source = WorkspaceSource::Empty;
    // A grandchild in its own session and process group, which a process
    // group kill alone would miss.
    let marker = format!("98765{}", std::process::id() % 1000);
    let script = format!("setsid sleep {marker} & sleep {marker}");
    let command = vec![OsString::from("/bin/sh"), "-c".into(), script.into()];
    let started = backend
        .start_command(&session, &spec, command)
        .await
        .unwrap();
    let id = started.envelope.id.clone();
    let temp = PathBuf::from(&started.envelope.root)
        .parent()
        .unwrap()
        .to_path_buf();
    assert!(temp.is_dir());
    assert_eq!(leftover_temp_dirs(&session), vec![temp.clone()]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while processes_with(&marker).len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(processes_with(&marker).len(), 2);
    let listed = backend.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, id);
    assert_eq!(listed[0].session, session.session);
    assert_eq!(listed[0].state, "running");

    backend.remove(&id).await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), started.ended)
        .await
        .unwrap();
    assert!(
        end.reason.starts_with("the unit was removed"),
        "{}",
        end.reason
    );
    assert!(!Path::new(&format!("/proc/{id}")).exists());
    if started
        .envelope
        .hardening
        .namespaces
        .contains(&"pid".to_owned())
    {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !processes_with(&marker).is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(processes_with(&marker), Vec::<String>::new());
    } else {
        eprintln!("FIXME: without a pid namespace a process in another group survives removal");
    }
    assert!(!temp.exists());
    backend.remove(&id).await.unwrap();
    backend.remove("no-such-unit").await.unwrap();
    assert!(backend.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn start_runs_the_executor_confined() {
    if !require_landlock() {
        return;
    }
    let backend = backend();
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    let started = backend.start(&session("start"), &spec).await.unwrap();
    let envelope = started.envelope.clone();
    assert_eq!(envelope.backend, "local");
    assert_eq!(
        envelope.root,
        std::fs::canonicalize(workspace.path())
            .unwrap()
            .display()
            .to_string()
    );
    assert!(envelope.hardening.landlock_enforced);
    assert!(envelope.hardening.no_new_privileges);
    backend.remove(&envelope.id).await.unwrap();
}

/// Inside a container (as on CI runners) namespaces are often blocked: the
/// unit then rests on landlock alone, and its envelope says so.
#[tokio::test]
async fn without_namespaces_landlock_alone_confines_the_unit() {
    if !require_landlock() {
        return;
    }
    let backend = LocalBackend::with_options(LocalOptions {
        box_exe: box_bin(),
        namespaces: Requirement::Off,
        landlock_min_abi: 1,
    });
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "CANARY-OUTSIDE").unwrap();
    let mut spec = unit_spec(workspace.path());
    spec.env_set.insert(
        "PORT".to_owned(),
        listener.local_addr().unwrap().port().to_string(),
    );
    spec.env_set
        .insert("HOST_PID".to_owned(), std::process::id().to_string());
    spec.env_set.insert(
        "CANARY_DIR".to_owned(),
        outside.path().display().to_string(),
    );
    let probe = probe_with(
        &backend,
        "no-namespaces",
        &spec,
        "grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status; \
         python3 -c 'import os, socket; socket.create_connection((\"127.0.0.1\", int(os.environ[\"PORT\"])), 2)' \
         && echo connected || echo connect-failed; \
         test -d /proc/$HOST_PID && echo host-pid-visible; \
         cat /proc/$HOST_PID/environ || echo environ-denied; \
         kill -0 $HOST_PID || echo signal-denied; \
         cat \"$CANARY_DIR/secret\" || echo read-denied; \
         echo x > \"$CANARY_DIR/new\" || echo write-denied",
    )
    .await;
    let hardening = &probe.envelope.hardening;
    assert!(hardening.namespaces.is_empty());
    assert!(!hardening.user_namespace);
    assert_eq!(probe.envelope.network["namespace"], false);
    assert_eq!(probe.envelope.network["landlockTcpDenied"], true);
    assert_eq!(
        status_field(&probe.output, "CapEff"),
        Some("0000000000000000")
    );
    assert_eq!(status_field(&probe.output, "NoNewPrivs"), Some("1"));
    if nix::unistd::geteuid().is_root() {
        // Root could drop its bounding set; so the envelope's empty list is exact.
        assert_eq!(
            status_field(&probe.output, "CapBnd"),
            Some("0000000000000000")
        );
    }
    assert!(probe.output.contains("host-pid-visible"));
    for expected in [
        "connect-failed",
        "environ-denied",
        "signal-denied",
        "read-denied",
        "write-denied",
    ] {
        assert!(probe.output.contains(expected), "missing {expected}");
    }
    assert!(!probe.output.contains("CANARY"));
    assert!(!outside.path().join("new").exists());
}

#[tokio::test]
async fn required_namespaces_are_entered_here() {
    if !require_landlock() {
        return;
    }
    let backend = LocalBackend::with_options(LocalOptions {
        box_exe: box_bin(),
        namespaces: Requirement::Required,
        landlock_min_abi: 1,
    });
    let workspace = tempfile::tempdir().unwrap();
    let spec = unit_spec(workspace.path());
    match backend
        .start_command(&session("required-ns"), &spec, vec!["/bin/true".into()])
        .await
    {
        Ok(started) => {
            let namespaces = &started.envelope.hardening.namespaces;
            for name in ["user", "mount", "ipc", "net", "pid"] {
                assert!(namespaces.contains(&name.to_owned()), "{name} missing");
            }
            backend.remove(&started.envelope.id).await.unwrap();
        }
        Err(error) => {
            // Where the kernel or a container forbids them, the refusal names the control.
            assert!(
                matches!(&error, BackendError::Unenforceable { control, .. } if control == "namespaces"),
                "{error}"
            );
            eprintln!("NOTE: namespaces are unavailable here: {error}");
        }
    }
}
