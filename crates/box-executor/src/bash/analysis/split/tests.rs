//! The splitter: its parts, its redirects, and the stamp of a line it cut.

use pretty_assertions::assert_eq;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::super::tests::{canary, claim, commands, fired, git, repository};
use super::*;
use crate::ToolOutcome;
use crate::bash::tests::context_with;

#[test]
fn lines_outside_the_subset_carry_the_sentinel() {
    let (_temp, context) = context_with(&[]);
    for line in [
        "git status #'\n touch /x\n#'",
        "git status >&/home/u/.bashrc",
        "echo $(touch x)",
        "cat notes.txt; rm -rf /",
        "a || b",
    ] {
        let facts = claim(&context, line).unwrap();
        let calls = facts.calls.unwrap();
        assert_eq!(
            calls.last().map(|call| call.args["command"].clone()),
            Some(json!(format!("{SENTINEL}{line}"))),
            "{line:?}"
        );
    }
}

#[test]
fn the_splitter_reaches_every_part() {
    let check = |line: &str, parts: &[&str]| {
        let split = split(line).unwrap();
        assert_eq!(split.parts, parts, "{line:?}");
    };
    check(
        "a; b | c && d || e & f\ng",
        &["a", "b", "c", "d", "e", "f", "g"],
    );
    check("git status #'\n touch /x\n#'", &["git status", "touch /x"]);
    check(
        "git status #\"\n touch /x\n#\"",
        &["git status", "touch /x"],
    );
    check(
        "git status $'\\'' ; touch /x #'",
        &["git status $'\\''", "touch /x"],
    );
    check("echo 'a;b' \"c|d\" e\\;f", &["echo 'a;b' \"c|d\" e\\;f"]);
    check("cat .env > out/x", &["cat .env"]);
    check("echo a#b", &["echo a#b"]);
    check("# only a comment", &[]);
    check("if true; then touch x; fi", &["true", "touch x", "fi"]);
    check(
        "(cd /; rm -rf x) && { ! exec touch y; }",
        &["cd /", "rm -rf x)", "touch y", "}"],
    );
    check(
        "while true; do nohup touch z; done",
        &["true", "touch z", "done"],
    );
    assert_eq!(split("echo 'abc").unwrap_err(), "unterminated quote");
    assert_eq!(split("echo \"abc").unwrap_err(), "unterminated quote");
    assert_eq!(split("echo $'abc").unwrap_err(), "unterminated quote");
}

#[test]
fn the_splitter_finds_every_file_redirect() {
    let targets = |line: &str| -> Vec<(&'static str, String)> {
        split(line)
            .unwrap()
            .redirects
            .into_iter()
            .map(|redirect| (redirect.tool, redirect.value))
            .collect()
    };
    let write = |path: &str| ("write", path.to_owned());
    assert_eq!(targets("a > x"), [write("x")]);
    assert_eq!(targets("a >> x 2>&1"), [write("x")]);
    assert_eq!(targets("a 2>err >|x"), [write("err"), write("x")]);
    assert_eq!(targets("a &> x; b &>> y"), [write("x"), write("y")]);
    assert_eq!(targets("a >&/home/u/.bashrc"), [write("/home/u/.bashrc")]);
    assert_eq!(targets("a >& f"), [write("f")]);
    assert_eq!(targets("a >&2foo"), [write("2foo")]);
    assert_eq!(targets("a >&2 2>&1 >&-"), []);
    assert_eq!(targets("a <> rw"), [write("rw")]);
    assert_eq!(targets("a < in"), [("read", "in".to_owned())]);
    assert_eq!(targets("a >'q x'"), [write("q x")]);
    assert_eq!(targets("cat <<EOF\nx\nEOF"), []);
}

