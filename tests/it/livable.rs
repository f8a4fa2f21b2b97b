//! Livable units (issue 23): an executable `/tmp`, a writable home, who a
//! unit runs as, volumes that outlive a session; each through `box serve`
//! (the envelope and the bash tool, as an agent sees them) on docker and on
//! the local backend, probed from inside.

use std::path::Path;
use std::time::Duration;

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
fn envelope(served: &Served) -> Value {
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
        let envelope = envelope(&served);
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

/// Room for a unit's start on a loaded machine.
#[allow(dead_code)]
const START: Duration = Duration::from_secs(120);
