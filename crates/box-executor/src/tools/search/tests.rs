use std::os::unix::fs::symlink;

use pretty_assertions::assert_eq;
use serde_json::json;

use crate::tools::testing::{call, context};

fn tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for (path, content) in [
        ("a.go", "package a\nfunc Main() {}\n"),
        ("b.txt", "hello\nHELLO world\n"),
        ("src/c.go", "package src\n// hello from c\n"),
        ("src/deep/d.go", "package deep\n"),
        (".git/config", "hello from git\n"),
        ("node_modules/m/index.js", "hello\n"),
        ("src/vendor/v.go", "hello vendored\n"),
        ("bin.dat", "hello\0binary\n"),
    ] {
        std::fs::create_dir_all(root.join(path).parent().unwrap()).unwrap();
        std::fs::write(root.join(path), content).unwrap();
    }
    symlink("src", root.join("srclink")).unwrap();
    symlink("b.txt", root.join("blink.txt")).unwrap();
    symlink("/etc/passwd", root.join("passwd.txt")).unwrap();
    dir
}

#[test]
fn glob_matches_sorted_paths_relative_to_the_root_and_skips_dirs() {
    let dir = tree();
    let context = context(dir.path());
    let glob = |arguments| call(&context, "glob", arguments);
    assert_eq!(
        glob(json!({"pattern": "**/*.go"})),
        Ok("a.go\nsrc/c.go\nsrc/deep/d.go\n".to_owned())
    );
    assert_eq!(
        glob(json!({"pattern": "*.go", "path": "src"})),
        Ok("src/c.go\n".to_owned())
    );
    assert_eq!(
        glob(json!({"pattern": "*.{txt,dat}"})),
        Ok("b.txt\nbin.dat\nblink.txt\n".to_owned())
    );
    assert_eq!(
        glob(json!({"pattern": "*.rs"})),
        Ok("(no files match)".to_owned())
    );
    assert_eq!(
        glob(json!({"pattern": "**/*.go", "max_results": 2})),
        Ok("a.go\nsrc/c.go\n... (stopped at 2 results; narrow the pattern or path)\n".to_owned())
    );
    // Naming a skipped directory as the base still searches it.
    assert_eq!(
        glob(json!({"pattern": "*", "path": ".git"})),
        Ok(".git/config\n".to_owned())
    );
}

#[test]
fn glob_bombs_are_bounded() {
    let dir = tree();
    let context = context(dir.path());
    let long = "*".repeat(5000);
    assert!(call(&context, "glob", json!({"pattern": long})).is_err());
    // Alternation is compiled to one automaton, never expanded: 2^40
    // spellings, nested groups and many `**` all finish at once.
    let started = std::time::Instant::now();
    for pattern in [
        "{a,b}".repeat(40),
        format!("{}x{}", "{a,".repeat(50), "}".repeat(50)),
        "**/".repeat(200) + "*.go",
    ] {
        let _ = call(&context, "glob", json!({"pattern": pattern}));
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn grep_finds_lines_sorted_by_path_and_skips_binary_and_dirs() {
    let dir = tree();
    let context = context(dir.path());
    let grep = |arguments| call(&context, "grep", arguments);
    assert_eq!(
        grep(json!({"pattern": "hello"})),
        Ok("b.txt:1:hello\nblink.txt:1:hello\nsrc/c.go:2:// hello from c\n".to_owned())
    );
    assert_eq!(
        grep(json!({"pattern": "hello", "ignore_case": true, "include": "b.txt"})),
        Ok("b.txt:1:hello\nb.txt:2:HELLO world\n".to_owned())
    );
    assert_eq!(
        grep(json!({"pattern": "package", "include": "src/**/*.go"})),
        Ok("src/c.go:1:package src\nsrc/deep/d.go:1:package deep\n".to_owned())
    );
    assert_eq!(
        grep(json!({"pattern": "hello", "path": "src/c.go"})),
        Ok("src/c.go:2:// hello from c\n".to_owned())
    );
    assert_eq!(
        grep(json!({"pattern": "nothing here"})),
        Ok("(no matches)".to_owned())
    );
    assert_eq!(
        grep(json!({"pattern": "hello", "max_results": 1})),
        Ok("b.txt:1:hello\n... (stopped at 1 matches; narrow the pattern or path)\n".to_owned())
    );
}

#[test]
fn grep_patterns_are_data() {
    let dir = tree();
    let context = context(dir.path());
    assert_eq!(
        call(&context, "grep", json!({"pattern": "--pre=sh"})),
        Ok("(no matches)".to_owned())
    );
    assert_eq!(
        call(&context, "grep", json!({"pattern": "-rf"})),
        Ok("(no matches)".to_owned())
    );
    let refused = call(&context, "grep", json!({"pattern": "("})).unwrap_err();
    assert!(refused.starts_with("invalid pattern"), "{refused}");
}

#[test]
fn grep_cuts_long_lines() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("long"), format!("{}\n", "x".repeat(1000))).unwrap();
    let context = context(dir.path());
    let out = call(&context, "grep", json!({"pattern": "x"})).unwrap();
    assert_eq!(out, format!("long:1:{}...\n", "x".repeat(500)));
}

#[test]
fn search_outside_is_refused() {
    let dir = tree();
    let context = context(dir.path());
    for tool in ["grep", "glob"] {
        let refused = call(&context, tool, json!({"pattern": "root", "path": "/etc"})).unwrap_err();
        assert_eq!(refused, "path is outside the workspace: /etc");
    }
}

#[test]
fn ls_lists_sorted_entries_and_links() {
    let dir = tree();
    let context = context(dir.path());
    let out = call(&context, "ls", json!({})).unwrap();
    assert_eq!(
        out,
        ".git/\na.go  25\nb.txt  18\nbin.dat  13\nblink.txt@  18\nnode_modules/\npasswd.txt@ (link outside the workspace or broken)\nsrc/\nsrclink@/\n"
    );
    assert_eq!(
        call(&context, "ls", json!({"path": "a.go"})),
        Err("a.go is not a directory".to_owned())
    );
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    assert_eq!(
        call(&context, "ls", json!({"path": "empty"})),
        Ok("(empty)".to_owned())
    );
    // A link in a subdirectory that climbs back up stays inside.
    symlink("../b.txt", dir.path().join("src/up.txt")).unwrap();
    let out = call(&context, "ls", json!({"path": "src"})).unwrap();
    assert!(out.contains("up.txt@  18\n"), "{out}");
}

#[test]
fn gathered_matches_stay_bounded_whatever_the_walk_order() {
    let mut found = super::Found::default();
    let lines = |n: usize| (0..n).map(|i| i.to_string()).collect::<Vec<_>>();
    for path in ["z", "m", "a", "q", "b"] {
        found.add(path.as_bytes().to_vec(), lines(3), 4);
    }
    // "a" and "b" hold 6 lines, enough for 4 and the trailer; the rest went.
    assert_eq!(found.files.keys().collect::<Vec<_>>(), [b"a", b"b"]);
    assert_eq!(found.total, 6);
}
