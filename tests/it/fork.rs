//! `box/fork`, `box/merge` and `box/discard` through `box serve` on Docker
//! and the local backend (issue 11): children in copy and worktree mode,
//! isolation both ways, a child's commit kept from the parent's refs and
//! objects, the borrowed objects never writable from the child, merges (modified, added,
//! deleted, binary), a conflicting merge that changes nothing, discard and
//! session end removing the child's container and storage, hostile git
//! configuration that never fires.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use boxhost::backend::docker::DockerBackend;
use serde_json::{Value, json};

use crate::support::{
    HttpHost, Served, box_bin, commit_all, containers, git, merges_workspace_back, serve_command,
    snapshot, under_ci,
};

/// Whether the Docker engine answers; under CI a missing engine is a failure.
fn docker() -> bool {
    let connected = std::thread::spawn(|| {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(DockerBackend::connect()).map(drop)
    })
    .join()
    .unwrap();
    match connected {
        Ok(()) => true,
        Err(error) => {
            assert!(!under_ci(), "CI needs a Docker engine: {error}");
            eprintln!("\n*** DOCKER FORK TESTS NOT RUN: {error} ***\n");
            false
        }
    }
}

/// A `box serve` over stdio on `backend` whose forks live under `state`,
/// with `more` flags (`--profiles`, `--profile`).
fn serve(
    backend: &str,
    instance: &str,
    workspace: &Path,
    state: &Path,
    more: &[&std::ffi::OsStr],
) -> Served {
    let mut command = serve_command(backend, instance, workspace);
    command.args(more).env("XDG_STATE_HOME", state);
    Served::start(command)
}

/// A repository with a commit, a binary file, a dirty change and an
/// untracked file; its git configuration and attributes hostile: a hook,
/// a filter, an fsmonitor and an external diff that would each leave a
/// canary in `canaries` if they ever ran.
fn hostile_repository(dir: &Path, canaries: &Path) {
    std::fs::write(dir.join("kept.txt"), "kept\n").unwrap();
    std::fs::write(dir.join("changed.txt"), "before\n").unwrap();
    std::fs::write(dir.join("gone.txt"), "to be deleted\n").unwrap();
    std::fs::write(dir.join("blob.bin"), [0u8, 159, 146, 150, 0, 1, 2]).unwrap();
    std::fs::write(dir.join(".gitattributes"), "*.txt filter=evil diff=evil\n").unwrap();
    commit_all(dir);
    let canary = |name: &str| format!("touch {}", canaries.join(name).display());
    let config = format!(
        "[core]\n\tfsmonitor = \"{fsmonitor}\"\n\thooksPath = hooks\n[filter \"evil\"]\n\tclean = \"{clean}\"\n\tsmudge = \"{smudge}\"\n\tprocess = \"{process}\"\n[diff \"evil\"]\n\ttextconv = \"{textconv}\"\n[diff]\n\texternal = \"{external}\"\n",
        fsmonitor = canary("fsmonitor"),
        clean = canary("clean"),
        smudge = canary("smudge"),
        process = canary("process"),
        textconv = canary("textconv"),
        external = canary("external"),
    );
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join(".git/config"))
        .unwrap();
    file.write_all(config.as_bytes()).unwrap();
    for hooks in [dir.join("hooks"), dir.join(".git/hooks")] {
        std::fs::create_dir_all(&hooks).unwrap();
        for hook in ["post-checkout", "pre-commit", "reference-transaction"] {
            let path = hooks.join(hook);
            std::fs::write(&path, format!("#!/bin/sh\n{}\n", canary(hook))).unwrap();
            std::os::unix::fs::PermissionsExt::set_mode(
                &mut std::fs::metadata(&path).unwrap().permissions(),
                0o755,
            );
            let mut permissions = std::fs::metadata(&path).unwrap().permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
            std::fs::set_permissions(&path, permissions).unwrap();
        }
    }
    // A link out of the tree: never copied into a child.
    std::os::unix::fs::symlink("/etc/hostname", dir.join("outside")).unwrap();
    // Uncommitted work the dirty overlay brings.
    std::fs::write(dir.join("changed.txt"), "dirty in the parent\n").unwrap();
    std::fs::write(dir.join("untracked.txt"), "untracked\n").unwrap();
}

/// The child directories under `state` (box's fork storage).
fn stored_forks(state: &Path) -> Vec<PathBuf> {
    let root = state.join("box/forks");
    let mut found = Vec::new();
    let Ok(instances) = std::fs::read_dir(&root) else {
        return found;
    };
    for instance in instances.flatten() {
        if instance.file_name() == "locks" {
            continue;
        }
        for session in std::fs::read_dir(instance.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            for child in std::fs::read_dir(session.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                found.push(child.path());
            }
        }
    }
    found
}

/// Fork in copy and in worktree mode on docker: see [`forks_in_both_modes`].
#[tokio::test(flavor = "multi_thread")]
async fn forks_in_both_modes_are_isolated_and_merge_back() {
    if !docker() {
        return;
    }
    forks_in_both_modes("docker").await;
}

