//! `box volumes ls|rm|prune` over the volumes `box run` leaves, on docker
//! and on the local backend: a profile volume outlives its session and is
//! listed with its size, a session volume goes with its session, one in use
//! is not removed (the message names the unit and session), prune keeps
//! profile volumes unless asked. Each test keeps its volumes under a state
//! directory of its own (`XDG_STATE_HOME`).

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{box_bin, docker_answers, under_ci};

/// A profile `p` with a profile-scoped and a session-scoped volume.
const PROFILE: &str = r#"extends = "default"

[[volume]]
name = "cache"
path = "~/.cache/thing"
scope = "profile"

[[volume]]
name = "scratch"
path = "~/scratch"
scope = "session"
"#;

/// A test's own state directory, profiles and workspace.
struct Place {
    state: tempfile::TempDir,
    profiles: tempfile::TempDir,
    workspace: tempfile::TempDir,
}

impl Place {
    fn new() -> Self {
        let profiles = tempfile::tempdir().unwrap();
        std::fs::write(profiles.path().join("p.toml"), PROFILE).unwrap();
        Self {
            state: tempfile::tempdir().unwrap(),
            profiles,
            workspace: tempfile::tempdir().unwrap(),
        }
    }

    /// `box ARGS` with this place's state directory.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(box_bin());
        command
            .args(args)
            .env("XDG_STATE_HOME", self.state.path())
            .current_dir(self.workspace.path());
        command
    }

    fn run_box(&self, args: &[&str]) -> Output {
        let output = self.command(args).output().unwrap();
        eprintln!(
            "box {}: {:?}\nstdout: {}\nstderr: {}",
            args.join(" "),
            output.status.code(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    /// `box run` of `script` in a unit of profile `p` on `backend`.
    fn run_unit(&self, backend: &str, script: &str) -> Output {
        let profiles = self.profiles.path().to_str().unwrap().to_owned();
        self.run_box(&[
            "run",
            "--backend",
            backend,
            "--profiles",
            &profiles,
            "--profile",
            "p",
            "--",
            "/bin/sh",
            "-c",
            script,
        ])
    }

    /// `box volumes ls --json ARGS`.
    fn listed(&self, args: &[&str]) -> Vec<Value> {
        let mut all = vec!["volumes", "ls", "--json"];
        all.extend_from_slice(args);
        let output = self.run_box(&all);
        assert!(output.status.success());
        serde_json::from_slice::<Value>(&output.stdout)
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }
}

/// A unit of profile `p` on `backend` that holds its volumes until killed,
/// started once it has written `ready` into its profile volume.
fn holding(place: &Place, backend: &str) -> Child {
    let profiles = place.profiles.path().to_str().unwrap().to_owned();
    let child = place
        .command(&[
            "run",
            "--backend",
            backend,
            "--profiles",
            &profiles,
            "--profile",
            "p",
            "--",
            "/bin/sh",
            "-c",
            "touch ~/.cache/thing/ready; sleep 120",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let ready = place
        .state
        .path()
        .join(format!("box/volumes/{backend}/p-p-cache/data/ready"));
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the holding unit did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// End `child` (`box run`) the way a terminal's ^C does: it removes its units.
fn interrupt(mut child: Child) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "box run did not end on SIGINT");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn volumes_are_listed_removed_and_pruned(backend: &str) {
    let place = Place::new();
    // A profile volume outlives the session; the session volume goes with it.
    let output = place.run_unit(
        backend,
        "printf 12345 > ~/.cache/thing/five && echo x > ~/scratch/x && echo wrote",
    );
    assert!(output.status.success());
    let listed = place.listed(&[]);
    assert_eq!(listed.len(), 1, "{listed:?}");
    let volume = &listed[0];
    assert_eq!(volume["key"], "p-p-cache");
    assert_eq!(volume["name"], "cache");
    assert_eq!(volume["backend"], backend);
    assert_eq!(volume["scope"], "profile");
    assert_eq!(volume["profile"], "p");
    assert_eq!(volume["bytes"], 5);
    assert!(
        volume["lastUsed"].as_str().unwrap().ends_with('Z'),
        "{volume}"
    );
    // The next session reads what the first wrote.
    let output = place.run_unit(backend, "cat ~/.cache/thing/five");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "12345");
    // `box volumes rm` completes the keys.
    let completed = place
        .command(&["--", "box", "volumes", "rm", "p-"])
        .env("BOX_COMPLETE", "bash")
        .env("_CLAP_COMPLETE_INDEX", "3")
        .env("_CLAP_IFS", "\n")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&completed.stdout).trim_end(),
        "p-p-cache"
    );
    // Filters.
    let other = if backend == "docker" {
        "local"
    } else {
        "docker"
    };
    assert!(
        place
            .listed(&["--filter", &format!("backend={other}")])
            .is_empty()
    );
    assert!(place.listed(&["--filter", "scope=session"]).is_empty());
    assert_eq!(place.listed(&["--filter", "profile=p"]).len(), 1);
    let table = place.run_box(&["volumes", "ls"]);
    let table = String::from_utf8_lossy(&table.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("KEY"), "{table}");
    assert!(lines[0].contains("LAST USED"), "{table}");
    assert!(lines[1].starts_with("p-p-cache"), "{table}");
    assert!(lines[1].contains("5 B"), "{table}");

    // In use: refused, naming the unit and its session.
    let held = holding(&place, backend);
    let refused = place.run_box(&["volumes", "rm", "p-p-cache"]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("volume cache (p-p-cache) is in use by unit workspace of session"),
        "{stderr}"
    );
    // While its session lives, its session volume is not pruned either.
    let during = place.run_box(&["volumes", "prune", "--all", "--dry-run", "--json"]);
    assert!(during.status.success());
    let would: Value = serde_json::from_slice(&during.stdout).unwrap();
    assert_eq!(would, serde_json::json!([]));
    interrupt(held);
    assert_eq!(
        place.listed(&[]).len(),
        1,
        "the session volume went with its session"
    );

    // Prune: without --all a profile volume stays.
    let pruned = place.run_box(&["volumes", "prune"]);
    assert!(pruned.status.success());
    assert!(String::from_utf8_lossy(&pruned.stdout).contains("Freed 0 volumes"));
    assert_eq!(place.listed(&[]).len(), 1);
    let dry = place.run_box(&["volumes", "prune", "--all", "--dry-run", "--json"]);
    let would: Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert_eq!(would[0]["key"], "p-p-cache");
    assert_eq!(place.listed(&[]).len(), 1, "--dry-run removes nothing");
    let removed = place.run_box(&["volumes", "rm", "p-p-cache"]);
    assert!(removed.status.success());
    assert_eq!(
        String::from_utf8_lossy(&removed.stdout),
        format!("p-p-cache ({backend})\n")
    );
    assert!(place.listed(&[]).is_empty());
    let missing = place.run_box(&["volumes", "rm", "p-p-cache"]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no volume has the key \"p-p-cache\"")
    );
}

