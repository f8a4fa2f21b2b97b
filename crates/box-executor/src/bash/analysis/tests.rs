//! The analysis as a whole: the exploit strings, the claims through the
//! workspace, stamps; the helpers the tests of its parts share.

use std::path::Path;

use pretty_assertions::assert_eq;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::lexer::lex;
use super::split::split;
use super::*;
use crate::ToolOutcome;
use crate::bash::tests::context_with;

pub(super) fn claim(context: &Context, command: &str) -> Result<Facts, String> {
    let arguments = json!({"command": command})
        .as_object()
        .cloned()
        .unwrap_or_default();
    facts(context, command, &arguments)
}

/// Whether a claim lets a policy auto-allow: a stamp, and no sentinel anywhere.
pub(super) fn is_auto_allowable(facts: &Facts) -> bool {
    facts
        .rewrite
        .as_ref()
        .is_some_and(|rewrite| rewrite.contains_key("dax_stamp"))
        && !has_sentinel(facts)
}

pub(super) fn has_sentinel(facts: &Facts) -> bool {
    facts.calls.iter().flatten().any(|call| {
        call.args.values().any(|value| {
            value
                .as_str()
                .is_some_and(|text| text.starts_with(SENTINEL))
        })
    })
}

pub(super) fn commands(facts: &Facts) -> Vec<(String, String)> {
    facts
        .calls
        .iter()
        .flatten()
        .map(|call| {
            let value = call
                .args
                .values()
                .next()
                .and_then(Value::as_str)
                .unwrap_or("");
            (call.tool.clone(), value.to_owned())
        })
        .collect()
}

pub(super) fn git(dir: &Path, args: &[&str]) {
    let output = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "a")
        .env("GIT_AUTHOR_EMAIL", "a@example.com")
        .env("GIT_COMMITTER_NAME", "a")
        .env("GIT_COMMITTER_EMAIL", "a@example.com")
        .output()
        .unwrap();
    assert!(output.status.success(), "git {args:?}: {output:?}");
}

/// A workspace that is a clean git repository with `internal/` and `notes.txt`.
pub(super) fn repository() -> (tempfile::TempDir, std::sync::Arc<Context>) {
    let (temp, context) = context_with(&[]);
    git(temp.path(), &["init", "-q"]);
    std::fs::create_dir(temp.path().join("internal")).unwrap();
    std::fs::write(temp.path().join("notes.txt"), "hello\n").unwrap();
    std::fs::write(temp.path().join("internal/a.go"), "package a\n").unwrap();
    git(temp.path(), &["add", "-A"]);
    git(temp.path(), &["commit", "-q", "-m", "init"]);
    (temp, context)
}

/// A program outside the workspace that records that it ran (`<canaries>/<role>`),
/// then passes its input through as a filter would.
pub(super) fn canary(canaries: &Path, role: &str) -> String {
    let path = canaries.join(format!("evil-{role}"));
    let body = format!(
        "#!/bin/sh\ntouch '{}'\ncase '{role}' in textconv) exec cat \"$1\" ;; esac\nexec cat\n",
        canaries.join(role).display()
    );
    std::fs::write(&path, body).unwrap();
    let mut permissions = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&path, permissions).unwrap();
    path.display().to_string()
}

pub(super) fn fired(canaries: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(canaries)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with("evil-") && name != "home")
        .collect();
    names.sort();
    names
}

/// Make `file` stat-dirty at the same size, so git hashes it again (through
/// its clean filter) instead of trusting the index.
pub(super) fn touch_later(file: &Path, seconds: u64) {
    let when = std::time::SystemTime::now() + std::time::Duration::from_secs(seconds);
    std::fs::File::options()
        .write(true)
        .open(file)
        .unwrap()
        .set_modified(when)
        .unwrap();
}

fn call_of(tool: &str, path: &str, text: &str) -> FactCall {
    FactCall {
        tool: tool.to_owned(),
        args: json!({ "path": path }).as_object().cloned().unwrap(),
        text: text.to_owned(),
    }
}

