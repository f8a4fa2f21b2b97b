//! Livable units (issue 23): an executable `/tmp`, a writable home, who a
//! unit runs as, volumes that outlive a session; each through `box serve`
//! (the envelope and the bash tool, as an agent sees them) on docker and on
//! the local backend, probed from inside.

use std::path::Path;

use serde_json::Value;

use crate::support::{Served, docker_here, local_here, serve_command};

/// The executor capability key, under which the envelopes come.
const KEY: &str = "io.github.christopherdavenport.dax/executor";

/// The toolchain image (`box image build dev`).
const DEV_IMAGE: &str = "box-dev:bookworm";

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
    if docker_here() {
        tmp_is_executable_unless_the_profile_says_noexec("docker");
    }
}

#[test]
fn local_tmp_is_executable_unless_the_profile_says_noexec() {
    if local_here() {
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
    if root_caller() && docker_here() {
        a_root_callers_unit_runs_as_the_workspaces_owner("docker");
    }
}

#[test]
fn local_a_root_callers_unit_runs_as_the_workspaces_owner() {
    if root_caller() && local_here() {
        a_root_callers_unit_runs_as_the_workspaces_owner("local");
    }
}

/// Issue 23, item 3: `box run` says it once on stderr when its unit runs as
/// uid 0 (a root caller in a root-owned workspace), and not when the
/// workspace is another user's; `box doctor` says the same, here.
#[test]
fn box_run_and_doctor_say_when_units_run_as_root() {
    if !root_caller() || !local_here() {
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
            .lines()
            .filter(
                |line| line.contains("WARN") && line.contains("the unit's processes run as uid 0")
            )
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

/// Build `tag` FROM box-base with a home that holds configuration, as a
/// toolchain image's does: `~/.npmrc` (0600) and `~/.cargo/config.toml`.
fn build_image_with_a_home(tag: &str) {
    let context = tempfile::tempdir().unwrap();
    std::fs::write(
        context.path().join("Dockerfile"),
        "FROM box-base:bookworm\n\
         RUN printf 'registry=https://npm.example.com/\\n' > /home/box/.npmrc \\\n\
          && chmod 0600 /home/box/.npmrc \\\n\
          && mkdir -p /home/box/.cargo \\\n\
          && printf '[net]\\ngit-fetch-with-cli = true\\n' > /home/box/.cargo/config.toml\n",
    )
    .unwrap();
    let built = std::process::Command::new("docker")
        .args(["build", "-q", "-t", tag])
        .arg(context.path())
        .env("DOCKER_BUILDKIT", "0")
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "docker build: {}",
        String::from_utf8_lossy(&built.stderr)
    );
}

/// Removes the test image on drop (also on panic).
struct ImageGuard(String);

impl Drop for ImageGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rmi", "-f", &self.0])
            .output();
    }
}

/// What the unit's `HOME` looks like from inside: the XDG variables, a file
/// written there, git's global configuration, and the home's mount options.
const HOME_PROBE: &str = "echo HOME=$HOME; echo XDG=$XDG_CACHE_HOME:$XDG_CONFIG_HOME:$XDG_DATA_HOME; \
     mkdir -p $XDG_CACHE_HOME/tool && echo cached > $XDG_CACHE_HOME/tool/c && echo home-writable; \
     git config --global user.name 'Unit User' && echo git=$(git config --global --get user.name); \
     awk -v h=$HOME '$5 == h { print \"options=\" $6 }' /proc/self/mountinfo | tail -n 1";

/// Issue 23, item 1, docker: the unit's home is writable on a read-only
/// root, holds what the image put there (modes kept), has the XDG
/// directories beneath it, takes `git config --global`, and is bounded by
/// `limits.home`; the envelope says so.
#[test]
fn docker_the_home_is_writable_holds_the_images_and_is_bounded() {
    if !docker_here() {
        return;
    }
    let tag = format!("box-test-home:{}", std::process::id());
    let _image = ImageGuard(tag.clone());
    build_image_with_a_home(&tag);
    let workspace = c_workspace();
    let profiles = profiles(&format!(
        "extends = \"default\"\n[workspace]\nimage = \"{tag}\"\nuser = \"1000:1000\"\n[limits]\nhome = \"16MiB\"\n"
    ));
    let mut served = serve("docker", workspace.path(), profiles.path());
    let envelope = envelope_of(&served);
    assert_eq!(
        envelope["home"],
        serde_json::json!({"path": "/home/box", "seededFrom": "image"}),
        "{envelope}"
    );
    assert_eq!(envelope["limits"]["homeBytes"], 16 << 20, "{envelope}");
    let out = served.bash(None, HOME_PROBE);
    assert!(out.contains("HOME=/home/box\n"), "{out}");
    assert!(
        out.contains("XDG=/home/box/.cache:/home/box/.config:/home/box/.local/share\n"),
        "{out}"
    );
    assert!(out.contains("home-writable\n"), "{out}");
    assert!(out.contains("git=Unit User\n"), "{out}");
    let options = out
        .lines()
        .find_map(|line| line.strip_prefix("options="))
        .unwrap_or_default();
    for option in ["rw", "nosuid", "nodev"] {
        assert!(options.split(',').any(|o| o == option), "{out}");
    }
    // The files and the home itself keep the image's modes, owned by the unit's user.
    let image = served.bash(
        None,
        "cat ~/.npmrc ~/.cargo/config.toml; stat -c '%a %u' ~/.npmrc ~; ls -a ~ | grep -c bashrc",
    );
    assert!(
        image.starts_with(
            "registry=https://npm.example.com/\n[net]\ngit-fetch-with-cli = true\n600 1000\n755 1000\n1\n"
        ),
        "{image}"
    );
    let full = served.bash(
        None,
        "head -c 20000000 /dev/zero > ~/big && echo wrote-it || echo bounded",
    );
    assert!(full.contains("No space left on device"), "{full}");
    assert!(full.contains("bounded"), "{full}");
    assert!(served.hang_up().success());
}

