//! The subset's read-only checks, its claims and its plan.

use pretty_assertions::assert_eq;
use serde_json::{Map, Value, json};

use super::super::tests::{claim, commands, is_auto_allowable, repository};
use super::super::{analyse, facts};
use crate::Context;
use crate::facts::{Facts, SENTINEL};

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