/// The same on the local backend: a worktree child sees the parent's objects
/// at their host path, bound read-only in its own mount namespace.
#[tokio::test(flavor = "multi_thread")]
async fn forks_in_both_modes_are_isolated_and_merge_back_on_the_local_backend() {
    forks_in_both_modes("local").await;
}

/// Fork in copy and in worktree mode on `backend`: each child sees the
/// parent's state, its writes stay its own until merged, the parent's stay
/// the parent's; a commit in the worktree child never reaches the parent's
/// refs, and its git reads the history it borrows but cannot write into the
/// parent's objects (the attacker's `touch`, `rm` and git told to write
/// there all fail, the parent's objects unchanged); the merge carries
/// modified, added, deleted and binary files; no hook, filter, fsmonitor or
/// diff driver of the parent ever runs.
async fn forks_in_both_modes(backend: &str) {
    let instance = format!("e2e-fork-{backend}-{}", std::process::id());
    let workspace = tempfile::tempdir().unwrap();
    let canaries = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let ws = workspace.path();
    hostile_repository(ws, canaries.path());
    let parent_head = git(ws, &["rev-parse", "HEAD"]);
    let parent_refs = git(ws, &["for-each-ref", "--format=%(refname)", "refs/heads"]);
    let parent_objects = ws.join(".git/objects");
    let mut served =
        tokio::task::block_in_place(|| serve(backend, &instance, ws, state.path(), &[]));

    for mode in ["copy", "worktree"] {
        let forked = tokio::task::block_in_place(|| {
            served.ok(
                "box/fork",
                json!({"mode": mode, "label": format!("{mode} child")}),
            )
        });
        let unit = forked["unit"].as_str().unwrap().to_owned();
        assert_eq!(forked["mode"], json!(mode), "{forked}");
        assert!(forked["envelope"]["name"].is_string(), "{forked}");
        assert!(forked.get("advisory").is_none(), "{forked}");
        assert_eq!(forked["envelope"]["backend"], json!(backend), "{forked}");
        assert_eq!(forked["envelope"]["parent"], json!("workspace"), "{forked}");
        let listed =
            tokio::task::block_in_place(|| served.ok("agentworkspace/servers.list", json!({})));
        assert!(
            listed["servers"]
                .as_array()
                .unwrap()
                .iter()
                .any(|server| server["name"] == json!(unit)
                    && server["fork"]["parent"] == json!("workspace")),
            "{listed}"
        );
        if backend == "docker" {
            assert_eq!(containers(&instance, Some(&unit)).await.len(), 1, "{unit}");
        }

        let seen = tokio::task::block_in_place(|| {
            served.bash(
                Some(&unit),
                "cat changed.txt untracked.txt kept.txt; od -An -tu1 blob.bin | tr -s ' '",
            )
        });
        assert!(seen.contains("dirty in the parent"), "{mode}: {seen}");
        assert!(seen.contains("untracked"), "{mode}: {seen}");
        assert!(seen.contains("0 159 146 150 0 1 2"), "{mode}: {seen}");
        let link = tokio::task::block_in_place(|| {
            served.bash(Some(&unit), "ls -l outside 2>&1; echo status=$?")
        });
        assert!(
            link.contains("status=2"),
            "{mode}: the link out of the tree was copied: {link}"
        );
        assert!(forked["skipped"].as_u64().unwrap_or(0) >= 1, "{forked}");

        // Writes on each side stay there.
        tokio::task::block_in_place(|| {
            served.bash(
                Some(&unit),
                &format!(
                    "printf 'from the {mode} child\\n' > changed.txt && printf 'new in {mode}\\n' > added-{mode}.txt && rm gone.txt && printf '\\000\\377{mode}' > blob.bin"
                ),
            );
            served.bash(
                None,
                &format!("printf 'parent only\\n' > parent-{mode}.txt"),
            );
        });
        assert_eq!(
            std::fs::read_to_string(ws.join("changed.txt")).unwrap(),
            "dirty in the parent\n"
        );
        assert!(!ws.join(format!("added-{mode}.txt")).exists());
        assert!(ws.join("gone.txt").exists());
        let child_sees = tokio::task::block_in_place(|| {
            served.bash(
                Some(&unit),
                &format!("ls parent-{mode}.txt 2>&1; echo status=$?"),
            )
        });
        assert!(child_sees.contains("status=2"), "{mode}: {child_sees}");

        if mode == "worktree" {
            borrowed_objects_stay_the_parents(&mut served, &unit, &forked, &parent_objects);
        }

        // A commit in the child stays in the child.
        let objects_before = snapshot(&parent_objects);
        let committed = tokio::task::block_in_place(|| {
            served.bash(
                Some(&unit),
                "git add -A >/dev/null 2>&1; git -c user.name=c -c user.email=c@c commit -qm child >/dev/null 2>&1; git branch -f escaped >/dev/null 2>&1; git rev-parse HEAD",
            )
        });
        assert_ne!(
            committed.trim(),
            parent_head,
            "{mode}: the child committed: {committed}"
        );
        assert_eq!(git(ws, &["rev-parse", "HEAD"]), parent_head, "{mode}");
        assert_eq!(
            git(ws, &["for-each-ref", "--format=%(refname)", "refs/heads"]),
            parent_refs,
            "{mode}: a child's branch reached the parent"
        );
        assert_eq!(
            snapshot(&parent_objects),
            objects_before,
            "{mode}: the child's commit wrote into the parent's objects"
        );

        // The parent changed changed.txt since the fork? No: only its own
        // new file. The merge carries every kind of change.
        let merged = tokio::task::block_in_place(|| served.ok("box/merge", json!({"unit": unit})));
        let names = |key: &str| -> Vec<String> {
            merged[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|path| path.as_str().unwrap().to_owned())
                .collect()
        };
        assert!(
            names("merged").contains(&"changed.txt".to_owned()),
            "{merged}"
        );
        assert!(
            names("merged").contains(&format!("added-{mode}.txt")),
            "{merged}"
        );
        assert!(names("merged").contains(&"blob.bin".to_owned()), "{merged}");
        assert!(
            names("deleted").contains(&"gone.txt".to_owned()),
            "{merged}"
        );
        assert_eq!(
            std::fs::read_to_string(ws.join("changed.txt")).unwrap(),
            format!("from the {mode} child\n")
        );
        assert_eq!(
            std::fs::read(ws.join("blob.bin")).unwrap(),
            [&[0u8, 255][..], mode.as_bytes()].concat()
        );
        assert!(!ws.join("gone.txt").exists());
        assert!(ws.join(format!("parent-{mode}.txt")).exists());
        assert_eq!(git(ws, &["rev-parse", "HEAD"]), parent_head, "{mode}");

        // Discard: the container and the storage go.
        let discarded =
            tokio::task::block_in_place(|| served.ok("box/discard", json!({"unit": unit})));
        assert_eq!(discarded["discarded"], json!(true), "{discarded}");
        if backend == "docker" {
            assert_eq!(
                containers(&instance, Some(&unit)).await,
                Vec::<String>::new()
            );
        }
        assert_eq!(stored_forks(state.path()), Vec::<PathBuf>::new());
        let gone = tokio::task::block_in_place(|| {
            served.call(
                "tools/call",
                json!({"name": "bash", "arguments": {"command": "true"}, "_meta": {"box/unit": unit}}),
            )
        });
        assert!(
            gone["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("discarded"),
            "{gone}"
        );
        // Restore for the next mode.
        std::fs::write(ws.join("gone.txt"), "to be deleted\n").unwrap();
        std::fs::write(ws.join("changed.txt"), "dirty in the parent\n").unwrap();
        std::fs::write(ws.join("blob.bin"), [0u8, 159, 146, 150, 0, 1, 2]).unwrap();
    }
    let status = tokio::task::block_in_place(|| served.hang_up());
    assert!(status.success(), "{status}");
    let fired: Vec<_> = std::fs::read_dir(canaries.path())
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name())
        .collect();
    assert_eq!(
        fired,
        Vec::<std::ffi::OsString>::new(),
        "hostile git configuration ran"
    );
    if backend == "docker" {
        assert_eq!(containers(&instance, None).await, Vec::<String>::new());
    }
}

