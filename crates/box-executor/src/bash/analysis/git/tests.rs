//! The git stages' checks and the configuration probe.

use tokio_util::sync::CancellationToken;

use super::super::tests::{canary, claim, fired, git, is_auto_allowable, repository, touch_later};
use crate::ToolOutcome;
use crate::bash::tests::context_with;

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
                crate::bash::call(&context, &rewrite, None, CancellationToken::new()).await;
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
    let outcome = crate::bash::call(&context, &stamped, None, CancellationToken::new()).await;
    assert_eq!(outcome, ToolOutcome::error(crate::bash::CHANGED));
    assert_eq!(fired(canaries.path()), Vec::<String>::new());
}
