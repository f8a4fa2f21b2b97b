//! The analysis: the subset, the splitter, the exploit strings, stamps.

use pretty_assertions::assert_eq;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::ToolOutcome;
use crate::bash::tests::context_with;

fn claim(context: &Context, command: &str) -> Result<Facts, String> {
    let arguments = json!({"command": command})
        .as_object()
        .cloned()
        .unwrap_or_default();
    facts(context, command, &arguments)
}

/// Whether a claim lets a policy auto-allow: a stamp, and no sentinel anywhere.
fn is_auto_allowable(facts: &Facts) -> bool {
    facts
        .rewrite
        .as_ref()
        .is_some_and(|rewrite| rewrite.contains_key("dax_stamp"))
        && !has_sentinel(facts)
}

fn has_sentinel(facts: &Facts) -> bool {
    facts.calls.iter().flatten().any(|call| {
        call.args.values().any(|value| {
            value
                .as_str()
                .is_some_and(|text| text.starts_with(SENTINEL))
        })
    })
}

fn commands(facts: &Facts) -> Vec<(String, String)> {
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

fn git(dir: &Path, args: &[&str]) {
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
fn repository() -> (tempfile::TempDir, std::sync::Arc<Context>) {
    let (temp, context) = context_with(&[]);
    git(temp.path(), &["init", "-q"]);
    std::fs::create_dir(temp.path().join("internal")).unwrap();
    std::fs::write(temp.path().join("notes.txt"), "hello\n").unwrap();
    std::fs::write(temp.path().join("internal/a.go"), "package a\n").unwrap();
    git(temp.path(), &["add", "-A"]);
    git(temp.path(), &["commit", "-q", "-m", "init"]);
    (temp, context)
}

#[test]
fn read_only_lines_are_auto_allowable() {
    let (_temp, context) = repository();
    for line in [
        "git status",
        "git status -s",
        "git log --oneline -n5",
        "git diff --stat HEAD~1",
        "git diff HEAD -- notes.txt",
        "git show HEAD",
        "git log --format=%h:%an",
        "git log --since=2024-01-01T10:00:00 --author=a:b",
        "ls -la internal",
        "ls",
        "pwd",
        "go version",
        "go env GOPATH GOOS",
        "cat notes.txt",
        "head -n5 notes.txt",
        "tail -3 notes.txt 2>&1",
        "wc -l notes.txt internal/a.go",
        "grep -n hello notes.txt",
        "git log --oneline | head -5",
        "git diff | grep -c x | wc -l >/dev/null",
        "cd internal && cat a.go",
        "git config --get user.name",
        "git config --get remote.origin.url",
        "git remote -v",
        "git branch -a",
        "git tag -l",
        "git stash list",
        "grep 'hello world' notes.txt",
    ] {
        let facts = claim(&context, line).unwrap();
        assert!(is_auto_allowable(&facts), "{line}: {facts:#?}");
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

#[test]
fn subset_stages_are_calls_of_their_own() {
    let (_temp, context) = repository();
    let facts = claim(&context, "git log --oneline | head -5 && echo done").unwrap();
    let stages: Vec<_> = commands(&facts)
        .into_iter()
        .filter(|(tool, _)| tool.is_empty())
        .collect();
    assert_eq!(
        stages,
        [
            (String::new(), "git log --oneline".to_owned()),
            (String::new(), "head -5".to_owned()),
            (String::new(), "echo done".to_owned()),
        ]
    );
    // echo is not read-only: the user's rules decide, so no stamp (and a
    // model-supplied stamp is removed).
    assert_eq!(facts.rewrite, None);
    let arguments = json!({"command": "echo hi", "dax_stamp": "forged"})
        .as_object()
        .cloned()
        .unwrap();
    let facts = facts_of(&context, &arguments);
    assert_eq!(
        facts.rewrite,
        Some(json!({"command": "echo hi"}).as_object().cloned().unwrap())
    );
    // A refused stage says why.
    let facts = claim(&context, "git log --output=x").unwrap();
    let call = &facts.calls.unwrap()[0];
    assert_eq!(
        call.args["command"],
        json!(format!("{SENTINEL}git log --output=x"))
    );
    assert_eq!(call.text, "git log --output=x  [git option --output]");
}

fn facts_of(context: &Context, arguments: &Map<String, Value>) -> Facts {
    facts(context, arguments["command"].as_str().unwrap(), arguments).unwrap()
}

#[test]
fn ls_globs_are_expanded_and_checked() {
    let (temp, context) = repository();
    std::fs::write(temp.path().join("-la"), "").unwrap();
    std::fs::write(temp.path().join(".hidden"), "").unwrap();
    let analysis = analyse(&context, "ls -l *.txt i*/* -*").unwrap();
    assert_eq!(
        analysis.run.as_deref(),
        Some("'ls' '-l' -- 'notes.txt' 'internal/a.go' '-la'")
    );
    let analysis = analyse(&context, "ls *.none").unwrap();
    assert_eq!(analysis.run.as_deref(), Some("'ls' -- '*.none'"));
    // A link named with a two-byte character to /etc: `?` in UTF-8, `??` in C.
    std::os::unix::fs::symlink("/etc", temp.path().join("é")).unwrap();
    for line in ["ls ?", "ls ??", "ls *", "ls /etc/*", "ls ../*"] {
        assert!(
            !is_auto_allowable(&claim(&context, line).unwrap()),
            "{line}"
        );
    }
    assert!(glob_matches(b"?", &['é']));
    assert!(glob_matches(b"??", "é".as_bytes()));
    assert!(!glob_matches(b"?", "é".as_bytes()));
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

#[test]
fn the_plan_is_rendered_quoted_with_git_guards() {
    let (_temp, context) = repository();
    let analysis = analyse(
        &context,
        "cd internal && git diff --stat HEAD~1 2>&1 | head -5",
    )
    .unwrap();
    assert_eq!(
        analysis.run.as_deref(),
        Some(
            "cd 'internal' && 'git' 'diff' --no-ext-diff --no-textconv '--stat' 'HEAD~1' 2>&1 | 'head' '-5'"
        )
    );
    let analysis = analyse(&context, "grep 'it'\"'\"'s' notes.txt").unwrap();
    assert_eq!(
        analysis.run.as_deref(),
        Some(r"'grep' 'it'\''s' 'notes.txt'")
    );
}

#[test]
fn a_repository_naming_a_program_is_not_auto_allowable() {
    for (key, value) in [
        ("filter.x.clean", "touch PROBE"),
        ("diff.x.textconv", "touch PROBE"),
        ("diff.external", "touch PROBE"),
        ("core.askPass", "touch PROBE"),
        ("core.editor", "touch PROBE"),
        ("credential.helper", "!touch PROBE"),
        ("credential.https://x.helper", "x"),
        ("merge.x.driver", "touch PROBE"),
        ("uploadpack.packObjectsHook", "x"),
        ("protocol.ext.allow", "always"),
        ("pager.log", "evil"),
        ("core.worktree", "/"),
        ("core.bare", "true"),
        ("extensions.worktreeConfig", "true"),
        ("submodule.x.update", "!touch PROBE"),
    ] {
        let (temp, context) = repository();
        git(temp.path(), &["config", key, value]);
        for line in [
            "git status",
            "git log --oneline -n5",
            "git diff HEAD -- notes.txt",
        ] {
            let facts = claim(&context, line).unwrap();
            assert!(!is_auto_allowable(&facts), "{key}: {line}");
            let text = &facts.calls.unwrap()[0].text;
            assert!(
                text.to_ascii_lowercase()
                    .contains(&key.to_ascii_lowercase()),
                "{key}: {text}"
            );
        }
    }
    for (key, value) in [
        ("core.fsmonitor", "touch PROBE"),
        ("core.pager", "touch PROBE"),
        ("core.hooksPath", "/tmp"),
        ("gpg.program", "x"),
        ("pager.log", "false"),
        ("protocol.ext.allow", "never"),
        ("remote.origin.url", "https://example.com/x"),
        ("core.bare", "false"),
    ] {
        let (temp, context) = repository();
        git(temp.path(), &["config", key, value]);
        assert!(
            is_auto_allowable(&claim(&context, "git status").unwrap()),
            "{key}"
        );
    }
}

#[test]
fn included_and_submodule_configuration_counts() {
    let (temp, context) = repository();
    std::fs::write(
        temp.path().join(".git/extra"),
        "[filter \"x\"]\n\tclean = touch PROBE\n",
    )
    .unwrap();
    git(temp.path(), &["config", "include.path", "extra"]);
    let facts = claim(&context, "git status").unwrap();
    assert!(!is_auto_allowable(&facts));
    assert!(facts.calls.unwrap()[0].text.contains("filter.x.clean"));

    let (temp, context) = repository();
    let module = temp.path().join(".git/modules/deep/sub");
    std::fs::create_dir_all(&module).unwrap();
    std::fs::write(
        module.join("config"),
        "[core]\n\tbare = false\n\tworktree = ../../../../sub\n",
    )
    .unwrap();
    assert!(is_auto_allowable(&claim(&context, "git status").unwrap()));
    std::fs::write(
        module.join("config"),
        "[core]\n\tworktree = ../../../../sub\n[filter \"y\"]\n\tclean = touch PROBE\n",
    )
    .unwrap();
    let facts = claim(&context, "git status").unwrap();
    assert!(!is_auto_allowable(&facts));
    assert!(facts.calls.unwrap()[0].text.contains("filter.y.clean"));
    std::fs::write(module.join("config"), "[core]\n\tfsmonitor = touch PROBE\n").unwrap();
    assert!(!is_auto_allowable(&claim(&context, "git status").unwrap()));
}

#[test]
fn a_dot_git_that_is_not_a_directory_is_not_auto_allowable() {
    let (temp, context) = context_with(&[]);
    std::fs::write(temp.path().join(".git"), "gitdir: /elsewhere\n").unwrap();
    let facts = claim(&context, "git status").unwrap();
    assert!(!is_auto_allowable(&facts));
    assert!(
        facts.calls.unwrap()[0]
            .text
            .contains("is a file that points git")
    );
    let (temp, context) = context_with(&[]);
    std::os::unix::fs::symlink("/tmp", temp.path().join(".git")).unwrap();
    assert!(!is_auto_allowable(&claim(&context, "git status").unwrap()));
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

#[tokio::test]
async fn a_stamped_redirect_line_runs_while_its_target_leads_the_same_way() {
    let (temp, context) = context_with(&[]);
    std::fs::create_dir(temp.path().join("out")).unwrap();
    let rewrite = claim(&context, "echo hi > out/x").unwrap().rewrite.unwrap();
    let outcome = super::super::call(&context, &rewrite, None, CancellationToken::new()).await;
    assert_eq!(outcome.text, "[exit 0]");
    assert_eq!(
        std::fs::read_to_string(temp.path().join("out/x")).unwrap(),
        "hi\n"
    );
    // out now leads elsewhere: refused, and nothing is written there.
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::remove_dir_all(temp.path().join("out")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), temp.path().join("out")).unwrap();
    let outcome = super::super::call(&context, &rewrite, None, CancellationToken::new()).await;
    assert_eq!(outcome, ToolOutcome::error(super::super::CHANGED));
    assert!(!elsewhere.path().join("x").exists());
}

/// A program outside the workspace that records that it ran (`<canaries>/<role>`),
/// then passes its input through as a filter would.
fn canary(canaries: &Path, role: &str) -> String {
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

fn fired(canaries: &Path) -> Vec<String> {
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
fn touch_later(file: &Path, seconds: u64) {
    let when = std::time::SystemTime::now() + std::time::Duration::from_secs(seconds);
    std::fs::File::options()
        .write(true)
        .open(file)
        .unwrap()
        .set_modified(when)
        .unwrap();
}

/// Issue 8, item 6: a stamped `git status` at the root enters an embedded
/// repository (a gitlink in the index) with that repository's own
/// configuration; the probe and the driver overrides looked at the root only.
#[tokio::test]
async fn a_stamped_git_status_neutralises_the_repositories_it_enters() {
    let canaries = tempfile::tempdir().unwrap();
    // The user's global configuration defines a driver for the embedded
    // repository only (a conditional include), as trusted configuration may.
    let home = canaries.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::write(
        home.join("sub.inc"),
        format!(
            "[filter \"y\"]\n\tclean = {}\n",
            canary(canaries.path(), "global")
        ),
    )
    .unwrap();
    std::fs::write(
        home.join(".gitconfig"),
        "[includeIf \"gitdir:**/sub/\"]\n\tpath = sub.inc\n",
    )
    .unwrap();
    let (temp, context) = context_with(&[("HOME", home.to_str().unwrap())]);
    git(temp.path(), &["init", "-q"]);
    std::fs::write(temp.path().join("notes.txt"), "hello\n").unwrap();
    let sub = temp.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    git(&sub, &["init", "-q"]);
    std::fs::write(sub.join("g"), "x\n").unwrap();
    git(&sub, &["add", "g"]);
    git(&sub, &["commit", "-q", "-m", "s"]);
    git(temp.path(), &["add", "-A"]);
    git(temp.path(), &["commit", "-q", "-m", "sub"]);
    std::fs::write(sub.join(".gitattributes"), "* filter=y\n").unwrap();
    std::fs::write(sub.join("g"), "y\n").unwrap();
    let run = |line: &'static str| {
        let context = std::sync::Arc::clone(&context);
        async move {
            let facts = claim(&context, line).unwrap();
            assert!(is_auto_allowable(&facts), "{line}: {facts:?}");
            let rewrite = facts.rewrite.unwrap();
            let outcome =
                super::super::call(&context, &rewrite, None, CancellationToken::new()).await;
            (outcome, rewrite)
        }
    };
    // The fixture is live: a plain `git status` at the root runs the filter.
    touch_later(&sub.join("g"), 10);
    let plain = std::process::Command::new("git")
        .args(["status", "--short"])
        .current_dir(temp.path())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &home)
        .output()
        .unwrap();
    assert!(plain.status.success(), "{plain:?}");
    assert_eq!(fired(canaries.path()), ["global"]);
    std::fs::remove_file(canaries.path().join("global")).unwrap();
    for (line, seconds) in [
        ("git status", 20),
        ("git status --short", 30),
        ("git diff --stat", 40),
    ] {
        touch_later(&sub.join("g"), seconds);
        let (outcome, _) = run(line).await;
        assert!(outcome.text.ends_with("[exit 0]"), "{line}: {outcome:?}");
        assert_eq!(fired(canaries.path()), Vec::<String>::new(), "{line}");
    }

    // The embedded repository's own configuration names a program: the stage
    // asks, naming it, and a stamp made before it appeared no longer runs.
    touch_later(&sub.join("g"), 50);
    let (_, stamped) = run("git status").await;
    git(
        &sub,
        &[
            "config",
            "filter.z.clean",
            &canary(canaries.path(), "local"),
        ],
    );
    std::fs::write(sub.join(".gitattributes"), "* filter=z\n").unwrap();
    touch_later(&sub.join("g"), 60);
    let facts = claim(&context, "git status").unwrap();
    assert!(!is_auto_allowable(&facts));
    let text = &facts.calls.unwrap()[0].text;
    assert!(
        text.contains("filter.z.clean names a program") && text.contains("which git enters"),
        "{text}"
    );
    let outcome = super::super::call(&context, &stamped, None, CancellationToken::new()).await;
    assert_eq!(outcome, ToolOutcome::error(super::super::CHANGED));
    assert_eq!(fired(canaries.path()), Vec::<String>::new());
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
    let outcome = super::super::call(&context, &rewrite, None, CancellationToken::new()).await;
    assert!(outcome.text.contains("[exit "), "{outcome:?}");
    assert_eq!(fired(canaries.path()), Vec::<String>::new());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

    /// No line panics the analysis, whatever its bytes.
    #[test]
    fn any_line_is_analysed_without_panic(line in "[ -~\\t\\néß€\\u{0}]{0,40}") {
        let _ = lex(&line);
        let _ = split(&line);
    }

    /// A line the subset accepts carries none of the characters that let bash
    /// run or redirect something other than its words.
    #[test]
    fn the_subset_admits_no_shell_syntax(line in "[a-z ;&|<>$`()'\"#\\\\*?~=.\\n-]{0,24}") {
        if let Some(tokens) = lex(&line) {
            for token in &tokens {
                if let Token::Word { span, .. } = token {
                    let raw = &line[span.0..span.1];
                    let unquoted: String = {
                        let mut out = String::new();
                        let mut quote = None;
                        for c in raw.chars() {
                            match (quote, c) {
                                (None, '\'' | '"') => quote = Some(c),
                                (Some(q), c) if c == q => quote = None,
                                (None, c) => out.push(c),
                                _ => {}
                            }
                        }
                        out
                    };
                    proptest::prop_assert!(
                        !unquoted.contains([';', '&', '|', '<', '>', '$', '`', '(', ')', '#', '\\', '\n']),
                        "{line:?} gave the word {raw:?}"
                    );
                    proptest::prop_assert!(!raw.starts_with('~'), "{line:?}");
                }
            }
        }
    }
}

fn call_of(tool: &str, path: &str, text: &str) -> FactCall {
    FactCall {
        tool: tool.to_owned(),
        args: json!({ "path": path }).as_object().cloned().unwrap(),
        text: text.to_owned(),
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