/// In a worktree child: its git reads the history it borrows through its
/// alternates, the answer says what it shares and where the unit sees it,
/// and nothing the child does writes into the parent's objects.
fn borrowed_objects_stay_the_parents(
    served: &mut Served,
    unit: &str,
    forked: &Value,
    parent_objects: &Path,
) {
    let history = tokio::task::block_in_place(|| {
        served.bash(
            Some(unit),
            "git log --format=%s -1; git cat-file -p HEAD:kept.txt; cat .git/objects/info/alternates",
        )
    });
    let mut lines = history.lines();
    assert_eq!(lines.next(), Some("base"), "{history}");
    assert_eq!(lines.next(), Some("kept"), "{history}");
    let in_unit = lines.next().unwrap_or_default().to_owned();
    assert!(in_unit.starts_with('/'), "{history}");
    let shares = forked["shares"].as_str().unwrap_or_default();
    assert!(
        shares.contains("git objects, read-only") && shares.contains(&in_unit),
        "{forked}"
    );
    let before = snapshot(parent_objects);
    let attack = tokio::task::block_in_place(|| {
        served.bash(
            Some(unit),
            &format!(
                "o='{in_unit}'; touch \"$o/planted\"; echo touch=$?; mkdir \"$o/zz\"; echo mkdir=$?; \
                 rm -f \"$o\"/pack/* \"$o\"/??/*; echo rm=$?; \
                 echo evil | GIT_OBJECT_DIRECTORY=\"$o\" git hash-object -w --stdin; echo hash=$?; \
                 git --git-dir=\"$o/..\" update-ref refs/heads/escaped HEAD; echo ref=$?"
            ),
        )
    });
    for refused in ["touch", "mkdir", "rm", "hash", "ref"] {
        assert!(
            attack.contains(&format!("{refused}=")) && !attack.contains(&format!("{refused}=0")),
            "{refused} wrote into the parent's repository: {attack}"
        );
    }
    assert_eq!(
        snapshot(parent_objects),
        before,
        "the parent's objects changed"
    );
}

