//! The namespace tools' rules (seed 003), each on its own: removal is not
//! recursive, copy takes regular files only, copy and move refuse an existing
//! destination, a file changed since it was read is not removed, nothing
//! leaves the workspace, hostile names are shown quoted.

use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::Path;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::tools::testing::{call, context, context_with};

fn read(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path).unwrap()
}

fn fifo(path: &Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
}

fn copy(
    context: &std::sync::Arc<crate::Context>,
    source: &str,
    destination: &str,
) -> Result<String, String> {
    call(
        context,
        "copy",
        json!({"source": source, "destination": destination}),
    )
}

fn move_(
    context: &std::sync::Arc<crate::Context>,
    source: &str,
    destination: &str,
) -> Result<String, String> {
    call(
        context,
        "move",
        json!({"source": source, "destination": destination}),
    )
}

fn remove(context: &std::sync::Arc<crate::Context>, path: &str) -> Result<String, String> {
    call(context, "remove", json!({"path": path}))
}

#[test]
fn copy_makes_a_new_file_with_the_sources_bytes_and_mode() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.sh"), "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(
        dir.path().join("a.sh"),
        std::fs::Permissions::from_mode(0o750),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let context = context(dir.path());
    assert_eq!(
        copy(&context, "a.sh", "sub/b.sh"),
        Ok("copied a.sh to sub/b.sh (18 bytes)".to_owned())
    );
    assert_eq!(read(dir.path().join("sub/b.sh")), "#!/bin/sh\necho hi\n");
    assert_eq!(read(dir.path().join("a.sh")), "#!/bin/sh\necho hi\n");
    let mode = std::fs::metadata(dir.path().join("sub/b.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o750);
    // No temp file is left beside it.
    assert_eq!(
        std::fs::read_dir(dir.path().join("sub")).unwrap().count(),
        1
    );
    // The copy counts as seen: writing it needs no read first.
    call(
        &context,
        "write",
        json!({"path": "sub/b.sh", "content": "new"}),
    )
    .unwrap();
}

#[test]
fn copy_and_move_refuse_an_existing_destination() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), "a").unwrap();
    std::fs::write(dir.path().join("b"), "b").unwrap();
    std::fs::create_dir(dir.path().join("d")).unwrap();
    symlink("nowhere", dir.path().join("dangling")).unwrap();
    let context = context(dir.path());
    for destination in ["b", "d", "dangling"] {
        let refused = copy(&context, "a", destination).unwrap_err();
        assert!(
            refused.starts_with(&format!("{destination} already exists")),
            "{refused}"
        );
        assert!(refused.contains("copy does not replace"), "{refused}");
        let refused = move_(&context, "a", destination).unwrap_err();
        assert!(
            refused.starts_with(&format!("{destination} already exists")),
            "{refused}"
        );
        assert!(refused.contains("move does not replace"), "{refused}");
    }
    assert_eq!(read(dir.path().join("a")), "a");
    assert_eq!(read(dir.path().join("b")), "b");
    assert!(
        std::fs::symlink_metadata(dir.path().join("dangling"))
            .unwrap()
            .is_symlink()
    );
    assert_eq!(std::fs::read_dir(dir.path().join("d")).unwrap().count(), 0);
}

#[test]
fn copy_takes_regular_files_only() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("file"), "x").unwrap();
    std::fs::create_dir(dir.path().join("dir")).unwrap();
    symlink("file", dir.path().join("link")).unwrap();
    fifo(&dir.path().join("fifo"));
    let context = context(dir.path());
    for (source, says) in [
        (
            "dir",
            "dir is a directory; copy takes regular files only (it is not recursive)",
        ),
        (
            "link",
            "link is a symbolic link; copy takes regular files only",
        ),
        (
            "fifo",
            "fifo is not a regular file (a FIFO, socket or device); copy takes regular files only",
        ),
        ("missing", "missing: no such file or directory"),
    ] {
        assert_eq!(
            copy(&context, source, "new"),
            Err(says.to_owned()),
            "{source}"
        );
        assert!(!dir.path().join("new").exists(), "{source}");
    }
    // A device (the workspace cannot hold one here; /dev/null through an
    // absolute path is outside): refused before it is opened.
    let refused = copy(&context, "/dev/null", "new").unwrap_err();
    assert!(refused.contains("outside the workspace"), "{refused}");
}