/// Issue 23, item 1, local: the unit's home is a private tmpfs of its own
/// (bounded by `limits.home`) starting as a copy of the host's `/etc/skel`,
/// never the caller's home, with the XDG directories beneath it and `git
/// config --global` working.
#[test]
fn local_the_home_is_writable_private_and_bounded() {
    if !local_here() {
        return;
    }
    let workspace = c_workspace();
    let profiles = profiles("extends = \"default\"\n[limits]\nhome = \"16MiB\"\n");
    let mut served = serve("local", workspace.path(), profiles.path());
    let envelope = envelope_of(&served);
    let home = envelope["home"]["path"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(home.ends_with("/home"), "{envelope}");
    assert_eq!(envelope["home"]["seededFrom"], "/etc/skel", "{envelope}");
    assert_eq!(envelope["limits"]["homeBytes"], 16 << 20, "{envelope}");
    let out = served.bash(None, HOME_PROBE);
    assert!(out.contains(&format!("HOME={home}\n")), "{out}");
    assert!(
        out.contains(&format!(
            "XDG={home}/.cache:{home}/.config:{home}/.local/share\n"
        )),
        "{out}"
    );
    assert!(out.contains("home-writable\n"), "{out}");
    assert!(out.contains("git=Unit User\n"), "{out}");
    let skel: Vec<String> = std::fs::read_dir("/etc/skel")
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    let listed = served.bash(None, "ls -A ~");
    for name in &skel {
        assert!(listed.contains(name.as_str()), "{name}: {listed}");
    }
    let full = served.bash(
        None,
        "head -c 20000000 /dev/zero > ~/big && echo wrote-it || echo bounded",
    );
    assert!(full.contains("bounded"), "{full}");
    assert!(served.hang_up().success());
}

/// Git configuration planted in a home (`~/.gitconfig` and the XDG one)
/// that would make git run programs: a hooks directory with a pre-commit
/// hook, an fsmonitor program, an ssh command; each touches a canary in
/// `root`. Then git commits, looks at the status, and reaches an ssh remote.
/// (`diff.external` and attribute drivers are neutralised per stamped run
/// only, wherever they are configured: docs/security.md, H81.)
fn plant_git_configuration(root: &str) -> String {
    format!(
        "set -e; mkdir -p ~/hooks $XDG_CONFIG_HOME/git; \
         printf '#!/bin/sh\\ntouch {root}/pwned-hook\\n' > ~/hooks/pre-commit; chmod +x ~/hooks/pre-commit; \
         printf '#!/bin/sh\\ntouch {root}/pwned-fsmonitor\\n' > ~/fsmonitor; chmod +x ~/fsmonitor; \
         printf '#!/bin/sh\\ntouch {root}/pwned-ssh\\n' > ~/ssh; chmod +x ~/ssh; \
         git config --global core.hooksPath ~/hooks; \
         git config --global core.fsmonitor ~/fsmonitor; \
         git config --file $XDG_CONFIG_HOME/git/config core.sshCommand ~/ssh; \
         git config --global --get core.hooksPath; \
         git init -q repo && cd repo && echo a > f && git add f \
           && git -c user.name=u -c user.email=u@example.com commit -q -m one \
           && echo b > f && git status --short; \
         git ls-remote ssh://git.example.invalid/x >/dev/null 2>&1 || true; echo done"
    )
}

const CANARIES: [&str; 3] = ["pwned-hook", "pwned-fsmonitor", "pwned-ssh"];

/// Issue 23, item 1, from the attacker's side: a unit that writes git
/// configuration into its now writable home cannot undo box's git
/// neutralisation: git run by the executor's tools runs none of it.
fn home_git_configuration_cannot_undo_the_neutralisation(backend: &str) {
    let workspace = c_workspace();
    let profiles = profiles(&dev_profile(""));
    let mut served = serve(backend, workspace.path(), profiles.path());
    let root = envelope_of(&served)["root"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let out = served.bash(None, &plant_git_configuration(&root));
    assert!(out.contains("/hooks\n"), "{out}");
    assert!(out.contains(" M f\n"), "{out}");
    assert!(out.contains("done"), "{out}");
    for canary in CANARIES {
        assert!(
            !workspace.path().join(canary).exists(),
            "{backend}: {canary} ran: {out}"
        );
    }
    assert!(served.hang_up().success());
}

/// The attack is real: the same script, run by git on the host with a home
/// of its own and no neutralisation, runs every planted program.
#[test]
fn planted_home_git_configuration_runs_without_the_neutralisation() {
    let workspace = c_workspace();
    let home = tempfile::tempdir().unwrap();
    let output = std::process::Command::new("sh")
        .args([
            "-c",
            &plant_git_configuration(&workspace.path().display().to_string()),
        ])
        .current_dir(workspace.path())
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join(".config"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    for canary in CANARIES {
        assert!(workspace.path().join(canary).exists(), "{canary}: {said}");
    }
}

#[test]
fn docker_home_git_configuration_cannot_undo_the_neutralisation() {
    if docker_here() {
        home_git_configuration_cannot_undo_the_neutralisation("docker");
    }
}

#[test]
fn local_home_git_configuration_cannot_undo_the_neutralisation() {
    if local_here() {
        home_git_configuration_cannot_undo_the_neutralisation("local");
    }
}

/// Every directory the unit can create a file in, among every mount point
/// it has (its writable places are mounts) and the usual directories of a
/// root file system (landlock keeps `/` itself from being listed), but the
/// kernel's (/proc, /sys, /dev).
const WRITABLE_PROBE: &str = "{ awk '{ print $5 }' /proc/self/mountinfo; \
     for d in / /bin /boot /etc /home /lib /lib64 /media /mnt /opt /root /run /sbin /srv /usr /usr/bin \
       /usr/lib /usr/local /usr/local/bin /usr/share /var /var/tmp /var/lib /var/cache /var/log /var/mail \
       /.box /.box/run /run/lock \"$HOME\" \"$PWD\"; do echo \"$d\"; done; } | sort -u | \
     while read -r d; do [ -d \"$d\" ] && [ ! -L \"$d\" ] || continue; \
     case \"$d\" in /proc|/proc/*|/sys|/sys/*|/dev|/dev/*) continue;; esac; \
     f=\"$d/.box-probe-$$\"; if ( : > \"$f\" ) 2>/dev/null; then rm -f \"$f\"; echo \"writable $d\"; fi; done";

/// Where the unit may write: its home, its /tmp, its workspace, and `more`
/// (volumes); everything else of its file system stays read-only, probed
/// from inside as uid 0 (so no permission bit hides a writable file system).
fn only_home_tmp_and_workspace_are_writable(backend: &str, extra: &str, more: &[&str]) {
    let workspace = c_workspace();
    let profiles = profiles(&format!(
        "extends = \"default\"\n[workspace]\nuser = \"0:0\"\n{extra}"
    ));
    let mut served = serve(backend, workspace.path(), profiles.path());
    let envelope = envelope_of(&served);
    assert_eq!(envelope["hardening"]["readOnlyRoot"], true, "{envelope}");
    let root = envelope["root"].as_str().unwrap_or_default().to_owned();
    let home = envelope["home"]["path"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let out = served.bash(None, WRITABLE_PROBE);
    let writable: Vec<&str> = out
        .lines()
        .filter_map(|line| line.strip_prefix("writable "))
        .collect();
    let allowed: Vec<&str> = [root.as_str(), home.as_str(), "/tmp"]
        .into_iter()
        .chain(more.iter().copied())
        .collect();
    for dir in &writable {
        assert!(
            allowed
                .iter()
                .any(|place| Path::new(dir).starts_with(place)),
            "{backend}: {dir} is writable: {out}"
        );
    }
    for place in &allowed {
        assert!(
            writable.iter().any(|dir| dir == place),
            "{backend}: {place} is not writable: {out}"
        );
    }
    assert!(served.hang_up().success());
}

/// Issue 23: every protection holds with a livable unit: the root file
/// system outside the home, /tmp and the workspace stays read-only.
#[test]
fn docker_only_home_tmp_and_workspace_are_writable() {
    if docker_here() {
        only_home_tmp_and_workspace_are_writable("docker", "", &[]);
    }
}

#[test]
fn local_only_home_tmp_and_workspace_are_writable() {
    if root_caller() && local_here() {
        only_home_tmp_and_workspace_are_writable("local", "", &[]);
    }
}