/// A merge refused for a path both sides changed changes nothing and names
/// the path; `theirs` then lets the child win. Session end removes a child's
/// container and storage.
#[tokio::test(flavor = "multi_thread")]
async fn a_conflicting_merge_changes_nothing_and_session_end_removes_children() {
    if !docker() {
        return;
    }
    let instance = format!("e2e-fork-conflict-{}", std::process::id());
    let workspace = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let ws = workspace.path();
    std::fs::write(ws.join("both.txt"), "base\n").unwrap();
    std::fs::write(ws.join("other.txt"), "base\n").unwrap();
    let mut served =
        tokio::task::block_in_place(|| serve("docker", &instance, ws, state.path(), &[]));
    let forked = tokio::task::block_in_place(|| served.ok("box/fork", json!({})));
    // Not a repository: auto is a copy.
    assert_eq!(forked["mode"], json!("copy"), "{forked}");
    let unit = forked["unit"].as_str().unwrap().to_owned();
    assert_eq!(stored_forks(state.path()).len(), 1);
    tokio::task::block_in_place(|| {
        served.bash(
            Some(&unit),
            "echo child > both.txt && echo child > other.txt && echo child > new.txt",
        )
    });
    std::fs::write(ws.join("both.txt"), "parent\n").unwrap();
    let refused = tokio::task::block_in_place(|| served.call("box/merge", json!({"unit": unit})));
    assert_eq!(
        refused["error"]["data"]["conflicts"],
        json!(["both.txt"]),
        "{refused}"
    );
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("both.txt"),
        "{refused}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("both.txt")).unwrap(),
        "parent\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("other.txt")).unwrap(),
        "base\n"
    );
    assert!(!ws.join("new.txt").exists());
    let merged = tokio::task::block_in_place(|| {
        served.ok("box/merge", json!({"unit": unit, "theirs": true}))
    });
    assert_eq!(
        std::fs::read_to_string(ws.join("both.txt")).unwrap(),
        "child\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("new.txt")).unwrap(),
        "child\n"
    );
    assert_eq!(merged["deleted"], json!([]), "{merged}");

    // A child's process id is the child's: the workspace unit does not know it.
    let started = tokio::task::block_in_place(|| {
        served.ok(
            "agentworkspace/process.start",
            json!({"args": ["cat"], "_meta": {"box/unit": unit}}),
        )
    });
    let process = started["id"].as_str().unwrap().to_owned();
    let elsewhere = tokio::task::block_in_place(|| {
        served.call(
            "agentworkspace/process.write",
            json!({"id": process, "data": "aGkK"}),
        )
    });
    assert!(elsewhere.get("error").is_some(), "{elsewhere}");
    let here = tokio::task::block_in_place(|| {
        served.call(
            "agentworkspace/process.write",
            json!({"id": process, "data": "aGkK", "_meta": {"box/unit": unit}}),
        )
    });
    assert!(here.get("result").is_some(), "{here}");

    // A fork of the fork: listed under it, and it keeps its parent from
    // being discarded first.
    let grandchild = tokio::task::block_in_place(|| {
        served.ok("box/fork", json!({"from": unit, "mode": "copy"}))
    });
    let grandchild = grandchild["unit"].as_str().unwrap().to_owned();
    let seen = tokio::task::block_in_place(|| served.bash(Some(&grandchild), "cat new.txt"));
    assert!(seen.contains("child"), "{seen}");
    let refused = tokio::task::block_in_place(|| served.call("box/discard", json!({"unit": unit})));
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&grandchild),
        "{refused}"
    );
    tokio::task::block_in_place(|| served.ok("box/discard", json!({"unit": grandchild})));

    // A second child, left running: the session's end takes it.
    // A fork narrows further with `tighten`, never wider.
    let wider = tokio::task::block_in_place(|| {
        served.call(
            "box/fork",
            json!({"tighten": {"network": {"mode": "bridge"}}}),
        )
    });
    assert!(
        wider["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tighten.network"),
        "{wider}"
    );
    let second = tokio::task::block_in_place(|| {
        served.ok(
            "box/fork",
            json!({"writable": false, "tighten": {"limits": {"memory": "256MiB"}}}),
        )
    });
    assert!(
        second["envelope"]
            .to_string()
            .contains(&(256u64 << 20).to_string()),
        "the child's envelope shows its narrower memory limit: {second}"
    );
    let second = second["unit"].as_str().unwrap().to_owned();
    let denied = tokio::task::block_in_place(|| {
        served.bash(Some(&second), "echo x > both.txt 2>&1; echo status=$?")
    });
    assert!(
        denied.contains("status=1"),
        "a read-only child wrote: {denied}"
    );
    assert_eq!(containers(&instance, None).await.len(), 3);
    let status = tokio::task::block_in_place(|| served.hang_up());
    assert!(status.success(), "{status}");
    assert_eq!(containers(&instance, None).await, Vec::<String>::new());
    assert_eq!(stored_forks(state.path()), Vec::<PathBuf>::new());
}