#[test]
fn exploit_strings_are_never_auto_allowable() {
    let (temp, context) = repository();
    std::os::unix::fs::symlink("/etc", temp.path().join("link")).unwrap();
    let lines = [
        // Quote-tracker desync with # and $'..'.
        "git status #'\n touch /x\n#'",
        "git status #\"\n touch /x\n#\"",
        "git status $'\\'' ; touch /x #'",
        "git status -- $'\\'' >/x #'",
        // >&file is a write.
        "git status >&/home/u/.bashrc",
        "git status >& /home/u/.bashrc",
        "git status >&$HOME/x",
        "git status >&2foo",
        "ls >&/home/u/.bashrc",
        // Dangerous flags of allowed commands.
        "git log --output=/tmp/x",
        "git diff --output=/tmp/x",
        "git show --output=/x HEAD",
        "git diff --no-index /dev/null ~/.ssh/id_rsa",
        "ls /home/u/.ssh",
        "ls /etc",
        "ls ~/.ssh",
        "git -c core.pager='sh -c x' log",
        "git log --ext-diff -p",
        "git diff --textconv",
        "git -C /etc status",
        "git --git-dir=/x status",
        // .. at all, or through a link.
        "ls link/..",
        "ls ..",
        "ls internal/..",
        "ls link",
        "git diff -- link/..",
        "git status ..",
        "cd .. && ls",
        "cd link && ls",
        "cat link/passwd",
        // Whole-repository revisions and pathspecs.
        "git show HEAD:secret.txt",
        "git show :secret.txt",
        "git diff :/secret.txt",
        "git log -- ':(top)'",
        "git diff -- ':^sub'",
        "git show :0:secret.txt",
        "git log -- ':(glob)**'",
        // git config beyond single safe keys.
        "git config --list",
        "git config -l",
        "git config --global --get user.name",
        "git config --get-regexp user",
        "git config --get http.extraheader",
        "git config --get credential.helper",
        "git config --get core.sshCommand",
        "git config user.name",
        // gpg formats.
        "git log --format=%GG",
        "git show --pretty=%G? HEAD",
    ];
    for line in lines {
        let facts = claim(&context, line).unwrap();
        assert!(
            !is_auto_allowable(&facts),
            "auto-allowed: {line:?}: {facts:#?}"
        );
        assert!(has_sentinel(&facts), "no sentinel for {line:?}: {facts:#?}");
    }
    // Beyond the reference's list: writers and runners that look like readers
    // are never auto-allowable (a command outside the read-only list is a
    // stage call of its own, for the user's rules).
    let lines = [
        "git branch newbranch",
        "git branch -D master",
        "git tag v1",
        "git tag -a v1 -m x",
        "git stash",
        "git commit -m x",
        "git push",
        "sort -o out notes.txt",
        "git log | sort -o /tmp/x",
        "git log | uniq - out",
        "grep -r hello .",
        "tail -f notes.txt",
        "cat notes.txt; rm -rf /",
        "cat notes.txt && rm -rf /",
        "cat notes.txt || touch x",
        "cat notes.txt & touch x",
        "echo $(touch x)",
        "echo `touch x`",
        "FOO=bar git status",
        "cat 'notes.txt' > out",
        "git status\ntouch /x",
        "git log -n1 | xargs touch",
        "cat /etc/passwd",
    ];
    for line in lines {
        let facts = claim(&context, line).unwrap();
        assert!(
            !is_auto_allowable(&facts),
            "auto-allowed: {line:?}: {facts:#?}"
        );
    }
}

#[test]
fn errors_and_nothing() {
    let (_temp, context) = context_with(&[]);
    assert_eq!(claim(&context, "").unwrap_err(), "empty command");
    assert_eq!(claim(&context, "  \n ").unwrap_err(), "empty command");
    assert_eq!(
        claim(&context, "echo 'abc").unwrap_err(),
        "unterminated quote"
    );
    assert_eq!(
        claim(&context, "# nothing").unwrap().calls,
        Some(Vec::new())
    );
}

