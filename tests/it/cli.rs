//! The command line itself: every subcommand's `--help`, closed choices,
//! exit codes, completions, NO_COLOR, `box run`'s argument forms (on the fake
//! backend; the real ones are in end_to_end.rs).

use std::process::{Command, Output};

use crate::support::{box_bin, testhost_bin};

fn run(args: &[&str]) -> Output {
    Command::new(box_bin()).args(args).output().unwrap()
}

/// box-testhost: the same command line with `--backend fake`.
fn testhost(args: &[&str]) -> Output {
    Command::new(testhost_bin())
        .env("RUST_LOG", "warn")
        .args(args)
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn every_subcommand_has_help_with_examples() {
    for (args, wants) in [
        (&["units", "ls", "--help"][..], &["--json", "Examples:"][..]),
        (&["units", "rm", "--help"], &["--force", "<ID>..."]),
        (&["units", "inspect", "--help"], &["<ID>"]),
        (&["units", "--help"], &["ls", "rm", "inspect"]),
        (
            &["image", "build", "--help"],
            &[
                "--force",
                "--mirror",
                "--suite",
                "--keyring",
                "--no-check-gpg",
                "Examples:",
            ],
        ),
        (&["image", "ls", "--help"], &["--json"]),
        (&["image", "--help"], &["build", "ls"]),
        (&["gc", "--help"], &["--all-instances", "Examples:"]),
        (&["doctor", "--help"], &["--strict", "Examples:"]),
        (&["completions", "--help"], &["bash", "zsh", "fish"]),
        (
            &["serve", "--help"],
            &["--profiles", "--workspace", "Examples:"],
        ),
        (&["execute", "--help"], &["--root", "Examples:"]),
        (&["profile", "--help"], &["--profiles", "Examples:"]),
        (&["profile", "list", "--help"], &["--json", "Examples:"]),
        (&["profile", "show", "--help"], &["<NAME>", "Examples:"]),
        (
            &["profile", "check", "--help"],
            &["[FILES]...", "Examples:"],
        ),
        (
            &["profile", "resolve", "--help"],
            &["--workspace", "--tighten", "Examples:"],
        ),
        (
            &["doctor", "--help"],
            &["--profiles", "--workspace", "Examples:"],
        ),
        (&["image", "ls", "--help"], &["--profiles", "Examples:"]),
        (
            &["run", "--help"],
            &[
                "-e, --env",
                "-i, --interactive",
                "Exit codes:",
                "125",
                "Examples:",
            ],
        ),
    ] {
        let output = run(args);
        let text = stdout(&output);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            stderr(&output)
        );
        for want in wants {
            assert!(text.contains(want), "{args:?} lacks {want:?}:\n{text}");
        }
    }
}

#[test]
fn the_exit_codes_are_in_help() {
    let text = stdout(&run(&["--help"]));
    for want in [
        "Exit codes:",
        "125",
        "130",
        "2    the command line is wrong",
    ] {
        assert!(text.contains(want), "{want:?}:\n{text}");
    }
}

#[test]
fn closed_choices_are_checked_by_the_parser() {
    for (args, want) in [
        (
            &["run", "--backend", "dokcer", "true"][..],
            "[possible values: auto, docker, local]",
        ),
        (
            &["serve", "--log-format", "xml"],
            "[possible values: text, json]",
        ),
        (
            &["run", "--log-format", "xml", "true"],
            "[possible values: text, json]",
        ),
        (&["units", "list"], "unrecognized subcommand 'list'"),
        (&["image", "pull"], "required arguments were not provided"),
        (&["completions", "tcsh"], "possible values"),
    ] {
        let output = run(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let text = stderr(&output);
        assert!(text.contains(want), "{args:?}: {text}");
        // Argument errors come before any backend is asked (no engine warnings).
        assert!(!text.contains("runc"), "{args:?}: {text}");
    }
    // The test binary's own backend is a choice there.
    let text = stdout(&testhost(&["run", "--help"]));
    assert!(text.contains("fake"), "{text}");
}

/// What box offers at a TAB after `words` (the last is the word being
/// completed), as the bash script `box completions bash` prints asks it.
fn complete(words: &[&str]) -> Vec<String> {
    complete_with(&[], words)
}

/// `complete`, with variables set (`XDG_CONFIG_HOME`: the operator's profiles).
fn complete_with(env: &[(&str, &std::path::Path)], words: &[&str]) -> Vec<String> {
    let output = Command::new(box_bin())
        .envs(env.iter().copied())
        .env("BOX_COMPLETE", "bash")
        .env("_CLAP_COMPLETE_INDEX", (words.len() - 1).to_string())
        .env("_CLAP_IFS", "\n")
        .arg("--")
        .args(words)
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{words:?}: {}",
        stderr(&output)
    );
    stdout(&output).lines().map(str::to_owned).collect()
}