/// `workspace.source = "fork"` on a shared HTTP host: two concurrent
/// sessions each work on their own fork of the host directory, never see
/// each other's writes, and one merges its work back with
/// `box/merge {unit: "workspace"}`; ending the sessions removes their forks.
#[tokio::test(flavor = "multi_thread")]
async fn http_sessions_on_forked_workspaces_are_isolated_and_merge_back() {
    use crate::serve::{http, post};
    if !docker() {
        return;
    }
    let instance = format!("e2e-fork-http-{}", std::process::id());
    let workspace = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let profiles = tempfile::tempdir().unwrap();
    let ws = workspace.path();
    std::fs::write(ws.join("shared.txt"), "host\n").unwrap();
    std::fs::write(
        profiles.path().join("forked.toml"),
        "description = \"each session on its own fork\"\nextends = \"default\"\n\n[workspace]\nsource = \"fork\"\nfork_mode = \"copy\"\n",
    )
    .unwrap();
    let host = HttpHost::on_a_free_port();
    let mut command = serve_command("docker", &instance, ws);
    command
        .arg("--profiles")
        .arg(profiles.path())
        .args(["--profile", "forked"])
        .arg("--audit")
        .arg(state.path().join("audit.jsonl"))
        .env("XDG_STATE_HOME", state.path());
    let mut child = host.serve(command).await;
    let address = host.address();
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let (session, answer) = host.initialize(json!({}), &[]).await;
        let fork = &answer["result"]["capabilities"]["experimental"]["io.github.christopherdavenport.dax/executor"]
            ["box"]["fork"];
        assert_eq!(fork["mode"], "copy", "{answer}");
        sessions.push(session.unwrap_or_else(|| panic!("no session id: {answer}")));
    }
    let bash = |session: String, command: &'static str| async move {
        let reply = post(
            address,
            Some(&session),
            &[],
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "bash", "arguments": {"command": command}}}),
        )
        .await;
        let answer = reply.json();
        answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("bash {command}: {answer}"))
            .to_owned()
    };
    let (a, b) = (sessions[0].clone(), sessions[1].clone());
    bash(a.clone(), "echo from-a > a.txt && echo a > shared.txt").await;
    bash(b.clone(), "echo from-b > b.txt").await;
    let seen_by_b = bash(b.clone(), "cat shared.txt; ls").await;
    assert!(seen_by_b.contains("host"), "{seen_by_b}");
    assert!(
        !seen_by_b.contains("a.txt"),
        "session B sees A's file: {seen_by_b}"
    );
    let seen_by_a = bash(a.clone(), "ls").await;
    assert!(
        !seen_by_a.contains("b.txt"),
        "session A sees B's file: {seen_by_a}"
    );
    assert!(!ws.join("a.txt").exists() && !ws.join("b.txt").exists());
    assert_eq!(
        std::fs::read_to_string(ws.join("shared.txt")).unwrap(),
        "host\n"
    );

    merges_workspace_back(
        address,
        &a,
        ws,
        &[("a.txt", "from-a\n"), ("shared.txt", "a\n")],
    )
    .await;
    assert!(!ws.join("b.txt").exists());
    let still_b = bash(b.clone(), "cat shared.txt; ls").await;
    assert!(
        still_b.contains("host") && !still_b.contains("a.txt"),
        "{still_b}"
    );
    assert_eq!(stored_forks(state.path()).len(), 2);

    // A child of A's workspace: the audit log and the metrics show it with
    // its parent; discarded, it leaves the unit counts as they were.
    let forked = post(
        address,
        Some(&a),
        &[],
        &json!({"jsonrpc": "2.0", "id": 3, "method": "box/fork", "params": {"mode": "copy"}}),
    )
    .await
    .json();
    let fork_unit = forked["result"]["unit"]
        .as_str()
        .unwrap_or_else(|| panic!("{forked}"))
        .to_owned();
    let in_child = post(
        address,
        Some(&a),
        &[],
        &json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
            "params": {"name": "bash", "arguments": {"command": "ls"}, "_meta": {"box/unit": fork_unit}}}),
    )
    .await
    .json();
    assert!(in_child.get("result").is_some(), "{in_child}");
    let discarded = post(
        address,
        Some(&a),
        &[],
        &json!({"jsonrpc": "2.0", "id": 5, "method": "box/discard", "params": {"unit": fork_unit}}),
    )
    .await
    .json();
    assert_eq!(discarded["result"]["discarded"], json!(true), "{discarded}");
    let audit = std::fs::read_to_string(state.path().join("audit.jsonl")).unwrap();
    let child_lines: Vec<Value> = audit
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|line| line["unit"] == json!(fork_unit))
        .collect();
    assert!(
        !child_lines.is_empty() && child_lines.iter().all(|line| line["parent"] == "workspace"),
        "{audit}"
    );
    let metrics = http(address, "GET", "/metrics", &[], b"").await;
    let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
    for want in [
        "box_sessions_active 2",
        "box_units{state=\"running\"} 2",
        "box_forks_total{parent=\"workspace\"} 1",
        "box_merges_total{outcome=\"merged\"} 1",
    ] {
        assert!(metrics.contains(want), "{want} in:\n{metrics}");
    }

    for session in &sessions {
        let reply = http(
            address,
            "DELETE",
            "/mcp",
            &[("Mcp-Session-Id", session)],
            b"",
        )
        .await;
        assert_eq!(reply.status, 200);
    }
    assert_eq!(containers(&instance, None).await, Vec::<String>::new());
    assert_eq!(stored_forks(state.path()), Vec::<PathBuf>::new());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
}