#[test]
fn a_redirect_line_claims_parts_writes_and_the_line() {
    let (_temp, context) = context_with(&[]);
    let facts = claim(&context, "cat .env > out/x").unwrap();
    let calls = commands(&facts);
    assert_eq!(calls.first(), Some(&(String::new(), "cat .env".to_owned())));
    assert_eq!(
        calls.last(),
        Some(&(String::new(), format!("{SENTINEL}cat .env > out/x")))
    );
    // A line with file redirects is stamped with where they lead.
    assert!(facts.rewrite.unwrap().contains_key("dax_stamp"));
    // Targets decided as raw text.
    for line in [
        "echo > $HOME/x",
        "echo > ~/x",
        "echo > *.txt",
        "echo > a\\b",
    ] {
        let facts = claim(&context, line).unwrap();
        let raw = facts
            .calls
            .unwrap()
            .into_iter()
            .find(|call| call.tool == "write")
            .unwrap();
        assert!(
            raw.args["path"].as_str().unwrap().starts_with(SENTINEL),
            "{line}"
        );
        assert!(claim(&context, line).unwrap().rewrite.is_none(), "{line}");
    }
}

#[tokio::test]
async fn a_stamped_redirect_line_runs_while_its_target_leads_the_same_way() {
    let (temp, context) = context_with(&[]);
    std::fs::create_dir(temp.path().join("out")).unwrap();
    let rewrite = claim(&context, "echo hi > out/x").unwrap().rewrite.unwrap();
    let outcome = crate::bash::call(&context, &rewrite, None, CancellationToken::new()).await;
    assert_eq!(outcome.text, "[exit 0]");
    assert_eq!(
        std::fs::read_to_string(temp.path().join("out/x")).unwrap(),
        "hi\n"
    );
    // out now leads elsewhere: refused, and nothing is written there.
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::remove_dir_all(temp.path().join("out")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), temp.path().join("out")).unwrap();
    let outcome = crate::bash::call(&context, &rewrite, None, CancellationToken::new()).await;
    assert_eq!(outcome, ToolOutcome::error(crate::bash::CHANGED));
    assert!(!elsewhere.path().join("x").exists());
}

/// Issue 8, item 6: a line outside the subset runs as typed, so which
/// repository its git enters (`-C`, `cd`, `GIT_DIR`, a `.git` file) cannot be
/// said; such a line is not stamped.
#[test]
fn a_line_outside_the_subset_that_names_git_is_not_stamped() {
    let (temp, context) = repository();
    std::fs::create_dir(temp.path().join("sub")).unwrap();
    git(&temp.path().join("sub"), &["init", "-q"]);
    for line in [
        "git -C sub log -p > out.txt",
        "cd sub && git log -p > out.txt",
        "GIT_DIR=sub/.git git log -p > out.txt",
        "git diff > x.patch",
        "g''it -C sub log -p > out.txt",
        "g\\it log -p > out.txt",
        "/usr/bin/GIT log > out.txt",
    ] {
        let facts = claim(&context, line).unwrap();
        assert!(
            !facts
                .rewrite
                .as_ref()
                .is_some_and(|rewrite| rewrite.contains_key("dax_stamp")),
            "{line}: {facts:?}"
        );
    }
    // A line that names no git keeps its stamp.
    let facts = claim(&context, "echo hi > out.txt").unwrap();
    assert!(facts.rewrite.unwrap().contains_key("dax_stamp"));
}

/// Issue 8, item 6: `diff.external` must not run in a stamped run, even one
/// whose line runs as typed (a script that runs `git diff`).
#[tokio::test]
async fn diff_external_does_not_run_in_a_stamped_run() {
    let (temp, context) = repository();
    let canaries = tempfile::tempdir().unwrap();
    git(
        temp.path(),
        &[
            "config",
            "diff.external",
            &canary(canaries.path(), "external"),
        ],
    );
    std::fs::write(temp.path().join("notes.txt"), "changed\n").unwrap();
    std::fs::write(temp.path().join("d.sh"), "exec \"$(printf gi)t\" diff\n").unwrap();
    let facts = claim(&context, "sh d.sh > out.txt").unwrap();
    let rewrite = facts.rewrite.unwrap();
    assert!(rewrite.contains_key("dax_stamp"));
    let outcome = crate::bash::call(&context, &rewrite, None, CancellationToken::new()).await;
    assert!(outcome.text.contains("[exit "), "{outcome:?}");
    assert_eq!(fired(canaries.path()), Vec::<String>::new());
}