#[test]
fn completions_are_printed_for_each_shell() {
    for (shell, want) in [
        (
            "bash",
            "complete -o nospace -o bashdefault -o nosort -F _clap_complete_box box",
        ),
        ("zsh", "#compdef box"),
        ("fish", "complete --keep-order --exclusive --command box"),
        ("elvish", "arg-completer[box]"),
        ("powershell", "Register-ArgumentCompleter"),
    ] {
        let output = run(&["completions", shell]);
        assert_eq!(output.status.code(), Some(0), "{shell}");
        let text = stdout(&output);
        assert!(text.contains(want), "{shell}: {text}");
        // The script asks this box at each TAB.
        assert!(
            text.contains("BOX_COMPLETE") && text.contains(shell),
            "{shell}: {text}"
        );
        assert!(
            text.contains(box_bin().to_str().unwrap()),
            "{shell}: {text}"
        );
    }
    let offered = complete(&["box", ""]);
    for name in ["serve", "run", "units", "profile", "doctor", "completions"] {
        assert!(offered.contains(&name.to_owned()), "{name}: {offered:?}");
    }
    // box's own helpers inside units are not for people to type.
    for name in ["sandbox", "confine", "init"] {
        assert!(!offered.contains(&name.to_owned()), "{name}: {offered:?}");
    }
    assert_eq!(complete(&["box", "units", "ins"]), ["inspect"]);
}

/// Profile names are completed wherever a profile is named, as box finds
/// them now (the shipped ones, and the operator's own).
#[test]
fn completions_offer_profile_names() {
    let config = tempfile::tempdir().unwrap();
    let dir = config.path().join("box/profiles");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("mine.toml"),
        "extends = \"default\"\ndescription = \"mine\"\n",
    )
    .unwrap();
    let complete = |words: &[&str]| complete_with(&[("XDG_CONFIG_HOME", config.path())], words);
    for words in [
        &["box", "profile", "show", ""][..],
        &["box", "profile", "resolve", ""],
        &["box", "run", "--profile", ""],
        &["box", "serve", "--profile", ""],
        &["box", "doctor", "--strict", "--profile", ""],
    ] {
        let offered = complete(words);
        for name in ["default", "ci", "offline", "mine"] {
            assert!(
                offered.contains(&name.to_owned()),
                "{words:?} lacks {name}: {offered:?}"
            );
        }
    }
    assert_eq!(complete(&["box", "run", "--profile", "o"]), ["offline"]);
    assert_eq!(complete(&["box", "profile", "show", "mi"]), ["mine"]);
}

#[test]
fn no_color_wins_over_a_forced_colour() {
    let coloured = Command::new(box_bin())
        .args(["--bogus"])
        .env("CLICOLOR_FORCE", "1")
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    assert!(
        stderr(&coloured).contains('\u{1b}'),
        "the control case has no colour"
    );
    let plain = Command::new(box_bin())
        .args(["--bogus"])
        .env("CLICOLOR_FORCE", "1")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert_eq!(plain.status.code(), Some(2));
    assert!(!stderr(&plain).contains('\u{1b}'), "{:?}", stderr(&plain));
}