/// On the local backend a repository without a commit forks as a copy
/// (`auto`; `worktree` is refused naming why): isolated, merged back,
/// removed.
#[test]
fn copy_forks_work_on_the_local_backend() {
    let workspace = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let ws = workspace.path();
    git(ws, &["init", "-q", "-b", "main"]);
    std::fs::write(ws.join("a.txt"), "parent\n").unwrap();
    let instance = format!("e2e-fork-local-{}", std::process::id());
    let mut served = serve("local", &instance, ws, state.path(), &[]);
    let forked = served.ok("box/fork", json!({}));
    assert_eq!(forked["mode"], json!("copy"), "{forked}");
    let unit = forked["unit"].as_str().unwrap().to_owned();
    let refused = served.call("box/fork", json!({"mode": "worktree"}));
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no commit yet"),
        "{refused}"
    );
    served.bash(Some(&unit), "echo child > a.txt && echo new > b.txt");
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "parent\n"
    );
    assert!(!ws.join("b.txt").exists());
    let merged = served.ok("box/merge", json!({"unit": unit}));
    assert_eq!(merged["merged"], json!(["a.txt", "b.txt"]), "{merged}");
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "new\n");
    assert_eq!(stored_forks(state.path()).len(), 1);
    let status = served.hang_up();
    assert!(status.success(), "{status}");
    assert_eq!(stored_forks(state.path()), Vec::<PathBuf>::new());
}

/// A `source = "fork"` session whose unit cannot start (an image the local
/// backend cannot give) is refused, and its fork goes with it: once the host
/// exits, nothing of it is left under box's fork storage, not even the
/// session's or the instance's empty directory (seen by hand: the session's
/// directory stayed, its removal raced the fork's).
#[test]
fn a_fork_session_that_cannot_start_leaves_no_directory() {
    let workspace = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let profiles = tempfile::tempdir().unwrap();
    let ws = workspace.path();
    git(ws, &["init", "-q", "-b", "main"]);
    std::fs::write(ws.join("a.txt"), "parent\n").unwrap();
    std::fs::write(
        profiles.path().join("forked.toml"),
        "description = \"a fork on an image the local backend cannot give\"\n\n[workspace]\nsource = \"fork\"\nimage = \"box-base:bookworm\"\n",
    )
    .unwrap();
    let instance = format!("e2e-fork-refused-local-{}", std::process::id());
    let mut command = serve_command("local", &instance, ws);
    command
        .args(["--profiles".as_ref(), profiles.path().as_os_str()])
        .args(["--profile", "forked"])
        .env("XDG_STATE_HOME", state.path());
    let mut served = Served::spawn(command);
    let answer = served.initialize(json!({}));
    let refused = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(refused.contains("local_userland"), "{answer}");
    let status = served.hang_up();
    assert!(status.success(), "{status}");
    let left: Vec<PathBuf> = std::fs::read_dir(state.path().join("box/forks"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| !path.ends_with("locks"))
        .collect();
    assert_eq!(left, Vec::<PathBuf>::new());
}

/// `source = "fork"` with `fork_mode = "worktree"` on the local backend: the
/// session's workspace unit starts on its own worktree of the host
/// directory (HEAD plus the uncommitted work), reads the history it borrows,
/// cannot write into the directory's objects, and its commit reaches neither
/// the directory's refs nor its objects; `box/merge {"unit": "workspace"}`
/// lands its files.
#[test]
fn a_forked_workspace_in_worktree_mode_on_the_local_backend() {
    let workspace = tempfile::tempdir().unwrap();
    let canaries = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let profiles = tempfile::tempdir().unwrap();
    let ws = workspace.path();
    hostile_repository(ws, canaries.path());
    std::fs::write(
        profiles.path().join("forked.toml"),
        "description = \"each session on its own worktree\"\nextends = \"default\"\n\n[workspace]\nsource = \"fork\"\nfork_mode = \"worktree\"\n",
    )
    .unwrap();
    let parent_head = git(ws, &["rev-parse", "HEAD"]);
    let parent_refs = git(ws, &["for-each-ref", "--format=%(refname)", "refs/heads"]);
    let objects = std::fs::canonicalize(ws.join(".git/objects")).unwrap();
    let before = snapshot(&objects);
    let instance = format!("e2e-fork-source-local-{}", std::process::id());
    let mut served = serve(
        "local",
        &instance,
        ws,
        state.path(),
        &[
            "--profiles".as_ref(),
            profiles.path().as_os_str(),
            "--profile".as_ref(),
            "forked".as_ref(),
        ],
    );
    // The initialize answer says the workspace is a fork, and what it shares.
    let fork = &served.initialized["result"]["capabilities"]["experimental"]["io.github.christopherdavenport.dax/executor"]
        ["box"]["fork"];
    assert_eq!(fork["mode"], "worktree", "{fork}");
    assert!(
        fork["shares"]
            .as_str()
            .is_some_and(|shares| !shares.is_empty()),
        "{fork}"
    );
    let seen = served.bash(
        None,
        "cat changed.txt untracked.txt; git log --format=%s -1; cat .git/objects/info/alternates",
    );
    assert_eq!(
        seen.lines().take(4).collect::<Vec<_>>(),
        [
            "dirty in the parent",
            "untracked",
            "base",
            objects.to_str().unwrap()
        ],
        "{seen}"
    );
    let attack = served.bash(
        None,
        &format!(
            "touch '{o}/planted'; echo touch=$?; echo evil | GIT_OBJECT_DIRECTORY='{o}' git hash-object -w --stdin; echo hash=$?",
            o = objects.display()
        ),
    );
    for refused in ["touch", "hash"] {
        assert!(
            attack.contains(&format!("{refused}=")) && !attack.contains(&format!("{refused}=0")),
            "{refused} wrote into the host directory's objects: {attack}"
        );
    }
    let committed = served.bash(
        None,
        "printf 'from the session\\n' > session.txt && git add -A >/dev/null 2>&1 && git -c user.name=c -c user.email=c@c commit -qm session >/dev/null 2>&1; git rev-parse HEAD",
    );
    assert_ne!(committed.trim(), parent_head, "{committed}");
    assert_eq!(git(ws, &["rev-parse", "HEAD"]), parent_head);
    assert_eq!(
        git(ws, &["for-each-ref", "--format=%(refname)", "refs/heads"]),
        parent_refs
    );
    assert_eq!(
        snapshot(&objects),
        before,
        "the host directory's objects changed"
    );
    assert!(!ws.join("session.txt").exists());
    let merged = served.ok("box/merge", json!({"unit": "workspace"}));
    assert!(
        merged["merged"]
            .as_array()
            .unwrap()
            .contains(&json!("session.txt")),
        "{merged}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("session.txt")).unwrap(),
        "from the session\n"
    );
    assert_eq!(git(ws, &["rev-parse", "HEAD"]), parent_head);
    let status = served.hang_up();
    assert!(status.success(), "{status}");
    assert_eq!(stored_forks(state.path()), Vec::<PathBuf>::new());
    let fired: Vec<_> = std::fs::read_dir(canaries.path())
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name())
        .collect();
    assert_eq!(
        fired,
        Vec::<std::ffi::OsString>::new(),
        "hostile git configuration ran"
    );
}