#[test]
fn move_renames_files_directories_and_links_keeping_what_was_read() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), "one").unwrap();
    std::fs::create_dir_all(dir.path().join("tree/deep")).unwrap();
    std::fs::write(dir.path().join("tree/deep/x"), "x").unwrap();
    symlink("f", dir.path().join("link")).unwrap();
    std::fs::create_dir(dir.path().join("to")).unwrap();
    let context = context(dir.path());
    call(&context, "read", json!({"path": "f"})).unwrap();
    assert_eq!(
        move_(&context, "f", "to/g"),
        Ok("moved f to to/g".to_owned())
    );
    assert!(!dir.path().join("f").exists());
    assert_eq!(read(dir.path().join("to/g")), "one");
    // What was read under the old name is still read under the new one.
    call(&context, "write", json!({"path": "to/g", "content": "two"})).unwrap();
    assert_eq!(
        move_(&context, "tree", "to/tree"),
        Ok("moved tree to to/tree".to_owned())
    );
    assert_eq!(read(dir.path().join("to/tree/deep/x")), "x");
    assert_eq!(
        move_(&context, "link", "to/link"),
        Ok("moved link to to/link".to_owned())
    );
    assert!(
        std::fs::symlink_metadata(dir.path().join("to/link"))
            .unwrap()
            .is_symlink()
    );
    // Into itself, onto the root, from nothing, into a missing directory.
    std::fs::create_dir(dir.path().join("p")).unwrap();
    let refused = move_(&context, "p", "p/q").unwrap_err();
    assert!(refused.contains("into itself"), "{refused}");
    let refused = move_(&context, ".", "elsewhere").unwrap_err();
    assert!(refused.contains("the workspace root"), "{refused}");
    let refused = move_(&context, "missing", "m2").unwrap_err();
    assert_eq!(refused, "missing: no such file or directory");
    let refused = move_(&context, "p", "no/such/dir").unwrap_err();
    assert!(
        refused.starts_with("no/such: no such file or directory"),
        "{refused}"
    );
}

#[test]
fn remove_is_not_recursive() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("full/inner")).unwrap();
    std::fs::write(dir.path().join("full/inner/f"), "keep").unwrap();
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    let context = context(dir.path());
    let refused = remove(&context, "full").unwrap_err();
    assert_eq!(
        refused,
        "full is a directory that is not empty; remove is not recursive: remove what is in it first"
    );
    assert_eq!(read(dir.path().join("full/inner/f")), "keep");
    assert_eq!(
        remove(&context, "empty"),
        Ok("removed the empty directory empty".to_owned())
    );
    assert!(!dir.path().join("empty").exists());
    let refused = remove(&context, ".").unwrap_err();
    assert!(refused.contains("the workspace root"), "{refused}");
}

#[test]
fn remove_needs_a_read_and_refuses_a_file_changed_since() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), "one").unwrap();
    let context = context(dir.path());
    let refused = remove(&context, "f").unwrap_err();
    assert!(refused.contains("has not been read"), "{refused}");
    assert!(dir.path().join("f").exists());
    call(&context, "read", json!({"path": "f"})).unwrap();
    std::fs::write(dir.path().join("f"), "one changed").unwrap();
    let refused = remove(&context, "f").unwrap_err();
    assert!(
        refused.contains("changed since it was last read"),
        "{refused}"
    );
    assert_eq!(read(dir.path().join("f")), "one changed");
    call(&context, "read", json!({"path": "f"})).unwrap();
    assert_eq!(remove(&context, "f"), Ok("removed f".to_owned()));
    assert!(!dir.path().join("f").exists());
    // Without the write guard, no read is needed.
    std::fs::write(dir.path().join("g"), "g").unwrap();
    let unguarded = context_with(dir.path(), false, 1 << 20);
    assert_eq!(remove(&unguarded, "g"), Ok("removed g".to_owned()));
}

#[test]
fn remove_takes_a_link_itself_and_a_fifo_without_a_read() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("target"), "keep").unwrap();
    symlink("target", dir.path().join("link")).unwrap();
    fifo(&dir.path().join("fifo"));
    let context = context(dir.path());
    assert_eq!(remove(&context, "link"), Ok("removed link".to_owned()));
    assert!(std::fs::symlink_metadata(dir.path().join("link")).is_err());
    assert_eq!(read(dir.path().join("target")), "keep");
    assert_eq!(remove(&context, "fifo"), Ok("removed fifo".to_owned()));
}