#[tokio::test]
async fn a_stamp_runs_the_plan_until_the_line_changes() {
    let (temp, context) = repository();
    let facts = claim(&context, "cat notes.txt").unwrap();
    let rewrite = facts.rewrite.unwrap();
    let outcome = super::super::call(&context, &rewrite, None, CancellationToken::new()).await;
    assert_eq!(outcome.text, "hello\n[exit 0]");
    // The stamp is for this line only.
    let mut other = rewrite.clone();
    other.insert("command".to_owned(), json!("cat internal/a.go"));
    let outcome = super::super::call(&context, &other, None, CancellationToken::new()).await;
    assert_eq!(outcome, ToolOutcome::error(super::super::CHANGED));
    // notes.txt now leads elsewhere (inside): the stamp no longer holds.
    std::fs::remove_file(temp.path().join("notes.txt")).unwrap();
    std::os::unix::fs::symlink("internal/a.go", temp.path().join("notes.txt")).unwrap();
    let outcome = super::super::call(&context, &rewrite, None, CancellationToken::new()).await;
    assert_eq!(outcome, ToolOutcome::error(super::super::CHANGED));
    // A repository that starts naming a program after the stamp: refused too.
    let rewrite = claim(&context, "git status -s").unwrap().rewrite.unwrap();
    git(temp.path(), &["config", "diff.external", "touch PROBE"]);
    let outcome = super::super::call(&context, &rewrite, None, CancellationToken::new()).await;
    assert_eq!(outcome, ToolOutcome::error(super::super::CHANGED));
    assert!(!temp.path().join("PROBE").exists());
}

#[tokio::test]
async fn a_stamped_run_redacts_userinfo() {
    let (temp, context) = repository();
    git(
        temp.path(),
        &[
            "remote",
            "add",
            "origin",
            "https://me:hunter2@example.com/x.git",
        ],
    );
    let rewrite = claim(&context, "git remote -v").unwrap().rewrite.unwrap();
    let outcome = super::super::call(&context, &rewrite, None, CancellationToken::new()).await;
    assert!(
        outcome.text.contains("https://***@example.com/x.git"),
        "{}",
        outcome.text
    );
    assert!(!outcome.text.contains("hunter2"));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

    /// No line panics the analysis, whatever its bytes.
    #[test]
    fn any_line_is_analysed_without_panic(line in "[ -~\\t\\néß€\\u{0}]{0,40}") {
        let _ = lex(&line);
        let _ = split(&line);
    }

}

#[test]
fn reads_and_writes_are_claimed_through_the_workspace() {
    let (temp, context) = repository();
    let calls = claim(&context, "cat notes.txt").unwrap().calls.unwrap();
    assert!(
        calls.contains(&call_of(
            "read",
            "notes.txt",
            "cat notes.txt  [reads notes.txt]"
        )),
        "{calls:#?}"
    );
    let calls = claim(&context, "cd internal && cat a.go")
        .unwrap()
        .calls
        .unwrap();
    assert!(
        calls.contains(&call_of("read", "internal/a.go", "cat a.go  [reads a.go]")),
        "{calls:#?}"
    );
    // A link inside is claimed by both names.
    std::os::unix::fs::symlink("notes.txt", temp.path().join("alias.txt")).unwrap();
    let calls = claim(&context, "head alias.txt").unwrap().calls.unwrap();
    assert!(
        calls.contains(&call_of(
            "read",
            "notes.txt",
            "head alias.txt  [reads alias.txt -> notes.txt]"
        )),
        "{calls:#?}"
    );
    // The reference's example: a part, the write, the whole line.
    let facts = claim(&context, "cat .env > out/x").unwrap();
    assert_eq!(
        facts.calls.unwrap(),
        [
            FactCall {
                tool: String::new(),
                args: command_args("cat .env".to_owned()),
                text: "cat .env".to_owned(),
            },
            call_of("write", "out/x", "out/x"),
            FactCall {
                tool: String::new(),
                args: command_args(format!("{SENTINEL}cat .env > out/x")),
                text: "cat .env > out/x".to_owned(),
            },
        ]
    );
    // A target after a plain cd is claimed from the root and from there.
    let calls = claim(&context, "cd internal; echo x > y")
        .unwrap()
        .calls
        .unwrap();
    assert!(calls.contains(&call_of("write", "y", "y")), "{calls:#?}");
    assert!(
        calls.contains(&call_of("write", "internal/y", "y")),
        "{calls:#?}"
    );
    // A target outside is the sentinel form.
    let calls = claim(&context, "echo x >> /etc/profile")
        .unwrap()
        .calls
        .unwrap();
    assert!(
        calls.contains(&call_of(
            "write",
            &format!("{SENTINEL}/etc/profile"),
            "/etc/profile"
        )),
        "{calls:#?}"
    );
}