/// Issue 23: a root host forking a repository its user (uid 1000) owns runs
/// git as that user, so a worktree fork pins its commit in their `.git`
/// (root's confined git, without capabilities, could not), and the pin, the
/// child's files and what the merge lands are all theirs.
#[test]
fn a_root_host_forks_a_users_repository_in_worktree_mode_as_its_owner() {
    if !nix::unistd::geteuid().is_root() {
        assert!(!under_ci(), "CI runs as root; this test needs a root host");
        eprintln!("\n*** ROOT HOST FORK TEST NOT RUN: needs root ***\n");
        return;
    }
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    const OWNER: u32 = 1000;
    let workspace = tempfile::tempdir().unwrap();
    // As a host's state directory is: a unit of uid 1000 passes through.
    let state = tempfile::tempdir().unwrap();
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ws = workspace.path();
    git(ws, &["init", "-q", "-b", "main"]);
    std::fs::write(ws.join("a.txt"), "parent\n").unwrap();
    git(ws, &["add", "a.txt"]);
    git(
        ws,
        &[
            "-c",
            "user.name=o",
            "-c",
            "user.email=o@example.com",
            "commit",
            "-qm",
            "base",
        ],
    );
    let status = Command::new("chown")
        .args(["-R", &format!("{OWNER}:{OWNER}")])
        .arg(ws)
        .status()
        .unwrap();
    assert!(status.success());
    let owned_by_others = |dir: &Path| -> Vec<PathBuf> {
        let mut wrong = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(path) = stack.pop() {
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.uid() != OWNER || meta.gid() != OWNER {
                wrong.push(path.clone());
            }
            if meta.is_dir() {
                for entry in std::fs::read_dir(&path).unwrap() {
                    stack.push(entry.unwrap().path());
                }
            }
        }
        wrong
    };
    let instance = format!("e2e-fork-owner-{}", std::process::id());
    let mut served = serve("local", &instance, ws, state.path(), &[]);
    let forked = served.ok("box/fork", json!({"mode": "worktree"}));
    assert_eq!(forked["mode"], json!("worktree"), "{forked}");
    let unit = forked["unit"].as_str().unwrap().to_owned();
    let pins = ws.join(".git/refs/box/forks");
    assert_eq!(std::fs::read_dir(&pins).unwrap().count(), 1, "no pin");
    let stored = stored_forks(state.path());
    assert_eq!(stored.len(), 1, "{stored:?}");
    let wrong = owned_by_others(&stored[0]);
    assert!(wrong.is_empty(), "the child is not {OWNER}'s: {wrong:?}");
    let out = served.bash(
        Some(&unit),
        "echo child > a.txt && echo new > b.txt && id -u",
    );
    assert!(out.contains(&OWNER.to_string()), "{out}");
    let merged = served.ok("box/merge", json!({"unit": unit}));
    assert_eq!(merged["merged"], json!(["a.txt", "b.txt"]), "{merged}");
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "new\n");
    let wrong = owned_by_others(ws);
    assert!(wrong.is_empty(), "not {OWNER}'s after the merge: {wrong:?}");
    let status = served.hang_up();
    assert!(status.success(), "{status}");
    assert_eq!(stored_forks(state.path()), Vec::<PathBuf>::new());
    // Session end discarded the child, and its pin with it, as the owner.
    assert_eq!(
        std::fs::read_dir(&pins).map(|dir| dir.count()).unwrap_or(0),
        0
    );
    let wrong = owned_by_others(ws);
    assert!(
        wrong.is_empty(),
        "not {OWNER}'s after the discard: {wrong:?}"
    );
}

