//! Livable units (issue 23): an executable `/tmp`, a writable home, who a
//! unit runs as, volumes that outlive a session; each through `box serve`
//! (the envelope and the bash tool, as an agent sees them) on docker and on
//! the local backend, probed from inside.

use std::path::Path;

use serde_json::Value;

use crate::support::{Served, serve_command, under_ci};

/// The executor capability key, under which the envelopes come.
const KEY: &str = "io.github.christopherdavenport.dax/executor";

/// The toolchain image (`box image build dev`).
const DEV_IMAGE: &str = "box-dev:bookworm";

/// Whether a Docker engine answers (under CI its absence fails the test).
fn docker() -> bool {
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(crate::support::docker_answers())
}

/// Whether the local backend can run here (landlock; under CI its absence fails).
fn local() -> bool {
    if box_confine::landlock_abi() > 0 {
        return true;
    }
    assert!(!under_ci(), "landlock is missing under CI");
    eprintln!("\n*** LOCAL PART NOT RUN: this kernel has no landlock ***\n");
    false
}

/// A directory holding one profile, `p.toml`, with `text`.
fn profiles(text: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.toml"), text).unwrap();
    dir
}

/// A profile on the dev image that extends `default` (the local backend runs
/// it on the host's userland), with `more` appended.
fn dev_profile(more: &str) -> String {
    format!(
        "extends = \"default\"\n[workspace]\nimage = \"{DEV_IMAGE}\"\nlocal_userland = \"host\"\n{more}"
    )
}

/// `box serve` on `backend` over `workspace` with profile `p` from `profiles`,
/// initialized.
fn serve(backend: &str, workspace: &Path, profiles: &Path) -> Served {
    let instance = format!("livable-{backend}-{}", std::process::id());
    let mut command = serve_command(backend, &instance, workspace);
    command
        .arg("--profiles")
        .arg(profiles)
        .args(["--profile", "p"]);
    Served::start(command)
}

/// The workspace unit's envelope.
fn envelope_of(served: &Served) -> Value {
    served.initialized["result"]["capabilities"]["experimental"][KEY]["box"]["units"][0].clone()
}

/// A C program that exits 0, in a fresh workspace the unit can enter.
fn c_workspace() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt as _;
    let workspace = tempfile::tempdir().unwrap();
    std::fs::set_permissions(workspace.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(
        workspace.path().join("a.c"),
        "int main(void) { return 0; }\n",
    )
    .unwrap();
    workspace
}

/// The options `/tmp` is mounted with, as the unit sees them.
const TMP_OPTIONS: &str = "awk '$5 == \"/tmp\" { print $6 }' /proc/self/mountinfo | tail -n 1";

/// Issue 23, item 2: by default a program compiled into `/tmp` runs, and
/// `/tmp` is still `nosuid` and `nodev`; with `[security] tmp = "noexec"` it
/// does not run. The envelope says which.
fn tmp_is_executable_unless_the_profile_says_noexec(backend: &str) {
    for (extra, exec) in [("", true), ("[security]\ntmp = \"noexec\"\n", false)] {
        let workspace = c_workspace();
        let profiles = profiles(&dev_profile(extra));
        let mut served = serve(backend, workspace.path(), profiles.path());
        let envelope = envelope_of(&served);
        let word = if exec { "exec" } else { "noexec" };
        assert_eq!(envelope["hardening"]["tmp"], word, "{envelope}");
        let out = served.bash(
            None,
            &format!(
                "{TMP_OPTIONS}; cc -o /tmp/a a.c && /tmp/a && echo ran-from-tmp; echo TMPDIR=$TMPDIR"
            ),
        );
        let options = out.lines().next().unwrap_or_default();
        for option in ["nosuid", "nodev"] {
            assert!(options.split(',').any(|o| o == option), "{backend}: {out}");
        }
        assert_eq!(
            options.split(',').any(|o| o == "noexec"),
            !exec,
            "{backend}: {out}"
        );
        assert_eq!(
            out.contains("ran-from-tmp"),
            exec,
            "{backend} {word}: {out}"
        );
        assert!(out.contains("TMPDIR=/tmp\n"), "{backend}: {out}");
        assert!(served.hang_up().success());
    }
}

#[test]
fn docker_tmp_is_executable_unless_the_profile_says_noexec() {
    if docker() {
        tmp_is_executable_unless_the_profile_says_noexec("docker");
    }
}

#[test]
fn local_tmp_is_executable_unless_the_profile_says_noexec() {
    if local() {
        tmp_is_executable_unless_the_profile_says_noexec("local");
    }
}