/// A session volume left behind by a session that is gone (a crashed host)
/// is pruned; `--all` then takes the profile volume too.
fn prune_takes_a_gone_sessions_volume(place: &Place, backend: &str) {
    use boxhost::backend::volumes::VolumeStore;
    use boxhost::plan::{Volume, VolumePath, VolumeScope};
    let store = VolumeStore::new(place.state.path().join("box/volumes"));
    let kind = if backend == "docker" {
        boxhost::backend::BackendKind::Docker
    } else {
        boxhost::backend::BackendKind::Local
    };
    let gone = boxhost::backend::SessionLabel {
        instance: "box-gone".to_owned(),
        session: "crashed".to_owned(),
        profile: "p".to_owned(),
    };
    let volume = Volume {
        scope: VolumeScope::Session,
        ..Volume::new("scratch".to_owned(), VolumePath::Home("scratch".into()))
    };
    store.prepare(kind, &volume, &gone, None).unwrap();
    let profile = Volume {
        scope: VolumeScope::Profile,
        ..Volume::new("cache".to_owned(), VolumePath::Home(".cache/thing".into()))
    };
    store.prepare(kind, &profile, &gone, None).unwrap();
    let pruned = place.run_box(&["volumes", "prune", "--json"]);
    assert!(pruned.status.success());
    let pruned: Value = serde_json::from_slice(&pruned.stdout).unwrap();
    assert_eq!(pruned.as_array().unwrap().len(), 1, "{pruned}");
    assert_eq!(pruned[0]["key"], "s-box-gone-crashed-scratch");
    assert_eq!(pruned[0]["session"], "crashed");
    let left: Vec<String> = store.list().into_iter().map(|volume| volume.key).collect();
    assert_eq!(left, vec!["p-p-cache".to_owned()]);
    let all = place.run_box(&["volumes", "prune", "--all"]);
    assert!(all.status.success());
    assert!(String::from_utf8_lossy(&all.stdout).contains("removed p-p-cache"));
    assert!(store.list().is_empty());
}

#[test]
fn local_volumes_are_listed_removed_and_pruned() {
    if box_confine::landlock_abi() == 0 {
        assert!(!under_ci(), "landlock is missing under CI");
        return;
    }
    volumes_are_listed_removed_and_pruned("local");
    prune_takes_a_gone_sessions_volume(&Place::new(), "local");
}

#[test]
fn docker_volumes_are_listed_removed_and_pruned() {
    let answers = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(docker_answers());
    if !answers {
        return;
    }
    volumes_are_listed_removed_and_pruned("docker");
    prune_takes_a_gone_sessions_volume(&Place::new(), "docker");
}

/// The engine's named volume goes with `box volumes rm`, not only box's
/// directory.
#[test]
fn docker_rm_removes_the_engines_named_volume() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    if !runtime.block_on(docker_answers()) {
        return;
    }
    let place = Place::new();
    let output = place.run_unit("docker", "echo kept > ~/.cache/thing/kept");
    assert!(output.status.success());
    let named = || {
        runtime.block_on(async {
            let docker =
                boxhost::backend::docker::bollard::Docker::connect_with_defaults().unwrap();
            let filters = std::collections::HashMap::from([(
                "label".to_owned(),
                vec!["box.volume-key=p-p-cache".to_owned()],
            )]);
            let options =
                boxhost::backend::docker::bollard::query_parameters::ListVolumesOptionsBuilder::new()
                    .filters(&filters)
                    .build();
            let listed = docker.list_volumes(Some(options)).await.unwrap();
            let data = place.state.path().join("box/volumes/docker/p-p-cache/data");
            listed
                .volumes
                .unwrap_or_default()
                .into_iter()
                .filter(|volume| {
                    volume.options.get("device").map(String::as_str)
                        == data.to_str()
                })
                .map(|volume| volume.name)
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(named().len(), 1);
    let removed = place.run_box(&["volumes", "rm", "--backend", "docker", "p-p-cache"]);
    assert!(removed.status.success());
    assert_eq!(named(), Vec::<String>::new());
    assert!(!Path::new(&place.state.path().join("box/volumes/docker/p-p-cache")).exists());
}