/// Two merges into one parent sent at once are serialized, and both land
/// whole; a fork whose dirty overlay cannot apply (the parent's index is
/// corrupt) starts on a clean HEAD and says so in its answer.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_merges_both_land_and_a_degraded_fork_says_so() {
    if !docker() {
        return;
    }
    let instance = format!("e2e-fork-concurrent-{}", std::process::id());
    let workspace = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let ws = workspace.path();
    for name in ["a.txt", "b.txt"] {
        std::fs::write(ws.join(name), "base\n").unwrap();
    }
    let mut served =
        tokio::task::block_in_place(|| serve("docker", &instance, ws, state.path(), &[]));
    let mut units = Vec::new();
    for (file, added) in [("a.txt", "from-one.txt"), ("b.txt", "from-two.txt")] {
        let forked = tokio::task::block_in_place(|| served.ok("box/fork", json!({"mode": "copy"})));
        let unit = forked["unit"].as_str().unwrap().to_owned();
        assert_eq!(forked["envelope"]["parent"], json!("workspace"), "{forked}");
        tokio::task::block_in_place(|| {
            served.bash(
                Some(&unit),
                &format!("echo {unit} > {file} && echo {unit} > {added}"),
            )
        });
        units.push(unit);
    }
    // `box units ls` shows each child with the unit it came from.
    let listed = Command::new(box_bin())
        .args(["units", "ls", "--json"])
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    for unit in &units {
        assert!(
            listed
                .as_array()
                .unwrap()
                .iter()
                .any(|listed| listed["instance"] == json!(instance)
                    && listed["unit"] == json!(unit)
                    && listed["parent"] == json!("workspace")),
            "{unit}: {listed:#}"
        );
    }
    let answers = tokio::task::block_in_place(|| {
        served.call_all(&[
            ("box/merge", json!({"unit": units[0]})),
            ("box/merge", json!({"unit": units[1]})),
        ])
    });
    for answer in &answers {
        assert!(answer.get("result").is_some(), "{answer}");
    }
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        format!("{}\n", units[0])
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("b.txt")).unwrap(),
        format!("{}\n", units[1])
    );
    assert!(ws.join("from-one.txt").is_file() && ws.join("from-two.txt").is_file());
    assert!(tokio::task::block_in_place(|| served.hang_up()).success());

    // A repository whose index is corrupt: HEAD resolves, `git status` cannot run.
    let repo = tempfile::tempdir().unwrap();
    let dir = repo.path();
    std::fs::write(dir.join("README.md"), "committed\n").unwrap();
    commit_all(dir);
    std::fs::write(dir.join("README.md"), "uncommitted\n").unwrap();
    std::fs::write(dir.join(".git/index"), b"DIRC garbage").unwrap();
    let instance = format!("e2e-fork-degraded-{}", std::process::id());
    let mut served =
        tokio::task::block_in_place(|| serve("docker", &instance, dir, state.path(), &[]));
    let forked = tokio::task::block_in_place(|| {
        served.ok("box/fork", json!({"mode": "worktree", "dirty": true}))
    });
    let advisory = forked["advisory"].as_str().unwrap_or_default();
    assert!(
        advisory.starts_with("the child sees committed HEAD only"),
        "{forked}"
    );
    let unit = forked["unit"].as_str().unwrap().to_owned();
    let seen = tokio::task::block_in_place(|| served.bash(Some(&unit), "cat README.md"));
    assert!(
        seen.contains("committed") && !seen.contains("uncommitted"),
        "{seen}"
    );
    assert!(tokio::task::block_in_place(|| served.hang_up()).success());
    assert!(containers(&instance, None).await.is_empty());
}