/// Whether this test runs as root (the rule it tests is a root caller's);
/// said loudly when not.
fn root_caller() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!(
        "\n*** NOT RUN: the rule is a root caller's, and these tests run as uid {} ***\n",
        nix::unistd::geteuid()
    );
    false
}

/// Issue 23, item 3: a root caller's `user = "host"` unit runs as the owner
/// of its workspace (files it writes keep that owner) and nothing warns; a
/// root-owned workspace gets uid 0, and then the envelope says so with the
/// remedies.
fn a_root_callers_unit_runs_as_the_workspaces_owner(backend: &str) {
    use std::os::unix::fs::MetadataExt as _;
    let profiles = profiles("extends = \"default\"\n");
    let owned = c_workspace();
    std::os::unix::fs::chown(owned.path(), Some(1000), Some(1000)).unwrap();
    let mut served = serve(backend, owned.path(), profiles.path());
    let envelope = envelope_of(&served);
    assert_eq!(envelope["user"], "1000:1000", "{envelope}");
    assert!(envelope.get("rootUser").is_none(), "{envelope}");
    let out = served.bash(None, "id -u; id -g; echo made > made-here");
    assert_eq!(
        out.lines().take(2).collect::<Vec<_>>(),
        ["1000", "1000"],
        "{out}"
    );
    let made = std::fs::metadata(owned.path().join("made-here")).unwrap();
    assert_eq!((made.uid(), made.gid()), (1000, 1000), "{backend}");
    assert!(served.hang_up().success());

    let roots = c_workspace();
    assert_eq!(std::fs::metadata(roots.path()).unwrap().uid(), 0);
    let mut served = serve(backend, roots.path(), profiles.path());
    let envelope = envelope_of(&served);
    assert_eq!(envelope["user"], "0:0", "{envelope}");
    let warning = envelope["rootUser"]["warning"].as_str().unwrap_or_default();
    assert!(warning.contains("uid 0, the host's root"), "{envelope}");
    let remedies = envelope["rootUser"]["remedies"].to_string();
    for remedy in [
        "user = \\\"1000:1000\\\"",
        "userns-remap",
        "rootless Docker",
    ] {
        assert!(remedies.contains(remedy), "{remedy}: {remedies}");
    }
    let out = served.bash(None, "id -u");
    assert_eq!(out.lines().next(), Some("0"), "{out}");
    assert!(served.hang_up().success());
}

#[test]
fn docker_a_root_callers_unit_runs_as_the_workspaces_owner() {
    if root_caller() && docker() {
        a_root_callers_unit_runs_as_the_workspaces_owner("docker");
    }
}

#[test]
fn local_a_root_callers_unit_runs_as_the_workspaces_owner() {
    if root_caller() && local() {
        a_root_callers_unit_runs_as_the_workspaces_owner("local");
    }
}

/// Issue 23, item 3: `box run` says it once on stderr when its unit runs as
/// uid 0 (a root caller in a root-owned workspace), and not when the
/// workspace is another user's; `box doctor` says the same, here.
#[test]
fn box_run_and_doctor_say_when_units_run_as_root() {
    if !root_caller() || !local() {
        return;
    }
    let run = |workspace: &Path| {
        std::process::Command::new(crate::support::box_bin())
            .args(["run", "--backend", "local", "--", "id", "-u"])
            .current_dir(workspace)
            .output()
            .unwrap()
    };
    let roots = c_workspace();
    let output = run(roots.path());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(String::from_utf8_lossy(&output.stdout), "0\n", "{stderr}");
    assert_eq!(
        stderr
            .matches("box run: warning: the unit's processes run as uid 0")
            .count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("remedies: a non-root user"), "{stderr}");
    let owned = c_workspace();
    std::os::unix::fs::chown(owned.path(), Some(1000), Some(1000)).unwrap();
    let output = run(owned.path());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "1000\n",
        "{stderr}"
    );
    assert!(!stderr.contains("uid 0"), "{stderr}");

    let doctor = |workspace: &Path| {
        let output = std::process::Command::new(crate::support::box_bin())
            .args(["doctor"])
            .current_dir(workspace)
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let said = doctor(roots.path());
    assert!(
        said.contains("units of user = \"host\" profiles run as 0:0 here"),
        "{said}"
    );
    assert!(
        said.contains("WARNING       the unit's processes run as uid 0"),
        "{said}"
    );
    assert!(said.contains("remedy      rootless Docker"), "{said}");
    let said = doctor(owned.path());
    assert!(said.contains("run as 1000:1000 here"), "{said}");
    assert!(!said.contains("WARNING"), "{said}");
}
