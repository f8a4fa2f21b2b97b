use std::os::unix::fs::symlink;

use pretty_assertions::assert_eq;
use serde_json::json;

use super::*;

fn workspace() -> (tempfile::TempDir, Workspace) {
    let dir = tempfile::tempdir().unwrap();
    let workspace = Workspace::open(dir.path()).unwrap();
    (dir, workspace)
}

#[test]
fn names_are_cleaned_relative_to_the_root() {
    let (dir, workspace) = workspace();
    let check = |raw: &str, expected: &str| {
        assert_eq!(workspace.name(raw).unwrap().to_string(), expected, "{raw}")
    };
    check("a/b/../c", "a/c");
    check("./a//b/", "a/b");
    check(".", ".");
    check("", ".");
    check(&format!("{}/x/y", dir.path().display()), "x/y");
    check(&dir.path().display().to_string(), ".");
    assert_eq!(workspace.word_name("sub", "../a").unwrap().to_string(), "a");
    // A tool's path may be quoted as the tools show names; a bash word is literal.
    assert_eq!(
        workspace.name("\"a\\nb\"/c").unwrap().as_path(),
        Path::new("a\nb/c")
    );
    assert_eq!(
        workspace.name("\"a\\nb\"/c").unwrap().to_string(),
        "\"a\\nb\"/c"
    );
    assert_eq!(
        workspace.word_name("", "\"x\"").unwrap().as_path(),
        Path::new("\"x\"")
    );
    // A quoted name is decoded before it is cleaned: `..` spelled in escapes is still `..`.
    assert!(matches!(
        workspace.name("\"\\x2e\\x2e\"/x"),
        Err(PathError::Outside(_))
    ));
}

#[test]
fn names_outside_are_refused() {
    let (dir, workspace) = workspace();
    for raw in [
        "..",
        "../x",
        "a/../../x",
        "/etc/shadow",
        "/proc/self/root/etc/passwd",
        "/proc/1/environ",
    ] {
        let error = workspace.name(raw).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("path is outside the workspace: {raw}")
        );
    }
    // A sibling sharing the root's prefix is outside (B13).
    let sibling = format!("{}-evil/x", dir.path().display());
    assert!(matches!(
        workspace.name(&sibling),
        Err(PathError::Outside(_))
    ));
}

#[test]
fn nul_bytes_and_over_long_names_are_invalid() {
    let (_dir, workspace) = workspace();
    assert!(matches!(workspace.name("a\0b"), Err(PathError::Invalid(_))));
    assert!(matches!(
        workspace.name(&"a/".repeat(3000)),
        Err(PathError::Invalid(_))
    ));
    assert!(matches!(
        workspace.name(&"x".repeat(256)),
        Err(PathError::Invalid(_))
    ));
    assert!(workspace.name(&"x".repeat(255)).is_ok());
}

#[test]
fn links_leading_out_are_refused_by_the_kernel() {
    let (dir, workspace) = workspace();
    symlink("/etc", dir.path().join("out")).unwrap();
    let error = workspace.open_regular("out/passwd").unwrap_err();
    assert!(
        matches!(error, FileError::Io(ref e) if is_escape(e)),
        "{error:?}"
    );
    assert_eq!(
        error.message("out/passwd"),
        "path is outside the workspace: out/passwd"
    );
}

#[test]
fn fifos_are_refused_without_blocking() {
    let (dir, workspace) = workspace();
    nix::unistd::mkfifo(
        &dir.path().join("notes.txt"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let error = workspace.open_regular("notes.txt").unwrap_err();
    assert!(matches!(error, FileError::NotRegular));
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
}

#[test]
fn path_facts_name_the_path_and_where_links_lead() {
    let (dir, workspace) = workspace();
    std::fs::create_dir(dir.path().join("real")).unwrap();
    std::fs::write(dir.path().join("real/f"), "x").unwrap();
    symlink("real", dir.path().join("alias")).unwrap();
    symlink("/etc", dir.path().join("out")).unwrap();
    let facts = |raw: &str| serde_json::to_value(workspace.path_facts(raw, "")).unwrap();
    assert_eq!(
        facts("real/f"),
        json!([{"tool": "", "args": {"path": "real/f"}, "text": "real/f"}])
    );
    assert_eq!(
        facts("alias/f"),
        json!([
            {"tool": "", "args": {"path": "alias/f"}, "text": "alias/f"},
            {"tool": "", "args": {"path": "real/f"}, "text": "alias/f -> real/f"},
        ])
    );
    assert_eq!(
        facts("alias/new"),
        json!([
            {"tool": "", "args": {"path": "alias/new"}, "text": "alias/new"},
            {"tool": "", "args": {"path": "real/new"}, "text": "alias/new -> real/new"},
        ])
    );
    assert_eq!(
        facts("out/passwd"),
        json!([
            {"tool": "", "args": {"path": "out/passwd"}, "text": "out/passwd"},
            {"tool": "", "args": {"path": "$(...) out/passwd"}, "text": "out/passwd -> outside the workspace"},
        ])
    );
    assert_eq!(
        facts("../x"),
        json!([{"tool": "", "args": {"path": "$(...) ../x"}, "text": "../x"}])
    );
    let as_read = serde_json::to_value(workspace.word_facts("real", "f", "read")).unwrap();
    assert_eq!(
        as_read,
        json!([{"tool": "read", "args": {"path": "real/f"}, "text": "f"}])
    );
}

#[test]
fn directory_is_checked_through_the_root() {
    let (dir, workspace) = workspace();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("file"), "x").unwrap();
    symlink("/", dir.path().join("rootlink")).unwrap();
    let root = workspace.root().to_path_buf();
    assert_eq!(workspace.directory("sub").unwrap(), root.join("sub"));
    assert_eq!(workspace.directory("").unwrap(), root);
    assert!(matches!(
        workspace.directory("rootlink"),
        Err(PathError::Outside(_))
    ));
    assert!(matches!(
        workspace.directory("../"),
        Err(PathError::Outside(_))
    ));
    assert!(workspace.directory("file").is_err());
}