#[test]
fn nothing_outside_the_workspace_is_touched() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("canary"), "canary").unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mine"), "mine").unwrap();
    symlink(outside.path(), dir.path().join("out")).unwrap();
    symlink(
        outside.path().join("canary"),
        dir.path().join("canary-link"),
    )
    .unwrap();
    let context = context(dir.path());
    let canary = outside.path().join("canary");
    let absolute = canary.to_str().unwrap();
    for (tool, arguments) in [
        ("copy", json!({"source": absolute, "destination": "stolen"})),
        (
            "copy",
            json!({"source": "../canary", "destination": "stolen"}),
        ),
        (
            "copy",
            json!({"source": "out/canary", "destination": "stolen"}),
        ),
        (
            "copy",
            json!({"source": "canary-link", "destination": "stolen"}),
        ),
        (
            "copy",
            json!({"source": "mine", "destination": "out/planted"}),
        ),
        (
            "copy",
            json!({"source": "mine", "destination": "../planted"}),
        ),
        (
            "move",
            json!({"source": "out/canary", "destination": "stolen"}),
        ),
        (
            "move",
            json!({"source": "mine", "destination": "out/planted"}),
        ),
        ("move", json!({"source": absolute, "destination": "stolen"})),
        ("remove", json!({"path": "out/canary"})),
        ("remove", json!({"path": absolute})),
        ("remove", json!({"path": "../canary"})),
    ] {
        let refused = call(&context, tool, arguments.clone()).unwrap_err();
        assert!(
            refused.contains("outside the workspace") || refused.contains("symbolic link"),
            "{tool} {arguments}: {refused}"
        );
    }
    assert_eq!(read(&canary), "canary");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
    assert!(!dir.path().join("stolen").exists());
    assert_eq!(read(dir.path().join("mine")), "mine");
    // The link itself, inside, may be removed; what it leads to stays.
    assert_eq!(
        remove(&context, "canary-link"),
        Ok("removed canary-link".to_owned())
    );
    assert_eq!(read(&canary), "canary");
}

#[test]
fn hostile_names_are_taken_quoted_and_shown_quoted() {
    let dir = tempfile::tempdir().unwrap();
    let newline = "line\nbreak.txt";
    std::fs::write(dir.path().join(newline), "n").unwrap();
    std::fs::write(dir.path().join("-rf"), "dash").unwrap();
    std::fs::write(dir.path().join("résumé ✓.txt"), "u").unwrap();
    let context = context(dir.path());
    assert_eq!(
        copy(&context, "\"line\\nbreak.txt\"", "\"copy\\nof\""),
        Ok("copied \"line\\nbreak.txt\" to \"copy\\nof\" (1 bytes)".to_owned())
    );
    assert_eq!(read(dir.path().join("copy\nof")), "n");
    assert_eq!(
        move_(&context, "-rf", "--help"),
        Ok("moved -rf to --help".to_owned())
    );
    assert_eq!(read(dir.path().join("--help")), "dash");
    assert_eq!(
        move_(&context, "résumé ✓.txt", "ünïcødé"),
        Ok("moved résumé ✓.txt to ünïcødé".to_owned())
    );
    call(&context, "read", json!({"path": "\"copy\\nof\""})).unwrap();
    assert_eq!(
        remove(&context, "\"copy\\nof\""),
        Ok("removed \"copy\\nof\"".to_owned())
    );
    // A name the model wrote raw with a newline in it is refused as a
    // missing file, shown quoted: one message, one line.
    let refused = remove(&context, "no\nsuch").unwrap_err();
    assert_eq!(refused, "\"no\\nsuch\": no such file or directory");
}

#[test]
fn facts_claim_both_paths_and_the_stamp_binds_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), "a").unwrap();
    let context = context(dir.path());
    let claimed = crate::tools::facts(
        &context,
        "copy",
        &crate::tools::testing::map(json!({"source": "a", "destination": "/etc/b"})),
    )
    .unwrap()
    .unwrap();
    let claimed = serde_json::to_value(claimed).unwrap();
    assert_eq!(
        claimed["calls"],
        json!([
            {"tool": "", "args": {"path": "a"}, "text": "a"},
            {"tool": "", "args": {"path": "$(...) /etc/b"}, "text": "/etc/b"},
        ])
    );
    let mut rewrite: Value = claimed["rewrite"].clone();
    assert!(rewrite["dax_stamp"].is_string());
    // The stamp was made for this destination: another is refused.
    rewrite["destination"] = json!("b");
    assert_eq!(
        call(&context, "copy", rewrite),
        Err(crate::tools::STAMP_MISMATCH.to_owned())
    );
    assert!(!dir.path().join("b").exists());
}
