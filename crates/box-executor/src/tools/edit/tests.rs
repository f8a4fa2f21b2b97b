use std::os::unix::fs::{PermissionsExt as _, symlink};

use pretty_assertions::assert_eq;
use serde_json::json;

use crate::tools::testing::{call, context, context_with};

#[test]
fn write_creates_parents_with_mode_0644() {
    let dir = tempfile::tempdir().unwrap();
    let context = context(dir.path());
    let out = call(
        &context,
        "write",
        json!({"path": "a/b/c.txt", "content": "hi\n"}),
    );
    assert_eq!(out, Ok("wrote 3 bytes to a/b/c.txt".to_owned()));
    let path = dir.path().join("a/b/c.txt");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "hi\n");
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o644
    );
    // No temp file is left beside it.
    assert_eq!(
        std::fs::read_dir(dir.path().join("a/b")).unwrap().count(),
        1
    );
}

#[test]
fn overwriting_needs_an_earlier_read() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), "old").unwrap();
    let context = context(dir.path());
    let refused = call(&context, "write", json!({"path": "f", "content": "new"})).unwrap_err();
    assert!(refused.contains("has not been read"), "{refused}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("f")).unwrap(),
        "old"
    );
    call(&context, "read", json!({"path": "f"})).unwrap();
    call(&context, "write", json!({"path": "f", "content": "new"})).unwrap();
    // The executor's own write counts as seen: a second write needs no read.
    call(&context, "write", json!({"path": "f", "content": "newer"})).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("f")).unwrap(),
        "newer"
    );
}

#[test]
fn a_file_changed_since_its_read_is_not_clobbered() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), "one two").unwrap();
    let context = context(dir.path());
    call(&context, "read", json!({"path": "f"})).unwrap();
    std::fs::write(dir.path().join("f"), "one three").unwrap();
    let refused = call(
        &context,
        "edit",
        json!({"path": "f", "old_string": "one", "new_string": "1"}),
    )
    .unwrap_err();
    assert!(
        refused.contains("changed since it was last read"),
        "{refused}"
    );
    assert!(refused.contains("read it again"), "{refused}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("f")).unwrap(),
        "one three"
    );
}

#[test]
fn the_write_guard_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), "old").unwrap();
    let context = context_with(dir.path(), false, 1 << 20);
    call(&context, "write", json!({"path": "f", "content": "new"})).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("f")).unwrap(),
        "new"
    );
}

#[test]
fn edit_replaces_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), "a b a c").unwrap();
    let context = context(dir.path());
    call(&context, "read", json!({"path": "f"})).unwrap();
    let edit = |old: &str, new: &str| {
        call(
            &context,
            "edit",
            json!({"path": "f", "old_string": old, "new_string": new}),
        )
    };
    assert_eq!(
        edit("", "x"),
        Err("old_string must not be empty".to_owned())
    );
    assert_eq!(
        edit("zz", "x"),
        Err("old_string not found in file".to_owned())
    );
    assert_eq!(
        edit("a", "x"),
        Err("old_string matches 2 times; add context to make it unique".to_owned())
    );
    assert_eq!(edit("b", "B"), Ok("edited f".to_owned()));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("f")).unwrap(),
        "a B a c"
    );
}

#[test]
fn edit_refuses_files_over_the_read_limit() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), "x".repeat(100)).unwrap();
    let context = context_with(dir.path(), true, 10);
    let refused = call(
        &context,
        "edit",
        json!({"path": "f", "old_string": "x", "new_string": "y"}),
    )
    .unwrap_err();
    assert_eq!(
        refused,
        "f is 100 bytes, over the 10-byte limit for this tool"
    );
}

#[test]
fn writes_through_links_out_create_nothing_outside() {
    let outside = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    symlink(outside.path(), dir.path().join("out")).unwrap();
    symlink(outside.path().join("canary"), dir.path().join("dangling")).unwrap();
    let context = context(dir.path());
    for path in ["out/x", "out/new/dir/x", "dangling", "../x", "/etc/x"] {
        let refused =
            call(&context, "write", json!({"path": path, "content": "pwned"})).unwrap_err();
        assert!(
            refused.contains("outside the workspace"),
            "{path}: {refused}"
        );
    }
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
}

#[test]
fn writes_follow_links_inside_and_keep_the_link() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("real"), "old").unwrap();
    symlink("real", dir.path().join("alias")).unwrap();
    let context = context(dir.path());
    call(&context, "read", json!({"path": "real"})).unwrap();
    call(
        &context,
        "write",
        json!({"path": "alias", "content": "new"}),
    )
    .unwrap();
    assert!(
        std::fs::symlink_metadata(dir.path().join("alias"))
            .unwrap()
            .is_symlink()
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("real")).unwrap(),
        "new"
    );
}

#[test]
fn fifos_and_directories_are_not_written() {
    let dir = tempfile::tempdir().unwrap();
    nix::unistd::mkfifo(
        &dir.path().join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let context = context_with(dir.path(), false, 1 << 20);
    let refused = call(&context, "write", json!({"path": "pipe", "content": "x"})).unwrap_err();
    assert_eq!(refused, "pipe: not a regular file");
    let refused = call(&context, "write", json!({"path": "sub", "content": "x"})).unwrap_err();
    assert_eq!(refused, "sub is a directory");
    let refused = call(
        &context,
        "edit",
        json!({"path": "pipe", "old_string": "a", "new_string": "b"}),
    )
    .unwrap_err();
    assert_eq!(refused, "pipe: not a regular file");
}

#[test]
fn concurrent_edits_of_one_file_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let lines: String = (0..16).map(|n| format!("line {n}\n")).collect();
    std::fs::write(dir.path().join("f"), &lines).unwrap();
    let context = context(dir.path());
    call(&context, "read", json!({"path": "f"})).unwrap();
    std::thread::scope(|scope| {
        for n in 0..16 {
            let context = &context;
            scope.spawn(move || {
                call(
                    context,
                    "edit",
                    json!({"path": "f", "old_string": format!("line {n}\n"), "new_string": format!("edited {n}\n")}),
                )
                .unwrap();
            });
        }
    });
    let text = std::fs::read_to_string(dir.path().join("f")).unwrap();
    assert_eq!(text.matches("edited").count(), 16, "{text}");
}
