//! `box profile` on the command line: exit codes, messages, `--json` golden output.

use std::path::Path;
use std::process::{Command, Output};

use crate::support::{box_bin, repo_root};

/// Run `box profile ARGS` with no user or system profile directories in the way.
fn profile_run(home: &Path, args: &[&str]) -> Output {
    Command::new(box_bin())
        .arg("profile")
        .args(args)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("HOME", home)
        .current_dir(home)
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn describe(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        stdout(output),
        stderr(output)
    )
}

#[test]
fn profile_list_shows_every_shipped_profile() {
    let home = tempfile::tempdir().unwrap();
    let output = profile_run(home.path(), &["list"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    for name in ["default", "ci", "offline", "no-fs", "fetch", "dev"] {
        assert!(
            stdout(&output).contains(&format!("[shipped:{name}.toml]")),
            "{}",
            describe(&output)
        );
    }
    let output = profile_run(home.path(), &["list", "--json"]);
    let listed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(listed["profiles"].as_array().unwrap().len(), 6);
    assert_eq!(listed["profiles"][0]["name"], "default");
    assert_eq!(listed["profiles"][0]["ok"], true);
}

#[test]
fn profile_check_of_the_shipped_profiles_passes() {
    let home = tempfile::tempdir().unwrap();
    let output = profile_run(home.path(), &["check"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(
        stdout(&output)
            .lines()
            .filter(|line| line.starts_with("ok "))
            .count(),
        6
    );
    let shipped = repo_root().join("profiles");
    let mut args = vec!["check".to_owned()];
    for name in ["default", "ci", "offline", "no-fs", "fetch", "dev"] {
        args.push(shipped.join(format!("{name}.toml")).display().to_string());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = profile_run(home.path(), &args);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
}

#[test]
fn profile_check_prints_every_error_and_exits_non_zero() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("good.toml"), "description = \"fine\"\n").unwrap();
    std::fs::write(
        home.path().join("bad.toml"),
        "description = \"bad\"\ncolour = \"red\"\n[limits]\nmemory = \"2 gigs\"\n[security]\nprivileged = true\n",
    )
    .unwrap();
    let output = profile_run(home.path(), &["check", "good.toml", "bad.toml"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        stdout(&output),
        "ok     good.toml\n\
         error  bad.toml:2:1: colour: unknown field; accepted here: description, extends, workspace, network, limits, env, security, lifecycle, pool, server, volume, operator\n\
         error  bad.toml:4:10: limits.memory: \"2 gigs\" is not a size; write a whole number and a unit (B, KiB, MiB, GiB or TiB), like \"2GiB\"\n\
         error  bad.toml:6:14: security.privileged: refused as dangerous: a privileged unit has every capability and every device; an operator who means it writes [operator] allow_dangerous = [\"privileged\"]\n\
         3 problem(s) found\n"
    );
    let output = profile_run(home.path(), &["check", "--json", "bad.toml"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["ok"], false);
    let problem = &report["profiles"][0]["problems"][1];
    assert_eq!(problem["file"], "bad.toml");
    assert_eq!(problem["line"], 4);
    assert_eq!(problem["column"], 10);
    assert_eq!(problem["field"], "limits.memory");
}

#[test]
fn profile_show_puts_dangerous_asks_first() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("mine");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(
        dir.join("fuse.toml"),
        "description = \"fuse\"\nextends = \"default\"\n[security]\ndevices = [\"/dev/fuse\"]\n[operator]\nallow_dangerous = [\"devices\"]\n",
    )
    .unwrap();
    let dir_arg = dir.display().to_string();
    let output = profile_run(home.path(), &["show", "fuse", "--profiles", &dir_arg]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let text = stdout(&output);
    assert!(
        text.starts_with("!!! DANGEROUS: this profile asks for devices (allowed by [operator] allow_dangerous) !!!\n"),
        "{text}"
    );
    assert!(text.contains("DANGEROUS    devices: /dev/fuse"), "{text}");
    let output = profile_run(
        home.path(),
        &["--profiles", &dir_arg, "show", "fuse", "--json"],
    );
    let shown: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(shown["dangerous"], serde_json::json!(["devices"]));
    assert_eq!(shown["extends"], serde_json::json!(["default"]));
}

/// Each dangerous `[security]` field a profile sets has a `DANGEROUS` line
/// of its own in `show`, named as the profile writes it, and is named on the
/// unit's security line of `resolve`.
#[test]
fn profile_show_and_resolve_name_each_dangerous_field_set() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("mine");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(
        dir.join("shared.toml"),
        "extends = \"default\"\n[security]\nprivileged = true\nhost_namespaces = [\"ipc\", \"uts\"]\n[operator]\nallow_dangerous = [\"privileged\", \"host-namespaces\"]\n",
    )
    .unwrap();
    let dir_arg = dir.display().to_string();
    let output = profile_run(home.path(), &["--profiles", &dir_arg, "show", "shared"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let text = stdout(&output);
    assert!(text.contains("\nDANGEROUS    privileged: true\n"), "{text}");
    assert!(
        text.contains("\nDANGEROUS    host_namespaces: ipc, uts\n"),
        "{text}"
    );
    assert!(!text.contains("devices"), "{text}");
    let output = profile_run(
        home.path(),
        &[
            "--profiles",
            &dir_arg,
            "resolve",
            "shared",
            "--workspace",
            "/home/user/project",
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let text = stdout(&output);
    assert!(
        text.contains(", DANGEROUS privileged true, DANGEROUS host_namespaces [ipc, uts]\n"),
        "{text}"
    );
}

#[test]
fn profile_show_of_an_unknown_profile_fails_with_the_known_names() {
    let home = tempfile::tempdir().unwrap();
    let output = profile_run(home.path(), &["show", "nope"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        stderr(&output),
        "box: no profile named \"nope\"; known: ci, default, dev, fetch, no-fs, offline\n"
    );
}

/// `resolve --json` of every shipped profile is committed under tests/golden/;
/// `BOX_UPDATE_GOLDEN=1` rewrites them.
#[test]
fn profile_resolve_json_matches_the_golden_plans() {
    let home = tempfile::tempdir().unwrap();
    for name in ["default", "ci", "offline", "no-fs", "fetch", "dev"] {
        let output = profile_run(
            home.path(),
            &[
                "resolve",
                name,
                "--json",
                "--workspace",
                "/home/user/project",
                "--caller",
                "1000:1000",
            ],
        );
        assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
        let path = repo_root().join(format!("tests/golden/resolve-{name}.json"));
        if std::env::var_os("BOX_UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, &output.stdout).unwrap();
        }
        let golden = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            stdout(&output),
            golden,
            "{} (BOX_UPDATE_GOLDEN=1 rewrites it)",
            path.display()
        );
    }
}

#[test]
fn profile_resolve_applies_a_tightening() {
    let home = tempfile::tempdir().unwrap();
    let ask = r#"{"workspace": {"mode": "ro"}, "limits": {"memory": "1GiB"}, "servers": []}"#;
    let output = profile_run(
        home.path(),
        &["resolve", "fetch", "--json", "--tighten", ask],
    );
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let plan: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(plan["units"].as_array().unwrap().len(), 1);
    assert_eq!(plan["units"][0]["mode"], "ro");
    assert_eq!(plan["units"][0]["limits"]["memoryBytes"], 1_u64 << 30);
    std::fs::write(home.path().join("ask.json"), ask).unwrap();
    let output = profile_run(
        home.path(),
        &["resolve", "fetch", "--json", "--tighten", "@ask.json"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
}

#[test]
fn profile_resolve_refuses_a_widening_with_the_exact_message() {
    let home = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str)] = &[
        (
            r#"{"workspace": {"mode": "rw"}}"#,
            "box: tighten.workspace.mode: asked for \"rw\", but profile `offline` allows at most \"ro\"\n",
        ),
        (
            r#"{"network": {"mode": "bridge"}}"#,
            "box: tighten.network.mode: asked for \"bridge\", but profile `offline` allows at most \"none\"\n",
        ),
        (
            r#"[{"workspace": {"mode": "ro"}}]"#,
            "box: tighten: expected an object with fields workspace, network, limits, env, servers, volumes, got an array\n",
        ),
        (
            r#"{"privileged": true}"#,
            "box: tighten: privileged: unknown field; accepted here: workspace, network, limits, env, servers, volumes\n",
        ),
        // A real field of the profile's that a session cannot tighten is told as one.
        (
            r#"{"workspace": {"user": "root"}}"#,
            "box: tighten: workspace.user: a profile's field, which a session cannot tighten (a profile that extends this one can set it); a session tightens here: image, mode, local_userland\n",
        ),
    ];
    for (ask, message) in cases {
        let output = profile_run(home.path(), &["resolve", "offline", "--tighten", ask]);
        assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
        assert_eq!(stderr(&output), *message, "{ask}");
        assert!(output.stdout.is_empty());
    }
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let output = profile_run(home.path(), &["resolve", "offline", "--tighten", &deep]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        stderr(&output).starts_with("box: tighten: not valid JSON: recursion limit exceeded"),
        "{}",
        describe(&output)
    );
    let output = profile_run(
        home.path(),
        &[
            "resolve",
            "offline",
            "--tighten",
            r#"{"limits": {"pids": 1, "pids": 2}}"#,
        ],
    );
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        stderr(&output),
        "box: tighten: not valid JSON: duplicate key `pids` at line 1 column 29 (in --tighten)\n"
    );
}

#[test]
fn profile_without_a_subcommand_is_a_usage_error() {
    let home = tempfile::tempdir().unwrap();
    let output = profile_run(home.path(), &[]);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
}

#[test]
fn profile_resolve_of_no_fs_says_there_is_no_workspace() {
    let home = tempfile::tempdir().unwrap();
    let output = profile_run(home.path(), &["resolve", "no-fs"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    assert_eq!(
        stdout(&output),
        "plan of profile no-fs\nno workspace unit: no file tools, no shell, no processes\n"
    );
    let output = profile_run(
        home.path(),
        &[
            "resolve",
            "no-fs",
            "--tighten",
            r#"{"workspace": {"mode": "ro"}}"#,
        ],
    );
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        stderr(&output),
        "box: tighten: workspace.mode: profile `no-fs` has no workspace to narrow\n"
    );
}

#[test]
fn profile_with_a_missing_profiles_directory_fails() {
    let home = tempfile::tempdir().unwrap();
    let output = profile_run(home.path(), &["list", "--profiles", "nowhere"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        stderr(&output),
        "box: --profiles nowhere: not a directory\n"
    );
}

/// `show --json` of every shipped profile is committed under tests/golden/;
/// `BOX_UPDATE_GOLDEN=1` rewrites them.
#[test]
fn profile_show_json_matches_the_golden_profiles() {
    let home = tempfile::tempdir().unwrap();
    for name in ["default", "ci", "offline", "no-fs", "fetch", "dev"] {
        let output = profile_run(home.path(), &["show", name, "--json"]);
        assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
        let path = repo_root().join(format!("tests/golden/show-{name}.json"));
        if std::env::var_os("BOX_UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, &output.stdout).unwrap();
        }
        let golden = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            stdout(&output),
            golden,
            "{} (BOX_UPDATE_GOLDEN=1 rewrites it)",
            path.display()
        );
    }
}

/// Issue 8, item 4: `box profile resolve` shows the refusal a session would
/// get when `cwd` resolves to a system directory, from there or by `--workspace` (or its old name `--cwd`).
#[test]
fn profile_resolve_refuses_a_cwd_in_a_system_directory() {
    let home = tempfile::tempdir().unwrap();
    let expected = "box: workspace.source = \"cwd\" resolved to /etc, which is the host's root or a system directory: refused as dangerous;";
    let mut from_etc = Command::new(box_bin());
    from_etc
        .args(["profile", "resolve", "default"])
        .env("XDG_CONFIG_HOME", home.path().join("config"))
        .current_dir("/etc");
    for output in [
        from_etc.output().unwrap(),
        profile_run(home.path(), &["resolve", "default", "--cwd", "/etc"]),
        profile_run(
            home.path(),
            &["resolve", "default", "--workspace", "../../../../../../etc"],
        ),
    ] {
        assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
        assert!(
            stderr(&output).starts_with(expected),
            "{}",
            describe(&output)
        );
        assert!(
            stderr(&output).contains("allow_dangerous = [\"host-root\"]"),
            "{}",
            describe(&output)
        );
        assert!(stdout(&output).is_empty(), "{}", describe(&output));
    }
}

/// Run from a home directory (root's `/root` here), box says so and names
/// a next step that works: a profile of one's own that extends the shipped
/// one (which cannot be edited), or another directory.
#[test]
fn profile_resolve_from_a_home_directory_names_it_and_a_profile_that_works() {
    let home = tempfile::tempdir().unwrap();
    let output = profile_run(home.path(), &["resolve", "default", "--workspace", "/root"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let text = stderr(&output);
    assert!(
        text.starts_with(
            "box: workspace.source = \"cwd\" resolved to /root, which is a home directory (its keys, credentials and shell history with it): refused as dangerous;"
        ),
        "{text}"
    );
    assert!(!text.contains("system directory"), "{text}");
    assert!(
        text.contains("extends = \"default\" and [operator] allow_dangerous = [\"host-root\"] in ~/.config/box/profiles/NAME.toml, then --profile NAME"),
        "{text}"
    );
    // The profile it describes, written where it says, resolves.
    let profiles = home.path().join("config/box/profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    std::fs::write(
        profiles.join("mine.toml"),
        "extends = \"default\"\ndescription = \"mine\"\n[operator]\nallow_dangerous = [\"host-root\"]\n",
    )
    .unwrap();
    let output = profile_run(home.path(), &["resolve", "mine", "--workspace", "/root"]);
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    // So does the other way it names: an empty directory.
    let empty = tempfile::tempdir().unwrap();
    let output = profile_run(
        home.path(),
        &[
            "resolve",
            "default",
            "--workspace",
            empty.path().to_str().unwrap(),
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
}