#[test]
fn run_takes_its_command_without_a_double_dash() {
    for (args, want) in [
        (&["run", "--backend", "fake", "true"][..], "ran: true\n"),
        (&["run", "--backend", "fake", "--", "true"], "ran: true\n"),
        // After the command starts, every argument is the command's.
        (
            &["run", "--backend", "fake", "ls", "-la", "--profile", "x"],
            "ran: ls -la --profile x\n",
        ),
    ] {
        let output = testhost(args);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            stderr(&output)
        );
        assert_eq!(stdout(&output), want, "{args:?}");
    }
    let output = testhost(&["run", "--backend", "fake"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("<CMD>"), "{}", stderr(&output));
}

#[test]
fn run_refuses_a_variable_the_profile_does_not_let_through() {
    let output = testhost(&[
        "run",
        "--backend",
        "fake",
        "-e",
        "AWS_SECRET_ACCESS_KEY=x",
        "true",
    ]);
    assert_eq!(output.status.code(), Some(125));
    let text = stderr(&output);
    assert!(
        text.contains("-e AWS_SECRET_ACCESS_KEY: profile default does not let this variable through; the variables it lets through (env.pass, env.secrets) are: LANG, TERM"),
        "{text}"
    );
    let output = testhost(&["run", "--backend", "fake", "-e", "1X=y", "true"]);
    assert_eq!(output.status.code(), Some(125));
    assert!(stderr(&output).contains("-e 1X=y: "), "{}", stderr(&output));
    // A tightening that drops a variable takes it out of what -e may set.
    let output = testhost(&[
        "run",
        "--backend",
        "fake",
        "--tighten",
        r#"{"env": {"drop": ["LANG"]}}"#,
        "-e",
        "LANG=C",
        "true",
    ]);
    assert_eq!(output.status.code(), Some(125));
    assert!(stderr(&output).contains("are: TERM"), "{}", stderr(&output));
    let output = testhost(&[
        "run",
        "--backend",
        "fake",
        "-e",
        "LANG=C",
        "-e",
        "TERM",
        "true",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

/// As `docker run -it`: an interactive terminal with no terminal to type at
/// is refused before anything starts; `-t` alone runs.
#[test]
fn run_it_refuses_a_stdin_that_is_not_a_terminal() {
    let output = testhost(&["run", "--backend", "fake", "-it", "true"]);
    assert_eq!(output.status.code(), Some(125), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("the input device is not a TTY"),
        "{}",
        stderr(&output)
    );
    let output = testhost(&["run", "--backend", "fake", "-t", "true"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn doctor_strict_judges_a_profile_box_cannot_find() {
    let output = run(&["doctor", "--strict", "--profile", "no-such-profile"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("--profile no-such-profile: no such profile"),
        "{}",
        stderr(&output)
    );
    // --profile means nothing without --strict.
    assert_eq!(run(&["doctor", "--profile", "ci"]).status.code(), Some(2));
}

/// As ripgrep and other Unix tools: a reader that goes away
/// (`box units ls | head -1`) ends the command quietly with 0, never a panic.
#[test]
fn a_closed_stdout_ends_every_command_quietly() {
    let workspace = tempfile::tempdir().unwrap();
    // `units ls` of docker and `image ls`: docker.rs.
    for args in [
        &["units", "--backend", "local", "ls"][..],
        &["units", "--backend", "local", "ls", "--json"],
        &["doctor"],
        &["doctor", "--json"],
        &["profile", "list"],
        &["profile", "list", "--json"],
        &["profile", "show", "ci"],
        &["profile", "show", "ci", "--json"],
        &["profile", "resolve", "ci", "--json"],
        &["profile", "check"],
        &["completions", "bash"],
        &["completions", "zsh"],
        &["completions", "fish"],
        &["--help"],
        &["--version"],
    ] {
        // The reader end is dropped before box starts: its first write fails
        // with EPIPE (box, like every Rust program, ignores SIGPIPE).
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let output = Command::new(box_bin())
            .args(args)
            .current_dir(workspace.path())
            .stdout(writer)
            .output()
            .unwrap();
        let text = stderr(&output);
        assert!(
            !text.contains("panicked") && !text.contains("Broken pipe"),
            "{args:?}: {text}"
        );
        assert_eq!(output.status.code(), Some(0), "{args:?}: {text}");
    }
}

/// One name per concept: every command that resolves profiles takes
/// `--profiles DIR` (one that is not a directory refused alike), and the
/// directory a `cwd` workspace means is `--workspace` everywhere (`box
/// profile resolve --cwd`, its old name, still works, unlisted).
#[test]
fn every_command_that_resolves_profiles_takes_profiles_and_workspace() {
    let profiles = tempfile::tempdir().unwrap();
    std::fs::write(
        profiles.path().join("mine.toml"),
        "extends = \"default\"\ndescription = \"mine, from --profiles\"\n",
    )
    .unwrap();
    let dir = profiles.path().to_str().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let workspace = std::fs::canonicalize(workspace.path()).unwrap();
    let ws = workspace.to_str().unwrap();

    let output = run(&["doctor", "--profiles", dir, "--workspace", ws, "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let mine = report["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|profile| profile["name"] == "mine")
        .unwrap_or_else(|| panic!("doctor --profiles does not judge mine: {report:#}"));
    assert!(mine.get("error").is_none(), "{mine}");
    let output = run(&["doctor", "--profiles", dir, "--strict", "--profile", "mine"]);
    assert!(
        !stderr(&output).contains("no such profile"),
        "{}",
        stderr(&output)
    );

    for flag in ["--workspace", "--cwd"] {
        let output = run(&[
            "profile",
            "--profiles",
            dir,
            "resolve",
            "mine",
            flag,
            ws,
            "--json",
        ]);
        assert_eq!(output.status.code(), Some(0), "{flag}: {}", stderr(&output));
        assert!(
            stdout(&output).contains(&format!("\"path\": \"{ws}\"")),
            "{flag}: {}",
            stdout(&output)
        );
    }
    let help = stdout(&run(&["profile", "resolve", "--help"]));
    assert!(!help.contains("--cwd"), "{help}");

    // A directory that is not one is refused by each, naming it.
    let missing = workspace.join("nowhere");
    let missing = missing.to_str().unwrap();
    let refusal = format!("--profiles {missing}: not a directory");
    for args in [
        &["doctor", "--profiles", missing][..],
        &["image", "ls", "--profiles", missing],
        &["profile", "--profiles", missing, "list"],
        &["serve", "--profiles", missing],
    ] {
        let output = run(args);
        assert_eq!(
            output.status.code(),
            Some(1),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(&refusal),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    let output = testhost(&["run", "--backend", "fake", "--profiles", missing, "true"]);
    assert_eq!(output.status.code(), Some(125), "{}", stderr(&output));
    assert!(stderr(&output).contains(&refusal), "{}", stderr(&output));
}

/// What is wrong with a `--listen` is named (a port out of range, one that
/// is not a number), before any host starts; only a host that is not
/// loopback is told as that.
#[test]
fn serve_names_what_is_wrong_with_a_listen_address() {
    for (value, want) in [
        (
            "127.0.0.1:99999",
            "box: --listen 127.0.0.1:99999: port 99999 is out of range; a port is 0 to 65535\n",
        ),
        (
            "foo:bar",
            "box: --listen foo:bar: the port \"bar\" is not a number; write HOST:PORT (127.0.0.1:8080, [::1]:8080, localhost:8080) or a bare port (8080)\n",
        ),
    ] {
        let output = run(&["serve", "--listen", value]);
        assert_eq!(
            output.status.code(),
            Some(1),
            "{value}: {}",
            stderr(&output)
        );
        // Only the error: no host started (no log line before it).
        assert_eq!(stderr(&output), want, "{value}");
    }
    let output = run(&["serve", "--listen", "box.example.com:8080"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("--listen box.example.com:8080 is not a loopback address"),
        "{}",
        stderr(&output)
    );
}
